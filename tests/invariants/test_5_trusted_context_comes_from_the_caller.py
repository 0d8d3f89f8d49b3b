"""Invariant 5: trusted context comes from the caller, never from the model or from arguments.

The tenant, principal, capabilities and deadline a run acts under are the caller's
``RunContext``. A model cannot set them (an argument naming a tenant is a schema violation, or,
for a tool whose schema has such a field, no part of the ``ToolContext`` the tool acts for).
LangGraph does not checkpoint ``context``: on every resume the caller passes it again, and it must
match the identity bound to the thread at start (a missing one, another tenant's or another
principal's is ``policy_denied`` before any tool runs; a deadline already past ends the run
``deadline_exceeded``), wherever the run paused, nested in a parent graph too. At an approval
the answer may also come from another principal of the run's tenant holding the approval right
(tests/features/test_approval_by_people.py); any other answer runs nothing and the run keeps
waiting. A context passed
as JSON (as LangGraph Server passes it) is the same identity as the ``RunContext`` it dumps.

Over both bindings (the ``binding`` parameter, ``tests/invariants/bindings.py``: fencepost's graph,
and ``create_agent`` with ``fp.FencepostMiddleware``), at the end of this file: arguments naming a
tenant, a resume or a run going on without the run's own context, a missing context, another
tenant's pool (the requester's answer after a wrong resume is a middleware limit). The other tests
drive the graph's own state, nodes or settings (``update_state``, ``Command(update=...)``,
channels, ``interrupt_before``, repair, the approver, token estimates, savers and ledgers by URL),
which the middleware binding does not have: they stay graph-only.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.policy import TerminationReason
from fencepost.policy.keys import started_key
from fencepost.policy.ledger import ReservationStatus
from tests.graph.kit import (
    ABSTAIN,
    DOCS,
    STATUS,
    UPLOAD,
    Calls,
    budget,
    call,
    context,
    final_citing_all,
    final_citing_last,
    harness,
    make_registry,
    sqlite_files,
    start_upload,
    thread,
    thread_account,
    upload_graph,
)
from tests.graph.nested_kit import Host
from tests.invariants import bindings as bd
from tests.middleware import kit as mw

# -- the identity a run acts for ---------------------------------------------------------------


def test_model_arguments_cannot_set_tenant_or_principal() -> None:
    sneaky = fp.ToolProposal(
        call_id="call-0001",
        tool_name="search_logs",
        arguments={"query": "x", "tenant_id": "globex"},
    )
    h = harness([sneaky], repair_attempts=0)  # the schema's refusal ends the run
    state = h.run()
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "schema_violation"
    assert h.calls.log == []
    assert state.tenant_id == "acme"


def test_thread_is_bound_to_the_identity_it_started_with() -> None:
    h = harness([call(), final_citing_last])
    state = h.run(ctx=context(tenant="acme", principal="u-9"))
    assert (state.tenant_id, state.principal_id) == ("acme", "u-9")


class CustomerArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    tenant_id: str
    principal_id: str


def test_tool_context_identity_comes_from_the_run_context_even_when_args_name_one() -> None:
    # A tool may legitimately take a field called tenant_id; the model fills it. The identity
    # the tool acts for (ToolContext) is the caller's, whatever the arguments say.
    calls = Calls()
    seen: list[tuple[str | None, str | None]] = []

    def lookup(args: CustomerArgs, ctx: fp.ToolContext) -> dict[str, Any]:
        seen.append((ctx.tenant_id, ctx.principal_id))
        return {"ok": True}

    spec = fp.ToolSpec(
        name="lookup_customer",
        description="Look up a customer record.",
        args_model=CustomerArgs,
        effect=fp.Effect.READ,
        capability="logs:read",
        timeout_seconds=5,
        execute=lookup,
    )
    sneaky = call("lookup_customer", 1, tenant_id="globex", principal_id="root")
    h = harness([sneaky, ABSTAIN], registry=make_registry(calls, extra=[spec]), calls=calls)
    state = h.run(ctx=context(tenant="acme", principal="u-1"))
    assert seen == [("acme", "u-1")]
    assert (state.tenant_id, state.principal_id) == ("acme", "u-1")


# -- the context passed again on resume --------------------------------------------------------


def test_resume_without_context_runs_nothing_and_the_run_keeps_waiting() -> None:
    h = harness([call("write_note", 1, note="x"), final_citing_last], approval="interrupt")
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context())
    out = h.graph.invoke(Command(resume="approve"), config)
    assert out["__interrupt__"][0].value["error"]["code"] == "missing_context"
    assert fp.run_output(out).termination is None and h.calls.log == []
    # The forgotten argument loses nothing: the same answer with the context goes through.
    out = h.graph.invoke(Command(resume="approve"), config, context=context())
    assert fp.run_output(out).termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1


@pytest.mark.parametrize(
    ("other", "code"),
    [
        (context(tenant="globex"), "wrong_tenant"),
        (context(principal="u-2"), "approval_right_missing"),
    ],
    ids=["other-tenant", "other-principal-without-the-right"],
)
def test_resume_as_another_tenant_or_a_principal_without_the_right_runs_nothing(
    other: fp.RunContext, code: str
) -> None:
    h = harness([call("write_note", 1, note="x")], approval="interrupt")
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context())
    out = h.graph.invoke(Command(resume="approve"), config, context=other)
    assert out["__interrupt__"][0].value["error"]["code"] == code
    assert fp.run_output(out).termination is None
    assert h.calls.log == []


@pytest.mark.parametrize(
    ("resumed_with", "reason", "code"),
    [
        (context(tenant="globex"), fp.TerminationReason.POLICY_DENIED, "context_mismatch"),
        (context(principal="u-2"), fp.TerminationReason.POLICY_DENIED, "context_mismatch"),
        (
            context(deadline=fp.Deadline(at=datetime.now(UTC) - timedelta(seconds=1))),
            fp.TerminationReason.DEADLINE_EXCEEDED,
            "deadline_exceeded",
        ),
    ],
    ids=["other-tenant", "other-principal", "deadline-passed"],
)
def test_the_executor_checks_the_context_it_is_resumed_with_before_any_tool_runs(
    resumed_with: fp.RunContext, reason: fp.TerminationReason, code: str
) -> None:
    # Paused between the gate and the executor (no approval step in between to catch it).
    h = harness([call(n=1), final_citing_last])
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context(), interrupt_before=["execute"])
    state = fp.run_output(h.graph.invoke(None, config, context=resumed_with))
    assert h.calls.log == []
    assert (state.termination, state.last_error_code) == (reason, code)


def test_a_nested_run_resumed_under_a_principal_without_the_right_runs_nothing() -> None:
    calls = Calls()
    agent = fp.build_agent_graph(
        make_registry(calls),
        ScriptedDecisionModel([call("write_note", 1, note="x"), final_citing_last]),
        approval="interrupt",
    ).compile()
    parent = StateGraph(Host, context_schema=fp.RunContext)
    parent.add_node("agent", agent)
    parent.add_edge(START, "agent")
    parent.add_edge("agent", END)
    graph: Any = parent.compile(checkpointer=InMemorySaver())
    config = thread()
    graph.invoke(fp.start("q", budget()), config, context=context(principal="u-1"))
    out = graph.invoke(Command(resume="approve"), config, context=context(principal="u-2"))
    assert out["__interrupt__"][0].value["error"]["code"] == "approval_right_missing"
    assert calls.log == []
    out = graph.invoke(Command(resume="approve"), config, context=context(principal="u-1"))
    assert calls.count("write_note") == 1


def test_a_run_resumed_by_a_fresh_graph_with_its_context_as_json_is_its_own(
    tmp_path: Path,
) -> None:
    # LangGraph Server passes the context as a dict: the owner it makes (identity + run tag) is
    # the one the account recorded from a RunContext, in another process's graph.
    config, ctx = thread(), context(caps=DOCS)
    with sqlite_files(tmp_path) as (saver, ledger):
        start_upload(upload_graph([UPLOAD], checkpointer=saver, ledger=ledger), config, ctx)
    with sqlite_files(tmp_path) as (saver, ledger):
        again = upload_graph([STATUS, final_citing_all], checkpointer=saver, ledger=ledger)
        as_json = ctx.model_dump(mode="json")
        state = fp.run_output(again.graph.invoke(None, config, context=as_json))
        closed = ledger.balance(thread_account(config)).closed
    assert state.termination is TerminationReason.COMPLETED
    assert closed == TerminationReason.COMPLETED.value


# -- over both bindings: fencepost's graph, and create_agent + FencepostMiddleware -------------


def test_arguments_naming_a_tenant_are_refused_in_either_binding(binding: type[bd.Binding]) -> None:
    sneaky = bd.call("search_logs", {"query": "x", "tenant_id": "globex"}, 1)
    b = binding(bd.then_answer(sneaky), steps=4, tools=4)
    out = b.start(mw.ctx())
    assert out.bodies == []
    assert (out.termination, out.error_code) == (
        fp.TerminationReason.INVALID_PROPOSAL.value,
        "schema_violation",
    )


def _other(who: str) -> fp.RunContext | None:
    """Not the run's own context: none, another tenant's, or another principal's (made when
    the test runs: its deadline is the kit's, counted from now)."""
    if who == "none":
        return None
    own = mw.ctx()
    if who == "tenant":
        return own.model_copy(update={"tenant_id": "globex"})
    return own.model_copy(update={"principal": own.principal.model_copy(update={"id": "u-2"})})


