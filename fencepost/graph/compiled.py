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
is an update of LangGraph's own channels (a goto by another name) and any ``Send``. So is an
answer (a ``Command`` with a ``resume``) whose update rewrites the run's identity
(:data:`IDENTITY_FIELDS`) to another tenant or principal: LangGraph would save that write
before the approval judged the answer, and a refused answer would leave the run another
principal's.

A resume value no checkpoint could hold (nested past what the serializer writes, an integer
past 64 bits, a type the serializer does not write) is replaced, before LangGraph stores it, by
a marker the approval reads as an answer to ask again (``approval.UNREPRESENTABLE_ANSWER``):
stored as given, the serializer's error would escape ``invoke`` and leave the answer
half-written. An update (a ``Command``'s, or ``update_state``'s) is handed to LangGraph as a
plain map of the channels the checks saw: the run record's write in the plain form the record
takes of it, any other value only if the saver's serializer writes it (else refused). An update
in any other form (an object LangGraph reads by its class's annotations, a bare value) is
refused, and a ``Command`` given to ``update_state`` is checked as one given to ``invoke``. An
``invoke`` input is a map, its values checked as an update's.

An invoke, stream or state update whose config names a checkpoint other than its thread's latest
forks the thread there (time travel): the call is given a write of the ``fork`` channel naming
that checkpoint (an input of ``None``, a replay, becomes that write alone), and the next node
goes on as a new run (:mod:`fencepost.graph.fork`). A thread whose latest checkpoint another
state layout wrote is refused before anything is saved
(:class:`~fencepost.graph.state.LayoutRefused`): LangGraph saves an input, a resume value or a
node's error before any node could read the run and refuse it.

Every invoke, stream or resume is one :meth:`~fencepost.graph.events.LoopListener.invoked`
event of the loop's event stream (fencepost's telemetry makes it an ``invoke_agent`` span when
OpenTelemetry is installed); ``invoke`` and ``ainvoke`` run through ``stream`` and ``astream``,
so those two carry it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from langchain_core.messages import convert_to_messages
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config
from langgraph.channels.last_value import LastValue
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.errors import GraphRecursionError
from langgraph.graph import StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Send, StateUpdate

from fencepost.graph.events import EVENTS
from fencepost.graph.record import FIELDS, caller_write, record_of, run_started
from fencepost.graph.settings import (
    NO_CHECKPOINTER,
    SYNC_SAVER,
    GraphConfigError,
    settings_of,
)
from fencepost.graph.state import (
    ForkChannel,
    RetiredChannel,
    RunInProgress,
    TurnChannel,
    fork_token,
    refuse_older_checkpoint,
    request_from,
)
from fencepost.policy import Phase
from fencepost.policy.approval import UNREPRESENTABLE_ANSWER, storable_answer


class CommandRefused(ValueError):
    """A ``Command`` or state update the loop cannot take: it would make two nodes write one field
    in one step, writes no channel of the state, is in no form of a map of channels, or holds a
    value no checkpoint can store (see the module docstring). Nothing of it was saved; the
    thread is as it was.

    >>> str(CommandRefused("goto names 2 nodes"))
    'command refused: goto names 2 nodes'
    """

    def __init__(self, why: str) -> None:
        super().__init__(f"command refused: {why}")
        self.why = why


def ended(values: Mapping[str, Any]) -> bool:
    """Whether the run in these channel values has ended."""
    return record_of(values).get("phase") == Phase.TERMINAL.value


def _targets(command: Command[Any]) -> list[Any]:
    goto = command.goto
    if isinstance(goto, list | tuple):
        return list(goto)
    return [goto] if goto else []


