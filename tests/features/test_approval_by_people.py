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

from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import fencepost as fp
from fencepost.policy import TerminationReason
from fencepost.policy.approval import may_answer
from tests.graph.kit import (
    Calls,
    budget,
    call,
    context,
    final_citing_last,
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


@pytest.mark.parametrize("saver_kind", ["memory", "sqlite"])
def test_a_lead_of_the_tenant_with_the_approval_right_approves_an_engineers_write(
    saver_kind: str, tmp_path: Path
) -> None:
    with SqliteSaver.from_conn_string(str(tmp_path / "cp.db")) as sqlite:
        saver = InMemorySaver() if saver_kind == "memory" else sqlite
        h, config = _paused(saver)
        h.graph.invoke(Command(resume="approve"), config, context=LEAD)
        assert h.calls.count("write_note") == 1
        state = state_of(h, config)
        # The run is still the engineer's: it waits for the engineer's next step.
        assert (state.tenant_id, state.principal_id) == ("acme", "oncall-ana")
        (receipt,) = state.receipts
        assert (receipt.approval, receipt.approved_by) == ("human", "lead-bo")
        answered = [m for m in state.manifests if m.approved_by is not None]
        assert [m.approved_by for m in answered] == ["lead-bo"]
        out = h.graph.invoke(None, config, context=ENGINEER)
        final = fp.run_output(out)
        assert final.termination is TerminationReason.COMPLETED
        assert h.calls.count("write_note") == 1


def test_the_tool_sees_the_requester_not_the_approver() -> None:
    calls = Calls()
    seen: list[tuple[str | None, str | None]] = []
    registry = make_registry(calls)
    spec = registry.get("write_note")
    body = spec.execute

    def remembering(args: Any, ctx: fp.ToolContext) -> Any:
        seen.append((ctx.tenant_id, ctx.principal_id))
        return body(args, ctx)

    registry = fp.ToolRegistry(
        [registry.get(n) for n in registry.names() if n != "write_note"]
        + [spec.model_copy(update={"execute": remembering})]
    )
    h = harness(list(SCRIPT), approval="interrupt", registry=registry, calls=calls)
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=ENGINEER)
    h.graph.invoke(Command(resume="approve"), config, context=LEAD)
    assert seen == [("acme", "oncall-ana")]


def test_the_approver_never_takes_the_requesters_next_step() -> None:
    h, config = _paused()
    out = h.graph.invoke(Command(resume="approve"), config, context=LEAD)
    assert interrupt_payload(out)["fencepost"] == "waiting_for_requester"
    # The lead resuming again changes nothing: no model step is taken for the engineer.
    steps = state_of(h, config).step
    h.graph.invoke(Command(resume="go on"), config, context=LEAD)
    assert state_of(h, config).step == steps
    assert fp.run_output(h.graph.invoke(None, config, context=ENGINEER)).termination is (
        TerminationReason.COMPLETED
    )


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
    h.graph.invoke(Command(resume="approve"), config, context=LEAD)
    out = h.graph.invoke(None, config, context=ENGINEER)
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
        h.graph.invoke(Command(resume="approve"), config, context=LEAD)
        assert h.calls.count("write_note") == 1
        assert state_of(h, config).last_error_code is None
        out = h.graph.invoke(None, config, context=ENGINEER)
        assert fp.run_output(out).termination is TerminationReason.COMPLETED
        assert h.calls.count("write_note") == 1


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
