"""An approval is a person's act, with a right of its own; a wrong answer loses nothing.

A paused write may be answered by its requester, or by any other principal of the run's tenant
holding the approval right: ``approve:<the tool's capability>`` by default, or what the graph
(``approval_right=``) or the tool (``ToolSpec.approval_right``) names. The run keeps the
requester's identity; who answered is in the receipt, the manifest, the span event and the stop
report. ``four_eyes=True`` refuses the requester's own answer. An answer with no context, from
another tenant, from a principal without the right (or the requester's own under four-eyes)
changes nothing: the run keeps waiting, asks again naming why, and the right person can still
answer — the write then runs once.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import fencepost as fp
from fencepost.policy import TerminationReason
from fencepost.policy.approval import may_answer
from fencepost.policy.keys import run_account, run_tag
from fencepost.policy.ownership import RUN, recorded_capabilities, run_owner
from tests.graph.kit import (
    ABSTAIN,
    Calls,
    budget,
    call,
    context,
    final_citing_last,
    forge_batch,
    harness,
    interrupt_payload,
    make_registry,
    state_of,
    thread,
)

# No deadline: a deadline made at import would have passed by the time a long suite runs these.
ENGINEER = context(principal="oncall-ana", seconds=None)
LEAD = context(principal="lead-bo", caps=frozenset({"approve:notes:write"}), seconds=None)
PEER = context(principal="peer-cy", caps=frozenset({"notes:write", "logs:read"}), seconds=None)
OTHER_TENANT_LEAD = context(
    tenant="globex",
    principal="lead-bo",
    caps=frozenset({"approve:notes:write"}),
    seconds=None,
)
SCRIPT = [call("write_note", 1, note="restart checkout"), final_citing_last]


def _paused(saver: Any = None, **build: Any) -> tuple[Any, dict[str, Any]]:
    h = harness(list(SCRIPT), approval="interrupt", checkpointer=saver, **build)
    config = thread()
    h.graph.invoke(fp.start("fix checkout", budget()), config, context=ENGINEER)
    assert h.graph.get_state(config).next == ("approve",)
    return h, config


def _still_waiting(h: Any, config: dict[str, Any], out: dict[str, Any], code: str) -> None:
    assert h.graph.get_state(config).next == ("approve",)
    assert interrupt_payload(out)["error"]["code"] == code
    state = state_of(h, config)
    assert state.termination is None and state.stop is None
    assert state.receipts == () and h.calls.count("write_note") == 0


# -- who may answer ------------------------------------------------------------------------------


def _seeing(calls: Calls) -> tuple[fp.ToolRegistry, list[tuple[str, str]]]:
    """The kit's registry whose tools record whom their ``ToolContext`` names."""
    seen: list[tuple[str, str]] = []
    base = make_registry(calls)

    def seeing(spec: fp.ToolSpec) -> fp.ToolSpec:
        body = spec.execute

        async def run(args: Any, ctx: fp.ToolContext) -> Any:
            seen.append((spec.name, ctx.principal_id))
            out = body(args, ctx)
            return await out if inspect.isawaitable(out) else out

        return spec.model_copy(update={"execute": run})

    return fp.ToolRegistry([seeing(base.get(n)) for n in base.names()]), seen


@pytest.mark.parametrize("saver_kind", ["memory", "sqlite"])
def test_after_a_leads_approval_the_run_goes_on_as_the_requester_in_the_same_invoke(
    saver_kind: str, tmp_path: Path
) -> None:
    # The lead holds only the approval right: the read after the write runs because the
    # engineer holds logs:read, as the run's ledger account recorded when it started.
    calls = Calls()
    registry, seen = _seeing(calls)
    script = [call("write_note", 1, note="restart checkout"), call(n=2), final_citing_last]
    with SqliteSaver.from_conn_string(str(tmp_path / "cp.db")) as sqlite:
        saver = InMemorySaver() if saver_kind == "memory" else sqlite
        h = harness(
            script, approval="interrupt", checkpointer=saver, registry=registry, calls=calls
        )
        config = thread()
        h.graph.invoke(fp.start("fix checkout", budget()), config, context=ENGINEER)
        assert h.graph.get_state(config).next == ("approve",)
        out = h.graph.invoke(Command(resume="approve"), config, context=LEAD)
        final = fp.run_output(out)
        assert "__interrupt__" not in out
        assert final.termination is TerminationReason.COMPLETED
        assert seen == [("write_note", "oncall-ana"), ("search_logs", "oncall-ana")]
        assert h.calls.count("write_note") == 1
        # The run is still the engineer's, and who approved is on record.
        assert (final.tenant_id, final.principal_id) == ("acme", "oncall-ana")
        write = next(r for r in final.receipts if r.call_id == "call-0001")
        assert (write.approval, write.approved_by) == ("human", "lead-bo")
        answered = [m for m in final.manifests if m.approved_by is not None]
        assert [m.approved_by for m in answered] == ["lead-bo"]


