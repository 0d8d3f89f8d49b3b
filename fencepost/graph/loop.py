"""What every node shares: the loop's settings and the trace.

Nodes are bodies over :class:`~fencepost.graph.node_io.NodeIO` (one body for the sync and the
async graph); the run's ledger account is reached through :mod:`fencepost.graph.run_account`.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, get_args

from langgraph.graph import StateGraph
from langgraph.runtime import Runtime

from fencepost.adapters import telemetry
from fencepost.policy import (
    AgentState,
    Clock,
    DecisionModel,
    Ledger,
    Phase,
    StepManifest,
    ToolRegistry,
)
from fencepost.policy._model import assemble
from fencepost.policy.approval import ApprovalMode
from fencepost.policy.approver import Approver
from fencepost.policy.context import RunContext
from fencepost.policy.denial import DenialMode
from fencepost.policy.manifest import Outcome

T = TypeVar("T")
Update = dict[str, Any]


@dataclass(frozen=True, slots=True)
class LoopConfig:
    """What the nodes need from the builder."""

    registry: ToolRegistry
    model: DecisionModel
    approval: ApprovalMode
    repeat_limit: int
    ledger: Ledger
    clock: Clock
    model_timeout_seconds: float
    require_citations: bool
    model_retries: int
    max_concurrent_tools: int
    verdict_key: bytes | None
    tokens_per_step: int
    """Tokens a model step reserves before the model is called (settled to what it reports)."""
    answer_margin: int
    """The last steps kept for answering: tool calls are refused in them."""
    repair_attempts: int
    """Refused proposals (unknown tool, schema, semantics) the model may repair, a step each."""
    owns_ledger: bool = False
    """The ledger is the graph's own (none was passed): runs that end are forgotten from it."""
    denial: DenialMode = "end_run"
    """What a capability or semantic denial does: end the run, or be an observation."""
    approver: Approver | None = None
    """The approver policy asked first about each call that needs approval."""


# The settings of each built graph, found again from the graph object (never from a name a
# caller chooses): ``cancel`` uses it to reach the run's ledger account from any thread.
_BUILT: weakref.WeakKeyDictionary[StateGraph[Any, Any, Any, Any], LoopConfig] = (
    weakref.WeakKeyDictionary()
)


def remember(graph: StateGraph[Any, Any, Any, Any], cfg: LoopConfig) -> None:
    """Record the settings a graph was built with."""
    _BUILT[graph] = cfg


def settings_of(graph: object) -> LoopConfig | None:
    """The settings of a graph ``build_agent_graph`` built (compiled or not), if it is one."""
    builder = getattr(graph, "builder", graph)
    if not isinstance(builder, StateGraph):
        return None
    return _BUILT.get(builder)


# -- the trace ------------------------------------------------------------------------------------


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


# Every field of a manifest in declared order, at its default (the required ones are always
# given): the values validation would fill in around the ones given.
_MANIFEST_DEFAULTS: dict[str, Any] = {
    name: None if info.is_required() else info.get_default(call_default_factory=True)
    for name, info in StepManifest.model_fields.items()
}


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
        given = _GIVEN[names] = frozenset(_MANIFEST_BASE | fields.keys())
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
_MANIFEST_BASE = frozenset(
    (
        "run_id",
        "step",
        "phase",
        "steps_remaining",
        "tool_calls_remaining",
        "tokens_used",
        "deadline_remaining_ms",
        "outcome",
    )
)
_OPTIONAL = frozenset(_MANIFEST_DEFAULTS) - _MANIFEST_BASE
_GIVEN: dict[tuple[str, ...], frozenset[str]] = {}
"""The fields set of a manifest given each tuple of optional field names (fencepost's own call
sites name a handful): validation records the names given, defaults aside."""


def recorded(
    state: AgentState, runtime: Runtime[Any], manifests: Sequence[StepManifest]
) -> AgentState:
    """Stream ``manifests`` (custom stream mode) and keep them in state; the telemetry
    (:mod:`fencepost.adapters.telemetry`: the agent span, the run's log lines) sees them too."""
    writer = runtime.stream_writer
    for m in manifests:
        writer({"fencepost": "manifest", **m.model_dump(mode="json")})
    telemetry.recorded(state, manifests)
    return state.model_copy(update={"manifests": state.manifests + tuple(manifests)})
