"""What the execute phase assembles of a call that ran (its outcome, its observation, its
receipt) is exactly what validating the same values makes: nothing a reader can tell apart."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from fencepost.policy import ErrorCode, Verdict, VerdictCode
from fencepost.policy.batch import BatchEntry
from fencepost.policy.effect import Effect
from fencepost.policy.events import ToolFailed, ToolSucceeded, observation_for
from fencepost.policy.execution import ran
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.observation import Observation
from fencepost.policy.outcome import CallOutcome, receipt_for
from fencepost.policy.receipt import Receipt, ReceiptStatus
from tests.policy.factories import make_proposal, make_spec
from tests.records import assert_same_record

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


def _entry(call_id: str = "call-0001") -> BatchEntry:
    proposal = make_proposal({"query": "q"}, call_id=call_id)
    return BatchEntry(
        proposal=proposal,
        verdict=Verdict(
            call_id=call_id,
            tool_name=proposal.tool_name,
            fingerprint=proposal_fingerprint(proposal.tool_name, proposal.arguments),
            code=VerdictCode.ALLOWED,
        ),
    )


@given(result=json_values, attempt=st.integers(1, 5))
@pytest.mark.parametrize("effect", [Effect.READ, Effect.WRITE])
def test_a_plain_results_outcome_is_what_validation_makes(
    result: Any, attempt: int, effect: Effect
) -> None:
    spec = make_spec(effect=effect, evidence_for=("upload",))
    made = ran(_entry(), spec, attempt, value=result)
    validated = CallOutcome(
        event=ToolSucceeded(call_id="call-0001", tool_name=spec.name, result=made.event.result),
        status=ReceiptStatus.COMPLETED,
        attempts=attempt,
        effect=spec.effect,
        task_id=None,
        code=None,
        completes=None,
        evidence_for=spec.evidence_for,
    )
    assert_same_record(made, validated)
    assert_same_record(made.event, validated.event)


@given(result=json_values, sequence=st.integers(0, 10**6), step=st.integers(0, 10**6))
def test_a_results_observation_is_what_validation_makes(
    result: Any, sequence: int, step: int
) -> None:
    event = ToolSucceeded(call_id="call-0001", tool_name="search_logs", result=result)
    validated = Observation(
        sequence=sequence,
        step=step,
        call_id="call-0001",
        tool_name="search_logs",
        kind="tool_result",
        result=event.result,
    )
    assert_same_record(observation_for(event, sequence, step=step), validated)


@pytest.mark.parametrize("code", list(ErrorCode))
def test_a_failures_observation_is_what_validation_makes(code: ErrorCode) -> None:
    event = ToolFailed(call_id="c-1", tool_name="t", error_code=code, retryable=True)
    validated = Observation(
        sequence=3,
        step=2,
        call_id="c-1",
        tool_name="t",
        kind="tool_error",
        error_code=code,
        retryable=True,
    )
    assert_same_record(observation_for(event, 3, step=2), validated)


def test_an_observation_at_no_position_is_refused_by_validation() -> None:
    event = ToolSucceeded(call_id="c-1", tool_name="t", result=1)
    with pytest.raises(ValueError):
        observation_for(event, -1, step=0)


@pytest.mark.parametrize("status", list(ReceiptStatus))
@pytest.mark.parametrize("failed", [False, True])
def test_a_receipt_is_what_validation_makes(status: ReceiptStatus, failed: bool) -> None:
    event: ToolSucceeded | ToolFailed = (
        ToolFailed(call_id="c-1", tool_name="t", error_code=ErrorCode.TIMEOUT)
        if failed
        else ToolSucceeded(call_id="c-1", tool_name="t", result={"a": 1})
    )
    outcome = CallOutcome(
        event=event,
        status=status,
        attempts=2,
        effect=Effect.WRITE,
        approval="human",
        approved_by="boss",
        scope_id="scope-1",
        rule="r",
    )
    code = ErrorCode.TIMEOUT if failed else None
    if code is None and status is ReceiptStatus.FAILED:
        code = ErrorCode.INCOMPLETE
    validated = Receipt(
        call_id="c-1",
        tool_name="t",
        status=status,
        error_code=code,
        attempts=2,
        effect=Effect.WRITE,
        task_id=None,
        approval="human",
        scope_id="scope-1",
        approved_by="boss",
        rule="r",
        missing_capability=None,
        provenance=None,
    )
    assert_same_record(receipt_for(outcome), validated)


class _Text(str):
    """Text that claims to equal anything: a tool's own str subclass."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


class _Mapping(dict[str, Any]):
    pass


class _DumpsItsOwn(BaseModel):
    """A tool's pydantic result whose dump is its own classes, not JSON data."""

    def model_dump(self, **_: Any) -> Any:  # type: ignore[override]
        return _Mapping(note=_Text("text"), items=[_Text("a"), _Mapping(k=_Text("v"))])


def _kinds(value: Any) -> Any:
    if isinstance(value, dict):
        return (type(value), {(type(k), k): _kinds(v) for k, v in value.items()})
    if isinstance(value, list):
        return (type(value), [_kinds(v) for v in value])
    return (type(value), value)


def test_a_pydantic_results_outcome_holds_plain_json_data() -> None:
    made = ran(_entry(), make_spec(), 1, value=_DumpsItsOwn())
    plain = {"note": "text", "items": ["a", {"k": "v"}]}
    assert _kinds(made.event.result) == _kinds(plain)
    assert_same_record(
        observation_for(made.event, 0),
        observation_for(
            ToolSucceeded(call_id="call-0001", tool_name=made.event.tool_name, result=plain), 0
        ),
    )
