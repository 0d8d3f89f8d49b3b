"""``build_agent_graph``: the bounded loop as an uncompiled LangGraph ``StateGraph``."""

from __future__ import annotations

import weakref
from dataclasses import replace
from functools import partial
from typing import Any, Unpack

from langgraph.graph import END, START, StateGraph

from fencepost.graph.approve import approve
from fencepost.graph.compiled import BoundedStateGraph
from fencepost.graph.context import ContextInput
from fencepost.graph.decide import decide
from fencepost.graph.default_ledger import LedgerNeeded, durable_ledger
from fencepost.graph.execute import execute
from fencepost.graph.node_io import loop_node
from fencepost.graph.routing import (
    route_after_approve,
    route_after_decide,
    route_after_execute,
    route_after_terminal,
    route_start,
)
from fencepost.graph.settings import (
    GraphConfigError,
    LoopConfig,
    LoopOptions,
    LoopSettings,
    remember,
    settings_from,
)
from fencepost.graph.state import GraphState, InputState
from fencepost.graph.terminal import terminal
from fencepost.policy import DecisionModel, InMemoryLedger, ToolRegistry
from fencepost.policy.context import RunContext


def build_agent_graph(
    registry: ToolRegistry,
    model: DecisionModel,
    *,
    settings: LoopSettings | None = None,
    **options: Unpack[LoopOptions],
) -> StateGraph[Any, RunContext, Any, Any]:
    """The bounded loop as an uncompiled ``StateGraph`` — compile it with your checkpointer.

    :func:`fencepost.create_agent` builds and compiles it in one call; this is for compiling your
    own (your ``compile`` arguments, or the loop as a node of a graph of yours). ``settings`` is
    an :class:`~fencepost.LoopSettings` (its fields say what each setting does and its default);
    keyword arguments of the same names build one, or change the fields of the one given (the
    keyword wins). :class:`GraphConfigError` names the setting given a bad value.

    Example::

        graph = build_agent_graph(registry, ScriptedDecisionModel([...])).compile(
            checkpointer=InMemorySaver()
        )
        out = graph.invoke(start("question", budget), config, context=RunContext(...))
        run_output(out).termination
    """
    given = settings_from(settings, options)
    return _assemble(LoopConfig.of(registry, model, given), twin=given.ledger is None)


def _assemble(cfg: LoopConfig, *, twin: bool = False) -> StateGraph[Any, RunContext, Any, Any]:
    """The loop's ``StateGraph`` over ``cfg``: its nodes, its edges, and (``twin``: a graph
    built with no ledger) the graph it compiles into instead with a checkpointer."""
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
    if twin:
        graph.durable_twin = partial(_durable_twin, cfg)
    remember(graph, cfg)
    return graph


def _durable_twin(cfg: LoopConfig, checkpointer: Any) -> StateGraph[Any, Any, Any, Any] | None:
    """The graph a graph built with no ledger compiles into with ``checkpointer``: the same
    loop over the ledger every graph compiled with that checkpointer shares, as durable as its
    checkpoints (``default_ledger``), or ``None`` when there is no saver to share one beside
    (the graph keeps its own in-memory ledger). ``GraphConfigError`` when no such ledger can be
    made."""
    try:
        ledger = durable_ledger(checkpointer)
    except LedgerNeeded as needed:
        raise GraphConfigError("ledger", str(needed)) from None
    if ledger is None:
        return None
    # A saver's in-memory ledger is process-local: its ended runs are forgotten from it too.
    twin = _assemble(replace(cfg, ledger=ledger, owns_ledger=isinstance(ledger, InMemoryLedger)))
    close = getattr(ledger, "close", None)
    if callable(close):
        # Made for this graph alone: its connection goes with the graph, if not before (with
        # the opener of the checkpointer; closing twice is harmless).
        weakref.finalize(twin, close)
    return twin
