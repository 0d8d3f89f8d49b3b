"""Closing a run as cancelled, durably, through the terminal node."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel

from fencepost.graph.context import RunContext
from fencepost.graph.state import run_output
from fencepost.policy import AgentState, StopRequest, TerminationReason

_CANCEL = StopRequest(reason=TerminationReason.CANCELLED, error_code="cancelled")


def cancel(
    graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *, context: RunContext | None = None
) -> AgentState | None:
    """End the thread in ``config`` as ``cancelled`` via the terminal node; idempotent.

    Use it after cancelling the task that ran ``ainvoke``/``astream`` (which re-raises
    ``CancelledError``), so the checkpoint holds a durable cancel record. Returns the final state,
    or ``None`` if nothing ever ran on the thread.
    """
    snapshot = graph.get_state(config)
    if "run_id" not in snapshot.values:
        return None
    state = run_output(snapshot.values)
    if not state.is_terminal:
        graph.update_state(config, {"stop": _CANCEL}, as_node="execute")
        graph.invoke(None, config, context=context)
        state = run_output(graph.get_state(config).values)
    return state


async def acancel(
    graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *, context: RunContext | None = None
) -> AgentState | None:
    """Async twin of :func:`cancel`."""
    snapshot = await graph.aget_state(config)
    if "run_id" not in snapshot.values:
        return None
    state = run_output(snapshot.values)
    if not state.is_terminal:
        await graph.aupdate_state(config, {"stop": _CANCEL}, as_node="execute")
        await graph.ainvoke(None, config, context=context)
        state = run_output((await graph.aget_state(config)).values)
    return state
