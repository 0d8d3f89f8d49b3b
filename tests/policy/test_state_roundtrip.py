"""AgentState survives JSON, its plain form and LangGraph's default checkpoint serializer unchanged.

Run under ``LANGGRAPH_STRICT_MSGPACK=true`` (``make test`` sets it; LangGraph reads it at import).
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import ValidationError

from fencepost.graph.record import plain
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
def test_state_round_trips_through_its_plain_form_and_langgraphs_default_serializer(
    state: AgentState,
) -> None:
    serde = JsonPlusSerializer()
    stored = serde.dumps_typed(plain(state))
    back = AgentState.model_validate(serde.loads_typed(stored))
    _assert_same_types(back, state)


def _plain_types(value: Any) -> set[type]:
    """Every type found in a plain value, walking dicts and lists."""
    found: set[type] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        found.add(type(item))
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


@STATES
def test_the_plain_form_of_a_state_holds_only_msgpack_native_values(state: AgentState) -> None:
    assert _plain_types(plain(state)) <= {dict, list, str, int, float, bool, type(None)}


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
