"""A call's outcome and its receipt: work accepted is pending, a run reported not completed is
an incomplete call, never a completed one."""

from __future__ import annotations

from fencepost.policy import (
    Accepted,
    Effect,
    ErrorCode,
    Observation,
    Receipt,
    ReceiptStatus,
    TerminationReason,
)
from fencepost.policy.events import ToolSucceeded
from fencepost.policy.outcome import CallOutcome, RunReport, receipt_for, result_status
from fencepost.policy.stop_report import stop_report
from fencepost.policy.terminate import terminate
from tests.policy.factories import make_state


def test_a_result_reporting_a_run_that_never_began_is_denied_never_failed() -> None:
    assert result_status(RunReport(completed=False, started=False)) is ReceiptStatus.DENIED


def test_a_result_reporting_a_run_not_completed_is_failed_and_incomplete() -> None:
    assert result_status(RunReport(completed=False)) is ReceiptStatus.FAILED
    assert result_status(RunReport(completed=True)) is ReceiptStatus.COMPLETED
    assert result_status(Accepted(task_id="task-17")) is ReceiptStatus.ACCEPTED_PENDING
    assert result_status({"completed": False}) is ReceiptStatus.COMPLETED  # plain data: no claim
    outcome = CallOutcome(
        event=ToolSucceeded(call_id="call-0001", tool_name="research", result={"completed": False}),
        status=ReceiptStatus.FAILED,
        attempts=1,
        effect=Effect.WRITE,
    )
    receipt = receipt_for(outcome)
    assert receipt.status is ReceiptStatus.FAILED
    assert receipt.error_code is ErrorCode.INCOMPLETE


def _result(call_id: str) -> Observation:
    return Observation(sequence=0, call_id=call_id, tool_name="research", kind="tool_result")


def test_an_incomplete_calls_result_is_not_evidence_an_answer_can_cite() -> None:
    incomplete = Receipt(
        call_id="call-0001",
        tool_name="research",
        status=ReceiptStatus.FAILED,
        error_code=ErrorCode.INCOMPLETE,
        effect=Effect.WRITE,
    )
    done = Receipt(call_id="call-0002", tool_name="research", status=ReceiptStatus.COMPLETED)
    state = make_state(
        observations=(
            _result("call-0001"),
            _result("call-0002").model_copy(update={"sequence": 1}),
        ),
        receipts=(incomplete, done),
    )
    assert state.evidence_ids() == frozenset({"call-0002"})
    # In the report: failed with its code, and its effects kept (the child may have made some).
    report = stop_report(terminate(state, TerminationReason.STEP_BUDGET_EXHAUSTED))
    assert [(c.call_id, c.error_code) for c in report.failed] == [
        ("call-0001", ErrorCode.INCOMPLETE)
    ]
    assert report.effects_made == ("call-0001",)


def test_each_outcome_carries_who_answered_its_calls_approval_as_its_verdict_says() -> None:
    from fencepost.policy import BatchEntry, ToolProposal, Verdict, VerdictCode
    from fencepost.policy.outcome import with_approvers

    def entry(call_id: str, approval: str | None) -> BatchEntry:
        proposal = ToolProposal(call_id=call_id, tool_name="research", arguments={})
        verdict = Verdict(
            call_id=call_id,
            tool_name="research",
            fingerprint="f",
            code=VerdictCode.ALLOWED,
            approval=approval,
        )
        return BatchEntry(proposal=proposal, verdict=verdict)

    def outcome(call_id: str, approval: str | None = None) -> CallOutcome:
        return CallOutcome(
            event=ToolSucceeded(call_id=call_id, tool_name="research", result={}),
            status=ReceiptStatus.COMPLETED,
            attempts=1,
            effect=Effect.WRITE,
            approval=approval,
        )

    batch = (entry("call-0001", "human"), entry("call-0002", None), entry("call-0003", "human"))
    stamped = with_approvers(
        [outcome("call-0001"), outcome("call-0002"), outcome("call-0003", "approver")], batch
    )
    assert [o.approval for o in stamped] == ["human", None, "approver"]  # an outcome's own stands
