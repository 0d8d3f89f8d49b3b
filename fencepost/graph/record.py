"""The run's record: what a checkpoint holds of a run, as plain data, in one channel.

A run lives in one LangGraph channel, ``run``: a dict of :class:`~fencepost.policy.AgentState`'s
fields in their plain form (what pydantic's ``model_dump(mode="json")`` makes of them, a field at
its default left out), so any saver with its default serializer stores it without an extension
type, and Studio and the LangGraph Server API show it as JSON. Each step writes what it changed:

- the items a record gained (``observations``, ``proposals``, ``receipts``, ``manifests``):
  records only grow;
- the entries a map changed (``answered``, ``evidence``; ``fingerprints``, whose repeat counts
  only grow);
- the new value of any other field.

As a delta channel, a checkpoint stores each step's write, not the whole run again. A write is
plain data and means the same whoever wrote it and whenever it is replayed (LangGraph rebuilds the
channel from the writes when it loads a checkpoint); what a caller writes (``update_state``,
``Command(update=...)``) is checked on the way in: a record's item or a map's entry that does not
validate is dropped (so no state update can take back a receipt, reset a repeat count or plant a
malformed observation); any other field takes what was written and the node that reads it judges
it (see :func:`fencepost.graph.state.load_state`).

The typed view is rebuilt at the node boundary by validation. Within one invoke it is carried
along instead: a node's own write (a :class:`StepWrite` the node made, recognised by identity,
never by anything a caller can write) carries the state it came from and the one it made, and the
record that write makes keeps the second as its :attr:`RunRecord.view`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from copy import deepcopy
from enum import Enum
from functools import cache
from typing import Any, get_args

from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import PendingWrite
from langgraph.types import Overwrite
from pydantic import BaseModel, TypeAdapter
from pydantic_core import PydanticSerializationError, to_jsonable_python

from fencepost.policy import AgentState, Phase
from fencepost.policy.fingerprint import encodable

FIELDS: tuple[str, ...] = tuple(AgentState.model_fields)
"""AgentState's fields: the keys a run record may hold."""
APPENDED = frozenset({"observations", "proposals", "receipts", "manifests", "turns"})
"""Fields whose write is the items a step added: they only grow."""
COUNTED = frozenset({"fingerprints"})
"""Maps whose entries only grow (repeat counts): a write cannot lower one."""
LATEST = frozenset({"answered", "evidence"})
"""Maps whose write is the entries a step changed (the last write of an entry wins)."""
REPLACED = frozenset(FIELDS) - APPENDED - COUNTED - LATEST
"""Fields a write gives whole."""

SNAPSHOT_EVERY = 5000
"""A full snapshot of the record every N updates. At LangGraph's own replay bound a step writes
only what it changed, and a resume replays at most that many writes."""

FOLLOWS_KEY = "__follows__"
"""The key of a new run's first write that names the ended run it follows on the thread: the
record starts over from that write (the ended run kept in its ``turns``). Only a node writes it:
a caller's write is stored as what the record takes of it (:func:`caller_write`), no such key."""

TURNS_KEPT_KEY = "__turns_kept__"
"""The key of a new run's first write (one naming :data:`FOLLOWS_KEY`) saying how many of the
ended run's ``turns`` the new record keeps: the write carries only the turns after them (the run
it follows), so a conversation's storage grows by one turn per run. A first write without it
(an older version's) gives every earlier turn."""

FORK_KEY = "__fork__"
"""The key of a node's write that names where the run's branch was forked from (``forked_from``,
``branch``): fields no caller's write sets, since they name the run's ledger account. A caller's
write is stored as what the record takes of it (:func:`caller_write`), no such key."""

FORK_FIELDS = frozenset({"forked_from", "branch", "origin_thread"})
"""The fields only a node's write that carries :data:`FORK_KEY` (or starts a run) sets."""

OVERWRITE_KEY = "__overwrite__"
"""How a JSON client spells LangGraph's ``Overwrite`` (``{"__overwrite__": value}``)."""


