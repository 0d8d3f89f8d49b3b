"""The reducer: tool events become ordered observations joined to proposals by call id."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from fencepost.policy import (
    ErrorCode,
    Observation,
    Phase,
    ToolFailed,
    ToolSucceeded,
    UnserializableResult,
    reduce_tool_event,
    reduce_tool_events,
    serialize_tool_result,
)
from tests.policy.factories import make_state


def test_success_becomes_a_tool_result_observation_for_its_call_id() -> None:
    state = make_state(phase=Phase.EXECUTE)
    after = reduce_tool_event(
        state, ToolSucceeded(call_id="call-0001", tool_name="search_logs", result={"hits": [1]})
    )
    assert after.phase is Phase.OBSERVE
    assert after.observations == (
        Observation(
            sequence=0,
            call_id="call-0001",
            tool_name="search_logs",
            kind="tool_result",
            result={"hits": [1]},
        ),
    )
    assert after.observations[0].is_evidence
    assert state.observations == ()


def test_failure_becomes_an_observation_with_only_the_safe_code() -> None:
    after = reduce_tool_event(
        make_state(),
        ToolFailed(
            call_id="call-0001",
            tool_name="search_logs",
            error_code=ErrorCode.RATE_LIMITED,
            retryable=True,
        ),
    )
    (observation,) = after.observations
    assert observation.kind == "tool_error"
    assert observation.error_code is ErrorCode.RATE_LIMITED
    assert observation.retryable is True
    assert observation.result is None
    assert not observation.is_evidence


def test_a_failure_event_has_no_room_for_exception_text() -> None:
    with pytest.raises(ValidationError):
        ToolFailed(
            call_id="call-0001",
            tool_name="search_logs",
            error_code=ErrorCode.INTERNAL_ERROR,
            message="Traceback ... password=hunter2",  # type: ignore[call-arg]
        )
    with pytest.raises(ValidationError):
        ToolFailed(call_id="c", tool_name="t", error_code="stack trace here")  # type: ignore[arg-type]


def test_observations_are_numbered_gap_free_after_the_existing_ones() -> None:
    state = reduce_tool_event(make_state(), ToolSucceeded(call_id="call-0001", tool_name="a_tool"))
    after = reduce_tool_events(
        state,
        (
            ToolSucceeded(call_id="call-0003", tool_name="a_tool", result=3),
            ToolFailed(call_id="call-0002", tool_name="b_tool", error_code=ErrorCode.TIMEOUT),
        ),
    )
    assert [o.sequence for o in after.observations] == [0, 1, 2]
    # Joined by call id, not by arrival position: each observation names the call it answers.
    assert [o.call_id for o in after.observations] == ["call-0001", "call-0003", "call-0002"]
    assert after.observations[1].result == 3
    assert after.observations[2].error_code is ErrorCode.TIMEOUT


def test_reducing_no_events_keeps_the_observations() -> None:
    state = reduce_tool_event(make_state(), ToolSucceeded(call_id="call-0001", tool_name="a_tool"))
    assert reduce_tool_events(state, ()).observations == state.observations


class Hit(BaseModel):
    id: int
    title: str


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"hits": [1, 2.5, None, "x", True]}, {"hits": [1, 2.5, None, "x", True]}),
        (Hit(id=1, title="a"), {"id": 1, "title": "a"}),
        ([Hit(id=1, title="a").model_dump()], [{"id": 1, "title": "a"}]),
        (None, None),
    ],
)
def test_tool_results_are_serialized_to_json_data(result: Any, expected: Any) -> None:
    assert serialize_tool_result(result) == expected


class FloatResult(BaseModel):
    score: float


@pytest.mark.parametrize(
    "result",
    [
        object(),
        {1, 2},
        {"when": object()},
        b"raw bytes",
        {"score": math.nan},
        [math.inf],
        FloatResult(score=math.nan),
    ],
)
def test_non_json_results_are_unserializable(result: Any) -> None:
    with pytest.raises(UnserializableResult) as caught:
        serialize_tool_result(result)
    assert caught.value.__cause__ is None
