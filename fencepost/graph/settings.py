"""What every node shares: the loop's settings and the trace.

Nodes are bodies over :class:`~fencepost.graph.node_io.NodeIO` (one body for the sync and the
async graph); the run's ledger account is reached through :mod:`fencepost.graph.account`.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, TypeVar

from langgraph.graph import StateGraph

from fencepost.graph.token_count import text_counter
from fencepost.policy import (
    DEFAULT_REPEAT_LIMIT,
    Clock,
    DecisionModel,
    InMemoryLedger,
    Ledger,
    SystemClock,
    ToolRegistry,
)
from fencepost.policy.approval import ApprovalMode
from fencepost.policy.approver import Approver
from fencepost.policy.denial import DENIAL_MODES, DenialMode
from fencepost.policy.pricing import ModelPrice
from fencepost.policy.provenance import PROVENANCE_MODES, ProvenanceMode
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
    provenance: ProvenanceMode = "observe"
    """What a write or external call whose sensitive arguments trace only to untrusted output
    gets: recorded only (``"observe"``), asked about (``"ask"``) or refused (``"refuse"``)."""


def loop_config(
    registry: ToolRegistry,
    model: DecisionModel,
    *,
    approval: ApprovalMode = "terminate",
    repeat_limit: int = DEFAULT_REPEAT_LIMIT,
    ledger: Ledger | None = None,
    clock: Clock | None = None,
    model_timeout_seconds: float = 120.0,
    require_citations: bool = False,
    model_retries: int = 2,
    max_concurrent_tools: int = 8,
    verdict_key: bytes | None = None,
    tokens_per_step: int | None = None,
    answer_margin: int = 1,
    repair_attempts: int = DEFAULT_REPAIR_ATTEMPTS,
    denial: DenialMode = "end_run",
    approver: Approver | None = None,
    needs_approval: NeedsApproval | None = None,
    approval_right: str | None = None,
    four_eyes: bool = False,
    price: ModelPrice | None = None,
    provenance: ProvenanceMode = "observe",
) -> LoopConfig:
    """The loop's settings, each checked (``GraphConfigError`` naming the field): the one
    spelling of them that ``build_agent_graph`` and ``FencepostMiddleware`` share."""
    if not isinstance(registry, ToolRegistry):
        raise GraphConfigError("registry", "must be a ToolRegistry")
    if not callable(getattr(model, "decide", None)):
        raise GraphConfigError("model", "must implement DecisionModel.decide(input, *, deadline)")
    if approval not in ("terminate", "interrupt"):
        raise GraphConfigError("approval", "must be 'terminate' or 'interrupt'")
    if not isinstance(repeat_limit, int) or isinstance(repeat_limit, bool) or repeat_limit < 1:
        raise GraphConfigError("repeat_limit", "must be an integer >= 1")
    if ledger is not None and not isinstance(ledger, Ledger):
        raise GraphConfigError("ledger", "must be a fencepost Ledger")
    if not isinstance(model_retries, int) or isinstance(model_retries, bool) or model_retries < 0:
        raise GraphConfigError("model_retries", "must be an integer >= 0")
    if (
        not isinstance(max_concurrent_tools, int)
        or isinstance(max_concurrent_tools, bool)
        or max_concurrent_tools < 1
    ):
        raise GraphConfigError("max_concurrent_tools", "must be an integer >= 1")
    if verdict_key is not None and (not isinstance(verdict_key, bytes) or len(verdict_key) < 16):
        raise GraphConfigError("verdict_key", "must be bytes, at least 16 of them")
    if not (model_timeout_seconds > 0 and math.isfinite(model_timeout_seconds)):
        # An infinite timeout has no deadline to compute: it failed at the first model step.
        raise GraphConfigError("model_timeout_seconds", "must be > 0 and finite")
    if (
        not isinstance(repair_attempts, int)
        or isinstance(repair_attempts, bool)
        or repair_attempts < 0
    ):
        raise GraphConfigError("repair_attempts", "must be an integer >= 0")
    if not isinstance(answer_margin, int) or isinstance(answer_margin, bool) or answer_margin < 0:
        raise GraphConfigError("answer_margin", "must be an integer >= 0")
    if denial not in DENIAL_MODES:
        raise GraphConfigError("denial", "must be 'end_run' or 'observe'")
    if approver is not None and not callable(approver):
        raise GraphConfigError(
            "approver", "must be callable: approver(ApproverInput) -> ApproverDecision"
        )
    if needs_approval is not None and not callable(needs_approval):
        raise GraphConfigError(
            "needs_approval", "must be callable: needs_approval(ApprovalQuestion) -> bool"
        )
    if approval_right is not None and (not isinstance(approval_right, str) or not approval_right):
        raise GraphConfigError("approval_right", "must be a non-empty capability name")
    if not isinstance(four_eyes, bool):
        raise GraphConfigError("four_eyes", "must be True or False")
    if provenance not in PROVENANCE_MODES:
        raise GraphConfigError("provenance", "must be 'observe', 'ask' or 'refuse'")
    if tokens_per_step is None:
        declared = getattr(model, "token_estimate", None)
        tokens_per_step = declared if isinstance(declared, int) and declared > 0 else 0
    if (
        not isinstance(tokens_per_step, int)
        or isinstance(tokens_per_step, bool)
        or tokens_per_step < 0
    ):
        raise GraphConfigError("tokens_per_step", "must be an integer >= 0")
    text_counter()  # chosen (a tokenizer loaded) now, never while a node runs
    return LoopConfig(
        registry=registry,
        model=model,
        approval=approval,
        repeat_limit=repeat_limit,
        ledger=ledger if ledger is not None else InMemoryLedger(),
        clock=clock or SystemClock(),
        model_timeout_seconds=model_timeout_seconds,
        require_citations=require_citations,
        model_retries=model_retries,
        max_concurrent_tools=max_concurrent_tools,
        verdict_key=verdict_key,
        tokens_per_step=tokens_per_step,
        answer_margin=answer_margin,
        repair_attempts=repair_attempts,
        owns_ledger=ledger is None,
        denial=denial,
        approver=approver,
        needs_approval=needs_approval,
        approval_right=approval_right,
        four_eyes=four_eyes,
        price=price,
        provenance=provenance,
    )


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
