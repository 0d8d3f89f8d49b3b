"""Remembered approvals: an approver's "approve always" for a scope (this tool for this tenant,
or this tool with these arguments, until revoked or an instant) approves every later call it
matches before the approver is asked, for that tenant only; every receipt it approves names it."""

from __future__ import annotations

from datetime import UTC, datetime

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import fencepost as fp
from fencepost.policy.remembered import ScopeKind, ScopeStore
from tests.graph.kit import budget, call, context, harness, thread

DONE = fp.FinalProposal(answer=fp.AnswerPayload(text=""))


def note(n: int, text: str = "restart api") -> fp.ToolProposal:
    return call("write_note", n=n, note=text)


class Always:
    """Approve always (``scope``) the first time it is asked; count what it is asked about."""

    def __init__(self, scope: ScopeKind = "tool") -> None:
        self.scope: ScopeKind = scope
        self.asked: list[tuple[str, str]] = []

    def __call__(self, request: fp.ApproverInput) -> fp.ApproverDecision:
        self.asked.append((request.context.tenant_id, request.proposal.call_id))
        return fp.ApproverDecision.approve_always(self.scope)


def test_approve_always_for_a_tool_approves_the_next_call_by_the_scope_without_asking() -> None:
    approver = Always("tool")
    h = harness([note(1, "a"), note(2, "b"), DONE], approver=approver)
    state = h.run(ctx=context())
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 2
    assert approver.asked == [("acme", "call-0001")]
    first, second = state.receipts
    assert first.scope_id is not None
    assert (second.status, second.approval, second.scope_id) == (
        fp.ReceiptStatus.COMPLETED,
        "approver",
        first.scope_id,
    )


def test_a_remembered_scope_outlives_its_run_on_the_same_ledger_but_never_crosses_tenants() -> None:
    approver = Always("tool")
    saver = InMemorySaver()
    h = harness(
        [note(1), DONE, note(1), DONE, note(1), DONE], approver=approver, checkpointer=saver
    )
    h.graph.invoke(fp.start("q", budget()), thread(), context=context(tenant="acme"))
    again = fp.run_output(
        h.graph.invoke(fp.start("q", budget()), thread(), context=context(tenant="acme"))
    )
    assert again.receipts[0].scope_id is not None
    other = fp.run_output(
        h.graph.invoke(fp.start("q", budget()), thread(), context=context(tenant="globex"))
    )
    assert approver.asked == [("acme", "call-0001"), ("globex", "call-0001")]
    assert other.receipts[0].scope_id not in (None, again.receipts[0].scope_id)


def test_an_arguments_scope_approves_only_the_same_arguments() -> None:
    approver = Always("arguments")
    h = harness([note(1, "a"), note(2, "b"), note(3, "a"), DONE], approver=approver)
    state = h.run(ctx=context())
    assert approver.asked == [("acme", "call-0001"), ("acme", "call-0002")]
    by_call = {r.call_id: r.scope_id for r in state.receipts}
    assert by_call["call-0003"] == by_call["call-0001"] != by_call["call-0002"]


def test_a_revoked_scope_approves_nothing_and_the_approver_is_asked_again() -> None:
    approver = Always("tool")
    ledger = fp.InMemoryLedger()
    h = harness([note(1), DONE, note(1), DONE], approver=approver, ledger=ledger)
    first = fp.run_output(h.graph.invoke(fp.start("q", budget()), thread(), context=context()))
    scope_id = first.receipts[0].scope_id
    assert isinstance(ledger, ScopeStore) and scope_id is not None
    ledger.revoke_scope("acme", scope_id, at=datetime.now(UTC))
    second = fp.run_output(h.graph.invoke(fp.start("q", budget()), thread(), context=context()))
    assert len(approver.asked) == 2
    assert second.receipts[0].scope_id not in (None, scope_id)


def test_a_humans_approve_always_answer_approves_the_next_run_without_pausing() -> None:
    h = harness([note(1), DONE, note(1), DONE], approval="interrupt")
    config = thread()
    paused = h.graph.invoke(fp.start("q", budget()), config, context=context())
    assert paused["__interrupt__"]
    answer = {"decision": "approve", "remember": {"scope": "tool"}}
    first = fp.run_output(h.graph.invoke(Command(resume=answer), config, context=context()))
    [receipt] = first.receipts
    assert (receipt.approval, receipt.status) == ("human", fp.ReceiptStatus.COMPLETED)
    assert receipt.scope_id is not None
    out = h.graph.invoke(fp.start("q", budget()), thread(), context=context())
    assert "__interrupt__" not in out
    second = fp.run_output(out)
    assert second.termination is fp.TerminationReason.COMPLETED
    assert (second.receipts[0].approval, second.receipts[0].scope_id) == ("human", receipt.scope_id)
    assert h.calls.count("write_note") == 2


def test_a_remember_answer_that_names_no_scope_is_asked_again_and_a_scope_with_until_is_kept() -> (
    None
):
    ledger = fp.InMemoryLedger()
    h = harness([note(1), DONE], approval="interrupt", ledger=ledger)
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context())
    wrong = {"decision": "approve", "remember": {"scope": "everything"}}
    out = h.graph.invoke(Command(resume=wrong), config, context=context())
    assert out["__interrupt__"][0].value["error"]["code"] == "unrecognized_answer"
    assert h.calls.count("write_note") == 0
    until = "2099-06-01T00:00:00Z"
    right = {"decision": "approve", "remember": {"scope": "arguments", "until": until}}
    state = fp.run_output(h.graph.invoke(Command(resume=right), config, context=context()))
    assert h.calls.count("write_note") == 1
    [scope] = ledger.approval_scopes("acme")
    assert (scope.scope_id, scope.kind, scope.answered_by, scope.created_by) == (
        state.receipts[0].scope_id,
        "arguments",
        "human",
        "u-1",
    )
    assert scope.until == datetime(2099, 6, 1, tzinfo=UTC)
