"""Token holds a service can run on: a model step holds a bounded estimate (what it sends plus
the model's output cap), never all that is left; busy is not exhausted (a step crowded out by
steps in flight waits for them); usage is settled honestly (a missing report is charged a count
of the text sent and received, never the hold), and concurrent runs overshoot a shared token
limit by at most each in-flight step's reply beyond its estimate."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from fencepost.adapters import SqliteLedger
from fencepost.graph.token_count import count_tokens
from fencepost.policy.keys import run_account
from fencepost.policy.usage import input_text, reply_text
from tests.graph.kit import Calls, call, context, final_citing_last, make_registry, thread

TENANT = "tenant"
FINAL = fp.FinalProposal(answer=fp.AnswerPayload(text="done"))


def tenant_context() -> fp.RunContext:
    return context().model_copy(update={"budget_account": TENANT})


def sent(inp: fp.DecisionInput) -> int:
    """Tokens a step's input counts for, as the graph counts it."""
    return count_tokens(input_text(inp))


class TwoStepModel:
    """Proposes a call, then answers citing it; reports ``tokens`` a step (or nothing with
    ``None``). Each call yields a while, so concurrent runs overlap in it."""

    def __init__(self, tokens: int | None, *, steps: int = 2, wait: float = 0.02) -> None:
        self.tokens = tokens
        self.steps = steps
        self.wait = wait
        self.lock = threading.Lock()
        self.inputs: list[fp.DecisionInput] = []
        self.replies: list[Any] = []

    async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
        with self.lock:
            self.inputs.append(inp)
        await asyncio.sleep(self.wait)
        decision: Any = call(n=1)
        if len(inp.observations) + 1 >= self.steps:
            decision = final_citing_last(inp) if inp.observations else FINAL
        with self.lock:
            self.replies.append(decision)
        if self.tokens is None:
            return fp.Decided(decision=decision)
        return fp.Decided(
            decision=decision,
            input_tokens=self.tokens // 2,
            output_tokens=self.tokens - self.tokens // 2,
        )


def budget() -> fp.RuntimeBudget:
    return fp.RuntimeBudget(steps_remaining=6, tool_calls_remaining=4)