def overwrite_of(write: Any) -> tuple[bool, Any]:
    """Whether ``write`` is LangGraph's ``Overwrite`` in any of its forms, and what it holds: the
    dataclass, ``{"__overwrite__": value}``, and ``{"type": "__overwrite__", "value": value}``
    (the dataclass once a JSON client's update has been through the LangGraph API server)."""
    if isinstance(write, Overwrite):
        return True, write.value
    if isinstance(write, dict):
        if len(write) == 1 and OVERWRITE_KEY in write:
            return True, write[OVERWRITE_KEY]
        if write.get("type") == OVERWRITE_KEY and "value" in write:
            return True, write["value"]
    return False, None


# -- the plain form ---------------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """``value`` as a checkpoint holds it: a contract record as its fields (those at their default
    left out), an enum as its value, a tuple as a list; JSON values as they are."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is tuple or kind is list:
        return [plain(v) for v in value]
    if isinstance(value, BaseModel):
        ahead = _AHEAD.pop(id(value), None) if _AHEAD else None
        return ahead[1] if ahead is not None and ahead[0] is value else _dump(value)
    if isinstance(value, Enum):
        return value.value
    if kind is dict or isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return to_jsonable_python(value)


_SCALARS = frozenset((str, int, float, bool, type(None)))


def _dump(record: BaseModel) -> Any:
    # A record a caller made without validation (``model_construct``) dumps what it holds, and
    # is judged when read: no warning is the serializer's to give.
    return record.__pydantic_serializer__.to_python(
        record, mode="json", exclude_defaults=True, warnings=False
    )


_AHEAD: dict[int, tuple[BaseModel, Any]] = {}
"""Plain forms made before the write that holds them (a manifest's, to stream it), by the
record's identity and with the record (an id is only ever that record's while it lives): the
write takes its record's. Bounded: one a write never takes (its node raised) is let go."""
_AHEAD_MOST = 64


def plain_ahead(record: BaseModel) -> Any:
    """``record``'s plain form (see :func:`plain`), made now for something else (a stream) and
    kept for the step's write of it, so a record is dumped once."""
    made = _dump(record)
    if len(_AHEAD) >= _AHEAD_MOST:
        _AHEAD.clear()
    _AHEAD[id(record)] = (record, made)
    return made


UNREPRESENTABLE_KEY = "__unrepresentable__"


def unrepresentable() -> dict[str, bool]:
    """What a caller's value with no storable plain form is recorded as: a map no field of a run
    validates, so the node that reads it ends the run ``invalid_state``."""
    return {UNREPRESENTABLE_KEY: True}


def _plain_or_marked(value: Any) -> Any:
    try:
        made = plain(value)
    except (PydanticSerializationError, TypeError, ValueError, RecursionError):
        return unrepresentable()
    return made if storable(made) else unrepresentable()


MAX_DEPTH = 64
"""How deep a caller's value may nest: far more than any field of a run needs, far less than
the serializers' own limits (msgpack refuses 255 levels; a record inside a run adds a few)."""


def storable(value: Any) -> bool:
    """Whether a plain value can be stored and counted on: JSON's types only (a map's keys
    text), nested at most :data:`MAX_DEPTH` deep, every integer a signed 64-bit one (a count a
    step adds one to must still fit), every string and key with a UTF-8 form (no lone
    surrogate: the serializer raises on one in a key and writes ``?`` for one in a value). What
    a serializer cannot write (a ``complex``, a map keyed by tuples) would otherwise raise out
    of ``invoke`` when LangGraph stores the write."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is int:
            if not -(2**63) <= item < 2**63:
                return False
        elif kind is str:
            if not encodable(item):
                return False
        elif kind is dict or kind is list:
            if depth >= MAX_DEPTH:
                return False
            if kind is dict and not all(type(k) is str and encodable(k) for k in item):
                return False
            children = item.values() if kind is dict else item
            stack.extend((child, depth + 1) for child in children)
        elif kind not in _SCALARS:
            return False
    return True


# -- the record and a node's write -------------------------------------------------------------------


class RunRecord(dict[str, Any]):
    """A run's record: AgentState's fields in plain form (a plain dict to every serializer).

    ``view`` is the typed state this record holds, when the step that made it knew it (a node's
    own write) or a node has validated it since; ``None`` otherwise. It is never stored."""

    __slots__ = ("view",)

    view: AgentState | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.view = None


class StepWrite(dict[str, Any]):
    """A node's write to the run record: the plain changes from ``before`` to ``after``.

    Made only by :func:`step_write`, which records it as the node's own: the record it makes
    keeps ``after`` as its view without validating what the node itself made."""

    __slots__ = ("__weakref__", "after", "before", "folded")

    before: AgentState | None
    after: AgentState
    folded: tuple[Mapping[str, Any], RunRecord] | None
    """The record this write was last folded onto and the record it made, until read once:
    LangGraph folds a node's write twice (the copy a routing function reads, then the channel
    itself), onto the same record."""


_OWN: weakref.WeakValueDictionary[int, StepWrite] = weakref.WeakValueDictionary()
"""The writes nodes made and LangGraph has not yet applied, by identity: what a caller writes,
whatever its class, is never one of them."""


def step_write(before: AgentState | None, after: AgentState, changes: dict[str, Any]) -> StepWrite:
    """A node's write to the run record: ``changes`` (plain), made from ``before`` to ``after``."""
    write = StepWrite(changes)
    write.before, write.after, write.folded = before, after, None
    _OWN[id(write)] = write
    return write


