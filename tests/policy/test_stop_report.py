"""The stop report: each row of the contract's table, derived from receipts and the terminal reason
only; every call in exactly one list; nothing in it but codes, call ids and tool names."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from fencepost.graph.record import plain
from fencepost.policy import (
    AgentState,
    AnswerPayload,
    BatchEntry,
    CallOutcome,
    Effect,
    ErrorCode,
    Receipt,
    ReceiptStatus,
    ReportedCall,
    RuntimeBudget,
    StopKind,
    StopReport,
    TerminationReason,
    ToolFailed,
    ToolProposal,
    ToolSucceeded,
    Verdict,
    VerdictCode,
    Waiting,
    kind_of,
    proposal_fingerprint,
    receipt_for,
    stop_report,
    terminate,
)
from fencepost.policy.stop_report import SAFE_CODE


def receipt(
    call_id: str,
    status: ReceiptStatus,
    *,
    tool: str = "search_logs",
    effect: Effect | None = Effect.READ,
    code: ErrorCode | None = None,
) -> Receipt:
    return Receipt(
        call_id=call_id,
        tool_name=tool,
        status=status,
        error_code=code,
        effect=effect,
        attempts=0 if status is ReceiptStatus.DENIED else 1,
    )


def entry(call_id: str, code: VerdictCode, tool: str = "restart_service") -> BatchEntry:
    args: dict[str, Any] = {"service": "orders-api"}
    return BatchEntry(
        proposal=ToolProposal(call_id=call_id, tool_name=tool, arguments=args),
        verdict=Verdict(
            call_id=call_id,
            tool_name=tool,
            fingerprint=proposal_fingerprint(tool, args),
            code=code,
        ),
    )


def ended(
    reason: TerminationReason,
    receipts: tuple[Receipt, ...] = (),
    *,
    code: str | None = None,
    answer: AnswerPayload | None = None,
) -> AgentState:
    state = AgentState(
        run_id="run-0001",
        question="Why is checkout returning 500s?",
        budget=RuntimeBudget(steps_remaining=0, tool_calls_remaining=0),
        receipts=receipts,
    )
    return terminate(state, reason, answer=answer, error_code=code)


def ids(calls: tuple[ReportedCall, ...]) -> list[str]:
    return [c.call_id for c in calls]


# --- one row of the table per terminal reason -------------------------------------------------


ROWS = {
    TerminationReason.COMPLETED: StopKind.COMPLETED,
    TerminationReason.INSUFFICIENT_EVIDENCE: StopKind.FAILED,
    TerminationReason.INVALID_PROPOSAL: StopKind.FAILED,
    TerminationReason.NO_PROGRESS: StopKind.FAILED,
    TerminationReason.POLICY_DENIED: StopKind.FAILED,
    TerminationReason.FAILED: StopKind.FAILED,
    TerminationReason.NEEDS_CLARIFICATION: StopKind.WAITING_FOR_INPUT,
    TerminationReason.APPROVAL_REQUIRED: StopKind.WAITING_FOR_INPUT,
    TerminationReason.STEP_BUDGET_EXHAUSTED: StopKind.STOPPED,
    TerminationReason.TOOL_BUDGET_EXHAUSTED: StopKind.STOPPED,
    TerminationReason.DEADLINE_EXCEEDED: StopKind.STOPPED,
    TerminationReason.CANCELLED: StopKind.STOPPED,
}


def test_every_terminal_reason_falls_in_one_row_of_the_table() -> None:
    assert set(ROWS) == set(TerminationReason), "a new reason needs its row here and in policy"
    for reason, kind in ROWS.items():
        assert kind_of(reason) is kind
        report = stop_report(ended(reason))
        assert (report.kind, report.reason) == (kind, reason)


def test_only_completed_is_reported_completed() -> None:
    # A reason the report does not know is a failure, never a success.
    assert [r for r in TerminationReason if kind_of(r) is StopKind.COMPLETED] == [
        TerminationReason.COMPLETED
    ]


def test_completed_reports_the_verified_results_and_where_they_are() -> None:
    receipts = (
        receipt("call-0001", ReceiptStatus.COMPLETED),
        receipt("call-0002", ReceiptStatus.COMPLETED, tool="deployment_history"),
    )
    answer = AnswerPayload(text="A release at 14:00.", citations=("call-0002",))
    report = stop_report(ended(TerminationReason.COMPLETED, receipts, answer=answer))
    assert report.kind is StopKind.COMPLETED
    assert [(c.call_id, c.tool_name) for c in report.completed] == [
        ("call-0001", "search_logs"),
        ("call-0002", "deployment_history"),
    ]
    assert report.cited == ("call-0002",)
    assert report.effects_made == () and report.waiting_for is None
    assert "14:00" not in report.model_dump_json()  # the answer's text is not the report


def test_failed_reports_the_cause_code_and_the_effects_already_made() -> None:
    receipts = (
        receipt("call-0001", ReceiptStatus.COMPLETED, tool="create_ticket", effect=Effect.WRITE),
        receipt(
            "call-0002",
            ReceiptStatus.UNCERTAIN,
            tool="send_email",
            effect=Effect.EXTERNAL,
            code=ErrorCode.EXECUTION_UNCERTAIN,
        ),
        receipt("call-0003", ReceiptStatus.COMPLETED),  # a read changes nothing
        receipt(
            "call-0004",
            ReceiptStatus.FAILED,
            tool="create_ticket",
            effect=Effect.WRITE,
            code=ErrorCode.CONFLICT,
        ),
    )
    state = ended(TerminationReason.POLICY_DENIED, receipts, code="executor_refused")
    report = stop_report(state)
    assert report.kind is StopKind.FAILED
    assert report.error_code == "executor_refused"
    assert report.effects_made == ("call-0001", "call-0002")
    assert [(c.call_id, c.error_code) for c in report.failed] == [("call-0004", ErrorCode.CONFLICT)]
    assert ids(report.uncertain) == ["call-0002"]


def test_approval_required_names_the_call_and_tool_waiting_for_approval() -> None:
    batch = (
        entry("call-0001", VerdictCode.APPROVAL_REQUIRED),
        entry("call-0002", VerdictCode.ALLOWED, "search_logs"),
    )
    state = ended(TerminationReason.APPROVAL_REQUIRED, code="approval_required")
    report = stop_report(state, unfinished=batch)
    assert report.kind is StopKind.WAITING_FOR_INPUT
    assert report.waiting_for == Waiting(condition="approval", calls=("call-0001",))
    waiting = next(c for c in report.never_started if c.call_id == "call-0001")
    assert (waiting.tool_name, waiting.verdict) == (
        "restart_service",
        VerdictCode.APPROVAL_REQUIRED,
    )
    # The rest of the batch never ran either: one denial stops the whole batch.
    assert ids(report.never_started) == ["call-0001", "call-0002"]


def test_needs_clarification_waits_for_a_clarification() -> None:
    report = stop_report(ended(TerminationReason.NEEDS_CLARIFICATION, code="needs_clarification"))
    assert report.waiting_for == Waiting(condition="clarification")
    assert report.calls == 0


@pytest.mark.parametrize(
    "reason",
    [
        TerminationReason.TOOL_BUDGET_EXHAUSTED,
        TerminationReason.STEP_BUDGET_EXHAUSTED,
        TerminationReason.DEADLINE_EXCEEDED,
        TerminationReason.CANCELLED,
    ],
)
def test_a_budget_or_deadline_stop_says_what_completed_never_started_is_uncertain_or_pending(
    reason: TerminationReason,
) -> None:
    receipts = (
        receipt("call-0001", ReceiptStatus.COMPLETED),
        receipt(
            "call-0002",
            ReceiptStatus.ACCEPTED_PENDING,
            tool="upload_document",
            effect=Effect.EXTERNAL,
        ),
        receipt(
            "call-0003",
            ReceiptStatus.UNCERTAIN,
            tool="create_ticket",
            effect=Effect.WRITE,
            code=ErrorCode.EXECUTION_UNCERTAIN,
        ),
        receipt(
            "call-0004",
            ReceiptStatus.DENIED,
            tool="deployment_history",
            effect=None,
            code=ErrorCode.BUDGET_EXHAUSTED,
        ),
    )
    # Proposed and allowed, but the stop came before it ran: it has no receipt.
    batch = (entry("call-0005", VerdictCode.ALLOWED, "search_logs"),)
    report = stop_report(ended(reason, receipts, code="tool_calls_exhausted"), unfinished=batch)
    assert report.kind is StopKind.STOPPED
    assert ids(report.completed) == ["call-0001"]
    assert ids(report.pending) == ["call-0002"]  # accepted is not done
    assert ids(report.uncertain) == ["call-0003"]
    assert ids(report.never_started) == ["call-0004", "call-0005"]
    assert report.never_started[0].error_code is ErrorCode.BUDGET_EXHAUSTED
    assert report.never_started[1].verdict is VerdictCode.ALLOWED
    # Stopping is not undoing: the accepted upload and the possible ticket are out there.
    assert report.effects_made == ("call-0002", "call-0003")
    assert report.waiting_for is None


def test_accepted_work_shown_done_later_is_reported_completed_once() -> None:
    # Receipts are append-only: a later receipt for the same call id is the current one.
    accepted = receipt("call-0001", ReceiptStatus.ACCEPTED_PENDING, tool="upload_document")
    receipts = (accepted, accepted.model_copy(update={"status": ReceiptStatus.COMPLETED}))
    report = stop_report(ended(TerminationReason.COMPLETED, receipts))
    assert ids(report.completed) == ["call-0001"] and report.pending == ()
    assert report.calls == 1


def test_a_state_that_has_not_ended_has_no_report() -> None:
    state = AgentState(
        run_id="run-0001",
        question="q",
        budget=RuntimeBudget(steps_remaining=1, tool_calls_remaining=1),
    )
    with pytest.raises(ValueError, match="ended"):
        stop_report(state)


def test_a_code_that_is_not_a_code_is_not_copied_into_the_report() -> None:
    report = stop_report(ended(TerminationReason.FAILED, code="Traceback: api_key=sk-123"))
    assert report.error_code == "unreadable_code"


def test_receipts_carry_the_tools_effect() -> None:
    event = ToolSucceeded(call_id="call-0001", tool_name="create_ticket", result={"id": 7})
    outcome = CallOutcome(
        event=event, status=ReceiptStatus.COMPLETED, attempts=1, effect=Effect.WRITE
    )
    assert receipt_for(outcome).effect is Effect.WRITE
    failed = ToolFailed(call_id="call-0002", tool_name="x_tool", error_code=ErrorCode.NOT_FOUND)
    assert (
        receipt_for(CallOutcome(event=failed, status=ReceiptStatus.DENIED, attempts=0)).effect
        is None
    )
    # Receipts written before the field existed still load.
    old = {"call_id": "call-0003", "tool_name": "search_logs", "status": "completed"}
    assert Receipt.model_validate(old, strict=False).effect is None


def test_the_report_survives_the_checkpoint_serializer() -> None:
    receipts = (
        receipt("call-0001", ReceiptStatus.COMPLETED, tool="create_ticket", effect=Effect.WRITE),
    )
    state = ended(TerminationReason.APPROVAL_REQUIRED, receipts, code="approval_required")
    state = state.model_copy(
        update={
            "report": stop_report(
                state, unfinished=(entry("call-0002", VerdictCode.APPROVAL_REQUIRED),)
            )
        }
    )
    serde = JsonPlusSerializer()
    back = AgentState.model_validate(serde.loads_typed(serde.dumps_typed(plain(state))))
    assert isinstance(back.report, StopReport)
    assert isinstance(back.report.completed, tuple) and type(back.report.kind) is StopKind
    assert isinstance(back.report.waiting_for, Waiting)
    assert back == state
    assert AgentState.model_validate_json(state.model_dump_json()) == state


# --- every call in exactly one list, and nothing but ids and codes ------------------------------

CALL_IDS = [f"call-{n:04d}" for n in range(1, 9)]
TOOLS = ["search_logs", "create_ticket", "send_email", "deployment_history"]

receipts_strategy = st.lists(
    st.builds(
        receipt,
        st.sampled_from(CALL_IDS),
        st.sampled_from(list(ReceiptStatus)),
        tool=st.sampled_from(TOOLS),
        effect=st.none() | st.sampled_from(list(Effect)),
        code=st.none() | st.sampled_from(list(ErrorCode)),
    ),
    max_size=12,
)
batch_strategy = st.lists(
    st.builds(
        entry,
        st.sampled_from(CALL_IDS),
        st.sampled_from(list(VerdictCode)),
        st.sampled_from(TOOLS),
    ),
    max_size=4,
)
_CODES = (
    {m.value for m in TerminationReason}
    | {m.value for m in StopKind}
    | {m.value for m in ErrorCode}
    | {m.value for m in VerdictCode}
    | {m.value for m in Effect}
    | {"approval", "clarification"}
)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


@settings(max_examples=300, deadline=None)
@given(
    receipts=receipts_strategy,
    batch=batch_strategy,
    reason=st.sampled_from(list(TerminationReason)),
    code=st.none() | st.text(max_size=20) | st.sampled_from(["tool_calls_exhausted", "cancelled"]),
    cited=st.lists(st.sampled_from(CALL_IDS), max_size=3),
)
def test_every_call_lands_in_exactly_one_list_and_the_report_holds_only_ids_and_codes(
    receipts: list[Receipt],
    batch: list[BatchEntry],
    reason: TerminationReason,
    code: str | None,
    cited: list[str],
) -> None:
    answer = AnswerPayload(text="Secret answer text sk-999.", citations=tuple(cited))
    report = stop_report(
        ended(reason, tuple(receipts), code=code, answer=answer), unfinished=tuple(batch)
    )
    latest = {r.call_id: r for r in receipts}
    unreceipted = {e.call_id for e in batch} - set(latest)

    lists = {
        ReceiptStatus.COMPLETED: report.completed,
        ReceiptStatus.FAILED: report.failed,
        ReceiptStatus.UNCERTAIN: report.uncertain,
        ReceiptStatus.ACCEPTED_PENDING: report.pending,
    }
    listed = [c.call_id for calls in lists.values() for c in calls]
    listed += ids(report.never_started)
    # Each call once; the counts add up to the receipted calls plus the proposals never run.
    assert len(listed) == len(set(listed)) == report.calls
    assert set(listed) == set(latest) | unreceipted
    # Each receipted call is where its latest receipt says.
    for status, calls in lists.items():
        assert {c.call_id for c in calls} == {i for i, r in latest.items() if r.status is status}
    assert {c.call_id for c in report.never_started} == unreceipted | {
        i for i, r in latest.items() if r.status is ReceiptStatus.DENIED
    }
    # Effects made: writes and externals done, possibly done, accepted and under way, or run to
    # a report without completing (a child run stopped half-way may have made some).
    assert set(report.effects_made) == {
        i
        for i, r in latest.items()
        if r.effect in (Effect.WRITE, Effect.EXTERNAL)
        and (
            r.status
            in (ReceiptStatus.COMPLETED, ReceiptStatus.UNCERTAIN, ReceiptStatus.ACCEPTED_PENDING)
            or r.error_code is ErrorCode.INCOMPLETE
        )
    }
    assert set(report.cited) <= set(ids(report.completed))
    assert (report.waiting_for is not None) == (report.kind is StopKind.WAITING_FOR_INPUT)
    # Nothing but codes, call ids and tool names: never the answer, never a free-text code.
    allowed = _CODES | set(CALL_IDS) | set(TOOLS)
    for text in _strings(report.model_dump(mode="json")):
        assert text in allowed or re.fullmatch(SAFE_CODE, text), text
    assert "sk-999" not in report.model_dump_json()


_receipts = st.builds(
    Receipt,
    call_id=st.text(min_size=1, max_size=12),
    tool_name=st.text(min_size=1, max_size=12),
    status=st.sampled_from(ReceiptStatus),
    error_code=st.none() | st.sampled_from(ErrorCode),
    effect=st.none() | st.sampled_from(Effect),
    approval=st.sampled_from([None, "approver", "human"]),
    approved_by=st.none() | st.text(max_size=8),
    missing_capability=st.none() | st.text(max_size=8),
)


@given(st.lists(_receipts, max_size=6, unique_by=lambda r: r.call_id))
@settings(max_examples=60, deadline=None)
def test_a_reported_call_is_what_validating_its_receipts_fields_makes(
    receipts: list[Receipt],
) -> None:
    """Each call the report lists holds its receipt's values, of the types (and with the
    fields set) validation gives them: the same report, dumped the same."""
    report = stop_report(ended(TerminationReason.FAILED, tuple(receipts)))
    listed = [
        *report.completed,
        *report.failed,
        *report.never_started,
        *report.uncertain,
        *report.pending,
    ]
    assert len(listed) == len(receipts)
    for call in listed:
        receipt = next(r for r in receipts if r.call_id == call.call_id)
        validated = ReportedCall(
            call_id=receipt.call_id,
            tool_name=receipt.tool_name,
            error_code=receipt.error_code,
            effect=receipt.effect,
            approval=receipt.approval,
            approved_by=receipt.approved_by,
            missing_capability=receipt.missing_capability,
        )
        assert call == validated
        assert call.model_fields_set == validated.model_fields_set
        assert call.model_dump(mode="json") == validated.model_dump(mode="json")
