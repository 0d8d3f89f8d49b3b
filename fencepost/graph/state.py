"""The graph's channels: one per AgentState field, plus the start request."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langgraph.channels.delta import DeltaChannel
from langgraph.managed import RemainingSteps

from fencepost.policy import (
    AgentState,
    AnswerPayload,
    Observation,
    Phase,
    Receipt,
    RuntimeBudget,
    StepManifest,
    StopReport,
    StopRequest,
    TerminationReason,
    ToolProposal,
)
from fencepost.policy._model import Frozen
from fencepost.policy.batch import BatchEntry


class StartRequest(Frozen):
    """The input that starts a run. Made by :func:`start`."""

    run_id: str
    question: str
    budget: RuntimeBudget


def _append(current: Sequence[Any], batches: Sequence[Sequence[Any]]) -> tuple[Any, ...]:
    """Append-only reducer for the record channels: each write is the items a node added."""
    out = tuple(current)
    for batch in batches:
        out += tuple(batch)
    return out


# Observations, receipts and manifests only ever grow. As delta channels a checkpoint stores the
# items each step added, not the whole history again: without this, serializing the growing
# tuples at every superstep was two thirds of the loop's cost (see benchmarks/).
# A full snapshot of a record every N updates makes a long run's checkpoints grow with its
# length; at LangGraph's own replay bound a step writes what it added, and a resume replays at
# most that many writes.
_SNAPSHOT_EVERY = 5000
Appended: DeltaChannel[tuple[Any, ...]] = DeltaChannel(_append, snapshot_frequency=_SNAPSHOT_EVERY)


def _count_up(current: dict[str, int] | None, batches: Sequence[dict[str, int]]) -> dict[str, int]:
    """Repeat counts per fingerprint: each write carries the counts that changed; counts only
    grow (a write cannot lower one), so a state edit cannot reset the no-progress check."""
    out = dict(current or {})
    for batch in batches:
        for key, count in batch.items():
            if count > out.get(key, 0):
                out[key] = count
    return out


Counted: DeltaChannel[dict[str, int]] = DeltaChannel(
    _count_up, dict, snapshot_frequency=_SNAPSHOT_EVERY
)


class GraphState(TypedDict, total=False):
    """LangGraph state schema: AgentState's fields as channels (validates back into AgentState)."""

    request: StartRequest
    run_id: str
    tenant_id: str | None
    principal_id: str | None
    question: str
    phase: Phase
    budget: RuntimeBudget
    step: int
    observations: Annotated[tuple[Observation, ...], Appended]
    proposals: Annotated[tuple[ToolProposal, ...], Appended]
    batch: tuple[BatchEntry, ...]
    receipts: Annotated[tuple[Receipt, ...], Appended]
    fingerprints: Annotated[dict[str, int], Counted]
    final_answer: AnswerPayload | None
    termination: TerminationReason | None
    last_error_code: str | None
    manifests: Annotated[tuple[StepManifest, ...], Appended]
    model_failures: int
    stop: StopRequest | None
    report: StopReport | None
    remaining_steps: RemainingSteps


class InputState(TypedDict):
    """What ``invoke`` takes to start a run: ``{"request": StartRequest}`` (see :func:`start`)."""

    request: StartRequest


_FIELDS = tuple(AgentState.model_fields)
_TUPLE_FIELDS = ("observations", "proposals", "batch", "receipts", "manifests")


def start(
    question: str,
    budget: RuntimeBudget | None = None,
    *,
    run_id: str | None = None,
    steps: int = 8,
    tool_calls: int = 8,
) -> InputState:
    """The input for ``invoke``/``stream`` that starts a run.

    >>> start("why is checkout slow?", RuntimeBudget(steps_remaining=6, tool_calls_remaining=3))["request"].question
    'why is checkout slow?'
    """
    return {
        "request": StartRequest(
            run_id=run_id or f"run-{uuid.uuid4().hex[:16]}",
            question=question,
            budget=budget or RuntimeBudget(steps_remaining=steps, tool_calls_remaining=tool_calls),
        )
    }


def load_state(values: dict[str, Any]) -> AgentState | None:
    """AgentState from channel values (None before a run has started on this thread).

    In-process values are already validated instances, so they are assembled without a second
    validation; anything that is not (a mapping from a foreign client) is validated in full.
    """
    if "run_id" not in values:
        return None
    data = {name: values[name] for name in _FIELDS if name in values}
    if isinstance(data.get("budget"), RuntimeBudget):
        # A checkpoint turns tuples into lists; their items are revived, validated models.
        revived = True
        for name in _TUPLE_FIELDS:
            items = data.get(name)
            if type(items) is list:
                revived = revived and not (items and isinstance(items[0], dict))
                data[name] = tuple(items)
        if revived:
            return AgentState.model_construct(**data)
    # Values that did not come back as fencepost types (a foreign client, a serializer without
    # fencepost's allowlist) are validated in full rather than half-read.
    return AgentState.model_validate(data, strict=False)


_APPENDED = frozenset({"observations", "proposals", "receipts", "manifests"})


def changed(before: AgentState | None, after: AgentState) -> dict[str, Any]:
    """The channel writes that turn ``before`` into ``after``: fields that changed, and for the
    append-only record channels only the items added."""
    if before is None:
        return {name: getattr(after, name) for name in _FIELDS}
    writes: dict[str, Any] = {}
    for name in _FIELDS:
        value = getattr(after, name)
        old = getattr(before, name)
        if value is old:
            continue
        if name == "fingerprints":
            added = {k: v for k, v in value.items() if old.get(k) != v}
            if added:
                writes[name] = added
            continue
        if name in _APPENDED:
            if len(value) < len(old) or value[: len(old)] != old:
                raise ValueError(f"{name} is append-only")
            if len(value) > len(old):
                writes[name] = value[len(old) :]
        else:
            writes[name] = value
    return writes


def require_state(values: dict[str, Any]) -> AgentState:
    """AgentState from channel values of a thread a run has started on."""
    state = load_state(values)
    if state is None:
        raise RuntimeError("no run on this thread")
    return state


def run_output(values: dict[str, Any]) -> AgentState:
    """A run's output (``invoke``'s return value or ``get_state(...).values``) as AgentState."""
    data = {name: values[name] for name in _FIELDS if name in values}
    return AgentState.model_validate(data, strict=False)
