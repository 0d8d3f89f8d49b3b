"""Closing a run as cancelled, durably, through its ledger account and the terminal node."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.pregel import Pregel
from langgraph.types import StateSnapshot

from fencepost.graph.account import account_open, account_owner, close_cancelled
from fencepost.graph.node_io import AsyncIO, SyncIO, drive
from fencepost.graph.record import plain
from fencepost.graph.settings import LoopConfig, settings_of
from fencepost.graph.state import has_run, load_state, run_output, with_pending_fork
from fencepost.policy import (
    AgentState,
    StopRequest,
    TerminationReason,
)
from fencepost.policy.context import RunContext
from fencepost.policy.keys import run_account
from fencepost.policy.stopping import CancelRefused, cancel_refusal

__all__ = ["CancelRefused", "NestedRunUnreachable", "acancel", "cancel"]

_CANCEL = StopRequest(reason=TerminationReason.CANCELLED, error_code="cancelled")

# The nodes cancel may write its stop as, in order. Never one the thread has pending: that node
# may be running right now (another thread's invoke, another worker), and LangGraph keeps only
# the first write per task and index, so a stop written as it would drop the node's own writes
# (a write's observation: the id of an effect already made). Written as a node that is not
# pending, the stop starts a checkpoint of its own; a node still running keeps its writes on
# its own checkpoints and its run, refused its next step or tool by the closed account, ends
# ``cancelled`` by itself with everything it did.
_WRITERS = ("terminal", "execute", "decide")

# "|" joins namespace levels and ":" ends a level's node name (LangGraph's NS_SEP and NS_END,
# private since 1.0).
_NS_SEP, _NS_END = "|", ":"


class NestedRunUnreachable(LookupError):
    """``cancel`` was given a parent graph whose nested fencepost run it cannot reach: the
    nested graph is not one LangGraph finds among the parent's subgraphs. The message says what
    to pass instead; nothing was changed."""

    def __init__(self, node: str, config: RunnableConfig) -> None:
        super().__init__(
            f"the run on this thread is nested in the parent's node {node!r}, whose graph "
            "LangGraph does not list among the parent's subgraphs: cancel it with "
            f"fp.cancel(nested_graph, {config!r}), the nested fencepost graph and this config"
        )
        self.config = config


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
    turn = 0 if state is None else len(state.turns)
    branch = None if state is None else state.branch
    return run_account(
        "" if thread is None else str(thread), run_id, _namespace(config), turn, branch
    )


def _current(values: Mapping[str, Any]) -> AgentState:
    """The run on a thread as its next node reads it: a value a caller wrote that does not
    validate is mended (the run then ends, never half-read), never raised out of a cancel. A
    state that reads ended is taken as ended only once the ledger agrees (the terminal node
    closes the account it owns before it writes an ending): an ending a caller wrote over a
    run still going does not stop a cancel from closing its account."""
    state = load_state(values)
    if state is None:  # has_run said there is one
        raise RuntimeError("no run on this thread")
    return with_pending_fork(values, state)


def _writer(pending: Sequence[str]) -> str:
    """The node the cancel's stop is written as (see ``_WRITERS``)."""
    return next(node for node in _WRITERS if node not in pending)


def _node_path(namespace: str) -> str:
    """A checkpoint namespace's node names (``agent:<task>|inner:<task>`` -> ``agent|inner``):
    what ``get_subgraphs`` takes."""
    return _NS_SEP.join(level.partition(_NS_END)[0] for level in namespace.split(_NS_SEP))


def _node(config: RunnableConfig) -> str:
    """The parent's node a nested run's config names (its namespace's innermost level)."""
    return _node_path(_namespace(config)).split(_NS_SEP)[-1]


def _settings(graph: Pregel[Any, Any, Any, Any], config: RunnableConfig) -> LoopConfig | None:
    """The settings of the fencepost graph whose run ``config`` names: ``graph`` itself, or, for
    a parent graph given a nested run's config, the nested graph among its subgraphs."""
    settings = settings_of(graph)
    namespace = _namespace(config)
    if settings is not None or not namespace:
        return settings
    for _, sub in graph.get_subgraphs(namespace=_node_path(namespace), recurse=True):
        return settings_of(sub)
    return None


def _check(
    owner: Mapping[str, str] | None, ctx: RunContext | None, state: AgentState | None
) -> None:
    """Raise :class:`CancelRefused` unless the caller in ``ctx`` may cancel the run."""
    code = cancel_refusal(
        owner,
        ctx,
        tenant_id=None if state is None else state.tenant_id,
        principal_id=None if state is None else state.principal_id,
        run_id=None if state is None else state.run_id,
    )
    if code is not None:
        raise CancelRefused(code)


def _owner(settings: LoopConfig, account: str) -> Mapping[str, str] | None:
    """Who the run's account was opened for; None if the ledger holds no such account."""
    return drive(account_owner(SyncIO(settings), account))