@pytest.fixture(params=["memory", "sqlite"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[fp.Ledger]:
    if request.param == "memory":
        yield fp.InMemoryLedger()
    else:
        with SqliteLedger(tmp_path / "ledger.db") as durable:
            yield durable


def test_five_concurrent_runs_on_a_large_tenant_token_budget_all_complete(
    ledger: fp.Ledger,
) -> None:
    ledger.open_account(TENANT, {"tokens": 1_000_000})
    model = TwoStepModel(100)
    graph = fp.build_agent_graph(make_registry(Calls()), model, ledger=ledger).compile(
        checkpointer=InMemorySaver()
    )

    async def all_five() -> list[dict[str, Any]]:
        return await asyncio.gather(
            *(
                graph.ainvoke(fp.start("q", budget()), thread(), context=tenant_context())
                for _ in range(5)
            )
        )

    states = [fp.run_output(out) for out in asyncio.run(all_five())]
    assert [s.termination for s in states] == [fp.TerminationReason.COMPLETED] * 5
    assert ledger.balance(TENANT).held["tokens"] == 5 * 2 * 100  # what they reported


def test_five_runs_in_threads_never_notice_each_other_on_a_large_tenant_budget(
    ledger: fp.Ledger,
) -> None:
    ledger.open_account(TENANT, {"tokens": 1_000_000})
    model = TwoStepModel(100)
    graph = fp.build_agent_graph(make_registry(Calls()), model, ledger=ledger).compile(
        checkpointer=InMemorySaver()
    )

    def one(_: int) -> fp.AgentState:
        return fp.run_output(
            graph.invoke(fp.start("q", budget()), thread(), context=tenant_context())
        )

    with ThreadPoolExecutor(max_workers=5) as pool:
        states = list(pool.map(one, range(5)))
    assert all(s.termination is fp.TerminationReason.COMPLETED for s in states)


def test_on_a_small_pool_runs_take_turns_and_it_pays_for_as_many_whole_runs_as_it_can(
    ledger: fp.Ledger,
) -> None:
    # One-step runs reporting 100 tokens each, on a pool of 300: three whole runs fit. Each
    # step's estimate (its input plus the default output cap) is more than the pool, so a step
    # in flight holds all of it and the others wait their turn instead of ending.
    ledger.open_account(TENANT, {"tokens": 300})
    model = TwoStepModel(100, steps=1)
    graph = fp.build_agent_graph(make_registry(Calls()), model, ledger=ledger).compile(
        checkpointer=InMemorySaver()
    )

    async def all_five() -> list[dict[str, Any]]:
        return await asyncio.gather(
            *(
                graph.ainvoke(fp.start("q", budget()), thread(), context=tenant_context())
                for _ in range(5)
            )
        )

    states = [fp.run_output(out) for out in asyncio.run(all_five())]
    ended = [s.termination for s in states]
    assert ended.count(fp.TerminationReason.COMPLETED) == 3
    assert ended.count(fp.TerminationReason.STEP_BUDGET_EXHAUSTED) == 2
    assert all(s.last_error_code == "tokens_exhausted" for s in states if not s.final_answer)
    # Those that ended exhausted did so with the pool spent, not merely held.
    assert ledger.balance(TENANT).held["tokens"] == 300
    assert model.inputs and len(model.inputs) == 3  # no model was asked past the pool


def test_a_model_that_reports_no_usage_is_charged_the_text_it_was_sent_and_wrote() -> None:
    ledger = fp.InMemoryLedger()
    model = TwoStepModel(None)
    graph = fp.build_agent_graph(make_registry(Calls()), model, ledger=ledger).compile(
        checkpointer=InMemorySaver()
    )
    limited = fp.RuntimeBudget(steps_remaining=6, tool_calls_remaining=4, tokens_remaining=10_000)
    config = thread()
    state = fp.run_output(graph.invoke(fp.start("q", limited), config, context=context()))
    assert state.termination is fp.TerminationReason.COMPLETED, state.last_error_code
    counted = sum(
        sent(inp) + count_tokens(reply_text(reply))
        for inp, reply in zip(model.inputs, model.replies, strict=True)
    )
    assert len(model.inputs) == 2
    assert 0 < counted < 10_000 // 4  # far below the hold each step took
    assert state.budget.tokens_used == counted
    account = run_account(config["configurable"]["thread_id"], state.run_id)
    assert ledger.balance(account).held["tokens"] == counted


def test_concurrent_runs_overshoot_a_token_limit_by_at_most_each_in_flight_replys_excess() -> None:
    # Each step's reply runs 500 tokens past its estimate. Three estimates fit the pool at
    # once, so three steps fly together: their reports are charged in full (past the limit),
    # and the limit is crossed by no more than what each in-flight step wrote beyond its hold.
    ledger = fp.InMemoryLedger()
    beyond = 500
    cap = 10
    probe = TwoStepModel(0, steps=1)
    fp.build_agent_graph(make_registry(Calls()), probe, ledger=ledger).compile(
        checkpointer=InMemorySaver()
    ).invoke(fp.start("q", budget()), thread(), context=context())
    estimate = sent(probe.inputs[0]) + cap
    pool = 3 * estimate
    ledger.open_account(TENANT, {"tokens": pool})
    model = TwoStepModel(estimate + beyond, steps=1, wait=0.1)
    graph = fp.build_agent_graph(
        make_registry(Calls()), model, ledger=ledger, tokens_per_step=cap
    ).compile(checkpointer=InMemorySaver())

    async def all_five() -> list[dict[str, Any]]:
        return await asyncio.gather(
            *(
                graph.ainvoke(fp.start("q", budget()), thread(), context=tenant_context())
                for _ in range(5)
            )
        )

    states = [fp.run_output(out) for out in asyncio.run(all_five())]
    spent = ledger.balance(TENANT).held["tokens"]
    flew = len(model.inputs)
    assert spent == flew * (estimate + beyond)  # every report charged as given
    assert spent > pool  # the overshoot happens,
    assert spent <= pool + flew * beyond  # and is bounded by each in-flight reply's excess
    assert flew == 3  # only the holds that fit went out; the rest found the pool spent
    # The charge that crossed the limit ends each run that made it; the rest are refused.
    assert {s.last_error_code for s in states} == {"tokens_exhausted"}
