"""A run ends once, through terminate, and a final answer cites only what was observed."""

from __future__ import annotations

import pytest

from fencepost.policy import (
    AgentState,
    AnswerPayload,
    ErrorCode,
    MissingCitation,
    Phase,
    TerminalStateError,
    TerminationReason,
    ToolFailed,
    ToolSucceeded,
    UnsupportedCitation,
    Verdict,
    VerdictCode,
    proposal_fingerprint,
    reduce_tool_events,
    terminate,
    validate_final_answer,
)
from fencepost.policy.batch import BatchEntry
from tests.policy.factories import make_proposal, make_state


def test_terminal_state_cannot_terminate_twice() -> None:
    done = terminate(make_state(), TerminationReason.COMPLETED)
    with pytest.raises(RuntimeError, match="already terminal"):
        terminate(done, TerminationReason.FAILED)


@pytest.mark.parametrize("reason", list(TerminationReason))
def test_every_reason_ends_the_run_exactly_once(reason: TerminationReason) -> None:
    done = terminate(make_state(), reason)
    assert done.is_terminal
    assert done.phase is Phase.TERMINAL
    assert done.termination is reason
    with pytest.raises(TerminalStateError):
        terminate(done, reason)


def test_terminate_records_answer_and_error_code_and_drops_pending_calls() -> None:
    proposal = make_proposal()
    verdict = Verdict(
        call_id=proposal.call_id,
        tool_name=proposal.tool_name,
        fingerprint=proposal_fingerprint(proposal.tool_name, proposal.arguments),
        code=VerdictCode.ALLOWED,
    )
    state = make_state(batch=(BatchEntry(proposal=proposal, verdict=verdict),))
    answer = AnswerPayload(text="It was a 500.", citations=())
    done = terminate(state, TerminationReason.COMPLETED, answer=answer, error_code="none")
    assert done.final_answer == answer
    assert done.last_error_code == "none"
    assert done.batch == ()
    assert not state.is_terminal
    assert state.pending == (make_proposal(),)


def test_terminal_state_error_is_a_runtime_error() -> None:
    assert issubclass(TerminalStateError, RuntimeError)


def _observed() -> AgentState:
    return reduce_tool_events(
        make_state(),
        (
            ToolSucceeded(call_id="call-0001", tool_name="search_logs", result={"hits": 1}),
            ToolFailed(call_id="call-0002", tool_name="search_logs", error_code=ErrorCode.TIMEOUT),
        ),
    )


def test_final_answer_may_cite_observed_results() -> None:
    answer = AnswerPayload(text="One hit.", citations=("call-0001",))
    assert validate_final_answer(answer, _observed()) is answer


@pytest.mark.parametrize("citation", ["call-0002", "call-9999", ""])
def test_final_answer_citing_unobserved_or_failed_calls_is_rejected(citation: str) -> None:
    answer = AnswerPayload(text="Trust me.", citations=("call-0001", citation))
    with pytest.raises(UnsupportedCitation):
        validate_final_answer(answer, _observed())


def test_missing_citations_are_rejected_only_when_required() -> None:
    answer = AnswerPayload(text="No sources.")
    assert validate_final_answer(answer, _observed()) is answer
    with pytest.raises(MissingCitation):
        validate_final_answer(answer, _observed(), require_citations=True)


def test_duplicate_citations_are_collapsed_in_order() -> None:
    answer = AnswerPayload(text="x", citations=("b", "a", "b"))
    assert answer.citations == ("b", "a")


def test_a_completed_stop_is_verified_again_at_the_end_as_a_final_answer_would_be() -> None:
    from fencepost.policy.decide import verified_stop
    from fencepost.policy.state import StopRequest

    def completed(answer: AnswerPayload | None) -> StopRequest:
        return StopRequest(reason=TerminationReason.COMPLETED, answer=answer)

    observed = _observed()
    good = completed(AnswerPayload(text="One hit.", citations=("call-0001",)))
    assert verified_stop(observed, good, require_citations=True) is good
    for ending, code, required in (
        (completed(None), "malformed_decision", False),
        (
            completed(AnswerPayload(text="x", citations=("call-0002",))),
            "unsupported_citation",
            False,
        ),
        (completed(AnswerPayload(text="x")), "missing_citation", True),
    ):
        verified = verified_stop(observed, ending, require_citations=required)
        assert (verified.reason, verified.error_code, verified.answer) == (
            TerminationReason.INVALID_PROPOSAL,
            code,
            None,
        )
    # Accepted work still pending: the answer is not taken as done, however well it cites.
    from fencepost.policy import Receipt, ReceiptStatus

    accepted = Receipt(
        call_id="call-0003",
        tool_name="upload_document",
        status=ReceiptStatus.ACCEPTED_PENDING,
        task_id="task-1",
    )
    pending = observed.model_copy(update={"receipts": (*observed.receipts, accepted)})
    verified = verified_stop(pending, good, require_citations=False)
    assert (verified.reason, verified.error_code) == (
        TerminationReason.INVALID_PROPOSAL,
        "tasks_pending",
    )
    other = StopRequest(reason=TerminationReason.POLICY_DENIED, error_code="x")
    assert verified_stop(observed, other, require_citations=True) is other
