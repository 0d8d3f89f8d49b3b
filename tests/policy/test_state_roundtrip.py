"""AgentState survives JSON and LangGraph's strict-msgpack checkpoint serializer unchanged.

Run under ``LANGGRAPH_STRICT_MSGPACK=true`` (``make test`` sets it; LangGraph reads it at import).
"""

from __future__ import annotations

import types
from enum import Enum
from typing import Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError

from fencepost.graph.serde import fencepost_serializer, registered
from fencepost.policy import (
    AgentState,
    AnswerPayload,
    Effect,
    ErrorCode,
    Observation,
    Phase,
    Receipt,
    ReceiptStatus,
    RuntimeBudget,
    StepManifest,
    TerminationReason,
    ToolProposal,
    Verdict,
    VerdictCode,
    proposal_fingerprint,
    terminate,
)
from fencepost.policy._model import Frozen
from fencepost.policy.batch import BatchEntry


def mid_run_state() -> AgentState:
    """A run between gate and execute: a pending proposal and its verdict."""
    args: dict[str, Any] = {"query": "checkout 500", "window": {"service": "api", "tags": [1, 2.5]}}
    fingerprint = proposal_fingerprint("search_logs", args)
    state = AgentState(
        run_id="run-0001",
        tenant_id="tenant-a",
        principal_id="user-1",
        question="Why did checkout fail?",
        phase=Phase.REDUCE,
        budget=RuntimeBudget(
            steps_remaining=4,
            steps_used=2,
            tool_calls_remaining=1,
            tool_calls_used=2,
            tokens_remaining=900,
            tokens_used=100,
            cost_remaining=0.75,
            cost_used=0.25,
            mutations_remaining=0,
            mutations_used=1,
        ),
        step=2,
        observations=(
            Observation(
                sequence=0,
                call_id="call-0001",
                tool_name="search_logs",
                kind="tool_result",
                result={"hits": [{"id": 1, "msg": "500 at 09:00", "score": 0.5}], "more": None},
            ),
            Observation(
                sequence=1,
                call_id="call-0002",
                tool_name="create_ticket",
                kind="tool_error",
                error_code=ErrorCode.TIMEOUT,
                retryable=True,
            ),
        ),
        batch=(
            BatchEntry(
                proposal=ToolProposal(call_id="call-0003", tool_name="search_logs", arguments=args),
                verdict=Verdict(
                    call_id="call-0003",
                    tool_name="search_logs",
                    fingerprint=fingerprint,
                    code=VerdictCode.ALLOWED,
                ),
            ),
        ),
        receipts=(
            Receipt(call_id="call-0001", tool_name="search_logs", status=ReceiptStatus.COMPLETED),
            Receipt(
                call_id="call-0002",
                tool_name="create_ticket",
                status=ReceiptStatus.UNCERTAIN,
                error_code=ErrorCode.EXECUTION_UNCERTAIN,
                attempts=2,
            ),
        ),
        fingerprints={fingerprint: 2},
        manifests=(
            StepManifest(
                run_id="run-0001",
                step=1,
                phase=Phase.EXECUTE,
                decision_kind="tool",
                tool_name="create_ticket",
                effect=Effect.WRITE,
                verdict=VerdictCode.ALLOWED,
                steps_remaining=5,
                tool_calls_remaining=2,
                tokens_used=40,
                deadline_remaining_ms=820,
                outcome="uncertain",
                code="execution_uncertain",
                input_tokens=30,
                output_tokens=10,
            ),
        ),
    )
    return state


def full_state() -> AgentState:
    """The mid-run state, ended: final answer and termination recorded."""
    return terminate(
        mid_run_state(),
        TerminationReason.COMPLETED,
        answer=AnswerPayload(text="A 500 at 09:00.", citations=("call-0001",)),
        error_code="none",
    )


def _assert_same_types(back: AgentState, state: AgentState) -> None:
    assert isinstance(back, AgentState)
    assert type(back.phase) is Phase
    assert isinstance(back.budget, RuntimeBudget)
    assert isinstance(back.observations, tuple)
    assert all(isinstance(o, Observation) for o in back.observations)
    assert type(back.observations[1].error_code) is ErrorCode
    assert all(isinstance(e, BatchEntry) for e in back.batch)
    assert all(isinstance(p, ToolProposal) for p in back.pending)
    assert all(type(e.verdict.code) is VerdictCode for e in back.batch)
    assert type(back.receipts[1].status) is ReceiptStatus
    assert type(back.manifests[0].effect) is Effect
    if state.is_terminal:
        assert type(back.termination) is TerminationReason
        assert isinstance(back.final_answer, AnswerPayload)
        assert isinstance(back.final_answer.citations, tuple)
    assert back == state


STATES = pytest.mark.parametrize(
    "state", [mid_run_state(), full_state()], ids=["mid_run", "terminal"]
)


@STATES
def test_state_round_trips_through_json_mode_dump_unchanged(state: AgentState) -> None:
    back = AgentState.model_validate(state.model_dump(mode="json"))
    _assert_same_types(back, state)


@STATES
def test_state_round_trips_through_json_text_unchanged(state: AgentState) -> None:
    back = AgentState.model_validate_json(state.model_dump_json())
    _assert_same_types(back, state)


@STATES
def test_state_round_trips_through_the_checkpoint_serializer(state: AgentState) -> None:
    serde = fencepost_serializer()
    back = serde.loads_typed(serde.dumps_typed(state))
    _assert_same_types(back, state)


class NotOnTheAllowlist(Frozen):
    value: int


def test_strict_msgpack_is_on_so_an_unlisted_type_comes_back_as_a_dict() -> None:
    # The control for the test above: it only proves something when unlisted types are blocked.
    serde = fencepost_serializer()
    back = serde.loads_typed(serde.dumps_typed(NotOnTheAllowlist(value=1)))
    assert not isinstance(back, NotOnTheAllowlist), (
        "run the suite with LANGGRAPH_STRICT_MSGPACK=true (make test sets it)"
    )


def _value_types(annotation: Any) -> set[type]:
    """Every pydantic model and enum reachable from ``annotation``."""
    found: set[type] = set()
    stack = [annotation]
    while stack:
        tp = stack.pop()
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp not in found:
                found.add(tp)
                stack.extend(field.annotation for field in tp.model_fields.values())
        elif isinstance(tp, type) and issubclass(tp, Enum):
            found.add(tp)
        elif get_origin(tp) is not None or isinstance(tp, types.UnionType):
            stack.extend(get_args(tp))
    return found


def test_every_value_type_in_the_state_is_on_the_serializer_allowlist() -> None:
    reachable = _value_types(AgentState)
    assert {AgentState, Observation, Verdict, Receipt, StepManifest} <= reachable
    missing = sorted(cls.__qualname__ for cls in reachable if not registered(cls))
    assert missing == []


def test_state_is_frozen_and_refuses_unknown_fields() -> None:
    state = full_state()
    with pytest.raises(ValidationError):
        state.phase = Phase.DECIDE  # type: ignore[misc]
    with pytest.raises(ValidationError):
        AgentState.model_validate({**state.model_dump(mode="json"), "chain_of_thought": "..."})


def test_state_rejects_coerced_scalars_on_load() -> None:
    dumped = full_state().model_dump(mode="json")
    with pytest.raises(ValidationError):
        AgentState.model_validate({**dumped, "step": "2"})


def test_union_helper_sees_through_optional_and_tuples() -> None:
    # Guards the allowlist test above against silently walking nothing.
    assert _value_types(Union[tuple[Observation, ...], None]) == {Observation, ErrorCode}  # noqa: UP007
