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
from fencepost.policy.ledger import Ledger
from fencepost.policy.run_check import check_owner

_CANCEL = StopRequest(reason=TerminationReason.CANCELLED, error_code="cancelled")


def _namespace(config: RunnableConfig) -> str:
    """The checkpoint namespace ``config`` names: "" for a top-level run, a parent graph's
    node's for a run nested in it."""
    return str((config.get("configurable") or {}).get("checkpoint_ns") or "")


def _head(config: RunnableConfig) -> RunnableConfig:
    """``config`` naming the thread's latest checkpoint: a cancel acts on the run as it is now,
    never on (nor forks from) an earlier checkpoint that a snapshot's config pins."""
    configurable = config.get("configurable") or {}
    if "checkpoint_id" not in configurable and "checkpoint_map" not in configurable:
        return config
    kept = {k: v for k, v in configurable.items() if k not in ("checkpoint_id", "checkpoint_map")}
    return {**config, "configurable": kept}


def _account(config: RunnableConfig, state: AgentState | None) -> str:
    thread = (config.get("configurable") or {}).get("thread_id")
    run_id = "" if state is None else state.run_id  # named by the thread whenever there is one
    return run_account("" if thread is None else str(thread), run_id, _namespace(config))


def _someone_elses(owner: Any, context: RunContext | None, state: AgentState | None) -> bool:
    """A caller who names a context cancels only a run whose account was opened for it (and
    this run, when its state could be read): another tenant on the same thread id closes
    nothing. Without a context it is the operator's cancel, as before."""
    run_id = None if state is None else state.run_id
    return context is not None and check_owner(owner, context, run_id) is not None


def _nested_state(graph: Pregel[Any, Any, Any, Any], config: RunnableConfig) -> AgentState | None:
    """A nested run's state as its own graph reads it; None if that graph cannot read it (it was
    compiled without a checkpointer: the parent's saver holds the run) or nothing ran there."""
    try:
        values = graph.get_state(config).values
    except ValueError:  # "No checkpointer set": nothing to read, the account is still named
        return None
    return run_output(values) if "run_id" in values else None


async def _anested_state(
    graph: Pregel[Any, Any, Any, Any], config: RunnableConfig
) -> AgentState | None:
    """Async twin of :func:`_nested_state`."""
    try:
        values = (await graph.aget_state(config)).values
    except ValueError:
        return None
    return run_output(values) if "run_id" in values else None


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

    A config pinned to a checkpoint (a snapshot's ``config``) cancels the thread's latest one:
    never a fork from an earlier checkpoint.

    A run nested in a parent graph's node is named by the subgraph's ``checkpoint_ns`` in
    ``config`` (``parent.get_state(config, subgraphs=True).tasks[0].state.config``). Given the
    nested fencepost graph, only its account is closed: the parent owns the thread, and the
    parent's next invoke (a resume, say) ends the nested run ``cancelled`` at its next model step
    or tool; it returns the nested state as it was, or ``None`` when that graph cannot read it
    (compiled without a checkpointer of its own). Given the parent graph, the nested run is
    cancelled through the parent as a top-level one is.
    """
    config = _head(config)
    if _namespace(config) and settings_of(graph) is not None:
        state = _nested_state(graph, config)
        if state is None or not state.is_terminal:
            _close(graph, config, context, state)
        return state
    snapshot = graph.get_state(config)
    if "run_id" not in snapshot.values:
        return None
    state = run_output(snapshot.values)
    if not state.is_terminal:
        _close(graph, config, context, state)
        graph.update_state(config, {"stop": _CANCEL}, as_node="execute")
        graph.invoke(None, config, context=context)
        state = run_output(graph.get_state(config).values)
    return state


async def acancel(
    graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *, context: RunContext | None = None
) -> AgentState | None:
    """Async twin of :func:`cancel`."""
    config = _head(config)
    if _namespace(config) and settings_of(graph) is not None:
        state = await _anested_state(graph, config)
        if state is None or not state.is_terminal:
            await _aclose(graph, config, context, state)
        return state
    snapshot = await graph.aget_state(config)
    if "run_id" not in snapshot.values:
        return None
    state = run_output(snapshot.values)
    if not state.is_terminal:
        await _aclose(graph, config, context, state)
        await graph.aupdate_state(config, {"stop": _CANCEL}, as_node="execute")
        await graph.ainvoke(None, config, context=context)
        state = run_output((await graph.aget_state(config)).values)
    return state


def _ledger_account(
    graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, state: AgentState | None
) -> tuple[Ledger, str] | None:
    """The ledger of a fencepost graph and the run's account on it; None for another graph."""
    settings = settings_of(graph)
    return None if settings is None else (settings.ledger, _account(config, state))


def _close(
    graph: Pregel[Any, Any, Any, Any],
    config: RunnableConfig,
    context: RunContext | None,
    state: AgentState | None,
) -> None:
    """Close the run's ledger account as cancelled, unless it is somebody else's."""
    if (target := _ledger_account(graph, config, state)) is not None:
        ledger, account = target
        with contextlib.suppress(UnknownAccount, LedgerConflict, ValueError):
            if not _someone_elses(ledger.balance(account).owner, context, state):
                ledger.close_account(account, TerminationReason.CANCELLED.value)


async def _aclose(
    graph: Pregel[Any, Any, Any, Any],
    config: RunnableConfig,
    context: RunContext | None,
    state: AgentState | None,
) -> None:
    """Async twin of :func:`_close`."""
    if (target := _ledger_account(graph, config, state)) is not None:
        ledger, account = target
        with contextlib.suppress(UnknownAccount, LedgerConflict, ValueError):
            if not _someone_elses((await ledger.abalance(account)).owner, context, state):
                await ledger.aclose_account(account, TerminationReason.CANCELLED.value)