@pytest.mark.parametrize("saver_kind", ["memory", "sqlite"])
def test_after_a_leads_approval_later_calls_are_gated_by_the_requesters_capabilities(
    saver_kind: str, tmp_path: Path
) -> None:
    # The lead holds "admin"; the engineer does not: the admin call after the approved write
    # is denied, whoever's invoke goes on.
    lead = context(
        principal="lead-bo", caps=frozenset({"approve:notes:write", "admin"}), seconds=None
    )
    script = [call("write_note", 1, note="restart checkout"), call("admin_reset", 2)]
    with SqliteSaver.from_conn_string(str(tmp_path / "cp.db")) as sqlite:
        saver = InMemorySaver() if saver_kind == "memory" else sqlite
        h = harness(script, approval="interrupt", checkpointer=saver)
        config = thread()
        h.graph.invoke(fp.start("fix checkout", budget()), config, context=ENGINEER)
        final = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=lead))
        assert h.calls.count("write_note") == 1 and h.calls.count("admin_reset") == 0
        assert final.termination is TerminationReason.POLICY_DENIED
        assert final.last_error_code == "capability_denied"
        assert final.report is not None and "admin" in str(final.report)


def test_an_account_that_records_no_capabilities_waits_for_the_requester() -> None:
    # An account opened before the requester's capabilities were recorded (owner: identity
    # and run only): the approved write runs, and the model's next step is the engineer's.
    ledger = fp.InMemoryLedger()
    h = harness(list(SCRIPT), approval="interrupt", ledger=ledger)
    config = thread()
    start = fp.start("fix checkout", budget(), run_id="run-older")
    account = run_account(config["configurable"]["thread_id"], "run-older")
    limits = fp.AgentState(run_id="run-older", question="q", budget=budget()).budget.limits()
    ledger.open_account(account, limits, owner={**ENGINEER.owner(), RUN: run_tag("run-older")})
    h.graph.invoke(start, config, context=ENGINEER)
    out = h.graph.invoke(Command(resume="approve"), config, context=LEAD)
    assert h.calls.count("write_note") == 1
    assert interrupt_payload(out)["fencepost"] == "waiting_for_requester"
    steps = state_of(h, config).step
    h.graph.invoke(Command(resume="go on"), config, context=LEAD)
    assert state_of(h, config).step == steps
    out = h.graph.invoke(None, config, context=ENGINEER)
    assert fp.run_output(out).termination is TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1


def test_a_first_step_run_again_with_other_capabilities_keeps_those_recorded_first() -> None:
    # A crash after the account was opened, before the first checkpoint: the step runs again
    # for the same caller and run, now holding other capabilities. The run is not refused as
    # another's (account_conflict); the capabilities recorded first stand.
    ledger = fp.InMemoryLedger()
    h = harness(list(SCRIPT), approval="interrupt", ledger=ledger)
    config = thread()
    account = run_account(config["configurable"]["thread_id"], "run-again")
    limits = fp.AgentState(run_id="run-again", question="q", budget=budget()).budget.limits()
    first = context(principal="oncall-ana", caps=frozenset({"notes:write"}), seconds=None)
    ledger.open_account(account, limits, owner=run_owner(first, "run-again"))
    h.graph.invoke(fp.start("fix checkout", budget(), run_id="run-again"), config, context=ENGINEER)
    assert h.graph.get_state(config).next == ("approve",)
    assert recorded_capabilities(ledger.balance(account).owner) == {"notes:write"}


