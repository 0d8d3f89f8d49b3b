"""The decide phase's decisions: the final turn, which stop a model failure asks for, the retry
count after a decision, a crashed step's number, and what the trace records of a decision."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencepost.policy import (
    AbstainProposal,
    AnswerPayload,
    ErrorCode,
    FinalProposal,
    InvalidProposal,
    StopRequest,
    TerminationReason,
)
from fencepost.policy.decide import (
    after_decision,
    decision_record,
    final_turn,
    model_failure,
    step_taken,
)
from fencepost.policy.decision_model import Decided
from tests.policy.factories import make_proposal, make_state


@given(left=st.integers(0, 50), margin=st.integers(0, 5))
def test_the_last_answer_margin_steps_are_the_final_turn(left: int, margin: int) -> None:
    assert final_turn(left, margin) is (left < margin)
    assert not final_turn(left, 0)  # a margin of 0 turns it off


@pytest.mark.parametrize("passed", [False, True])
def test_a_timeout_after_the_run_deadline_is_the_deadlines(passed: bool) -> None:
    stop = model_failure(ErrorCode.TIMEOUT, run_deadline_passed=passed)
    if passed:
        assert stop.reason is TerminationReason.DEADLINE_EXCEEDED
    else:
        assert (stop.reason, stop.error_code) == (TerminationReason.FAILED, "timeout")


@pytest.mark.parametrize(
    "code", [ErrorCode.RATE_LIMITED, ErrorCode.INTERNAL_ERROR, ErrorCode.CANCELLED]
)
def test_any_other_model_failure_keeps_its_own_code_whatever_the_deadline(
    code: ErrorCode,
) -> None:
    stop = model_failure(code, run_deadline_passed=True)
    assert (stop.reason, stop.error_code) == (TerminationReason.FAILED, code.value)


def test_a_decision_starts_the_model_retry_count_again() -> None:
    failing = make_state(model_failures=2, last_error_code="rate_limited")
    after = after_decision(failing)
    assert (after.model_failures, after.last_error_code) == (0, None)
    clean = make_state()
    assert after_decision(clean) is clean


def test_a_step_number_an_earlier_attempt_held_is_skipped() -> None:
    assert step_taken(held_before=False)
    assert not step_taken(held_before=True)


def _decided(decision: object) -> Decided:
    return Decided(decision=decision)  # type: ignore[arg-type]


def test_a_decisions_trace_record_says_whether_it_stands() -> None:
    done = StopRequest(reason=TerminationReason.COMPLETED)
    refused = StopRequest(reason=TerminationReason.INVALID_PROPOSAL, error_code="missing_citation")
    final = _decided(FinalProposal(answer=AnswerPayload(text="x")))
    abstain = _decided(AbstainProposal(reason="insufficient_evidence"))
    tool = _decided(make_proposal({"query": "q"}))
    clarify = StopRequest(reason=TerminationReason.INSUFFICIENT_EVIDENCE)
    assert decision_record(final, done) == ("final", "decided", None)
    assert decision_record(final, refused) == ("final", "denied", "missing_citation")
    assert decision_record(abstain, clarify) == ("abstain", "decided", "insufficient_evidence")
    assert decision_record(tool, refused)[:2] == ("tool", "denied")
    invalid = InvalidProposal("malformed_decision")
    assert decision_record(invalid, refused)[:2] == ("invalid", "denied")