async def _aowner(settings: LoopConfig, account: str) -> Mapping[str, str] | None:
    """Async twin of :func:`_owner`."""
    return await account_owner(AsyncIO(settings), account)


def _nested_runs(snapshot: StateSnapshot) -> Iterator[StateSnapshot]:
    """The fencepost runs nested in the parent's pending tasks, outermost first, as LangGraph's
    ``subgraphs=True`` state names them."""
    for task in snapshot.tasks:
        sub = task.state
        if isinstance(sub, StateSnapshot):
            if has_run(sub.values):
                yield sub
            else:
                yield from _nested_runs(sub)


def _nested_config(config: RunnableConfig, sub: StateSnapshot) -> RunnableConfig:
    configurable = sub.config.get("configurable") or {}
    thread = (config.get("configurable") or {}).get("thread_id")
    return {"configurable": {"thread_id": thread, "checkpoint_ns": configurable["checkpoint_ns"]}}


def _reachable(
    graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, parent: StateSnapshot
) -> list[RunnableConfig]:
    """The configs of the fencepost runs nested in ``parent``'s pending tasks, each reachable
    through ``graph``; else :class:`NestedRunUnreachable` before anything is changed."""
    nested = [_nested_config(config, sub) for sub in _nested_runs(parent)]
    for each in nested:
        if _settings(graph, each) is None:
            raise NestedRunUnreachable(_node(each), each)
    return nested


def _unlisted(config: RunnableConfig, parent: StateSnapshot) -> list[tuple[str, RunnableConfig]]:
    """Each pending task of ``parent`` whose state LangGraph does not list (its graph is not
    among the parent's subgraphs), with the config of the namespace a run nested in it has."""
    thread = (config.get("configurable") or {}).get("thread_id")
    return [
        (
            task.name,
            {
                "configurable": {
                    "thread_id": thread,
                    "checkpoint_ns": f"{task.name}{_NS_END}{task.id}",
                }
            },
        )
        for task in parent.tasks
        if task.state is None
    ]


def _holds_run(checkpoint: Mapping[str, Any]) -> bool:
    """Whether a stored checkpoint holds a fencepost run: its run record channel was written (a
    delta channel's value is stored as writes, so its version is what the checkpoint shows), or
    it is of the first layout (refused when read)."""
    versions = checkpoint.get("channel_versions") or {}
    return "run" in versions or "run_id" in versions


def _refuse_unlisted(saver: Any, tasks: list[tuple[str, RunnableConfig]]) -> None:
    """Raise :class:`NestedRunUnreachable` for an unlisted task whose namespace holds a
    fencepost run on the parent's checkpointer: a cancel could not reach it, and saying nothing
    would leave it to run its write at the next approval."""
    if not isinstance(saver, BaseCheckpointSaver):
        return
    for node, nested in tasks:
        saved = saver.get_tuple(nested)
        if saved is not None and _holds_run(saved.checkpoint):
            raise NestedRunUnreachable(node, nested)


async def _arefuse_unlisted(saver: Any, tasks: list[tuple[str, RunnableConfig]]) -> None:
    """Async twin of :func:`_refuse_unlisted`."""
    if not isinstance(saver, BaseCheckpointSaver):
        return
    for node, nested in tasks:
        saved = await saver.aget_tuple(nested)
        if saved is not None and _holds_run(saved.checkpoint):
            raise NestedRunUnreachable(node, nested)