def test_a_principal_the_ledger_does_not_mark_as_an_approver_never_acts_for_the_run() -> None:
    # State says the peer approved (a caller's update_state can write that); the ledger marks
    # only the lead, so the peer's context is refused, not turned into the engineer's.
    h, config = _paused()
    (entry,) = state_of(h, config).batch
    verdict = entry.verdict.model_copy(
        update={
            "code": fp.policy.VerdictCode.ALLOWED,
            "approval": "human",
            "approved_by": "peer-cy",
        }
    )
    h.graph.update_state(config, forge_batch(h, config, verdicts=(verdict,)), as_node="approve")
    final = fp.run_output(h.graph.invoke(None, config, context=PEER))
    assert h.calls.count("write_note") == 0
    assert final.termination is TerminationReason.POLICY_DENIED
    assert final.last_error_code == "context_mismatch"


def test_a_graph_may_name_its_own_approval_right() -> None:
    h, config = _paused(approval_right="notes:approve")
    out = h.graph.invoke(Command(resume="approve"), config, context=LEAD)
    _still_waiting(h, config, out, "approval_right_missing")
    assert interrupt_payload(out)["error"]["rights"] == ["notes:approve"]
    approver = context(principal="lead-bo", caps=frozenset({"notes:approve"}))
    h.graph.invoke(Command(resume="approve"), config, context=approver)
    assert h.calls.count("write_note") == 1


def test_a_tool_may_name_its_own_approval_right_and_four_eyes() -> None:
    calls = Calls()
    base = make_registry(calls)
    spec = base.get("write_note").model_copy(
        update={"approval_right": "notes:sign", "four_eyes": True}
    )
    registry = fp.ToolRegistry([base.get(n) for n in base.names() if n != "write_note"] + [spec])
    h = harness(list(SCRIPT), approval="interrupt", registry=registry, calls=calls)
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=ENGINEER)
    out = h.graph.invoke(Command(resume="approve"), config, context=ENGINEER)
    _still_waiting(h, config, out, "own_approval_refused")
    out = h.graph.invoke(Command(resume="approve"), config, context=LEAD)
    _still_waiting(h, config, out, "approval_right_missing")
    signer = context(principal="lead-bo", caps=frozenset({"notes:sign"}))
    h.graph.invoke(Command(resume="approve"), config, context=signer)
    assert h.calls.count("write_note") == 1


def test_the_fp_tool_decorator_takes_the_approval_right_and_four_eyes() -> None:
    @fp.tool(effect="write", capability="notes:write", approval_right="notes:sign", four_eyes=True)
    def sign(note: str) -> str:
        """Sign a note."""
        return note

    assert (sign.approval_right, sign.four_eyes) == ("notes:sign", True)


def test_four_eyes_refuses_the_requesters_own_answer_and_takes_the_leads() -> None:
    h, config = _paused(four_eyes=True)
    out = h.graph.invoke(Command(resume="approve"), config, context=ENGINEER)
    _still_waiting(h, config, out, "own_approval_refused")
    assert interrupt_payload(out)["error"]["four_eyes"] is True
    h.graph.invoke(Command(resume="approve"), config, context=LEAD)
    assert h.calls.count("write_note") == 1


def test_without_four_eyes_the_requester_still_answers_its_own_write() -> None:
    h, config = _paused()
    out = h.graph.invoke(Command(resume="approve"), config, context=ENGINEER)
    assert fp.run_output(out).termination is TerminationReason.COMPLETED
    (receipt,) = fp.run_output(out).receipts
    assert receipt.approved_by == "oncall-ana"


def test_a_rejection_by_the_lead_is_recorded_as_the_leads() -> None:
    h, config = _paused()
    h.graph.invoke(Command(resume="reject"), config, context=LEAD)
    (receipt,) = state_of(h, config).receipts
    assert receipt.status is fp.ReceiptStatus.DENIED
    assert (receipt.approval, receipt.approved_by) == ("human", "lead-bo")
    assert h.calls.count("write_note") == 0


def test_who_answered_is_in_the_span_event(spans: Any) -> None:
    h, config = _paused()
    h.graph.invoke(Command(resume="approve"), config, context=LEAD)
    events = [
        e for s in spans.get_finished_spans() for e in s.events if e.name.endswith(".answered")
    ]
    assert [(e.attributes or {}).get("fencepost.approval.by") for e in events] == ["lead-bo"]
    assert [(e.attributes or {}).get("fencepost.approval.kind") for e in events] == ["human"]


