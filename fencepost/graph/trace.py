"""The trace: the step manifests a node records, kept in state and streamed (``custom`` mode).

A manifest names the run, the step, the phase, the budget and time left and the outcome, never a
prompt, an argument or a result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, get_args

from langgraph.runtime import Runtime
from pydantic_core import to_jsonable_python

from fencepost.graph.events import EVENTS
from fencepost.graph.record import plain_ahead
from fencepost.graph.settings import LoopConfig
from fencepost.policy import AgentState, Phase, StepManifest
from fencepost.policy.context import RunContext
from fencepost.policy.contract import assemble
from fencepost.policy.manifest import SHARED_FIELDS, Outcome


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


class _ManifestLayout:
    """A plain object whose attributes are a manifest's fields: its ``__dict__`` is a
    split-table dict (keys shared by every instance), see :data:`_MANIFEST_DEFAULTS`."""


def _split_table(values: dict[str, Any]) -> dict[str, Any]:
    layout = _ManifestLayout()
    for name, value in values.items():
        setattr(layout, name, value)
    return layout.__dict__


# Every field of a manifest in declared order, at its default (the required ones are always
# given): the values validation would fill in around the ones given. A split-table dict: a copy
# of it (``|``, then ``update`` of fields it already has) stays one, holding only its values
# (296 bytes, where a dict of its own 18 keys takes 464), and a manifest is kept for as long as
# its run is: ten of them in a five-step run in flight.
_MANIFEST_DEFAULTS: dict[str, Any] = _split_table(
    {
        name: None if info.is_required() else info.get_default(call_default_factory=True)
        for name, info in StepManifest.model_fields.items()
    }
)


_MANIFEST_SHOWN: dict[str, Any] = {
    name: to_jsonable_python(default) for name, default in _MANIFEST_DEFAULTS.items()
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
    assembled, as validation would make it, without validating again."""
    budget, step = state.budget, state.step
    used, steps, calls = budget.tokens_used, budget.steps_remaining, budget.tool_calls_remaining
    names = tuple(fields)
    given = _GIVEN.get(names)
    if given is None and fields.keys() <= _OPTIONAL:
        given = _GIVEN[names] = frozenset(SHARED_FIELDS | fields.keys())
    if (
        given is None
        or not (type(state.run_id) is str and type(step) is type(steps) is type(calls) is int)
        or type(used) is not int
        or step < 0
        or outcome not in _OUTCOMES
    ):
        # A key no manifest has (or one given twice), a state value of another type (a budget
        # view a caller wrote, a ledger gave no balance for) or an outcome no manifest has:
        # judged, and refused, by validation.
        return manifest(state, cfg, ctx, phase=phase, outcome=outcome, **fields)
    values = _MANIFEST_DEFAULTS | _where(state, cfg, ctx, phase, outcome)  # in declared order
    values.update(fields)
    # The state's values were just checked as validation checks them; the deadline is the
    # trusted context's; ``fields`` are fencepost's own (see the docstring).
    return assemble(StepManifest, values, given)


_OUTCOMES = frozenset(get_args(Outcome))
_OPTIONAL = frozenset(_MANIFEST_DEFAULTS) - SHARED_FIELDS
_GIVEN: dict[tuple[str, ...], frozenset[str]] = {}
"""The fields set of a manifest given each tuple of optional field names (fencepost's own call
sites name a handful): validation records the names given, defaults aside."""


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