def own(write: Any) -> bool:
    """Whether ``write`` is a node's own :class:`StepWrite` (by identity). ``None`` (a caller's
    ``{"run": null}``) is no write of a node's, though it is what a miss of ``_OWN`` returns."""
    found = _OWN.get(id(write))
    return found is not None and found is write


# -- what a caller's write may hold ---------------------------------------------------------------


def _item_type(name: str) -> Any:
    args = [a for a in get_args(AgentState.model_fields[name].annotation) if a is not Ellipsis]
    while args and get_args(args[0]) and not isinstance(args[0], type):
        args = [a for a in get_args(args[0]) if a is not Ellipsis]
    return args[0]


def _items_reader(name: str) -> Callable[[Any], list[Any] | None]:
    """The items a caller's write of record ``name`` adds, in plain form, or None (dropped)."""
    item = _item_type(name)
    check: Callable[[Any], Any] = item.model_validate

    def read(write: Any) -> list[Any] | None:
        if not isinstance(write, list | tuple):
            return None
        try:
            # The plain form first, then validated: a record made without validation
            # (``model_construct``) is judged by what it holds, not by its class.
            items = [_dump(check(plain(v))) for v in write]
        except Exception:
            return None
        return items if storable(items) else None

    return read


def _entries_reader(name: str) -> Callable[[Any], dict[str, Any] | None]:
    """The entries a caller's write of map ``name`` changes, or None (dropped)."""
    annotation: Any = AgentState.model_fields[name].annotation
    adapter: TypeAdapter[Any] = TypeAdapter(annotation)

    def read(write: Any) -> dict[str, Any] | None:
        if not isinstance(write, dict):
            return None
        try:
            value = dict(adapter.validate_python(write, strict=True))
        except Exception:
            return None
        return value if storable(value) else None

    return read


_READERS: dict[str, Callable[[Any], Any]] = {
    **{n: _items_reader(n) for n in APPENDED},
    **{n: _entries_reader(n) for n in COUNTED | LATEST},
}


def _taken(write: Any) -> dict[str, Any] | None:
    """A caller's write as the record takes it: its fields in plain form, each record's items
    and each map's entries only if they validate; None for a write that is no field map."""
    if not isinstance(write, dict) or overwrite_of(write)[0]:
        return None  # LangGraph's Overwrite would reset the run: never
    out: dict[str, Any] = {}
    starts = FOLLOWS_KEY in write
    forks = starts or FORK_KEY in write
    for key, value in write.items():
        if key not in _KINDS:
            continue  # no field of a run
        if key in FORK_FIELDS and not forks:
            continue  # a run's branch names its ledger account: only a node's write sets it
        if key == "turns" and not starts:
            # A run's place in the conversation names its ledger account: only the write that
            # starts it (a node's, stored with the run it follows) gives its earlier turns.
            continue
        reader = _READERS.get(key)
        if reader is None:
            out[key] = _plain_or_marked(value)
            continue
        read = reader(value)
        if read is not None:
            out[key] = read
    return out


_KINDS = frozenset(FIELDS)
_TERMINAL = Phase.TERMINAL.value


