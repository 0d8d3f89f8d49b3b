"""Money: a model step is priced in a currency from its token usage and a price table.

A graph with a price (``create_agent(..., price=...)``, a model name in ``fp.PRICES`` or an
``fp.ModelPrice``) charges each model step on the ``money`` axis as tokens are charged: the hold
priced before the call, settled to the reported usage priced (cached input at the cached price),
an unreported step priced from its text count; the ledger holds whole micro-units, so it never
drifts. The table is dated and visible; a model it does not price is never guessed: naming one
is a ``GraphConfigError`` at build time, and a money limit on an unpriced graph ends the run
before its first step (``money_unpriced``).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from fencepost.adapters import SqliteLedger
from fencepost.graph.settings import GraphConfigError
from fencepost.graph.token_count import count_tokens
from fencepost.policy.pricing import MICROS, price_micros
from fencepost.policy.usage import UsageKind, UsageReport, input_text, reply_text, step_settlement
from tests.adapters import fakes
from tests.graph.kit import Calls, call, context, final_citing_last, make_registry, thread

PRICE = fp.ModelPrice(input=Decimal("0.15"), output=Decimal("0.60"), cached_input=Decimal("0.075"))


class PricedModel:
    """Proposes a call per step until ``steps`` steps, then answers citing the last; reports
    ``usage`` (input, output, cached) a step, or nothing with ``None``."""

    def __init__(self, usage: tuple[int, int, int] | None, *, steps: int = 2) -> None:
        self.usage = usage
        self.steps = steps
        self.inputs: list[fp.DecisionInput] = []
        self.replies: list[Any] = []

    async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
        self.inputs.append(inp)
        await asyncio.sleep(0)
        decision: Any = call(n=len(inp.observations) + 1)
        if len(inp.observations) + 1 >= self.steps:
            decision = final_citing_last(inp)
        self.replies.append(decision)
        if self.usage is None:
            return fp.Decided(decision=decision)
        tokens_in, tokens_out, cached = self.usage
        return fp.Decided(
            decision=decision,
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            cached_input_tokens=cached,
        )


@pytest.fixture(params=["memory", "sqlite"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[fp.Ledger]:
    if request.param == "memory":
        yield fp.InMemoryLedger()
    else:
        with SqliteLedger(tmp_path / "ledger.db") as durable:
            yield durable


def money_budget(money: str, steps: int = 8) -> fp.RuntimeBudget:
    return fp.RuntimeBudget(
        steps_remaining=steps, tool_calls_remaining=8, money_remaining=Decimal(money)
    )


def run(ledger: fp.Ledger, model: Any, budget: fp.RuntimeBudget, **build: Any) -> fp.AgentState:
    graph = fp.build_agent_graph(make_registry(Calls()), model, ledger=ledger, **build).compile(
        checkpointer=InMemorySaver()
    )
    return fp.run_output(graph.invoke(fp.start("q", budget), thread(), context=context()))


def test_a_step_is_charged_its_reported_usage_priced(ledger: fp.Ledger) -> None:
    state = run(ledger, PricedModel((1000, 100, 0)), money_budget("1"), price=PRICE)
    assert state.termination is fp.TerminationReason.COMPLETED
    # 1000 in at $0.15/M + 100 out at $0.60/M = 210 micro-dollars a step, two steps.
    assert state.budget.money_used == Decimal("0.00042")
    assert state.budget.money_remaining == Decimal("0.99958")


def test_cached_input_is_priced_at_the_cached_price(ledger: fp.Ledger) -> None:
    state = run(ledger, PricedModel((1000, 100, 1000)), money_budget("1"), price=PRICE)
    # 1000 cached in at $0.075/M + 100 out at $0.60/M = 135 micro-dollars a step.
    assert state.budget.money_used == Decimal("0.00027")


def test_an_unreported_step_is_priced_from_the_text_it_sent_and_received(
    ledger: fp.Ledger,
) -> None:
    model = PricedModel(None)
    state = run(ledger, model, money_budget("1"), price=PRICE)
    expected = sum(
        price_micros(PRICE, count_tokens(input_text(inp)), count_tokens(reply_text(reply)))
        for inp, reply in zip(model.inputs, model.replies, strict=True)
    )
    assert expected > 0
    assert state.budget.money_used == Decimal(expected) / MICROS


def test_a_run_ends_money_exhausted_when_its_money_is_spent(ledger: fp.Ledger) -> None:
    # 500 micro-dollars: two steps of 210 fit, the third's report crosses the limit.
    model = PricedModel((1000, 100, 0), steps=6)
    state = run(ledger, model, money_budget("0.0005"), price=PRICE)
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert state.last_error_code == "money_exhausted"
    assert len(model.inputs) == 3
    # Charged what was spent, past the limit: never more than the third step's report.
    assert state.budget.money_used == Decimal("0.00063")
    assert "money_remaining" in state.report.what_to_do


def test_a_tenant_money_pool_caps_its_runs_together(ledger: fp.Ledger) -> None:
    ledger.open_account("acme-pool", {"money": 1000.0}, owner={"tenant": "acme"})
    graph = fp.build_agent_graph(
        make_registry(Calls()), PricedModel((1000, 100, 0)), ledger=ledger, price=PRICE
    ).compile(checkpointer=InMemorySaver())
    pooled = context().model_copy(update={"budget_account": "acme-pool"})
    ends = [
        fp.run_output(
            graph.invoke(
                fp.start("q", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=4)),
                thread(),
                context=pooled,
            )
        ).last_error_code
        for _ in range(3)
    ]
    # 420 micro-dollars a run: two runs complete, the third crosses the pool's 1000.
    assert ends[:2] == [None, None]
    assert ends[2] == "money_exhausted"
    assert ledger.balance("acme-pool").held["money"] == 1050.0


def test_a_price_naming_a_model_the_table_lacks_is_refused_at_build() -> None:
    with pytest.raises(GraphConfigError) as refused:
        fp.build_agent_graph(make_registry(Calls()), PricedModel(None), price="gpt-0-unknown")
    assert refused.value.field == "price"
    assert "gpt-0-unknown" in str(refused.value)


def test_a_model_is_priced_by_its_own_name_or_a_table_the_app_passes(ledger: fp.Ledger) -> None:
    class Named(PricedModel):
        model_name = "my-model-2025-01-31"

    table = fp.PriceTable(
        as_of=date(2026, 1, 1),
        source="our contract",
        prices={"my-model": fp.ModelPrice(input=Decimal("1"), output=Decimal("2"))},
    )
    state = run(ledger, Named((10, 5, 0)), money_budget("1"), prices=table)
    assert state.budget.money_used == Decimal(2 * 20) / MICROS


@pytest.mark.parametrize("pool", [False, True])
def test_a_money_limit_on_an_unpriced_graph_ends_before_any_step(
    ledger: fp.Ledger, pool: bool
) -> None:
    model = PricedModel((1000, 100, 0))
    graph = fp.build_agent_graph(make_registry(Calls()), model, ledger=ledger).compile(
        checkpointer=InMemorySaver()
    )
    ctx = context()
    budget = money_budget("1")
    if pool:
        ledger.open_account("acme-pool", {"money": 1000.0}, owner={"tenant": "acme"})
        ctx = ctx.model_copy(update={"budget_account": "acme-pool"})
        budget = fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=4)
    state = fp.run_output(graph.invoke(fp.start("q", budget), thread(), context=ctx))
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "money_unpriced"
    assert model.inputs == []
    assert "price=" in state.report.what_to_do


def test_the_price_table_is_dated_sourced_and_matches_only_dated_snapshots() -> None:
    assert isinstance(fp.PRICES.as_of, date)
    assert fp.PRICES.source and fp.PRICES.currency == "USD"
    assert fp.PRICES.price_of("gpt-4o-mini-2024-07-18") == fp.PRICES.price_of("gpt-4o-mini")
    assert fp.PRICES.price_of("gpt-4o-mini") is not None
    # Not a guess: a model the table does not name is not priced like one it does.
    assert fp.PRICES.price_of("gpt-4o-audio-preview") is None


@given(
    tokens_in=st.integers(0, 2_000_000),
    tokens_out=st.integers(0, 2_000_000),
    cached=st.integers(0, 2_000_000),
    held=st.integers(0, 10_000_000),
)
def test_a_step_settles_exactly_its_priced_usage_in_whole_micro_units(
    tokens_in: int, tokens_out: int, cached: int, held: int
) -> None:
    report = UsageReport(
        kind=UsageKind.REPORTED,
        charged=tokens_in + tokens_out,
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        cached_input_tokens=min(cached, tokens_in),
    )
    cost = price_micros(PRICE, tokens_in, tokens_out, min(cached, tokens_in))
    exact = (
        (tokens_in - min(cached, tokens_in)) * PRICE.input
        + min(cached, tokens_in) * (PRICE.cached_input or PRICE.input)
        + tokens_out * PRICE.output
    )
    assert cost == math.ceil(exact)
    actual, overage = step_settlement(report, 0, money=(held, cost))
    charged = actual["money"] + overage.get("money", 0.0)
    assert charged == cost and charged.is_integer()


class NamedChatModel(fakes.FakeToolChatModel):
    model_name: str = "gpt-4o-mini-2024-07-18"


def usage(tokens_in: int, tokens_out: int, cached: int) -> dict[str, Any]:
    return {
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "total_tokens": tokens_in + tokens_out,
        "input_token_details": {"cache_read": cached},
    }


@pytest.mark.parametrize(
    ("name", "ending"), [("gpt-4o-mini-2024-07-18", None), ("ours-1", "money_unpriced")]
)
def test_a_chat_model_is_priced_by_its_own_name_and_its_cached_input(
    ledger: fp.Ledger, name: str, ending: str | None
) -> None:
    chat = NamedChatModel(
        model_name=name,
        messages=iter(
            [
                fakes.ai_call(
                    "search_logs",
                    {"query": "500"},
                    "call-model-01",
                    usage_metadata=usage(1000, 100, 1000),
                ),
                lambda messages: fakes.ai_final("deploy 42", ["call-model-01"]).model_copy(
                    update={"usage_metadata": usage(1000, 100, 0)}
                ),
            ]
        ),
    )
    log = fakes.ToolLog()
    graph = fakes.build(fakes.langchain_registry(log), fp.ChatModelDecider(chat), ledger=ledger)
    state = fp.run_output(
        graph.invoke(fp.start("why?", money_budget("1")), fakes.thread(), context=fakes.ctx())
    )
    assert state.last_error_code == ending
    if ending is None:
        # gpt-4o-mini's row: 1000 cached in + 100 out = 135, then 1000 in + 100 out = 210.
        assert state.budget.money_used == Decimal(135 + 210) / MICROS
