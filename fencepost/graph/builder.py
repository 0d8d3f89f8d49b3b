"""The bounded loop as an uncompiled LangGraph ``StateGraph``: its nodes and edges over the
loop's resolved settings.

The graph binding does not pick a ledger for a saver, nor who listens to its events: the
composition root (``fp.build_agent_graph``, which ``fp.create_agent`` calls) gives
:func:`assemble` both.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from langgraph.graph import END, START, StateGraph

from fencepost.graph.approve import approve
from fencepost.graph.compiled import BoundedStateGraph
from fencepost.graph.context import ContextInput
from fencepost.graph.decide import decide
from fencepost.graph.execute import execute
from fencepost.graph.node_io import loop_node
from fencepost.graph.routing import (
    route_after_approve,
    route_after_decide,
    route_after_execute,
    route_after_terminal,
    route_start,
)
from fencepost.graph.settings import LoopConfig, remember
from fencepost.graph.state import GraphState, InputState
from fencepost.graph.terminal import terminal
from fencepost.policy import InMemoryLedger, Ledger
from fencepost.policy.context import RunContext

LedgerFor = Callable[[Any], Ledger | None]
"""Given the checkpointer a graph built with no ledger is compiled with: the ledger to run it
over, or ``None`` to keep the graph's own in-memory one (``GraphConfigError`` to refuse)."""


def assemble(
    cfg: LoopConfig, *, ledger_for: LedgerFor | None = None
) -> StateGraph[Any, RunContext, Any, Any]:
    """The loop's ``StateGraph`` over ``cfg``: its nodes, its edges, and (``ledger_for``: how a
    graph built with no ledger gets one as durable as its checkpointer) the graph it compiles
    into instead with a checkpointer."""
    # A mapping context is validated by the nodes, not by LangGraph (see ContextInput).
    graph = BoundedStateGraph(GraphState, context_schema=ContextInput, input_schema=InputState)
    # One body per node, run by the sync or the async path (see fencepost.graph.node_io).
    for name, body in (
        ("decide", decide),
        ("execute", execute),
        ("approve", approve),
        ("terminal", terminal),
    ):
        graph.add_node(name, loop_node(cfg, name, body))
    graph.add_conditional_edges(START, route_start, ["decide", "approve", "execute", "terminal"])
    graph.add_conditional_edges(
        "decide", route_after_decide, ["approve", "execute", "decide", "terminal"]
    )
    # "approve" too: a state update made as the approve node while a call still awaits a human.
    graph.add_conditional_edges(
        "approve", route_after_approve, ["approve", "execute", "decide", "terminal"]
    )
    graph.add_conditional_edges("execute", route_after_execute, ["decide", "terminal"])
    # "terminal" too: a state update made as the terminal node is not an ended run.
    graph.add_conditional_edges("terminal", route_after_terminal, ["terminal", END])
    if ledger_for is not None:
        graph.durable_twin = partial(_durable_twin, cfg, ledger_for)
    remember(graph, cfg)
    return graph


def _durable_twin(
    cfg: LoopConfig, ledger_for: LedgerFor, checkpointer: Any
) -> StateGraph[Any, Any, Any, Any] | None:
    """The graph a graph built with no ledger compiles into with ``checkpointer``: the same
    loop over the ledger ``ledger_for`` picks for it (the one every graph compiled with that
    checkpointer shares, as durable as its checkpoints), or ``None`` when there is no saver to
    share one beside (the graph keeps its own in-memory ledger). ``ledger_for`` raises
    ``GraphConfigError`` when no such ledger can be made."""
    ledger = ledger_for(checkpointer)
    if ledger is None:
        return None
    # A saver's in-memory ledger is process-local: its ended runs are forgotten from it too.
    twin = assemble(replace(cfg, ledger=ledger, owns_ledger=isinstance(ledger, InMemoryLedger)))
    close = getattr(ledger, "close", None)
    if callable(close):
        # Made for this graph alone: its connection goes with the graph, if not before (with
        # the opener of the checkpointer; closing twice is harmless).
        weakref.finalize(twin, close)
    return twin