def caller_write(write: Any) -> dict[str, Any]:
    """A caller's write to the record (``update_state``, ``Command(update=...)``) as the
    checkpoint stores it: what the record takes of it, in plain form (``{}``: nothing). Stored
    as given, a value no serializer writes would raise out of ``invoke`` after the write was
    half-saved, a node's own write handed back (a stream's ``updates``) would still be taken for
    the node's, and an ``Overwrite`` would be kept for LangGraph to replay."""
    taken = _taken(write) or {}
    taken.pop("turns", None)  # a caller's write never starts a run (see _taken)
    for name in FORK_FIELDS:
        taken.pop(name, None)  # nor forks one
    return taken


# -- the reducer and the channel ----------------------------------------------------------------


def _apply(out: RunRecord, changes: Mapping[str, Any]) -> None:
    for key, value in changes.items():
        if key in (FOLLOWS_KEY, FORK_KEY, TURNS_KEPT_KEY):
            continue  # read by _starts_run and _taken: no field of the run
        if key in APPENDED:
            if value:
                # Concatenated, not unpacked into a growing list: the record holds the list
                # for as long as the run is in flight, and a grown list keeps spare slots.
                held = out.get(key)
                out[key] = _as_list(held) + _as_list(value) if held else _as_list(value)[:]
        elif key in COUNTED:
            counts = dict(out.get(key) or {})
            for entry, count in value.items():
                if count > counts.get(entry, 0):
                    counts[entry] = count
            out[key] = counts
        elif key in LATEST:
            if value:
                out[key] = {**(out.get(key) or {}), **value}
        else:
            out[key] = value


def _as_list(items: Any) -> list[Any]:
    return items if type(items) is list else list(items)


@cache
def _default_values() -> tuple[tuple[str, Any], ...]:
    # pydantic's get_default inspects each factory's signature at every call (about 0.1 ms a
    # run start); the defaults are constants (no factory reads a clock or makes an id).
    return tuple(
        (name, plain(info.get_default(call_default_factory=True)))
        for name, info in AgentState.model_fields.items()
        if not info.is_required()
    )


def _defaults() -> dict[str, Any]:
    """Every field of a run at its default, plain (fresh containers each time)."""
    return {name: deepcopy(value) for name, value in _default_values()}


def _completed(out: RunRecord) -> RunRecord:
    """``out`` with every field it leaves out at its default: a step writes only what changed,
    and a run's first write leaves its defaults out, but a reader (a server client, Studio, a
    node) sees every field."""
    if "run_id" in out and len(out) < len(FIELDS):
        for name, value in _defaults().items():
            out.setdefault(name, value)
    return out


def _starts_run(out: Mapping[str, Any], changes: Mapping[str, Any]) -> bool:
    """Whether ``changes`` is a run's first write: it gives the record its run id. What a caller
    wrote to the thread before it is no part of that run, records included (an observation
    planted there would be read as the result of a call of the run that has the same id). A
    later run's first write names the ended run it follows (:data:`FOLLOWS_KEY`)."""
    if "run_id" not in changes:
        return False
    if "run_id" not in out:
        return True
    return (
        changes.get(FOLLOWS_KEY) == out.get("run_id")
        and out.get("phase") == _TERMINAL
        and isinstance(changes.get(FOLLOWS_KEY), str)
    )


def _unreadable(out: Mapping[str, Any]) -> dict[str, Any]:
    """What a stored write that is no map (nor an ``Overwrite``, dropped) is read as. Every
    caller's write is stored as a map (:func:`caller_write`) and every node's is one, so only a
    hand-edited checkpoint holds such a write, and what it held of the run is lost: skipped, the record would be half-read (a
    receipt gone, a call run again), and a run's lost first write would leave no run at all.
    It is read as a stop no run can hold, so the node that reads the record ends the run
    ``invalid_state`` (the terminal node writes the stop over it); where no run has started, as
    a run id no run can hold too, so the run it may have started is the one that ends."""
    changes: dict[str, Any] = {"stop": unrepresentable()}
    if not run_started(out):
        changes["run_id"] = unrepresentable()
    return changes


