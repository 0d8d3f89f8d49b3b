"""The bounded loop as an uncompiled LangGraph ``StateGraph``: its nodes and edges over the
loop's resolved settings. Each node is one body over the node I/O, run by the sync or the async
graph, with a fork of the thread taken first and the messages view added (:func:`loop_node`).

The graph binding does not pick a ledger for a saver, nor who listens to its events: the
composition root (``fp.build_agent_graph``, which ``fp.create_agent`` calls) gives
:func:`assemble` both.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Coroutine
from dataclasses import replace
from functools import partial
from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime, get_runtime

from fencepost.graph.approve import approve
from fencepost.graph.compiled import BoundedStateGraph
from fencepost.graph.context import ContextInput
from fencepost.graph.decide import decide
from fencepost.graph.execute import execute
from fencepost.graph.fork import fork_written, take_fork
from fencepost.graph.messages import with_messages
from fencepost.graph.node_io import AsyncIO, NodeIO, SyncIO, drive
from fencepost.graph.routing import (
    route_after_approve,
    route_after_decide,
    route_after_execute,
    route_after_terminal,
    route_start,
)
from fencepost.graph.settings import LoopConfig, Update, remember
from fencepost.graph.state import GraphState, InputState, InvalidState
from fencepost.graph.terminal import terminal
from fencepost.graph.writes import refusal_writes, reset_prerun_values
from fencepost.policy import InMemoryLedger, Ledger
from fencepost.policy.context import RunContext

NodeBody = Callable[[NodeIO, dict[str, Any], Runtime[Any]], Coroutine[Any, Any, Update]]


class LoopNode(Runnable[Any, Update]):
    """One node of the loop as a LangChain ``Runnable`` with a sync and an async body: the
    public way to give a LangGraph node both (``invoke`` runs the sync graph's, ``ainvoke`` the
    async graph's). It reads the graph's ``Runtime`` with :func:`langgraph.runtime.get_runtime`,
    and, like a function node, opens no callback run of its own."""

    def __init__(
        self,
        name: str,
        run: Callable[[dict[str, Any], Runtime[Any]], Update],
        arun: Callable[[dict[str, Any], Runtime[Any]], Coroutine[Any, Any, Update]],
    ) -> None:
        self.name = name
        self._run = run
        self._arun = arun

    def invoke(
        self, input: dict[str, Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> Update:
        return self._run(input, get_runtime())

    async def ainvoke(
        self, input: dict[str, Any], config: RunnableConfig | None = None, **kwargs: Any
    ) -> Update:
        return await self._arun(input, get_runtime())


def loop_node(cfg: LoopConfig, name: str, body: NodeBody) -> LoopNode:
    """The node ``name`` running ``body``, sync or async. It adds the ``messages`` that show
    what its body changed (:mod:`fencepost.graph.messages`), so no body writes them itself,
    and resets what a caller wrote before a run began (:func:`~fencepost.graph.writes.reset_prerun_values`).

    A body that acts on state (approves, runs tools) reads it with ``require_state``, which
    raises :class:`~fencepost.graph.state.InvalidState` on a value no field can hold: the body
    is not run; only the stop that ends the run is written (``writes.refusal_writes``), routing it to
    the terminal node, as a node ends a run on a missing or mismatched context.
    """
    sync_io, async_io = SyncIO(cfg), AsyncIO(cfg)

    def run(values: dict[str, Any], runtime: Runtime[Any]) -> Update:
        # A fork of the thread (time travel) is taken first: its run goes on on its own account.
        forked = drive(take_fork(sync_io, values, runtime))
        if forked is not None:
            values = forked[0]
        try:
            writes = drive(body(sync_io, values, runtime))
        except InvalidState as invalid:
            writes = refusal_writes(invalid.state)
        if forked is not None:
            writes = fork_written(writes, forked[1])
        return with_messages(values, reset_prerun_values(values, writes))

    async def arun(values: dict[str, Any], runtime: Runtime[Any]) -> Update:
        forked = await take_fork(async_io, values, runtime)
        if forked is not None:
            values = forked[0]
        try:
            writes = await body(async_io, values, runtime)
        except InvalidState as invalid:
            writes = refusal_writes(invalid.state)
        if forked is not None:
            writes = fork_written(writes, forked[1])
        return with_messages(values, reset_prerun_values(values, writes))

    return LoopNode(name, run, arun)


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
    # One body per node, run by the sync or the async path (see :func:`loop_node`).
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