def _pairs(update: Any) -> list[tuple[Any, Any]] | None:
    """What an update writes, as (channel, value) pairs read once (None: nothing). A map's
    pairs are read as a ``dict`` holds them (a subclass's own ``items`` or ``__iter__`` could
    name one set of channels to this check and another to LangGraph). Any other form LangGraph
    takes (an object whose class annotates channel names, a bare value it writes to
    ``__root__``) would write channels no check here saw: refused."""
    if not update:
        return None  # LangGraph writes nothing for it
    if isinstance(update, dict):
        return list(dict.items(update))
    if isinstance(update, list | tuple) and all(
        isinstance(p, tuple) and len(p) == 2 for p in update
    ):
        return [(p[0], p[1]) for p in update]
    raise CommandRefused("the update is no map of channel names to values")


def _keys(update: Any) -> list[Any] | None:
    """The channels an update writes (None: a form LangGraph writes to no channel)."""
    pairs = _pairs(update)
    return None if pairs is None else [k for k, _ in pairs]


def _serializes(value: Any, serde: SerializerProtocol) -> bool:
    try:
        serde.dumps_typed(value)
    except Exception:  # the serializer's own refusal (TypeError, RecursionError, ValueError...)
        return False
    return True


def _stored_update(update: Any, serde: SerializerProtocol) -> Any:
    """``update`` as LangGraph is handed it: a plain ``dict`` (or list of pairs) of the channels
    the checks saw, the run record's write in the plain form the record takes
    (:func:`~fencepost.graph.record.caller_write`). LangGraph saves a command's writes before
    it applies them: a value no checkpoint can store would raise out of ``invoke`` half-saved
    (and an update's, out of ``update_state``): refused, nothing saved."""
    pairs = _pairs(update)
    if pairs is None:
        return update
    stored: list[tuple[Any, Any]] = []
    for key, value in pairs:
        if key == "run":
            value = caller_write(value)
        elif not _serializes(value, serde):
            raise CommandRefused(f"the update's value for {key!r} is one no checkpoint can store")
        stored.append((key, value))
    if isinstance(update, dict):
        return dict(stored)
    return stored


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


IDENTITY_FIELDS = ("tenant_id", "principal_id")
"""The run record's fields that say whose run it is, bound at its start."""


def _identity_written(command: Command[Any]) -> dict[str, Any]:
    """What an answer's update writes of :data:`IDENTITY_FIELDS` to the run record (read as
    the record will take the write: :func:`~fencepost.graph.record.caller_write`); nothing
    for a command that answers nothing."""
    if command.resume is None:
        return {}
    written: dict[str, Any] = {}
    for key, value in _pairs(command.update) or ():
        if key == "run":
            taken = caller_write(value)
            written.update((name, taken[name]) for name in IDENTITY_FIELDS if name in taken)
    return written


def _identity_refusal(written: Mapping[str, Any], values: Mapping[str, Any]) -> str | None:
    """Why an answer whose update writes ``written`` of the run's identity is refused, given
    the thread's channel ``values``: it names another tenant or principal than the run's.
    LangGraph saves a command's update before the node judges its answer, so a refused
    answer's rewrite would stay, and the requester's own answer would then read as another
    principal's."""
    record = record_of(values)
    for name, value in written.items():
        if name in record and record[name] != value:
            return f"the answer's update rewrites the run's {name!r}: an answer cannot change whose run it is"
    return None


def _unknown_key(keys: list[Any], fields: Mapping[str, Any]) -> str | None:
    """Why an update naming ``keys`` writes no channel of the state, if one does not."""
    for key in keys:
        if (
            isinstance(key, str)
            and key in fields
            and not isinstance(fields[key], RetiredChannel | TurnChannel | ForkChannel)
        ):
            continue
        if isinstance(key, str) and key in FIELDS:
            return (
                f"the update writes {key!r}, a field of the run record: write "
                f'{{"run": {{"{key}": ...}}}}'
            )
        return "the update writes a channel that is no field of the state"
    return None


_DEFAULT_SERDE = JsonPlusSerializer()
"""LangGraph's default serializer: what a graph without a saver of its own is judged by."""