def _started_over(out: Mapping[str, Any], write: Any) -> RunRecord:
    """The record a run's first write starts from: empty, but for the earlier turns a later
    run's first write keeps (:data:`TURNS_KEPT_KEY`)."""
    fresh = RunRecord()
    kept = write.get(TURNS_KEPT_KEY) if isinstance(write, dict) else None
    turns = out.get("turns")
    if type(kept) is int and kept > 0 and isinstance(turns, list):
        fresh["turns"] = turns[:kept]
    return fresh


def fold(current: Mapping[str, Any] | None, writes: Sequence[Any]) -> RunRecord:
    """The record after ``writes`` (a step's, or a checkpoint's history replayed) in order."""
    base = current if isinstance(current, dict) else {}
    if len(writes) == 1 and own(writes[0]):
        write: StepWrite = writes[0]
        folded = write.folded
        if folded is not None and folded[0] is base:
            # A record is never changed in place, nor is a write: the same fold again (the
            # channel after its routing copy) makes the same record. Read once, then let go.
            write.folded = None
            return folded[1]
        out = RunRecord(base)
        started = _starts_run(out, write)
        if started:
            out = _started_over(out, write)
        _apply(out, write)
        view = getattr(base, "view", None)
        if (write.before is not None and view is write.before) or (
            write.before is None and started
        ):
            out.view = write.after
        out = _completed(out)
        write.folded = (base, out)
        return out
    out = RunRecord(base)
    for write in writes:
        if own(write):
            changes: Mapping[str, Any] | None = write
        elif isinstance(write, dict) or overwrite_of(write)[0]:
            changes = _taken(write)  # an Overwrite is never taken
        else:
            changes = _unreadable(out)
        if changes:
            # A stored write that names the run it follows is a node's (a caller's write is
            # stored without the key): the new run's first.
            follows = own(write) or (isinstance(write, dict) and FOLLOWS_KEY in write)
            if _starts_run(out, write if follows else changes):
                out = _started_over(out, write if follows else changes)
            _apply(out, changes)
    return _completed(out)


class RunChannel(DeltaChannel[Any]):
    """The ``run`` channel: the run's record, grown by what each step wrote (see the module
    docstring). Reads as an empty record before a run starts; LangGraph's ``Overwrite`` is never
    taken, so no state update can start the record over."""

    def __init__(
        self,
        reducer: Callable[[Any, Sequence[Any]], Any] = fold,
        typ: Any = dict,
        *,
        snapshot_frequency: int = SNAPSHOT_EVERY,
    ) -> None:
        # LangGraph makes each graph's channel with this signature (a delta channel's).
        super().__init__(reducer, typ, snapshot_frequency=snapshot_frequency)
        self.value = RunRecord()

    def copy(self) -> RunChannel:
        # LangGraph copies every channel to route each step; a record is never changed in
        # place (each step makes a new one), so a copy shares it.
        out = _new(type(self))
        out.typ, out.key, out.value = self.typ, self.key, self.value
        out.reducer, out.snapshot_frequency = self.reducer, self.snapshot_frequency
        return out

    def from_checkpoint(self, checkpoint: Any) -> RunChannel:
        out = super().from_checkpoint(checkpoint)
        value = out.value
        out.value = RunRecord(value) if isinstance(value, dict) else RunRecord()
        return out

    def update(self, values: Sequence[Any]) -> bool:
        if not values:
            return False  # every channel is told of every step; most are not written in it
        self.value = fold(self.value, values)
        return True

    def replay_writes(self, writes: Sequence[PendingWrite]) -> None:
        values = [value for _, _, value in writes]
        if values:
            self.value = fold(self.value, values)

    def get(self) -> RunRecord:
        return self.value  # type: ignore[no-any-return]

    def is_available(self) -> bool:
        return True


_new = object.__new__


def record_of(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """The run record in a node's (or ``get_state``'s) channel values: empty before a run."""
    record = values.get("run")
    return record if isinstance(record, dict) else {}


def run_started(record: Mapping[str, Any]) -> bool:
    """Whether a run has started on the thread whose record this is."""
    return "run_id" in record


def fields_given(names: Iterable[str]) -> frozenset[str]:
    """The names of ``names`` that are AgentState fields."""
    return frozenset(names) & _KINDS
