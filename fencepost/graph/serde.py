"""The checkpoint serializer allowlist for fencepost's types.

Under ``LANGGRAPH_STRICT_MSGPACK=true`` LangGraph only revives types it was told about; an
unregistered type would come back as a plain dict. Every value type that fencepost keeps in a
checkpoint is listed here, and :func:`fencepost_serializer` returns a serializer that knows them.
"""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import BaseModel

from fencepost import policy
from fencepost.graph.state import StartRequest

_CHECKPOINTED: tuple[type[Any], ...] = (
    StartRequest,
    policy.AgentState,
    policy.RuntimeBudget,
    policy.Observation,
    policy.AnswerPayload,
    policy.ToolProposal,
    policy.FinalProposal,
    policy.AbstainProposal,
    policy.ToolBatch,
    policy.Verdict,
    policy.BatchEntry,
    policy.Receipt,
    policy.StopRequest,
    policy.StopReport,
    policy.ReportedCall,
    policy.Waiting,
    policy.StepManifest,
    policy.Deadline,
    policy.Phase,
    policy.TerminationReason,
    policy.VerdictCode,
    policy.ReceiptStatus,
    policy.ErrorCode,
    policy.Effect,
    policy.BudgetAxis,
    policy.StopKind,
)


# Where types lived in checkpoints written by earlier versions (still importable from there).
_MOVED = (("fencepost.policy.tool", "Effect"),)


def serializer_allowlist() -> frozenset[tuple[str, str]]:
    """``(module, name)`` of every fencepost type that may appear in a checkpoint."""
    return frozenset((cls.__module__, cls.__name__) for cls in _CHECKPOINTED) | frozenset(_MOVED)


def fencepost_serializer(base: JsonPlusSerializer | None = None) -> JsonPlusSerializer:
    """A LangGraph serializer that revives fencepost's types (strict msgpack or not)."""
    if base is None:
        # An explicit allowlist, strict mode or not: LangGraph's permissive default would revive
        # fencepost's types with an "unregistered type" warning each.
        return JsonPlusSerializer(allowed_msgpack_modules=tuple(serializer_allowlist()))
    return base.with_msgpack_allowlist(serializer_allowlist())


def registered(cls: type[BaseModel]) -> bool:
    """Whether ``cls`` is on the allowlist (used by tests to pin that nothing was forgotten)."""
    return (cls.__module__, cls.__name__) in serializer_allowlist()