_INTERRUPT_ID = re.compile(r"[0-9a-f]{32}")
"""How LangGraph names an interrupt (an xxh3-128 hex digest): the keys of a resume map."""


def _storable(command: Command[Any], serde: SerializerProtocol) -> Command[Any]:
    """``command`` with each resume value no checkpoint could hold replaced by the marker, and
    its update as it will be stored (:func:`_stored_update`)."""
    update = _stored_update(command.update, serde)
    if update is not command.update:
        command = dataclasses.replace(command, update=update)
    resume = command.resume
    if resume is None:
        return command
    if (
        isinstance(resume, dict)
        and resume
        and all(isinstance(k, str) and _INTERRUPT_ID.fullmatch(k) for k in resume)
    ):
        # A map of interrupt ids to answers: each answer judged on its own.
        kept = {
            k: v if _answer_fits(v, serde) else UNREPRESENTABLE_ANSWER
            for k, v in dict.items(resume)
        }
        if all(kept[k] is resume[k] for k in kept):
            return command
        return dataclasses.replace(command, resume=kept)
    if _answer_fits(resume, serde):
        return command
    return dataclasses.replace(command, resume=UNREPRESENTABLE_ANSWER)


def _stored_input(input: Any, serde: SerializerProtocol) -> Any:
    """An ``invoke`` input as LangGraph is handed it (:func:`_stored_update`): LangGraph saves
    it before any node reads it, and an input that is no map (``"hello"``) it saves and then
    raises on, at that invoke and every later one of the thread."""
    if not isinstance(input, dict):
        raise CommandRefused("the input is no map of channel names to values")
    return _stored_update(input, serde)


def _answer_fits(answer: Any, serde: SerializerProtocol) -> bool:
    """Whether a resume value can be stored: nested no deeper than an answer may be, and of
    types the serializer writes (a ``complex``, an object of the caller's own, raise there)."""
    return storable_answer(answer) and _serializes(answer, serde)


def _state_updates(
    supersteps: list[Any],
    fields: Mapping[str, Any],
    serde: SerializerProtocol,
    waiting: Callable[[Command[Any]], tuple[str, ...]],
) -> list[Any]:
    """The supersteps of a state update as LangGraph is handed them, or :class:`CommandRefused`:
    each update's values a map of the state's channels, stored as :func:`_stored_update` says; a
    ``Command`` as its values is checked as one given to ``invoke`` is (a goto beside the node
    the thread waits on, a ``Send``, a goto by another name), since LangGraph takes it as one."""
    out: list[Any] = []
    for step in supersteps:
        updates: list[Any] = []
        for update in step:
            values = getattr(update, "values", None)
            if isinstance(values, Command):
                why = _refusal(values, waiting(values), fields)
                if why is not None:
                    raise CommandRefused(why)
                values = _storable(values, serde)
            elif values is not None and not isinstance(values, dict):
                raise CommandRefused("a state update's values are a map of channel names")
            else:
                keys = _keys(values)
                why = _unknown_key(keys, fields) if keys else None
                if why is not None:
                    raise CommandRefused(why)
                values = _stored_update(values, serde)
            if isinstance(update, StateUpdate):
                update = update._replace(values=values)  # type: ignore[arg-type]
            updates.append(update)
        out.append(updates)
    return out


def _top_level_thread(config: RunnableConfig | None, checkpointer: Any) -> bool:
    """Whether ``config`` names a thread of a graph with a checkpointer of its own. A graph run
    inside a parent graph's node (a checkpoint namespace) is the parent's to judge."""
    if config is None or not isinstance(checkpointer, BaseCheckpointSaver):
        return False
    configurable = config.get("configurable") or {}
    return configurable.get("thread_id") is not None and not configurable.get("checkpoint_ns")


