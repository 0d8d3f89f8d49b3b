"""Runs that choose the same names share nothing: no account, no budget, no state, no marker.

DESIGN, isolation: nothing process-wide is keyed by a name a caller or model chooses. Run ids,
thread ids and names that share a separator are picked alike by two runs, or two tenants, on one
graph, one ledger, or one thread id with checkpointers of their own: each run's ledger account is
its own (named from its thread, and its checkpoint namespace when nested, and owned by the
identity and run it was opened for), so another run is refused it (``account_conflict``) and can
neither spend from it, close it, nor count its completion markers.
"""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command
from typing_extensions import TypedDict

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.policy import StopRequest, TerminationReason
from fencepost.policy.keys import completed_key
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
    start_upload,
    state_of,
    thread,
    thread_account,
    two_tenants,
    upload_graph,
    upload_registry,
)

# -- run ids, thread ids and separators --------------------------------------------------------


def test_two_runs_whose_names_share_a_separator_do_not_share_an_account() -> None:
    h = harness([call(n=1), ABSTAIN, call(n=2), ABSTAIN])
    ctx = context()
    h.graph.invoke(
        fp.start("q", budget(), run_id="r\x1fx"),
        {"configurable": {"thread_id": "t"}},
        context=ctx,
    )
    second = fp.run_output(
        h.graph.invoke(
            fp.start("q", budget(), run_id="x"),
            {"configurable": {"thread_id": "t\x1fr"}},
            context=ctx,
        )
    )
    assert h.calls.count("search_logs") == 2
    assert second.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE


BETA = context(tenant="beta", principal="b-1", seconds=None)


def test_another_tenant_choosing_the_same_names_cannot_close_a_paused_run() -> None:
    ledger = fp.policy.InMemoryLedger()
    a = harness([call("write_note", 1, note="a"), ABSTAIN], approval="interrupt", ledger=ledger)
    b = harness([ABSTAIN], approval="interrupt", ledger=ledger)
    config = {"configurable": {"thread_id": "support-1"}}
    a.graph.invoke(fp.start("q", budget(), run_id="run-1"), config, context=context())
    b.graph.invoke(fp.start("q", budget(), run_id="run-1"), config, context=BETA)
    out = a.graph.invoke(Command(resume="approve"), config, context=context())
    assert a.calls.count("write_note") == 1
    assert fp.run_output(out).termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE


def test_another_tenant_choosing_the_same_names_cannot_spend_on_a_run_account() -> None:
    ledger = fp.policy.InMemoryLedger()
    a = harness([call(n=1), ABSTAIN], ledger=ledger)
    b = harness([call(n=1), call(n=2), ABSTAIN], ledger=ledger)
    config = {"configurable": {"thread_id": "support-1"}}
    a.graph.invoke(
        fp.start("q", budget(), run_id="run-1"),
        config,
        context=context(),
        interrupt_before=["execute"],
    )
    out = fp.run_output(
        b.graph.invoke(fp.start("q", budget(), run_id="run-1"), config, context=BETA)
    )
    assert b.calls.count("search_logs") == 0
    assert out.termination is fp.TerminationReason.POLICY_DENIED


def test_two_tenants_interleaved_on_one_graph_and_ledger_share_no_state_or_budget() -> None:
    ledger = fp.InMemoryLedger()
    calls = Calls()

    def script(inp: fp.DecisionInput) -> Any:
        # Each run's first decision is its own write; then it answers from what it saw.
        if not inp.observations:
            return call("write_note", 1, note=inp.question)
        if any(o.kind == "tool_result" for o in inp.observations):
            return final_citing_last(inp)
        return ABSTAIN

    h = harness([script] * 8, approval="interrupt", ledger=ledger, calls=calls)
    ca, cb = thread(), thread()
    xa = context(tenant="tenant-a", principal="alice")
    xb = context(tenant="tenant-b", principal="bob")
    h.graph.invoke(fp.start("a", budget(steps=4, tools=2), run_id="same"), ca, context=xa)
    h.graph.invoke(fp.start("b", budget(steps=6, tools=3), run_id="same"), cb, context=xb)
    b = fp.run_output(h.graph.invoke(Command(resume="approve"), cb, context=xb))
    a = fp.run_output(h.graph.invoke(Command(resume="reject"), ca, context=xa))
    assert [(n, args) for n, args, _ in calls.log] == [("write_note", {"note": "b"})]
    assert b.termination is TerminationReason.COMPLETED
    assert a.termination is TerminationReason.INSUFFICIENT_EVIDENCE
    assert (a.tenant_id, a.principal_id, b.tenant_id, b.principal_id) == (
        "tenant-a",
        "alice",
        "tenant-b",
        "bob",
    )
    assert (b.budget.steps_used, b.budget.tool_calls_used, b.budget.steps_remaining) == (2, 1, 4)
    assert (a.budget.steps_used, a.budget.tool_calls_used, a.budget.steps_remaining) == (2, 0, 2)
    assert [o.call_id for o in b.observations] == ["call-0001"]
    assert all(o.kind == "tool_error" for o in a.observations)
    assert b.final_answer is not None and a.final_answer is None
    assert a.report is not None and b.report is not None and a.report != b.report
    # What one run's values hand out cannot reach the other's: scribbling on them changes nothing.
    record = h.graph.get_state(cb).values["run"]
    record.setdefault("fingerprints", {})["x"] = 99
    record.setdefault("evidence", {})["x"] = "forged"
    assert "x" not in state_of(h, ca).fingerprints and "x" not in state_of(h, cb).evidence


