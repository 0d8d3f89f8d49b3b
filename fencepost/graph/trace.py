"""The trace: the step manifests a node records, kept in state and streamed (``custom`` mode).

A manifest names the run, the step, the phase, the budget and time left and the outcome, never a
prompt, an argument or a result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langgraph.runtime import Runtime
from pydantic_core import to_jsonable_python

from fencepost.graph.events import EVENTS
from fencepost.graph.record import plain_ahead
from fencepost.graph.settings import LoopConfig
from fencepost.policy import AgentState, Phase, StepManifest
from fencepost.policy.context import RunContext
from fencepost.policy.manifest import MANIFEST_DEFAULTS, manifest_base, step_manifest


def manifest(
    state: AgentState,
    cfg: LoopConfig,
    ctx: RunContext | None,
    *,
    phase: Phase,
    outcome: Any,
    **fields: Any,
) -> StepManifest:
    """One trace record: what happened at this point, with the budget left, and no payload text."""
    return StepManifest(**_where(state, cfg, ctx, phase, outcome), **fields)


def _where(
    state: AgentState, cfg: LoopConfig, ctx: RunContext | None, phase: Phase, outcome: Any
) -> dict[str, Any]:
    """The fields every manifest has: the run, the step, the budget and time left, the outcome."""
    budget, deadline = state.budget, ctx.deadline if ctx is not None else None
    return {
        "run_id": state.run_id,
        "step": state.step,
        "phase": phase,
        "steps_remaining": budget.steps_remaining,
        "tool_calls_remaining": budget.tool_calls_remaining,
        "tokens_used": budget.tokens_used,
        "deadline_remaining_ms": deadline.remaining_ms(clock=cfg.clock) if deadline else None,
        "outcome": outcome,
    }


_MANIFEST_SHOWN: dict[str, Any] = {
    name: to_jsonable_python(default) for name, default in MANIFEST_DEFAULTS.items()
}
"""A manifest's fields in declared order, each at its default in JSON form (the required ones
are in every plain form, and take their place here)."""


def checked_manifest(
    state: AgentState,
    cfg: LoopConfig,
    ctx: RunContext | None,
    *,
    phase: Phase,
    outcome: Any,
    **fields: Any,
) -> StepManifest:
    """:func:`manifest` for ``fields`` that are already checked values of their fields (the
    gate's own codes, a registered tool's effect, a judged usage report): the record is
    assembled, as validation would make it, without validating again
    (``policy.manifest.step_manifest``; a state value of another type is validated, and
    refused)."""
    deadline = ctx.deadline if ctx is not None else None
    remaining = deadline.remaining_ms(clock=cfg.clock) if deadline else None
    base = manifest_base(state.run_id, state.step, state.budget, phase, remaining)
    return step_manifest(base, outcome, fields)


def recorded(
    state: AgentState, runtime: Runtime[Any], manifests: Sequence[StepManifest]
) -> AgentState:
    """Stream ``manifests`` (custom stream mode) and keep them in state; the loop's event
    stream (:mod:`fencepost.graph.events`: the agent span, the run's log lines) hears them too."""
    writer = runtime.stream_writer
    for m in manifests:
        # Its plain form, the step's write of it too, with the fields it leaves at their
        # default: what ``model_dump(mode="json")`` makes, in the fields' order.
        chunk = {"fencepost": "manifest", **_MANIFEST_SHOWN, **plain_ahead(m)}
        provenance = chunk["provenance"]
        if provenance:
            # The one field holding containers: the consumer's own copy, as the chunk is, so
            # an edit made to it in place never reaches the write (a checkpoint, a next step).
            chunk["provenance"] = {name: list(labels) for name, labels in provenance.items()}
        writer(chunk)
    EVENTS.recorded(state, manifests)
    return state.model_copy(update={"manifests": state.manifests + tuple(manifests)})