def _judge_thread(config: RunnableConfig | None, latest: CheckpointTuple | None) -> str | None:
    """The checkpoint ``config`` forks the thread at (one other than the thread's ``latest``),
    or None; raises :class:`~fencepost.graph.state.LayoutRefused` where ``latest`` is of another
    state layout."""
    if latest is not None:
        refuse_older_checkpoint(latest.checkpoint["channel_versions"])
    named = ((config or {}).get("configurable") or {}).get("checkpoint_id")
    if named and (latest is None or _id_of(latest.config) != str(named)):
        return fork_token(str(named))
    return None


def _forked(update: Any, fork: str) -> Any:
    """A state update (or ``Command``) that also records the fork it is made at: the next node
    starts the fork's run (see :mod:`fencepost.graph.fork`)."""
    if isinstance(update, Command):
        return dataclasses.replace(update, update=_forked(update.update, fork))
    if not update:
        return {"fork": fork}
    if isinstance(update, dict):
        return {**update, "fork": fork}
    return [*update, ("fork", fork)]


def _with_fork(supersteps: list[Any], fork: str | None) -> list[Any]:
    """A state update's supersteps, the first update recording the fork it is made at."""
    if fork is None or not supersteps or not supersteps[0]:
        return supersteps
    first = supersteps[0][0]
    values = _forked(getattr(first, "values", None), fork)
    first = first._replace(values=values) if isinstance(first, StateUpdate) else values
    return [[first, *supersteps[0][1:]], *supersteps[1:]]


def _turn_input(input: dict[str, Any], values: Mapping[str, Any], thread: str, paused: bool) -> Any:
    """An ``invoke`` input (a map, already checked) on a thread whose latest state is ``values``:
    on a thread whose run ended, one that asks a question starts the next run (``turn`` names the
    ended run; a ``messages`` input also clears the ended run's start request, so its question is
    the new message's; a start request naming a run the thread already holds is that start sent
    again, and starts nothing); on a thread whose run has not ended, :class:`RunInProgress`. A
    caller's own ``turn`` is never taken."""
    given = {k: v for k, v in input.items() if k not in _FENCEPOST_SET}
    record = record_of(values)
    if not run_started(record):
        return given
    run_id = str(record.get("run_id"))
    request = given.get("request")
    if request is not None and _named_run(request) in _run_ids(record):
        # The same start sent again (a retry): that run, not a new one; one still going
        # continues, as it would from ``invoke(None)``.
        return given
    if record.get("phase") != Phase.TERMINAL.value:
        raise RunInProgress(thread, run_id, paused=paused)
    if request is None:
        if not _asks(given.get("messages")):
            return given  # no question: nothing to start (as an update of the messages)
        given["request"] = None
    return {**given, "turn": run_id}


_FENCEPOST_SET = frozenset({"turn", "fork"})
"""Input channels only fencepost sets: a caller's value for them is dropped."""


def _asks(messages: Any) -> bool:
    """Whether a ``messages`` input holds a human message with a question, in any form LangGraph
    takes (a message, a ``{"role": "user", ...}`` map, a ``("user", text)`` pair, a string)."""
    given = messages if isinstance(messages, list) else [messages]
    try:
        converted = convert_to_messages(given) if messages is not None else []
    except Exception:
        return False  # no message: the conversation drops it too
    return request_from({"messages": converted}, required=False) is not None


def _named_run(request: Any) -> str | None:
    """The run id a start request names (None where it names none)."""
    named = request.get("run_id") if isinstance(request, Mapping) else None
    named = getattr(request, "run_id", None) if named is None else named
    return named if isinstance(named, str) else None


