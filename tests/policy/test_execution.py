"""The execute phase's decisions: what a call's receipt says when it does not run, when a call
of a batch may start, what is refunded, and what the trace records of a call that ran."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencepost.policy import ErrorCode, ReceiptStatus, StopRequest, TerminationReason
from fencepost.policy.batch import BatchEntry
from fencepost.policy.execution import (
    dependency_failed,
    executed_record,
    may_start,
    out_of_budget,
    ran,
    refunded_when_not_started,
    refused_at_claim,
)
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.verdict import Verdict, VerdictCode
from tests.policy.factories import make_proposal, make_spec


def _entry(call_id: str = "call-0001", depends_on: tuple[str, ...] = ()) -> BatchEntry:
    proposal = make_proposal({"query": "q"}, call_id=call_id).model_copy(
        update={"depends_on": depends_on}
    )
    return BatchEntry(
        proposal=proposal,
        verdict=Verdict(
            call_id=call_id,
            tool_name=proposal.tool_name,
            fingerprint=proposal_fingerprint(proposal.tool_name, proposal.arguments),
            code=VerdictCode.ALLOWED,
        ),
    )


def test_a_first_attempt_the_budget_cannot_cover_never_started_and_is_denied() -> None:
    outcome = out_of_budget(_entry(), make_spec(), attempt=1)
    assert outcome.status is ReceiptStatus.DENIED and outcome.attempts == 0
    assert outcome.event.error_code is ErrorCode.BUDGET_EXHAUSTED  # type: ignore[union-attr]


@given(attempt=st.integers(2, 20))
def test_a_retry_the_budget_cannot_cover_is_uncertain_never_denied(attempt: int) -> None:
    # The attempt before it started and crashed: it may have had its effect.
    outcome = out_of_budget(_entry(), make_spec(), attempt=attempt)
    assert outcome.status is ReceiptStatus.UNCERTAIN
    assert outcome.attempts == attempt - 1


def test_a_call_whose_dependency_produced_nothing_never_starts_and_is_refunded() -> None:
    failed = dependency_failed(_entry(), make_spec())
    assert failed.status is ReceiptStatus.DENIED and failed.attempts == 0
    assert failed.event.error_code is ErrorCode.DEPENDENCY_FAILED  # type: ignore[union-attr]
    assert refunded_when_not_started(failed)


def test_nothing_is_refunded_for_a_call_that_was_attempted() -> None:
    spec = make_spec()
    assert not refunded_when_not_started(ran(_entry(), spec, 1, value={"hits": []}))
    assert not refunded_when_not_started(ran(_entry(), spec, 1, error=ErrorCode.TIMEOUT))
    assert not refunded_when_not_started(out_of_budget(_entry(), spec, attempt=1))


def test_a_dependent_call_starts_only_on_its_dependencies_verified_results() -> None:
    spec = make_spec()
    done = ran(_entry("call-0001"), spec, 1, value={"hits": []})
    failed = ran(_entry("call-0001"), spec, 1, error=ErrorCode.INTERNAL_ERROR)
    dependent = _entry("call-0002", depends_on=("call-0001",))
    assert may_start(dependent, [done], [], set(), dependencies_broken=False)
    assert not may_start(dependent, [failed], [], set(), dependencies_broken=False)
    # A batch edited since the gate into impossible dependencies starts none of them.
    assert not may_start(dependent, [done], [], set(), dependencies_broken=True)
    # A call that depends on nothing starts, however broken the rest of its batch.
    assert may_start(_entry("call-0003"), [], [], set(), dependencies_broken=True)
    # One outside the batch must be a call the ledger marks as having produced a result.
    outside = _entry("call-0004", depends_on=("call-0009",))
    assert may_start(outside, [], ["call-0009"], {"call-0009"}, dependencies_broken=False)
    assert not may_start(outside, [], ["call-0009"], set(), dependencies_broken=False)


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        (TerminationReason.CANCELLED, ErrorCode.CANCELLED),
        (TerminationReason.POLICY_DENIED, ErrorCode.PERMISSION_DENIED),
    ],
)
def test_a_call_whose_claim_was_refused_is_denied_with_why(
    reason: TerminationReason, code: ErrorCode
) -> None:
    outcome = refused_at_claim(_entry(), make_spec(), StopRequest(reason=reason))
    assert outcome.status is ReceiptStatus.DENIED and outcome.attempts == 0
    assert outcome.event.error_code is code  # type: ignore[union-attr]


def test_an_executed_calls_trace_record_says_success_error_or_uncertain() -> None:
    spec = make_spec()
    assert executed_record(ran(_entry(), spec, 1, value={"hits": []})) == ("success", "completed")
    assert executed_record(ran(_entry(), spec, 1, error=ErrorCode.NOT_FOUND)) == (
        "error",
        "not_found",
    )
    write = make_spec("write_note", effect="write")  # type: ignore[arg-type]
    cut = ran(_entry(), write, 1, error=ErrorCode.TIMEOUT, cut_off=True)
    assert executed_record(cut)[0] == "uncertain"
