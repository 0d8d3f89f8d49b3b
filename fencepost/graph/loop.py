"""What every node shares: the loop's settings and the trace.

Nodes are bodies over :class:`~fencepost.graph.node_io.NodeIO` (one body for the sync and the
async graph); the run's ledger account is reached through :mod:`fencepost.graph.run_account`.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from langgraph.graph import StateGraph
from langgraph.runtime import Runtime

from fencepost.policy import (
    AgentState,
    Clock,
    DecisionModel,
    Ledger,
    Phase,
    StepManifest,
    ToolRegistry,
)
from fencepost.policy.approval import ApprovalMode
from fencepost.policy.context import RunContext

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
    answer_margin: int
    repair_attempts: int
    owns_ledger: bool = False
    """The ledger is the graph's own (none was passed): runs that end are forgotten from it."""
    """Refused proposals (unknown tool, schema, semantics) the model may repair, a step each."""
    """The last steps kept for answering: tool calls are refused in them."""
    """Tokens a model step reserves before the model is called (settled to what it reports)."""


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
    deadline = ctx.deadline if ctx is not None else None
    return StepManifest(
        run_id=state.run_id,
        step=state.step,
        phase=phase,
        steps_remaining=state.budget.steps_remaining,
        tool_calls_remaining=state.budget.tool_calls_remaining,
        tokens_used=state.budget.tokens_used,
        deadline_remaining_ms=deadline.remaining_ms(clock=cfg.clock) if deadline else None,
        outcome=outcome,
        **fields,
    )


def recorded(
    state: AgentState, runtime: Runtime[Any], manifests: Sequence[StepManifest]
) -> AgentState:
    """Stream ``manifests`` (custom stream mode) and keep them in state."""
    writer = runtime.stream_writer
    for m in manifests:
        writer({"fencepost": "manifest", **m.model_dump(mode="json")})
    return state.model_copy(update={"manifests": state.manifests + tuple(manifests)})
