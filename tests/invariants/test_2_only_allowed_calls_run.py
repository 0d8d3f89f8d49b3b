"""Invariant 2: a tool runs only if it is allowed — registered, valid, authorized, its effect
allowed or approved (by a human, or the graph's approver policy), its budget reserved. Here: what
a human's answer, the approver's, and a caller writing the batch beside them can and cannot let
run, and that a denied call never runs whether its denial ends the run or is data."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.types import Command

import fencepost as fp
from fencepost.policy.approval import unasked, waiting
from fencepost.policy.gating import after_reservations
from fencepost.policy.keys import call_key, run_account
from tests.graph.kit import (
    ABSTAIN,
    LEDGERS,
    VERDICT_KEY,
    allowed_entry,
    budget,
    call,
    context,
    each_ledger,
    harness,
    interrupt_payload,
    state_of,
    thread,
)

ledger = pytest.fixture(params=LEDGERS, name="ledger")(each_ledger)


def _paused(**build: Any) -> tuple[Any, dict[str, Any], fp.RunContext]:
    h = harness(
        [call("write_note", 1, note="hi"), ABSTAIN, ABSTAIN, ABSTAIN], approval="interrupt", **build
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    assert h.graph.get_state(config).next == ("approve",)
    return h, config, ctx


NOT_ONE_FORM = {
    "global-approve-beside-a-per-call-reject": {"decision": "approve", "call-0001": "reject"},
    "per-call-approve-beside-a-global-reject": {"call-0001": "approve", "decision": "reject"},
    "decision-and-type-disagree": {"decision": "approve", "type": "reject"},
    "decision-and-type-both": {"decision": "approve", "type": "approve"},
    "an-extra-key": {"decision": "approve", "note": "x"},
    "arguments-on-an-approve": {"decision": "approve", "arguments": {"note": "hi"}},
    "an-edit-with-an-extra-key": {"decision": "edit", "arguments": {"note": "x"}, "why": "y"},
    "a-per-call-answer-not-one-form": {"call-0001": {"decision": "approve", "type": "reject"}},
    "a-per-call-answer-nested": {"call-0001": {"call-0001": "approve"}},
}


@pytest.mark.parametrize("answer", list(NOT_ONE_FORM.values()), ids=list(NOT_ONE_FORM))
@pytest.mark.parametrize("key", [None, VERDICT_KEY], ids=["no-key", "key"])
def test_an_answer_that_is_not_exactly_one_accepted_form_is_asked_again_and_runs_nothing(
    answer: dict[str, Any], key: bytes | None
) -> None:
    h, config, ctx = _paused(verdict_key=key)
    out = h.graph.invoke(Command(resume=answer), config, context=ctx)
    assert h.calls.log == []
    payload = interrupt_payload(out)
    assert payload["error"]["code"] == "unrecognized_answer"
    assert [c["call_id"] for c in payload["calls"]] == ["call-0001"]
    # Asked again, the human's clear answer is the one that counts.
    state = fp.run_output(h.graph.invoke(Command(resume="reject"), config, context=ctx))
    assert h.calls.log == []
    assert state.receipts[-1].status is fp.ReceiptStatus.DENIED


def _forged_write() -> fp.policy.BatchEntry:
    return allowed_entry(call("write_note", 2, note="forged"))


@pytest.mark.parametrize("how", ["update_state-as-decide", "command-update-beside-resume"])
def test_with_a_verdict_key_an_approval_never_seals_an_entry_the_gate_did_not_judge(
    how: str, ledger: fp.Ledger
) -> None:
    h, config, ctx = _paused(verdict_key=VERDICT_KEY, ledger=ledger)
    batch = (*state_of(h, config).batch, _forged_write())
    if how == "update_state-as-decide":
        h.graph.update_state(config, {"run": {"batch": batch}}, as_node="decide")
        h.graph.invoke(None, config, context=ctx)  # asked again, the batch as written
        out = h.graph.invoke(Command(resume="reject"), config, context=ctx)
    else:
        out = h.graph.invoke(
            Command(update={"run": {"batch": batch}}, resume="reject"), config, context=ctx
        )
    state = fp.run_output(out)
    assert h.calls.log == []
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "executor_refused"


@pytest.mark.parametrize("answer", ["approve", {"call-0001": "approve"}])
def test_with_a_verdict_key_an_approval_answers_only_the_calls_that_were_waiting(
    answer: Any, ledger: fp.Ledger
) -> None:
    h, config, ctx = _paused(verdict_key=VERDICT_KEY, ledger=ledger)
    genuine = state_of(h, config).batch[0]
    # Written beside it: a pending entry the gate never judged, and the genuine call's sealed
    # verdict under other arguments.
    slipped = _forged_write()
    pending = fp.policy.BatchEntry(
        proposal=slipped.proposal,
        verdict=slipped.verdict.model_copy(update={"code": fp.policy.VerdictCode.APPROVAL_PENDING}),
    )
    h.graph.invoke(
        Command(update={"run": {"batch": (genuine, pending)}}, resume=answer), config, context=ctx
    )
    assert h.calls.log == [("write_note", {"note": "hi"}, "call-0001")]


def test_with_a_verdict_key_a_waiting_call_whose_arguments_were_rewritten_is_not_asked_about(
    ledger: fp.Ledger,
) -> None:
    h, config, ctx = _paused(verdict_key=VERDICT_KEY, ledger=ledger)
    genuine = state_of(h, config).batch[0]
    rewritten = genuine.proposal.model_copy(update={"arguments": {"note": "rm -rf /"}})
    forged = fp.policy.BatchEntry(proposal=rewritten, verdict=genuine.verdict)
    out = h.graph.invoke(
        Command(update={"run": {"batch": (forged,)}}, resume="approve"), config, context=ctx
    )
    assert "__interrupt__" not in out
    assert h.calls.log == []


def _pending_entry(proposal: fp.ToolProposal) -> fp.policy.BatchEntry:
    entry = allowed_entry(proposal)
    pending = entry.verdict.model_copy(update={"code": fp.policy.VerdictCode.APPROVAL_PENDING})
    return entry.with_verdict(pending)


def test_only_a_pending_verdict_made_for_its_arguments_and_sealed_is_waiting() -> None:
    genuine = _pending_entry(call("write_note", 1, note="hi"))
    sealed = genuine.with_verdict(
        fp.policy.seal_verdict(genuine.verdict, run_id="run-1", key=VERDICT_KEY)
    )
    rewritten = fp.policy.BatchEntry(
        proposal=genuine.proposal.model_copy(update={"arguments": {"note": "other"}}),
        verdict=sealed.verdict,
    )
    for entry, with_key, without in [
        (sealed, [sealed], [sealed]),
        (genuine, [], [genuine]),  # no key: what state says, for these arguments
        (rewritten, [], []),
    ]:
        assert waiting((entry,), run_id="run-1", verdict_key=VERDICT_KEY) == with_key
        assert waiting((entry,)) == without
    assert waiting((sealed,), run_id="run-2", verdict_key=VERDICT_KEY) == []
    # One call id twice: neither is what the gate left waiting.
    assert waiting((sealed, genuine)) == []
    assert unasked((sealed, genuine), [sealed]) == (sealed,)


def test_a_pending_verdicts_seal_never_passes_for_an_allowed_one() -> None:
    pending = _pending_entry(call("write_note", 1, note="hi")).verdict
    sealed = fp.policy.seal_verdict(pending, run_id="run-1", key=VERDICT_KEY)
    assert fp.policy.verdict_is_sealed(sealed, run_id="run-1", key=VERDICT_KEY)
    as_allowed = sealed.model_copy(update={"code": fp.policy.VerdictCode.ALLOWED})
    assert not fp.policy.verdict_is_sealed(as_allowed, run_id="run-1", key=VERDICT_KEY)
    rejected = sealed.model_copy(update={"code": fp.policy.VerdictCode.REJECTED})
    assert fp.policy.seal_verdict(rejected, run_id="run-1", key=VERDICT_KEY) is rejected


def test_after_an_approval_only_the_calls_it_answered_are_sealed() -> None:
    answered = allowed_entry(call("write_note", 1, note="hi"))
    slipped = allowed_entry(call("write_note", 2, note="forged"))
    batch, stopped = after_reservations(
        (answered, slipped),
        {},
        run_id="run-1",
        verdict_key=VERDICT_KEY,
        only=frozenset({"call-0001"}),
    )
    assert stopped is None
    assert fp.policy.verdict_is_sealed(batch[0].verdict, run_id="run-1", key=VERDICT_KEY)
    assert batch[1] is slipped and batch[1].verdict.seal is None


@pytest.mark.parametrize("denial", ["end_run", "observe"])
def test_a_denied_call_never_runs_and_reserves_nothing_whether_its_denial_ends_the_run_or_not(
    denial: str, ledger: fp.Ledger
) -> None:
    h = harness(
        [call("admin_reset", 1), call("search_logs", 2), ABSTAIN], denial=denial, ledger=ledger
    )
    config = thread()
    state = fp.run_output(h.graph.invoke(fp.start("q", budget()), config, context=context()))
    assert h.calls.count("admin_reset") == 0
    account = run_account(config["configurable"]["thread_id"], state.run_id)
    assert ledger.get(call_key(account, "call-0001", 1)) is None
    ran_on = h.calls.count("search_logs")
    assert ran_on == (1 if denial == "observe" else 0)
    assert state.budget.tool_calls_used == ran_on


@pytest.mark.parametrize("approval", ["terminate", "interrupt"])
def test_a_write_runs_only_as_the_approver_or_a_human_approved_it(approval: str) -> None:
    def only_restarts(request: fp.ApproverInput) -> fp.ApproverDecision:
        if request.proposal.arguments.get("note") == "restart api":
            return fp.ApproverDecision.approve()
        return fp.ApproverDecision.reject("not_a_restart")

    h = harness(
        [call("write_note", 1, note="wipe db"), call("write_note", 2, note="restart api"), ABSTAIN],
        approval=approval,
        approver=only_restarts,
        verdict_key=VERDICT_KEY,
    )
    state = h.run()
    assert [args for name, args, _ in h.calls.log] == [{"note": "restart api"}]
    assert {r.call_id: (r.status, r.approval) for r in state.receipts} == {
        "call-0001": (fp.ReceiptStatus.DENIED, "approver"),
        "call-0002": (fp.ReceiptStatus.COMPLETED, "approver"),
    }
