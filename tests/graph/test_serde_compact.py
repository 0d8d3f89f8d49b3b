"""fencepost's serializer writes its records without the fields at their default, in LangGraph's
own format: what it writes reads back the same, with fencepost's reader and with LangGraph's, and
a checkpoint written with every field (as before) still reads the same.

Run under ``LANGGRAPH_STRICT_MSGPACK=true`` (``make test`` sets it).
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from fencepost.graph.serde import _LAYOUTS, fencepost_serializer, serializer_allowlist
from fencepost.policy import (
    AgentState,
    Effect,
    Observation,
    Phase,
    Receipt,
    ReceiptStatus,
    RuntimeBudget,
    StepManifest,
    VerdictCode,
)
from tests.policy.test_state_roundtrip import _assert_same_types, full_state, mid_run_state


def every_field_serializer() -> JsonPlusSerializer:
    """LangGraph's serializer with fencepost's allowlist: every field of a record written, as
    fencepost wrote checkpoints before."""
    return JsonPlusSerializer(allowed_msgpack_modules=tuple(serializer_allowlist()))


STATES = pytest.mark.parametrize(
    "state", [mid_run_state(), full_state()], ids=["mid_run", "terminal"]
)


@STATES
def test_a_compact_checkpoint_reads_back_the_same_state(state: AgentState) -> None:
    serde = fencepost_serializer()
    written = serde.dumps_typed(state)
    assert len(written[1]) < len(every_field_serializer().dumps_typed(state)[1])
    _assert_same_types(serde.loads_typed(written), state)


@STATES
def test_a_checkpoint_written_with_every_field_still_reads_the_same(state: AgentState) -> None:
    old = every_field_serializer().dumps_typed(state)
    _assert_same_types(fencepost_serializer().loads_typed(old), state)


@STATES
def test_a_compact_checkpoint_reads_the_same_with_langgraphs_own_serializer(
    state: AgentState,
) -> None:
    written = fencepost_serializer().dumps_typed(state)
    _assert_same_types(every_field_serializer().loads_typed(written), state)


def test_records_at_their_defaults_and_enum_fields_read_back_exactly() -> None:
    serde = fencepost_serializer()
    records: list[Any] = [
        StepManifest(
            run_id="run-1",
            step=0,
            phase=Phase.DECIDE,
            steps_remaining=1,
            tool_calls_remaining=0,
            outcome="decided",
        ),
        StepManifest(
            run_id="run-1",
            step=2,
            phase=Phase.EXECUTE,
            effect=Effect.WRITE,
            verdict=VerdictCode.ALLOWED,
            steps_remaining=0,
            tool_calls_remaining=3,
            tokens_used=7,
            outcome="success",
            code="x",
        ),
        Receipt(call_id="call-0001", tool_name="t", status=ReceiptStatus.COMPLETED),
        Receipt(
            call_id="call-0002",
            tool_name="t",
            status=ReceiptStatus.UNCERTAIN,
            attempts=2,
            effect=Effect.EXTERNAL,
        ),
        Observation(sequence=0, call_id="call-0001", tool_name="t", kind="tool_result"),
        RuntimeBudget(steps_remaining=1, tool_calls_remaining=1, cost_used=0.5),
    ]
    for record in records:
        back = serde.loads_typed(serde.dumps_typed(record))
        assert back == record
        assert type(back) is type(record)
        for name in type(record).model_fields:
            assert type(getattr(back, name)) is type(getattr(record, name)), name
    # An enum that is a channel's whole value (the phase) is no field that validates it.
    assert type(serde.loads_typed(serde.dumps_typed(Phase.DECIDE))) is Phase


# A field left out at its default is read back as the default the reader knows: changing one of
# these changes what every checkpoint already written says. Change it only with a migration.
_DEFAULTS_IN_THE_FORMAT: dict[str, dict[str, Any]] = {
    "AgentState": {
        "tenant_id": None,
        "principal_id": None,
        "phase": Phase.OBSERVE,
        "step": 0,
        "observations": (),
        "proposals": (),
        "batch": (),
        "receipts": (),
        "fingerprints": {},
        "answered": {},
        "evidence": {},
        "final_answer": None,
        "termination": None,
        "last_error_code": None,
        "manifests": (),
        "open_tasks": (),
        "repairs": 0,
        "repair_notes": (),
        "model_failures": 0,
        "stop": None,
        "report": None,
    },
    "RuntimeBudget": {
        "tokens_remaining": None,
        "cost_remaining": None,
        "mutations_remaining": None,
        "steps_used": 0,
        "tool_calls_used": 0,
        "tokens_used": 0,
        "cost_used": 0.0,
        "mutations_used": 0,
    },
    "Observation": {"step": 0, "result": None, "error_code": None, "retryable": False},
    "AnswerPayload": {"citations": ()},
    "ToolProposal": {"depends_on": ()},
    "ToolBatch": {"kind": "batch"},
    "Verdict": {"problems": (), "exhausted_axis": None, "seal": None, "approval": None},
    "Receipt": {
        "error_code": None,
        "attempts": 1,
        "effect": None,
        "task_id": None,
        "completed_by": None,
        "approval": None,
        "rule": None,
    },
    "StopRequest": {"answer": None, "error_code": None},
    "StopReport": {
        # Optional for a paused run's report, which run_output derives and nothing stores.
        "reason": None,
        "error_code": None,
        "completed": (),
        "failed": (),
        "never_started": (),
        "uncertain": (),
        "pending": (),
        "effects_made": (),
        "cited": (),
        "waiting_for": None,
    },
    "ReportedCall": {"error_code": None, "verdict": None, "effect": None},
    "Waiting": {"calls": ()},
    "StepManifest": {
        "decision_kind": None,
        "tool_name": None,
        "effect": None,
        "verdict": None,
        "tokens_used": 0,
        "deadline_remaining_ms": None,
        "code": None,
        "input_tokens": None,
        "output_tokens": None,
        "approval": None,
    },
}


def test_the_defaults_a_compact_checkpoint_leaves_out_are_the_ones_its_format_names() -> None:
    left_out = {
        cls.__name__: {name: default for name, optional, default, _ in layout if optional}
        for cls, layout in _LAYOUTS.items()
    }
    assert {k: v for k, v in left_out.items() if v} == _DEFAULTS_IN_THE_FORMAT
    for name, defaults in _DEFAULTS_IN_THE_FORMAT.items():
        for field, default in defaults.items():
            held = next(c for c in _LAYOUTS if c.__name__ == name).model_fields[field]
            assert type(held.get_default(call_default_factory=True)) is type(default)
