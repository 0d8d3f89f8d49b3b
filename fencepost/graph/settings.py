"""What every node shares: the loop's settings and the trace.

Nodes are bodies over :class:`~fencepost.graph.node_io.NodeIO` (one body for the sync and the
async graph); the run's ledger account is reached through :mod:`fencepost.graph.account`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, TypeVar

from langgraph.graph import StateGraph

from fencepost.policy import (
    Clock,
    DecisionModel,
    Ledger,
    ToolRegistry,
)
from fencepost.policy.approval import ApprovalMode
from fencepost.policy.approver import Approver
from fencepost.policy.denial import DenialMode
from fencepost.policy.pricing import ModelPrice
from fencepost.policy.repair import DEFAULT_REPAIR_ATTEMPTS
from fencepost.policy.tool import NeedsApproval

T = TypeVar("T")
Update = dict[str, Any]


class GraphConfigError(ValueError):
    """``build_agent_graph`` was given a bad setting, or the graph was compiled or invoked in a
    way it cannot run (an approval no checkpointer could resume, a sync saver under
    ``ainvoke``); the message names the field and the public fix."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


NO_CHECKPOINTER = (
    "approval='interrupt' pauses a run that only a checkpointer can resume: pass one, "
    "fp.create_agent(..., checkpointer=...) or graph.compile(checkpointer=...)"
)

SYNC_SAVER = (
    "{saver} has no async methods, and ainvoke/astream need them: open the checkpointer with "
    "`async with fp.aopen_checkpointer(url) as saver` and compile with that saver"
)


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
    repair_attempts: int = DEFAULT_REPAIR_ATTEMPTS
    """Refused proposals (unknown tool, schema, semantics) the model may repair, a step each."""
    owns_ledger: bool = False
    """The ledger is an in-memory one fencepost made (none was passed): the graph's own, or its
    saver's (``default_ledger.in_memory_ledger``). Runs that end are forgotten from it."""
    denial: DenialMode = "end_run"
    """What a capability or semantic denial does: end the run, or be an observation."""
    approver: Approver | None = None
    """The approver policy asked first about each call that needs approval."""
    needs_approval: NeedsApproval | None = None
    """Decides per call whether it needs approval, for every tool without its own."""
    approval_right: str | None = None
    """The capability another principal than the requester must hold to answer an approval
    (``None``: ``approve:<the tool's capability>``); a tool's own ``approval_right`` wins."""
    four_eyes: bool = False
    """Refuse the requester's own answer to its approvals (a tool's own ``four_eyes`` wins)."""
    price: ModelPrice | None = None
    """What the model's tokens cost (``None``: unpriced, and a run whose chain limits money is
    refused, ``money_unpriced``)."""


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
