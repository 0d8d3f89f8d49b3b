"""Hostile review of fc333e1 (``_Compact``: fencepost's records written without the fields at
their default, enum fields as their values) and 8fecd5b (a ToolMessage names ``status`` only
for an error).

Seats: a caller or a decision model handing over records that hold a subclass of a contract
record (a proposal with a field of the application's own); another version (LangGraph's
serializer with the allowlist, as the previous release wrote and read checkpoints).

Run under ``LANGGRAPH_STRICT_MSGPACK=true`` (``make test`` sets it).
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Command

import fencepost as fp
from fencepost.graph.record import plain
from fencepost.graph.state import StartRequest
from fencepost.policy import (
    AnswerPayload,
    BatchEntry,
    ReportedCall,
    RuntimeBudget,
    StopKind,
    StopReport,
    StopRequest,
    TerminationReason,
    ToolProposal,
    Verdict,
    VerdictCode,
)
from tests.graph.kit import budget, call, context, final_citing_last, harness, thread


class ReasonedProposal(ToolProposal):
    """An application's proposal with a field of its own (its model's stated reason)."""

    why: str = ""


class ConfidentAnswer(AnswerPayload):
    confidence: float = 0.5


class TrackedBudget(RuntimeBudget):
    owner: str = "team-a"


class NotedCall(ReportedCall):
    note: str = ""


def _proposal() -> ReasonedProposal:
    return ReasonedProposal(
        call_id="call-0001", tool_name="write_note", arguments={"note": "hi"}, why="asked to"
    )


_HOLDING_A_SUBCLASS: list[Any] = [
    BatchEntry(
        proposal=_proposal(),
        verdict=Verdict(
            call_id="call-0001",
            tool_name="write_note",
            fingerprint="f" * 64,
            code=VerdictCode.APPROVAL_PENDING,
        ),
    ),
    StopRequest(
        reason=TerminationReason.COMPLETED, answer=ConfidentAnswer(text="done", confidence=0.9)
    ),
    StartRequest(
        run_id="run-1",
        question="q",
        budget=TrackedBudget(steps_remaining=3, tool_calls_remaining=2),
    ),
    StopReport(
        kind=StopKind.COMPLETED,
        reason=TerminationReason.COMPLETED,
        completed=(NotedCall(call_id="call-0001", tool_name="t", note="n"),),
    ),
]


def _types(value: Any) -> Any:
    if hasattr(value, "__dict__") and hasattr(type(value), "model_fields"):
        return (type(value), {k: _types(v) for k, v in value.__dict__.items()})
    if isinstance(value, tuple | list):
        return [_types(v) for v in value]
    return type(value)


@pytest.mark.parametrize("record", _HOLDING_A_SUBCLASS, ids=lambda r: type(r).__name__)
def test_a_record_holding_a_subclass_is_stored_as_the_type_its_field_declares(
    record: Any,
) -> None:
    """A contract record may hold an instance of a subclass of the record a field names (strict
    pydantic accepts one). Its plain form, what a checkpoint stores, holds the fields the
    declared type has, so it reads back as that type, never half-read."""
    serde = JsonPlusSerializer()
    back = type(record).model_validate(serde.loads_typed(serde.dumps_typed(plain(record))))
    declared = type(record).model_validate(plain(record))
    assert back == declared
    assert _types(back) == _types(declared)


def test_a_decision_models_proposal_subclass_survives_an_approval_pause() -> None:
    """A decision model's own ToolProposal subclass, paused for approval and resumed from the
    checkpoint: the run ends with a terminal reason (it crashed in the approve node with
    ``'dict' object has no attribute 'code'`` when the batch entry came back half-read)."""
    h = harness(
        [_proposal(), final_citing_last],
        approval="interrupt",
        checkpointer=InMemorySaver(),
    )
    config, ctx = thread(), context()
    paused = h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    assert "__interrupt__" in paused
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.log == [("write_note", {"note": "hi"}, "call-0001")]


def test_a_batch_entry_a_checkpoint_half_reads_is_refused_not_acted_on() -> None:
    """Pre-existing, with either serializer: a caller writes a batch entry made with
    ``model_construct`` whose verdict has a field of the wrong type. The batch channel checks
    its entries by type alone, so the entry is kept; the checkpoint revives it with
    ``model_construct`` (its proposal and verdict as dicts) and the approve node crashed on
    ``'dict' object has no attribute 'code'``. A half-read entry is an invalid state: the run
    ends typed, and nothing runs."""
    h, config, ctx = _paused_with_a_forged_verdict(problems=5)
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.report is not None and state.report.error_code == "invalid_state"
    assert h.calls.log == []


def test_a_decision_models_proposal_subclass_runs_in_the_step_it_was_proposed() -> None:
    """A batch entry's items are checked field by field when a node loads state; the proposal a
    field holds may be of a subclass, as pydantic takes it, so a decision model's own proposal
    class (a read, run without a pause) is not refused as an invalid state."""
    h = harness(
        [
            ReasonedProposal(
                call_id="call-0001", tool_name="search_logs", arguments={"query": "q"}
            ),
            final_citing_last,
        ],
        checkpointer=InMemorySaver(),
    )
    state = fp.run_output(h.graph.invoke(fp.start("q", budget()), thread(), context=context()))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert [name for name, _, _ in h.calls.log] == ["search_logs"]


def _paused_with_a_forged_verdict(**fields: Any) -> tuple[Any, dict[str, Any], fp.RunContext]:
    """A run paused for approval of a write, whose batch entry a caller then rewrote with
    ``update_state``: its verdict made with ``model_construct``, ``fields`` changed."""
    h = harness(
        [call("write_note", 1, note="hi"), final_citing_last],
        approval="interrupt",
        checkpointer=InMemorySaver(),
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    entry = fp.run_output(h.graph.get_state(config).values).batch[0]
    verdict = Verdict.model_construct(**{**entry.verdict.__dict__, **fields})
    forged = BatchEntry.model_construct(proposal=entry.proposal, verdict=verdict)
    h.graph.update_state(config, {"run": {"batch": (forged,)}})
    return h, config, ctx