# -- another run or tenant on the same thread id, a shared ledger ------------------------------


def test_another_tenant_on_the_same_thread_id_is_refused_and_never_marks_this_runs_task() -> None:
    # Tenant B keeps its own checkpointer but shares the ledger and picks the same thread id: its
    # run is refused at the start (the account is A's), and A's genuine completion is A's alone.
    t = two_tenants([UPLOAD, STATUS, final_citing_all])
    ledger, config, ctx_a, ctx_b, a, b = t.ledger, t.config, t.ctx_a, t.ctx_b, t.a, t.b
    other = b.run(ctx=ctx_b, config=config)
    assert (other.termination, other.last_error_code) == (
        TerminationReason.POLICY_DENIED,
        "account_conflict",
    )
    assert ledger.get(completed_key(thread_account(config), "call-0001")) is None
    state = fp.run_output(a.graph.invoke(None, config, context=ctx_a))
    assert state.termination is TerminationReason.COMPLETED


# Tenant B, on its own checkpointer but the shared ledger and tenant A's thread id, rewrites its
# refused run's stop to cancelled: the terminal node closes, and judges completions by, only an
# account whose recorded owner is the caller, never one a stop's error code points at.
def test_a_stop_another_tenant_writes_on_its_own_thread_never_closes_this_runs_account() -> None:
    t = two_tenants([UPLOAD, final_citing_all, ABSTAIN])
    ledger, config, ctx_a, ctx_b, a, b = t.ledger, t.config, t.ctx_a, t.ctx_b, t.a, t.b
    b.graph.invoke(
        fp.start("upload", budget()), config, context=ctx_b, interrupt_before=["terminal"]
    )
    cancel = StopRequest(reason=TerminationReason.CANCELLED, error_code="cancelled")
    b.graph.update_state(config, {"run": {"stop": cancel}}, as_node="execute")
    b.graph.invoke(None, config, context=ctx_b)
    assert ledger.balance(thread_account(config)).closed is None
    state = fp.run_output(a.graph.invoke(None, config, context=ctx_a))
    assert state.termination is TerminationReason.COMPLETED


# Run B of the same tenant, on the thread id run A used (its own checkpointer, the shared
# ledger): the account's owner names the run it was opened for, so B is refused
# (account_conflict) and never completes on A's marker.
def test_a_run_on_a_thread_id_another_run_used_never_counts_that_runs_completion_marker() -> None:
    ledger = fp.InMemoryLedger()
    config, ctx = thread(), context(caps=DOCS)
    a = upload_graph([UPLOAD, STATUS, ABSTAIN], ledger=ledger)
    start_upload(a, config, ctx)
    a.graph.invoke(None, config, context=ctx, interrupt_after=["execute"])
    assert ledger.get(completed_key(thread_account(config), "call-0001")) is not None
    b = upload_graph(
        [UPLOAD, final_citing_all, final_citing_all, ABSTAIN],
        status={"status": "done"},
        ledger=ledger,
    )
    state = b.run(ctx=ctx, config=config)
    assert state.termination is not TerminationReason.COMPLETED
    assert (state.termination, state.last_error_code) == (
        TerminationReason.POLICY_DENIED,
        "account_conflict",
    )


class _Parent(TypedDict, total=False):
    first: str
    second: str


# A fencepost graph invoked from a node of a parent graph runs on the parent's thread, under a
# checkpoint namespace of its own: its account is named from the thread and that namespace, so
# two such runs on one parent thread never share one.
def test_two_agent_runs_nested_in_one_parent_thread_each_get_an_account_of_their_own() -> None:
    ledger = fp.InMemoryLedger()
    ctx = context(caps=DOCS)

    def agent() -> Any:
        model = ScriptedDecisionModel([UPLOAD, STATUS, final_citing_all])
        return fp.build_agent_graph(upload_registry(), model, ledger=ledger).compile()

    first, second = agent(), agent()

    def node(graph: Any, key: str) -> Any:
        def run(_: _Parent) -> dict[str, str]:
            out = fp.run_output(graph.invoke(fp.start("upload", budget()), context=ctx))
            return {key: f"{out.termination.value}:{out.last_error_code}"}

        return run

    parent = StateGraph(_Parent)
    parent.add_node("first", node(first, "first"))
    parent.add_node("second", node(second, "second"))
    parent.add_edge(START, "first")
    parent.add_edge("first", "second")
    parent.add_edge("second", END)
    out = parent.compile(checkpointer=InMemorySaver()).invoke({}, thread(), context=ctx)
    assert out == {"first": "completed:None", "second": "completed:None"}
