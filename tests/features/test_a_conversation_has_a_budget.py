"""A conversation has a budget: the runs of a thread can share one ledger account that caps
their sum (``fp.conversation_account``), named from the tenant and the thread together and owned
by the tenant, so no other tenant can spend it or name it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from fencepost.adapters import SqliteLedger
from tests.graph.kit import Calls, call, context, final_citing_last, make_registry, thread


class ReportingModel:
    """Proposes a call, then answers citing it; reports ``tokens`` a step."""

    def __init__(self, tokens: int = 100) -> None:
        self.tokens = tokens
        self.steps = 0

    async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
        self.steps += 1
        await asyncio.sleep(0)
        # A fresh call id each step, as a provider issues: a call id is claimed on its thread,
        # and a later run of the same conversation never runs one again.
        decision: Any = final_citing_last(inp) if inp.observations else call(n=self.steps)
        half = self.tokens // 2
        return fp.Decided(decision=decision, input_tokens=half, output_tokens=self.tokens - half)


@pytest.fixture(params=["memory", "sqlite"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[fp.Ledger]:
    if request.param == "memory":
        yield fp.InMemoryLedger()
    else:
        with SqliteLedger(tmp_path / "ledger.db") as durable:
            yield durable


def budget() -> fp.RuntimeBudget:
    return fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=4)


def graph_on(ledger: fp.Ledger, model: Any, **build: Any) -> Any:
    return fp.build_agent_graph(make_registry(Calls()), model, ledger=ledger, **build).compile(
        checkpointer=InMemorySaver()
    )


def test_three_runs_of_a_thread_stop_when_its_account_is_spent_another_thread_goes_on(
    ledger: fp.Ledger,
) -> None:
    graph = graph_on(ledger, ReportingModel(100))
    spent_thread, other_thread = thread(), thread()
    # 200 tokens a run: two runs fit in 450, the third crosses it.
    spent_ctx, other_ctx = (
        context().model_copy(
            update={
                "budget_account": fp.conversation_account(
                    ledger, "acme", config["configurable"]["thread_id"], tokens=450
                )
            }
        )
        for config in (spent_thread, other_thread)
    )
    ends = [
        fp.run_output(graph.invoke(fp.start(f"q{n}", budget()), spent_thread, context=spent_ctx))
        for n in range(3)
    ]
    assert [s.termination for s in ends] == [
        fp.TerminationReason.COMPLETED,
        fp.TerminationReason.COMPLETED,
        fp.TerminationReason.STEP_BUDGET_EXHAUSTED,
    ]
    assert ends[2].last_error_code == "tokens_exhausted"
    assert len({s.run_id for s in ends}) == 3  # three runs of one conversation
    # Each run's own budget had room: the thread's account is what stopped the third.
    assert ends[2].budget.tokens_remaining is None
    assert ledger.balance(spent_ctx.budget_account or "").held["tokens"] == 500.0
    # The thread stays spent for its next run too.
    fourth = fp.run_output(graph.invoke(fp.start("q3", budget()), spent_thread, context=spent_ctx))
    assert fourth.last_error_code == "tokens_exhausted"

    others = [
        fp.run_output(graph.invoke(fp.start(f"q{n}", budget()), other_thread, context=other_ctx))
        for n in range(2)
    ]
    assert [s.termination for s in others] == [fp.TerminationReason.COMPLETED] * 2


def test_a_conversation_money_budget_caps_its_runs_money(ledger: fp.Ledger) -> None:
    price = fp.ModelPrice(input=Decimal("1"), output=Decimal("1"))
    graph = graph_on(ledger, ReportingModel(100), price=price)
    config = thread()
    # 100 tokens at $1/M are 100 micro-dollars a step, 200 a run: 0.0003 funds one and a half.
    name = fp.conversation_account(
        ledger, "acme", config["configurable"]["thread_id"], money="0.0003"
    )
    ctx = context().model_copy(update={"budget_account": name})
    codes = [
        fp.run_output(
            graph.invoke(fp.start(f"q{n}", budget()), config, context=ctx)
        ).last_error_code
        for n in range(2)
    ]
    assert codes == [None, "money_exhausted"]


def test_the_same_thread_id_names_another_account_for_another_tenant(ledger: fp.Ledger) -> None:
    acme = fp.conversation_account(ledger, "acme", "t-1", tokens=100)
    globex = fp.conversation_account(ledger, "globex", "t-1", tokens=100)
    assert acme != globex
    assert ledger.balance(acme).owner == {"tenant": "acme"}
    assert ledger.balance(globex).owner == {"tenant": "globex"}


def test_another_tenant_naming_a_conversation_account_is_refused_and_spends_nothing(
    ledger: fp.Ledger,
) -> None:
    model = ReportingModel(100)
    graph = graph_on(ledger, model)
    name = fp.conversation_account(ledger, "acme", "t-1", tokens=1_000)
    intruder = context(tenant="globex").model_copy(update={"budget_account": name})
    state = fp.run_output(graph.invoke(fp.start("q", budget()), thread(), context=intruder))
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "budget_account_denied"
    assert model.steps == 0
    assert ledger.balance(name).held.get("tokens", 0.0) == 0.0


def test_a_conversation_account_is_funded_only_by_its_tenants_pool(ledger: fp.Ledger) -> None:
    ledger.open_account("globex-pool", {"tokens": 10_000}, owner={"tenant": "globex"})
    with pytest.raises(fp.ConversationBudgetDenied):
        fp.conversation_account(ledger, "acme", "t-1", tokens=100, parent="globex-pool")
    ledger.open_account("acme-pool", {"tokens": 150}, owner={"tenant": "acme"})
    name = fp.conversation_account(ledger, "acme", "t-2", tokens=1_000, parent="acme-pool")
    assert ledger.balance(name).parent == "acme-pool"