@pytest.mark.parametrize("who", ["none", "tenant", "principal"])
def test_a_resume_without_the_runs_own_context_runs_nothing(
    binding: type[bd.Binding], who: str
) -> None:
    b = bd.waiting_write(binding)
    out = b.resume("approve", _other(who))
    held = b.reservation("call-0001")
    assert out.bodies == []
    assert held is None or held.status is fp.policy.ReservationStatus.RELEASED


def test_after_a_resume_without_context_the_requester_can_still_answer(
    binding: type[bd.Binding],
) -> None:
    b = bd.waiting_write(binding)
    assert b.resume("approve", None).paused
    out = b.resume("approve", mw.ctx())
    assert out.bodies == ["write_note:x"]
    assert out.termination == fp.TerminationReason.COMPLETED.value


def test_a_run_naming_another_tenants_pool_spends_nothing_of_it(binding: type[bd.Binding]) -> None:
    ledger = fp.InMemoryLedger()
    ledger.open_account("globex-pool", {"tool_calls": 10}, owner={"tenant": "globex"})
    b = binding(bd.searches(), steps=4, tools=4, ledger=ledger)
    out = b.start(mw.ctx().model_copy(update={"budget_account": "globex-pool"}))
    assert out.bodies == []
    assert out.termination == fp.TerminationReason.POLICY_DENIED.value
    assert ledger.balance("globex-pool").held.get("tool_calls", 0) == 0