def _run_ids(record: Mapping[str, Any]) -> set[Any]:
    """The run ids a thread's record holds: its latest run's and each earlier turn's."""
    turns = record.get("turns")
    earlier = [t.get("run_id") for t in turns if isinstance(t, Mapping)] if turns else []
    return {record.get("run_id"), *earlier} - {None}


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
        settings = settings_of(self)
        if checkpointer is False and settings is not None and settings.approval == "interrupt":
            # Checkpointing turned off, even as a subgraph: a pause could never be resumed.
            # (``None`` is legitimate: a subgraph inherits its parent's saver, and LangGraph
            # Server supplies one; an invoke that has none is refused then, see ``stream``.)
            raise GraphConfigError("checkpointer", NO_CHECKPOINTER)
        twin = self.durable_twin(checkpointer) if self.durable_twin is not None else None
        if twin is not None:
            return twin.compile(checkpointer, **kwargs)
        compiled = super().compile(checkpointer, **kwargs)
        compiled.__class__ = BoundedCompiledGraph
        return compiled


class BoundedCompiledGraph(CompiledStateGraph[Any, Any, Any, Any]):
    """A compiled fencepost graph: LangGraph's, except as the module docstring says."""

    def _serde(self) -> SerializerProtocol:
        """The serializer a caller's values will be stored with: the saver's (a nested graph's
        is its parent's, unknown here: LangGraph's default)."""
        saver = self.checkpointer
        if isinstance(saver, BaseCheckpointSaver):
            return saver.serde
        return _DEFAULT_SERDE

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

    def _check_thread(
        self, config: RunnableConfig | None
    ) -> tuple[CheckpointTuple | None, str | None]:
        """The thread's latest checkpoint and the checkpoint ``config`` forks it at (None: no
        fork), read before LangGraph saves anything of the call; a latest checkpoint of another
        state layout is refused (:class:`~fencepost.graph.state.LayoutRefused`: LangGraph would
        save an input, a ``__resume__`` or a node's ``__error__`` before any node could read
        the run)."""
        saver = self.checkpointer
        if not _top_level_thread(config, saver):
            return None, None
        latest = saver.get_tuple(_thread_head(config))  # type: ignore[union-attr]
        return latest, _judge_thread(config, latest)

    async def _acheck_thread(
        self, config: RunnableConfig | None
    ) -> tuple[CheckpointTuple | None, str | None]:
        saver = self.checkpointer
        if not _top_level_thread(config, saver):
            return None, None
        latest = await saver.aget_tuple(_thread_head(config))  # type: ignore[union-attr]
        return latest, _judge_thread(config, latest)

    def _turn(self, input: Any, config: RunnableConfig | None, latest: Any, fork: Any) -> Any:
        """``input`` as the thread takes it (:func:`_turn_input`), checked before anything of
        it is saved, at the checkpoint it is given at (the thread's latest, or the one it
        forks). Off a thread of the graph's own saver, or on a new thread (no ``latest``
        checkpoint), only a caller's ``turn`` and ``fork`` are dropped."""
        if not isinstance(input, dict):
            return input
        if latest is None:
            return {k: v for k, v in input.items() if k not in _FENCEPOST_SET}
        at = config if fork else _thread_head(config)
        snapshot = self.get_state(at)  # type: ignore[arg-type]
        thread = str(_thread_head(config)["configurable"]["thread_id"])
        return _turn_input(input, snapshot.values, thread, bool(snapshot.interrupts))

    async def _aturn(
        self, input: Any, config: RunnableConfig | None, latest: Any, fork: Any
    ) -> Any:
        if not isinstance(input, dict):
            return input
        if latest is None:
            return {k: v for k, v in input.items() if k not in _FENCEPOST_SET}
        at = config if fork else _thread_head(config)
        snapshot = await self.aget_state(at)  # type: ignore[arg-type]
        thread = str(_thread_head(config)["configurable"]["thread_id"])
        return _turn_input(input, snapshot.values, thread, bool(snapshot.interrupts))

    def _taken_input(self, input: Any, fork: str | None) -> Any:
        """The input of a call that forks the thread at ``fork``, recording the fork (an input
        of ``None``, a replay, becomes an update of the ``fork`` channel alone)."""
        if fork is None:
            return input
        return _forked(input, fork) if input is not None else Command(update={"fork": fork})

    def bulk_update_state(self, config: RunnableConfig, supersteps: Any) -> RunnableConfig:
        _, fork = self._check_thread(config)
        supersteps = _state_updates(
            list(supersteps),
            self.builder.channels,
            self._serde(),
            lambda command: self._waiting(command, config),
        )
        return super().bulk_update_state(config, _with_fork(supersteps, fork))

    async def abulk_update_state(self, config: RunnableConfig, supersteps: Any) -> RunnableConfig:
        _, fork = await self._acheck_thread(config)
        supersteps = list(supersteps)
        goes = any(
            isinstance(getattr(u, "values", None), Command) and _targets(u.values)
            for step in supersteps
            for u in step
        )
        waiting = tuple((await self.aget_state(config)).next) if goes else ()
        supersteps = _state_updates(
            supersteps, self.builder.channels, self._serde(), lambda command: waiting
        )
        return await super().abulk_update_state(config, _with_fork(supersteps, fork))

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        return EVENTS.invoked(self._bounded_stream(input, config, **kwargs), self, config)

    def _refuse_unresumable(self, config: RunnableConfig | None) -> None:
        """Refuse a top-level run of an ``approval="interrupt"`` graph with no checkpointer: its
        pause could never be resumed. A graph run inside a parent graph (a checkpoint
        namespace) is resumed by its parent's saver."""
        settings = settings_of(self)
        if settings is None or settings.approval != "interrupt" or self.checkpointer:
            return
        # A graph invoked inside a parent's node inherits the parent's config (and its saver)
        # from the running context even when no config is passed.
        if (ensure_config(config).get("configurable") or {}).get("checkpoint_ns"):
            return
        raise GraphConfigError("checkpointer", NO_CHECKPOINTER)

    def _bounded_stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        self._refuse_unresumable(config)
        latest, fork = self._check_thread(config)
        if isinstance(input, Command):
            why = _refusal(
                input,
                self._waiting(input, config),
                self.builder.channels,
                self._written(input, config),
            )
            identity = _identity_written(input)
            if why is None and identity and config is not None and self.checkpointer is not None:
                why = _identity_refusal(identity, self.get_state(config).values)
            if why is not None:
                raise CommandRefused(why)
            input = _storable(input, self._serde())
        elif input is not None:
            input = self._turn(_stored_input(input, self._serde()), config, latest, fork)
        input = self._taken_input(input, fork)
        try:
            yield from super().stream(input, config, **kwargs)
        except GraphRecursionError:
            if not self._ended(config):
                raise

    def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        return EVENTS.ainvoked(self._bounded_astream(input, config, **kwargs), self, config)

    async def _bounded_astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        self._refuse_unresumable(config)
        try:
            latest, fork = await self._acheck_thread(config)
        except NotImplementedError:
            # A saver with sync methods only (SqliteSaver): LangGraph's own error would name
            # its async twin's module; the public fix is fencepost's async opener.
            raise GraphConfigError(
                "checkpointer", SYNC_SAVER.format(saver=type(self.checkpointer).__name__)
            ) from None
        if isinstance(input, Command):
            why = _refusal(
                input,
                await self._awaiting(input, config),
                self.builder.channels,
                await self._awritten(input, config),
            )
            identity = _identity_written(input)
            if why is None and identity and config is not None and self.checkpointer is not None:
                why = _identity_refusal(identity, (await self.aget_state(config)).values)
            if why is not None:
                raise CommandRefused(why)
            input = _storable(input, self._serde())
        elif input is not None:
            input = await self._aturn(_stored_input(input, self._serde()), config, latest, fork)
        input = self._taken_input(input, fork)
        try:
            async for chunk in super().astream(input, config, **kwargs):
                yield chunk
        except GraphRecursionError:
            if not await self._aended(config):
                raise