def test_who_answered_is_in_the_stop_report() -> None:
    h, config = _paused()
    out = h.graph.invoke(Command(resume="approve"), config, context=LEAD)
    report = fp.run_output(out).report
    assert report is not None
    assert [(c.call_id, c.approved_by, c.approval) for c in report.completed] == [
        ("call-0001", "lead-bo", "human")
    ]
    assert "approved by lead-bo" in str(report)


# -- a wrong answer loses nothing ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "code"),
    [
        (None, "missing_context"),
        ({}, "missing_context"),
        ({"tenant_id": "acme"}, "invalid_context"),
        (OTHER_TENANT_LEAD, "wrong_tenant"),
        (PEER, "approval_right_missing"),
    ],
    ids=["none", "empty", "malformed", "other-tenant", "no-right"],
)
@pytest.mark.parametrize("saver_kind", ["memory", "sqlite"])
def test_a_wrong_answer_changes_nothing_and_the_lead_can_still_approve(
    given: Any, code: str, saver_kind: str, tmp_path: Path
) -> None:
    with SqliteSaver.from_conn_string(str(tmp_path / "cp.db")) as sqlite:
        saver = InMemorySaver() if saver_kind == "memory" else sqlite
        h, config = _paused(saver)
        budget_before = state_of(h, config).budget
        for answer in ("approve", "reject"):
            out = h.graph.invoke(Command(resume=answer), config, context=given)
            _still_waiting(h, config, out, code)
        assert state_of(h, config).budget == budget_before
        out = h.graph.invoke(Command(resume="approve"), config, context=LEAD)
        assert h.calls.count("write_note") == 1
        assert state_of(h, config).last_error_code is None
        assert fp.run_output(out).termination is TerminationReason.COMPLETED


async def test_a_wrong_answer_changes_nothing_under_ainvoke_too() -> None:
    h, config = _paused()
    out = await h.graph.ainvoke(Command(resume="approve"), config, context=PEER)
    _still_waiting(h, config, out, "approval_right_missing")
    await h.graph.ainvoke(Command(resume="approve"), config, context=LEAD)
    assert h.calls.count("write_note") == 1


def test_may_answer_is_one_policy_question() -> None:
    owner = {"tenant": "acme", "principal": "oncall-ana"}
    right = ["approve:notes:write"]
    assert may_answer(owner, LEAD, right) is None
    assert may_answer(owner, ENGINEER, right) is None
    assert may_answer(owner, ENGINEER, right, four_eyes=True) == "own_approval_refused"
    assert may_answer(owner, PEER, right) == "approval_right_missing"
    assert may_answer(owner, OTHER_TENANT_LEAD, right) == "wrong_tenant"
    assert may_answer(owner, None, right) == "missing_context"
    assert may_answer(owner, None, right, given="acme") == "invalid_context"


@pytest.mark.parametrize("field", ["principal_id", "tenant_id"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_an_answer_that_rewrites_whose_run_it_is_is_refused_and_the_requester_can_still_answer(
    field: str, mode: str
) -> None:
    # LangGraph saves a command's update before the approval judges its answer: an intruder's
    # answer that also rewrote the run's identity would leave the run another principal's,
    # and the requester's own answer would then end it context_mismatch.
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt")
    config, owner, intruder = thread(), context(principal="u-1"), context(principal="u-2")
    h.graph.invoke(fp.start("q", budget()), config, context=owner)
    before = h.graph.get_state(config)
    forged = Command(resume="approve", update={"run": {field: "u-2"}})
    with pytest.raises(fp.CommandRefused, match=field):
        if mode == "invoke":
            h.graph.invoke(forged, config, context=intruder)
        else:
            asyncio.run(h.graph.ainvoke(forged, config, context=intruder))
    # Nothing of it was saved: the thread is at the checkpoint it paused at.
    after = h.graph.get_state(config)
    assert after.config == before.config and after.values == before.values
    assert h.calls.count("write_note") == 0
    out = h.graph.invoke(Command(resume="approve"), config, context=owner)
    assert h.calls.count("write_note") == 1
    # The model abstains after the write: the run ends as its model says, still u-1's (a
    # rewritten principal would have ended it policy_denied, context_mismatch).
    ended = fp.run_output(out)
    assert ended.termination is TerminationReason.INSUFFICIENT_EVIDENCE
    assert ended.principal_id == "u-1" and ended.last_error_code is None