def test_a_run_started_without_context_ends_missing_context_and_runs_nothing(
    binding: type[bd.Binding],
) -> None:
    b = binding(bd.searches(), steps=4, tools=4)
    out = b.start(None)
    assert out.bodies == [] and out.received == []
    assert (out.termination, out.error_code) == (
        fp.TerminationReason.POLICY_DENIED.value,
        "missing_context",
    )


@pytest.mark.parametrize("who", ["tenant", "principal"])
def test_a_run_going_on_under_another_identity_ends_context_mismatch_and_runs_nothing_more(
    binding: type[bd.Binding], who: str
) -> None:
    b = binding(bd.searches(), steps=6, tools=6)
    assert len(b.start(mw.ctx(), interrupt_after=[binding.TOOLS]).bodies) == 1
    out = b.go_on(_other(who))
    assert len(out.bodies) == 1 and len(out.received) == 1
    assert (out.termination, out.error_code) == (
        fp.TerminationReason.POLICY_DENIED.value,
        "context_mismatch",
    )


def test_a_write_approved_after_the_callers_deadline_never_runs(binding: type[bd.Binding]) -> None:
    clock = fp.policy.FakeClock()
    ctx = mw.ctx().model_copy(update={"deadline": fp.Deadline.after(60, clock=clock)})
    b = bd.waiting_write(binding, ctx=ctx, clock=clock)
    clock.advance(120)
    out = b.resume("approve", ctx)
    assert out.bodies == []
    assert out.termination == fp.TerminationReason.DEADLINE_EXCEEDED.value


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "sqlite"])
@pytest.mark.parametrize("who", ["tenant", "principal"])
def test_a_call_the_gate_reserved_is_never_claimed_or_started_under_another_identity(
    binding: type[bd.Binding], who: str, durable: bool, tmp_path: Path
) -> None:
    # Paused between the gate and the tools, the first attempt's reservation the gate's: the
    # run going on under another identity leaves it as it was, and no start marker is written.
    # The run is refused before execute's ledger step here; that step's own owner judge is
    # pinned in tests/graph/test_a_call_starts_only_on_its_callers_account.py.
    ledger = fp.SqliteLedger(str(tmp_path / "ledger.db")) if durable else fp.InMemoryLedger()
    b = binding(bd.searches(), steps=6, tools=6, ledger=ledger)
    b.start(mw.ctx(), interrupt_before=[binding.TOOLS])
    assert b.graph.get_state(b.config).next == (binding.TOOLS,)
    held = b.reservation("call-0001")
    assert held is not None and held.status is ReservationStatus.RESERVED
    out = b.go_on(_other(who))
    assert out.bodies == []
    assert (out.termination, out.error_code) == (
        fp.TerminationReason.POLICY_DENIED.value,
        "context_mismatch",
    )
    assert ledger.get(started_key(b.account(), "call-0001", 1)) is None
    assert b.reservation("call-0001") == held.model_copy(update={"balance": None})
