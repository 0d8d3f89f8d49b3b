"""Closing a run as cancelled, durably, through its ledger account and the terminal node."""

from __future__ import annotations

import contextlib
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel

from fencepost.graph.loop import settings_of
from fencepost.graph.state import run_output
from fencepost.policy import (
    AgentState,
    LedgerConflict,
    StopRequest,
    TerminationReason,
    UnknownAccount,
)
from fencepost.policy.context import RunContext
from fencepost.policy.keys import run_account
from fencepost.policy.run_check import check_owner

_CANCEL = StopRequest(reason=TerminationReason.CANCELLED, error_code="cancelled")


def _account(config: RunnableConfig, state: AgentState) -> str:
    configurable = config.get("configurable") or {}
    thread = configurable.get("thread_id")
    namespace = str(configurable.get("checkpoint_ns") or "")
    return run_account("" if thread is None else str(thread), state.run_id, namespace)


def _someone_elses(owner: Any, context: RunContext | None, state: AgentState) -> bool:
    """A caller who names a context cancels only a run whose account was opened for it (and
    this run): another tenant on the same thread id closes nothing. Without a context it is the
    operator's cancel, as before."""
    return context is not None and check_owner(owner, context, state.run_id) is not None


def cancel(
    graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *, context: RunContext | None = None
) -> AgentState | None:
    """End the thread in ``config`` as ``cancelled``; idempotent, and safe from any thread.

    First the run's ledger account is closed: a run still going on (another thread's ``invoke``,
    another worker) is refused its next model step or tool and ends ``cancelled`` by itself.
    Then the terminal node writes the durable cancel record. Use it also after cancelling the
    task that ran ``ainvoke``/``astream`` (which re-raises ``CancelledError``). Returns the final
    state, or ``None`` if nothing ever ran on the thread. LangGraph saves checkpoints in the
    background by default, so a run that started a moment ago may not show on its thread yet:
    ``None`` then means nothing was cancelled (call again, or start the run with
    ``durability="sync"``).
    """
    snapshot = graph.get_state(config)
    if "run_id" not in snapshot.values:
        return None
    state = run_output(snapshot.values)
    settings = settings_of(graph)
    if settings is not None and not state.is_terminal:
        account = _account(config, state)
        with contextlib.suppress(UnknownAccount, LedgerConflict, ValueError):
            if not _someone_elses(settings.ledger.balance(account).owner, context, state):
                settings.ledger.close_account(account, TerminationReason.CANCELLED.value)
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
    settings = settings_of(graph)
    if settings is not None and not state.is_terminal:
        account = _account(config, state)
        with contextlib.suppress(UnknownAccount, LedgerConflict, ValueError):
            if not _someone_elses((await settings.ledger.abalance(account)).owner, context, state):
                await settings.ledger.aclose_account(account, TerminationReason.CANCELLED.value)
    if not state.is_terminal:
        await graph.aupdate_state(config, {"stop": _CANCEL}, as_node="execute")
        await graph.ainvoke(None, config, context=context)
        state = run_output((await graph.aget_state(config)).values)
    return state
