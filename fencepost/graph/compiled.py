"""The StateGraph ``build_agent_graph`` returns: a plain LangGraph ``StateGraph`` whose compiled
graph never lets ``GraphRecursionError`` out once the run has ended with a reason, and refuses a
``Command`` that would make two nodes write one field in one step.

With ``recursion_limit=1`` LangGraph runs the terminal node (which records
``step_budget_exhausted``) and then raises anyway: its step check runs before its "nothing left
to run" check. The run has ended as data by then, so the error is dropped and the ended state is
returned; any other ``GraphRecursionError`` is raised as before.

The loop runs one node per step. A caller's ``goto`` beside a node the thread is already waiting
on (the approval, or the node after an ``interrupt_after``), a ``goto`` of several nodes, an
update that names one field twice, or one of a field an earlier command's update to the same
pause wrote (still pending: its answer was asked again) would have two writers of one field:
LangGraph saves such a Command's writes before applying them and then raises
``InvalidUpdateError`` (at every later invoke of the thread, for the first three). It is refused before anything is saved (:class:`CommandRefused`), and so
is an update of LangGraph's own channels (a goto by another name) and any ``Send``.

A resume value no checkpoint could hold (nested past what the serializer writes, an integer
past 64 bits) is replaced, before LangGraph stores it, by a marker the approval reads as an
answer to ask again (``approval.UNREPRESENTABLE_ANSWER``): stored as given, the serializer's
error would escape ``invoke`` and leave the answer half-written.

Time travel is refused too (:class:`ForkRefused`): an invoke, stream or state update whose
config names a checkpoint other than its thread's latest would fork the thread there, and a
fork of a fencepost run is no run at all (its ledger account is closed, or still the
original's), so nothing of it is written and the thread keeps the ending it has.

Every invoke, stream or resume is one ``invoke_agent`` span when OpenTelemetry is installed
(:mod:`fencepost.adapters.telemetry`); ``invoke`` and ``ainvoke`` run through ``stream`` and
``astream``, so those two carry it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.channels.last_value import LastValue
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import GraphRecursionError
from langgraph.graph import StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Send

from fencepost.adapters import telemetry
from fencepost.graph.record import FIELDS, record_of
from fencepost.graph.state import RetiredChannel
from fencepost.policy import Phase
from fencepost.policy.approval import UNREPRESENTABLE_ANSWER, storable_answer


class CommandRefused(ValueError):
    """A ``Command`` or state update the loop cannot take: it would make two nodes write one field
    in one step, or writes no channel of the state (see the module docstring). Nothing of it was
    saved; the thread is as it was.

    >>> str(CommandRefused("goto names 2 nodes"))
    'command refused: goto names 2 nodes'
    """

    def __init__(self, why: str) -> None:
        super().__init__(f"command refused: {why}")
        self.why = why


class ForkRefused(ValueError):
    """An invoke, stream or state update named a checkpoint that is not its thread's latest:
    LangGraph would fork the thread there (time travel). A fencepost run's budget is its ledger
    account, closed when the run ended, so a fork is never that run, nor a new one: it is
    refused before anything is written, and the thread keeps the ending it has.

    >>> str(ForkRefused("ck-1"))
    "fork refused: checkpoint 'ck-1' is not the thread's latest; invoke the thread's config (without a checkpoint_id) or start a new thread"
    """

    def __init__(self, checkpoint_id: str) -> None:
        super().__init__(
            f"fork refused: checkpoint {checkpoint_id!r} is not the thread's latest; invoke "
            "the thread's config (without a checkpoint_id) or start a new thread"
        )
        self.checkpoint_id = checkpoint_id


def ended(values: Mapping[str, Any]) -> bool:
    """Whether the run in these channel values has ended."""
    return record_of(values).get("phase") == Phase.TERMINAL.value


def _targets(command: Command[Any]) -> list[Any]:
    goto = command.goto
    if isinstance(goto, list | tuple):
        return list(goto)
    return [goto] if goto else []


def _keys(update: Any) -> list[Any] | None:
    """The channels an update writes (None: a form LangGraph writes to no channel)."""
    if isinstance(update, dict):
        return list(update)
    if isinstance(update, list | tuple) and all(
        isinstance(p, tuple) and len(p) == 2 for p in update
    ):
        return [p[0] for p in update]
    return None


def _update_refusal(
    command: Command[Any], fields: Mapping[str, Any], written: AbstractSet[str] = frozenset()
) -> str | None:
    """A state update may write the state's own fields, each last-value one once (a list of
    pairs can name one twice; a record or the conversation takes several writes a step), and
    none an earlier ``Command`` to the same pause already wrote (``written``: its update is
    still pending, applied again with this one's). LangGraph's own channels
    (``branch:to:<node>``, ``__start__``, ``__pregel_tasks``) are a goto by another name: never."""
    keys = _keys(command.update)
    if keys is None:
        return None
    unknown = _unknown_key(keys, fields)
    if unknown is not None:
        return unknown
    seen: set[str] = set()
    for key in keys:
        if isinstance(fields[key], LastValue):
            if key in seen:
                return f"the update writes {key!r} twice"
            if key in written:
                return f"the update writes {key!r}, which an earlier command to this pause wrote"
            seen.add(key)
    return None


def _refusal(
    command: Command[Any],
    waiting: tuple[str, ...],
    fields: Mapping[str, Any],
    written: AbstractSet[str] = frozenset(),
) -> str | None:
    """Why ``command`` cannot be taken on a thread ``waiting`` on these nodes, if it cannot."""
    targets = _targets(command)
    if len(targets) > 1:
        return f"goto names {len(targets)} nodes"
    if any(isinstance(t, Send) for t in targets):
        # A node fed by a Send reads the Send's argument as its state: no node here is.
        return "goto sends a node its own input"
    # A goto of the very node the thread waits on is that one task.
    if targets and any(node != targets[0] for node in waiting):
        return f"goto beside {', '.join(waiting)}, which the thread is waiting on"
    return _update_refusal(command, fields, written)


def _unknown_key(keys: list[Any], fields: Mapping[str, Any]) -> str | None:
    """Why an update naming ``keys`` writes no channel of the state, if one does not."""
    for key in keys:
        if isinstance(key, str) and key in fields and not isinstance(fields[key], RetiredChannel):
            continue
        if isinstance(key, str) and key in FIELDS:
            return (
                f"the update writes {key!r}, a field of the run record: write "
                f'{{"run": {{"{key}": ...}}}}'
            )
        return "the update writes a channel that is no field of the state"
    return None


def _state_update_refusal(supersteps: Any, fields: Mapping[str, Any]) -> str | None:
    """Why a state update (``update_state``, ``bulk_update_state``) names a key that is no
    channel of the state (LangGraph would drop it without a word), if one does."""
    try:
        updates = [u for step in supersteps for u in step]
    except TypeError:
        return None
    for update in updates:
        keys = _keys(getattr(update, "values", None))
        if keys:
            why = _unknown_key(keys, fields)
            if why is not None:
                return why
    return None


_INTERRUPT_ID = re.compile(r"[0-9a-f]{32}")
"""How LangGraph names an interrupt (an xxh3-128 hex digest): the keys of a resume map."""


def _storable(command: Command[Any]) -> Command[Any]:
    """``command`` with each resume value no checkpoint could hold replaced by the marker."""
    resume = command.resume
    if resume is None:
        return command
    if (
        isinstance(resume, dict)
        and resume
        and all(isinstance(k, str) and _INTERRUPT_ID.fullmatch(k) for k in resume)
    ):
        # A map of interrupt ids to answers: each answer judged on its own.
        kept = {k: v if storable_answer(v) else UNREPRESENTABLE_ANSWER for k, v in resume.items()}
        if all(kept[k] is resume[k] for k in resume):
            return command
        return dataclasses.replace(command, resume=kept)
    if storable_answer(resume):
        return command
    return dataclasses.replace(command, resume=UNREPRESENTABLE_ANSWER)


def _named_checkpoint(config: RunnableConfig | None, checkpointer: Any) -> str | None:
    """The checkpoint id a top-level call's ``config`` names, if it names one and the graph has
    a checkpointer of its own. A graph run inside a parent graph's node (a checkpoint namespace)
    is the parent's to judge."""
    if config is None or checkpointer is None or isinstance(checkpointer, bool):
        return None
    configurable = config.get("configurable") or {}
    named = configurable.get("checkpoint_id")
    if not named or configurable.get("checkpoint_ns") or configurable.get("thread_id") is None:
        return None
    return str(named)


def _thread_head(config: RunnableConfig | None) -> RunnableConfig:
    configurable = (config or {}).get("configurable") or {}
    return {"configurable": {"thread_id": configurable["thread_id"], "checkpoint_ns": ""}}


def _id_of(config: RunnableConfig) -> str | None:
    value = (config.get("configurable") or {}).get("checkpoint_id")
    return None if value is None else str(value)


class BoundedStateGraph(StateGraph[Any, Any, Any, Any]):
    """A ``StateGraph`` whose ``compile()`` returns a :class:`BoundedCompiledGraph`."""

    durable_twin: Callable[[Any], StateGraph[Any, Any, Any, Any] | None] | None = None
    """Given the checkpointer ``compile`` is called with, the graph to compile instead (the same
    loop over a ledger as durable as that checkpointer), or ``None`` to compile this one; set by
    the builder on a graph built with no ledger. It may raise to refuse the checkpointer."""

    def compile(
        self, checkpointer: Any = None, **kwargs: Any
    ) -> CompiledStateGraph[Any, Any, Any, Any]:
        twin = self.durable_twin(checkpointer) if self.durable_twin is not None else None
        if twin is not None:
            return twin.compile(checkpointer, **kwargs)
        compiled = super().compile(checkpointer, **kwargs)
        compiled.__class__ = BoundedCompiledGraph
        return compiled


class BoundedCompiledGraph(CompiledStateGraph[Any, Any, Any, Any]):
    """A compiled fencepost graph: LangGraph's, except as the module docstring says."""

    def _ended(self, config: RunnableConfig | None) -> bool:
        if config is None or self.checkpointer is None:
            return False
        try:
            return ended(self.get_state(config).values)
        except Exception:
            return False

    async def _aended(self, config: RunnableConfig | None) -> bool:
        if config is None or self.checkpointer is None:
            return False
        try:
            return ended((await self.aget_state(config)).values)
        except Exception:
            return False

    def _waiting(self, command: Command[Any], config: RunnableConfig | None) -> tuple[str, ...]:
        if not _targets(command) or config is None or self.checkpointer is None:
            return ()
        return tuple(self.get_state(config).next)

    def _written(self, command: Command[Any], config: RunnableConfig | None) -> frozenset[str]:
        """The channels an earlier command's update wrote to the checkpoint the thread waits at:
        pending writes of no task of it (a task's own writes name the task)."""
        saver = self.checkpointer
        if (
            not _keys(command.update)
            or config is None
            or not isinstance(saver, BaseCheckpointSaver)
        ):
            return frozenset()  # a nested graph's (its parent's saver) is its parent's to check
        saved = saver.get_tuple(config)
        if saved is None or not saved.pending_writes:
            return frozenset()
        tasks = {t.id for t in self.get_state(config).tasks}
        return frozenset(ch for task, ch, _ in saved.pending_writes if task not in tasks)

    async def _awritten(
        self, command: Command[Any], config: RunnableConfig | None
    ) -> frozenset[str]:
        saver = self.checkpointer
        if (
            not _keys(command.update)
            or config is None
            or not isinstance(saver, BaseCheckpointSaver)
        ):
            return frozenset()
        saved = await saver.aget_tuple(config)
        if saved is None or not saved.pending_writes:
            return frozenset()
        tasks = {t.id for t in (await self.aget_state(config)).tasks}
        return frozenset(ch for task, ch, _ in saved.pending_writes if task not in tasks)

    async def _awaiting(
        self, command: Command[Any], config: RunnableConfig | None
    ) -> tuple[str, ...]:
        if not _targets(command) or config is None or self.checkpointer is None:
            return ()
        return tuple((await self.aget_state(config)).next)

    def _fork_of(self, config: RunnableConfig | None) -> str | None:
        """The checkpoint ``config`` names when that is not its thread's latest (a fork)."""
        named = _named_checkpoint(config, self.checkpointer)
        if named is None:
            return None
        latest = self.checkpointer.get_tuple(_thread_head(config))  # type: ignore[union-attr]
        return named if latest is None or _id_of(latest.config) != named else None

    async def _afork_of(self, config: RunnableConfig | None) -> str | None:
        named = _named_checkpoint(config, self.checkpointer)
        if named is None:
            return None
        latest = await self.checkpointer.aget_tuple(_thread_head(config))  # type: ignore[union-attr]
        return named if latest is None or _id_of(latest.config) != named else None

    def bulk_update_state(self, config: RunnableConfig, supersteps: Any) -> RunnableConfig:
        fork = self._fork_of(config)
        if fork is not None:
            raise ForkRefused(fork)
        supersteps = list(supersteps)
        why = _state_update_refusal(supersteps, self.builder.channels)
        if why is not None:
            raise CommandRefused(why)
        return super().bulk_update_state(config, supersteps)

    async def abulk_update_state(self, config: RunnableConfig, supersteps: Any) -> RunnableConfig:
        fork = await self._afork_of(config)
        if fork is not None:
            raise ForkRefused(fork)
        supersteps = list(supersteps)
        why = _state_update_refusal(supersteps, self.builder.channels)
        if why is not None:
            raise CommandRefused(why)
        return await super().abulk_update_state(config, supersteps)

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        return telemetry.traced(self._bounded_stream(input, config, **kwargs), self, config)

    def _bounded_stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        fork = self._fork_of(config)
        if fork is not None:
            raise ForkRefused(fork)
        if isinstance(input, Command):
            why = _refusal(
                input,
                self._waiting(input, config),
                self.builder.channels,
                self._written(input, config),
            )
            if why is not None:
                raise CommandRefused(why)
            input = _storable(input)
        try:
            yield from super().stream(input, config, **kwargs)
        except GraphRecursionError:
            if not self._ended(config):
                raise

    def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        return telemetry.atraced(self._bounded_astream(input, config, **kwargs), self, config)

    async def _bounded_astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        fork = await self._afork_of(config)
        if fork is not None:
            raise ForkRefused(fork)
        if isinstance(input, Command):
            why = _refusal(
                input,
                await self._awaiting(input, config),
                self.builder.channels,
                await self._awritten(input, config),
            )
            if why is not None:
                raise CommandRefused(why)
            input = _storable(input)
        try:
            async for chunk in super().astream(input, config, **kwargs):
                yield chunk
        except GraphRecursionError:
            if not await self._aended(config):
                raise
