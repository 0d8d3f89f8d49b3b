"""Invariant 3: reserve before the call — a model step's tokens, a tool call's budget.

A step holds tokens before the model is asked; what the model reports afterwards is always
charged (past the limit too: the run then stops), and the hold with no estimate configured is
every token the run's chain has left, so runs sharing a limit cannot multiply it. A report no
one can trust (missing, not a count, too small for the reply) is charged at least the estimate,
on the real graph too. A call that was attempted stays charged (a failure refunds nothing), and
runs funded by one shared account never spend more than it holds.

Over both bindings (the ``binding`` parameter, ``tests/invariants/bindings.py``: fencepost's graph,
and ``create_agent`` with ``fp.FencepostMiddleware``), at the end of this file: exactly N calls
with N left, a failed call stays charged, runs sharing one account. The other tests drive the
graph's own state, nodes or settings (``update_state``, ``Command(update=...)``, channels,
``interrupt_before``, repair, the approver, token estimates, savers and ledgers by URL), which the
middleware binding does not have: they stay graph-only.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from fencepost.adapters.chat_model import ChatModelDecider
from fencepost.graph.token_count import count_tokens
from fencepost.policy.keys import call_key, run_account
from fencepost.policy.reservations import DEFAULT_OUTPUT_TOKENS, step_hold
from fencepost.policy.usage import (
    MOST_CHARACTERS_PER_TOKEN,
    UsageKind,
    input_text,
    reply_size,
    reply_text,
    usage_report,
)
from tests.adapters.fakes import fake_model
from tests.graph.kit import (
    ABSTAIN,
    Calls,
    budget,
    call,
    context,
    harness,
    make_registry,
    thread,
)
from tests.invariants import bindings as bd
from tests.middleware import kit as mw

FINAL = fp.FinalProposal(answer=fp.AnswerPayload(text="done"))


def tenant_context(tenant_account: str = "tenant") -> fp.RunContext:
    return context().model_copy(update={"budget_account": tenant_account})


def account_of(config: dict[str, Any], state: fp.AgentState) -> str:
    return run_account(config["configurable"]["thread_id"], state.run_id)


def token_budget(**kw: Any) -> fp.RuntimeBudget:
    return fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=4, **kw)


class ReportingModel:
    """Answers every run at once, reporting ``tokens`` (30 in, the rest out) per call; counts
    the calls that went out. Each call waits a little, so concurrent runs overlap in it."""

    def __init__(self, tokens: int, *, wait: float = 0.2) -> None:
        self.tokens = tokens
        self.wait = wait
        self.calls = 0
        self.lock = threading.Lock()

    async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
        with self.lock:
            self.calls += 1
        await asyncio.sleep(self.wait)
        return fp.Decided(decision=FINAL, input_tokens=30, output_tokens=self.tokens - 30)


def test_concurrent_runs_on_one_tenant_token_limit_spend_it_at_most_one_step_over() -> None:
    # Ten runs at once on a tenant of 100 tokens, each model call reporting 40, no estimate.
    ledger = fp.InMemoryLedger()
    ledger.open_account("tenant", {"tokens": 100})
    model = ReportingModel(40)
    graph = fp.build_agent_graph(make_registry(Calls()), model, ledger=ledger).compile(
        checkpointer=InMemorySaver()
    )
    configs = [thread() for _ in range(10)]

    def one(config: dict[str, Any]) -> fp.AgentState:
        out = graph.invoke(fp.start("q", token_budget()), config, context=tenant_context())
        return fp.run_output(out)

    with ThreadPoolExecutor(max_workers=10) as pool:
        states = list(pool.map(one, configs))
    reported = 40 * model.calls
    held = ledger.balance("tenant").held.get("tokens", 0.0)
    assert held == reported, "every reported token is charged"
    assert reported <= 100 + 40, f"{model.calls} calls went out on a limit of 100"
    for config, state in zip(configs, states, strict=True):
        assert state.is_terminal
        account = ledger.balance(account_of(config, state))
        assert state.budget.tokens_used == account.held.get("tokens", 0.0)
        if state.termination is not fp.TerminationReason.COMPLETED:
            assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
            assert state.last_error_code == "tokens_exhausted"


def test_an_overage_that_crosses_the_limit_is_charged_and_stops_the_run() -> None:
    # The estimate (5) is far below what the step reports (3,000): the difference is charged
    # all the same, the tenant is left past its limit, and the run stops there.
    ledger = fp.InMemoryLedger()
    ledger.open_account("tenant", {"tokens": 100})
    model = ReportingModel(3_000, wait=0)
    calls = Calls()
    graph = fp.build_agent_graph(
        make_registry(calls), model, ledger=ledger, tokens_per_step=5
    ).compile(checkpointer=InMemorySaver())
    config = thread()
    state = fp.run_output(
        graph.invoke(fp.start("q", token_budget()), config, context=tenant_context())
    )
    assert model.calls == 1
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert state.last_error_code == "tokens_exhausted"
    assert ledger.balance("tenant").held == {"steps": 1.0, "tokens": 3_000.0}
    assert state.budget.tokens_used == 3_000
    # A later run on the tenant is refused before its model is asked.
    again = fp.run_output(
        graph.invoke(fp.start("q", token_budget()), thread(), context=tenant_context())
    )
    assert model.calls == 1
    assert again.last_error_code == "tokens_exhausted"


def test_a_run_limit_crossed_by_a_report_is_charged_in_full_and_ends_the_run() -> None:
    ledger = fp.InMemoryLedger()
    model = ReportingModel(250, wait=0)
    graph = fp.build_agent_graph(
        make_registry(Calls()), model, ledger=ledger, tokens_per_step=10
    ).compile(checkpointer=InMemorySaver())
    config = thread()
    state = fp.run_output(
        graph.invoke(fp.start("q", token_budget(tokens_remaining=100)), config, context=context())
    )
    assert state.last_error_code == "tokens_exhausted"
    assert state.budget.tokens_used == 250
    assert ledger.balance(account_of(config, state)).held["tokens"] == 250.0


def test_with_no_estimate_a_step_holds_its_input_and_the_default_output_cap() -> None:
    ledger = fp.InMemoryLedger()
    ledger.open_account("tenant", {"tokens": 1_000_000})
    ledger.open_account("earlier", {}, parent="tenant")
    ledger.charge("earlier", "spent", {"tokens": 25})
    seen: list[float] = []
    sent: list[int] = []

    class Watching:
        async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
            seen.append(ledger.balance("tenant").held["tokens"])
            sent.append(count_tokens(input_text(inp)))
            return fp.Decided(decision=FINAL, input_tokens=8, output_tokens=2)

    graph = fp.build_agent_graph(make_registry(Calls()), Watching(), ledger=ledger).compile(
        checkpointer=InMemorySaver()
    )
    state = fp.run_output(
        graph.invoke(
            fp.start("q", token_budget(tokens_remaining=1_000_000)),
            thread(),
            context=tenant_context(),
        )
    )
    # Held while the model ran: what it was sent plus the default output cap, not all left.
    assert seen == [25.0 + sent[0] + DEFAULT_OUTPUT_TOKENS]
    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.budget.tokens_used == 10  # and settled to what it reported
    assert ledger.balance("tenant").held["tokens"] == 35.0


def test_a_zero_token_report_for_a_megabyte_reply_is_not_trusted() -> None:
    huge = "x" * 1_000_000

    def megabyte(_: Any) -> AIMessage:
        message = AIMessage(
            content="",
            tool_calls=[{"name": "search_logs", "args": {"query": huge}, "id": "call-0001"}],
        )
        message.usage_metadata = {"input_tokens": 10, "output_tokens": 0, "total_tokens": 10}
        return message

    final = AIMessage(content="done")
    final.usage_metadata = {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}
    model = ChatModelDecider(fake_model([megabyte, final]), token_estimate=50)
    graph = fp.build_agent_graph(make_registry(Calls()), model).compile(
        checkpointer=InMemorySaver()
    )
    state = fp.run_output(
        graph.invoke(
            fp.start("q", token_budget(tokens_remaining=1_000_000)), thread(), context=context()
        )
    )
    assert state.termination is fp.TerminationReason.COMPLETED
    first = state.manifests[0]
    assert first.input_tokens is None and first.output_tokens is None  # not kept as usage
    # The megabyte step is charged the count of the text it wrote (at least what that many
    # characters can have cost), never its hold; the last step what it reported.
    assert state.budget.tokens_used >= count_tokens(huge) + 12
    assert state.budget.tokens_used >= 1_000_000 // MOST_CHARACTERS_PER_TOKEN + 12


def test_a_bool_token_count_is_charged_the_text_count_never_a_malformed_decision() -> None:
    def boolean(_: Any) -> AIMessage:
        message = AIMessage(content="done")
        # Set after construction: AIMessage would have made it 1, a provider object may not.
        message.usage_metadata = {"input_tokens": True, "output_tokens": 5, "total_tokens": 6}
        return message

    model = ChatModelDecider(fake_model([boolean]), token_estimate=70)
    graph = fp.build_agent_graph(make_registry(Calls()), model).compile(
        checkpointer=InMemorySaver()
    )
    state = fp.run_output(
        graph.invoke(
            fp.start("q", token_budget(tokens_remaining=1_000)), thread(), context=context()
        )
    )
    assert state.termination is fp.TerminationReason.COMPLETED, state.last_error_code
    # Neither the report nor the 70-token hold: the text sent and the "done" received.
    assert 0 < state.budget.tokens_used < 70 + 1_000
    assert state.budget.tokens_used != 70


# -- the rules, as policy ----------------------------------------------------------------------


def test_the_hold_is_the_input_plus_the_output_cap_capped_at_what_is_unspent() -> None:
    assert step_hold(10, 40, 1_000.0) == 50
    assert step_hold(10, 0, 1_000_000.0) == 10 + DEFAULT_OUTPUT_TOKENS
    assert step_hold(10, 40, 0.0) == 1  # nothing unspent: a step still asks for one, refused
    assert step_hold(0, 40, 2.5) == 2
    assert step_hold(10, 40, None) == 0  # no account limits tokens


def test_a_reply_is_never_cheaper_than_its_length_allows() -> None:
    decided = fp.Decided(decision=call(query="y" * 10_000), input_tokens=5, output_tokens=1)
    size = reply_size(decided.decision)
    assert size >= 10_000
    report = usage_report(5, 1, counted=7, reply_chars=size)
    assert report.kind is UsageKind.IMPLAUSIBLE
    assert report.charged == -(-size // MOST_CHARACTERS_PER_TOKEN)
    counted = count_tokens(reply_text(decided.decision))
    assert usage_report(5, 1, counted=counted, reply_chars=size).charged == max(
        counted, report.charged
    )
    plausible = usage_report(5, 100, counted=7, reply_chars=size)
    assert (plausible.kind, plausible.charged) == (UsageKind.REPORTED, 105)


_COUNT = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(
    tokens_in=_COUNT,
    tokens_out=_COUNT,
    counted=st.integers(0, 10_000),
    chars=st.integers(0, 10**7),
)
def test_any_usage_report_is_judged_never_raises_and_an_untrusted_one_costs_the_text_count(
    tokens_in: Any, tokens_out: Any, counted: int, chars: int
) -> None:
    report = usage_report(tokens_in, tokens_out, counted=counted, reply_chars=chars)
    floor = -(-chars // MOST_CHARACTERS_PER_TOKEN)
    if report.kind is UsageKind.REPORTED:
        assert report.input_tokens is not None or report.output_tokens is not None
        assert (report.output_tokens or 0) >= floor
        assert report.charged == (report.input_tokens or 0) + (report.output_tokens or 0)
    elif report.kind is UsageKind.UNREPORTED:
        assert tokens_in is None and tokens_out is None
        assert report.charged == counted
    else:
        assert report.charged == max(counted, floor)
        assert report.input_tokens is None and report.output_tokens is None


# -- what a run spends is what the ledger charged ----------------------------------------------


def test_a_failed_call_stays_charged_in_the_ledger() -> None:
    ledger = fp.InMemoryLedger()
    h = harness([call("explode", 1), ABSTAIN], ledger=ledger)
    config = thread()
    state = h.run(config=config)
    assert state.observations[0].error_code is fp.ErrorCode.INTERNAL_ERROR
    account = run_account(config["configurable"]["thread_id"], state.run_id)
    reservation = ledger.get(call_key(account, "call-0001", 1))
    assert reservation is not None
    assert reservation.status is fp.policy.ReservationStatus.SETTLED
    held = ledger.balance(account).held
    assert held.get("tool_calls") == state.budget.tool_calls_used == 1


def test_runs_under_one_shared_account_never_spend_more_than_it_holds() -> None:
    ledger = fp.policy.InMemoryLedger()
    ledger.open_account("pool", {"tool_calls": 3}, owner={"tenant": "acme", "principal": "u-1"})
    ctx = context().model_copy(update={"budget_account": "pool"})
    calls = Calls()
    for _ in range(3):
        h = harness(
            [call(n=1), call(n=2), ABSTAIN],
            ledger=ledger,
            calls=calls,
            registry=make_registry(calls),
        )
        h.graph.invoke(fp.start("q", budget(steps=6, tools=2)), thread(), context=ctx)
    ran = calls.count("search_logs")
    assert ran == 3
    assert ledger.balance("pool").held["tool_calls"] == 3


def _decided(**usage: Any) -> fp.policy.Decided:
    return fp.policy.Decided.model_construct(decision=call(n=1), generated_call_ids=(), **usage)


@pytest.mark.parametrize(
    "usage",
    [
        {"input_tokens": -5, "output_tokens": 3},
        {"input_tokens": 2**64, "output_tokens": 2**70},
        {"input_tokens": "lots", "output_tokens": None},
        {"input_tokens": float("nan"), "output_tokens": float("inf")},
        {"input_tokens": True, "output_tokens": [1]},
        {"input_tokens": 9_000_000, "output_tokens": 9_000_000},
    ],
    ids=["negative", "huge", "text", "nan-inf", "bool-list", "sum-too-big"],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_usage_report_no_one_can_trust_is_charged_the_text_count_and_ends_typed(
    usage: dict[str, Any], mode: str
) -> None:
    h = harness([_decided(**usage), ABSTAIN], tokens_per_step=100)
    limited = fp.RuntimeBudget(steps_remaining=6, tool_calls_remaining=4, tokens_remaining=100_000)
    inp, config = fp.start("q", limited), thread()
    if mode == "sync":
        out = h.graph.invoke(inp, config, context=context())
    else:
        out = asyncio.run(h.graph.ainvoke(inp, config, context=context()))
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    first, second = h.model.inputs
    counted = (
        count_tokens(input_text(first))
        + count_tokens(reply_text(call(n=1)))
        + count_tokens(input_text(second))
        + count_tokens(reply_text(ABSTAIN))
    )
    assert state.budget.tokens_used == counted  # never the 100-token holds


# -- over both bindings: fencepost's graph, and create_agent + FencepostMiddleware -------------


def test_with_n_calls_left_exactly_n_run(binding: type[bd.Binding]) -> None:
    b = binding(bd.searches(), steps=50, tools=3)
    out = b.start(mw.ctx())
    assert len(out.bodies) == 3
    assert out.termination == fp.TerminationReason.TOOL_BUDGET_EXHAUSTED.value


def test_a_failed_call_stays_charged_in_either_bindings_ledger(binding: type[bd.Binding]) -> None:
    b = bd.waiting_write(binding, failing_write=True)
    out = b.resume("approve", mw.ctx())
    assert out.bodies == ["write_note:x"]
    reservation = b.reservation("call-0001")
    assert reservation is not None
    assert reservation.status is fp.policy.ReservationStatus.SETTLED
    assert b.ledger.balance(b.account()).held.get("tool_calls") == 1


@pytest.mark.parametrize("axis", ["tool_calls", "steps"])
def test_runs_of_either_binding_under_one_shared_account_never_spend_more_than_it_holds(
    binding: type[bd.Binding], axis: str
) -> None:
    ledger = fp.InMemoryLedger()
    ledger.open_account("pool", {axis: 3}, owner={"tenant": "acme", "principal": "u-1"})
    shared = mw.ctx().model_copy(update={"budget_account": "pool"})
    spent = 0
    for _ in range(3):
        b = binding(bd.searches(), steps=6, tools=6, ledger=ledger)
        out = b.start(shared)
        spent += len(out.bodies) if axis == "tool_calls" else len(out.received)
    assert spent == 3
    assert ledger.balance("pool").held[axis] == 3