def cancel(
    graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *, context: RunContext | None = None
) -> AgentState | None:
    """End the thread in ``config`` as ``cancelled``; idempotent, and safe from any thread.

    First the run's ledger account is closed: a run still going on (another thread's ``invoke``,
    another worker) is refused its next model step or tool and ends ``cancelled`` by itself.
    Then the terminal node writes the durable cancel record, never as a node that may still be
    running: a call the ledger shows started and that has no receipt yet is recorded
    ``uncertain`` (its id kept), and the run still going writes its own results and ending
    after it. Use it also after cancelling the task that ran ``ainvoke``/``astream`` (which
    re-raises ``CancelledError``). Returns the final state, or ``None`` if nothing ever ran on
    the thread. LangGraph saves checkpoints in the background by default, so a run that started
    a moment ago may not show on its thread yet: ``None`` then means nothing was cancelled (call
    again, or start the run with ``durability="sync"``).

    ``context`` is the caller's: a cancel naming the context of anyone but the run's owner (the
    identity its ledger account was opened for) changes nothing and raises
    :class:`CancelRefused`. Without one it is the operator's cancel.

    A config pinned to a checkpoint (a snapshot's ``config``) cancels the thread's latest one:
    never a fork from an earlier checkpoint.

    A run nested in a parent graph's node belongs to the parent's thread: its account is closed,
    and the parent's next invoke (a resume, say) ends it ``cancelled`` at its next model step or
    tool; no node of the parent runs here. Name it with the parent graph and the parent's config
    (every fencepost run nested in the parent's pending tasks, as LangGraph's
    ``get_state(config, subgraphs=True)`` lists them, is cancelled, and the first one's state
    returned), or with the parent or the nested graph and the nested run's own config (its
    subgraph's ``checkpoint_ns``). The state returned is the nested run's as it was (``None``
    when the graph given cannot read it: the nested graph compiled without a checkpointer). A
    nested graph LangGraph does not list among the parent's subgraphs cannot be reached from the
    parent: :class:`NestedRunUnreachable` says what to pass instead, and nothing is changed.
    """
    config = _head(config)
    if _namespace(config):
        return _cancel_nested(graph, config, context)
    snapshot = graph.get_state(config)
    if not has_run(snapshot.values):
        if settings_of(graph) is not None:
            return None
        parent = graph.get_state(config, subgraphs=True)
        nested = _reachable(graph, config, parent)
        _refuse_unlisted(graph.checkpointer, _unlisted(config, parent))
        ended = [_cancel_nested(graph, each, context) for each in nested]
        return ended[0] if ended else None
    state = _current(snapshot.values)
    settings = settings_of(graph)
    account = _account(config, state)
    if state.is_terminal and not (
        settings is not None and drive(account_open(SyncIO(settings), account))
    ):
        return state
    _check(None if settings is None else _owner(settings, account), context, state)
    if settings is not None:
        _close(settings, account)
    graph.update_state(config, {"run": {"stop": plain(_CANCEL)}}, as_node=_writer(snapshot.next))
    graph.invoke(None, config, context=context)
    return run_output(graph.get_state(config).values)


async def acancel(
    graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *, context: RunContext | None = None
) -> AgentState | None:
    """Async twin of :func:`cancel`."""
    config = _head(config)
    if _namespace(config):
        return await _acancel_nested(graph, config, context)
    snapshot = await graph.aget_state(config)
    if not has_run(snapshot.values):
        if settings_of(graph) is not None:
            return None
        parent = await graph.aget_state(config, subgraphs=True)
        nested = _reachable(graph, config, parent)
        await _arefuse_unlisted(graph.checkpointer, _unlisted(config, parent))
        ended = [await _acancel_nested(graph, each, context) for each in nested]
        return ended[0] if ended else None
    state = _current(snapshot.values)
    settings = settings_of(graph)
    account = _account(config, state)
    if state.is_terminal and not (
        settings is not None and await account_open(AsyncIO(settings), account)
    ):
        return state
    _check(None if settings is None else await _aowner(settings, account), context, state)
    if settings is not None:
        await _aclose(settings, account)
    await graph.aupdate_state(
        config, {"run": {"stop": plain(_CANCEL)}}, as_node=_writer(snapshot.next)
    )
    await graph.ainvoke(None, config, context=context)
    return run_output((await graph.aget_state(config)).values)


def _cancel_nested(
    graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, context: RunContext | None
) -> AgentState | None:
    """Close the account of the run nested at ``config``'s namespace, read through ``graph``
    (the nested graph or its parent); the parent's next invoke ends it."""
    settings = _settings(graph, config)
    if settings is None:
        raise NestedRunUnreachable(_node(config), config)
    state = _nested_state(graph, config)
    account = _account(config, state)
    _check(_owner(settings, account), context, state)
    if state is None or not state.is_terminal:
        _close(settings, account)
    return state


async def _acancel_nested(
    graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, context: RunContext | None
) -> AgentState | None:
    """Async twin of :func:`_cancel_nested`."""
    settings = _settings(graph, config)
    if settings is None:
        raise NestedRunUnreachable(_node(config), config)
    state = await _anested_state(graph, config)
    account = _account(config, state)
    _check(await _aowner(settings, account), context, state)
    if state is None or not state.is_terminal:
        await _aclose(settings, account)
    return state


def _nested_state(graph: Pregel[Any, Any, Any, Any], config: RunnableConfig) -> AgentState | None:
    """A nested run's state as its own graph reads it; None if that graph cannot read it (it was
    compiled without a checkpointer: the parent's saver holds the run) or nothing ran there."""
    try:
        values = graph.get_state(config).values
    except ValueError:  # "No checkpointer set": nothing to read, the account is still named
        return None
    return run_output(values) if has_run(values) else None


async def _anested_state(
    graph: Pregel[Any, Any, Any, Any], config: RunnableConfig
) -> AgentState | None:
    """Async twin of :func:`_nested_state`."""
    try:
        values = (await graph.aget_state(config)).values
    except ValueError:
        return None
    return run_output(values) if has_run(values) else None


def _close(settings: LoopConfig, account: str) -> None:
    """Close the run's ledger account as cancelled (the first close's reason stands)."""
    drive(close_cancelled(SyncIO(settings), account))


async def _aclose(settings: LoopConfig, account: str) -> None:
    """Async twin of :func:`_close`."""
    await close_cancelled(AsyncIO(settings), account)
