"""The graph's channels: defaulted fields, records (delta channels: a checkpoint stores what a
step wrote), and the exact type checks of what a caller writes to them. The messages view's
channel is in :mod:`fencepost.graph.conversation`."""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from functools import cache
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, MaxLen, MinLen
from langgraph._internal._typing import MISSING
from langgraph.channels.binop import _get_overwrite
from langgraph.channels.delta import DeltaChannel
from langgraph.channels.last_value import LastValue
from langgraph.checkpoint.base import PendingWrite
from pydantic import BaseModel, Strict, TypeAdapter
from pydantic.fields import FieldInfo

Check = Callable[[Any], bool]


def value_check(
    typ: Any, *, deep: bool = True, records: bool = False, within: bool = False
) -> Check:
    """A check, without pydantic, that a value is exactly of ``typ``: ``type(v) is X`` (a bool is
    no int, a str no enum), a tuple maybe a list (revived); ``deep=False``: items unchecked.

    ``records``: a contract record (a pydantic model) is checked field by field too, as
    :func:`record_check` does, a record's items (a batch's entries) included; else by its type
    alone. ``within``: the value is a field of a record, where a record may be of a subclass
    (as pydantic takes it: a decision model's own proposal class in a batch entry)."""
    origin, args = get_origin(typ), get_args(typ)
    if typ is int:  # and one a checkpoint holds, with room to count on
        return lambda v: type(v) is int and -(2**63) <= v < 2**63
    if records and isinstance(typ, type) and issubclass(typ, BaseModel):
        return record_check(typ, subclasses=within)
    if isinstance(typ, type) and origin is None:
        return lambda v: type(v) is typ
    if origin is Annotated:  # a bound inside an optional: ``int | None`` with ``ge=0`` on the int
        inner = value_check(args[0], deep=deep, records=records, within=within)
        return _bounded(inner, typ.__metadata__)
    if origin is Literal:
        return lambda v: any(type(v) is type(a) and v == a for a in args)
    if (origin is Union or origin is types.UnionType) and len(args) == 2 and type(None) in args:
        some = value_check(
            args[0] if args[1] is type(None) else args[1],
            deep=deep,
            records=records,
            within=within,
        )
        return lambda v: v is None or some(v)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = value_check(args[0], records=records, within=within)
        if not deep:  # a revived list is checked by its first item (a foreign serializer's dicts)
            return lambda v: type(v) is tuple or (type(v) is list and (not v or item(v[0])))
        return lambda v: (type(v) is tuple or type(v) is list) and all(map(item, v))
    if origin is dict:
        key, entry = value_check(args[0]), value_check(args[1])
        return lambda v: (
            type(v) is dict and (not deep or (all(map(key, v)) and all(map(entry, v.values()))))
        )
    raise TypeError(f"no exact check for {typ!r}")


class Defaulted(LastValue[Any]):
    """A last-value channel that reads as ``default`` until it is first written.

    Most of a run's fields keep their default for the whole run (no stop, no report, no
    repairs): as plain channels each was written at the run's start, a serialized write and a
    version in every checkpoint after it. Unwritten, they cost nothing and still read as their
    default, so ``get_state().values`` and a server client see every key.
    """

    __slots__ = ("default",)

    def __init__(self, typ: Any, key: str = "", default: Any = None) -> None:
        super().__init__(typ, key)
        self.default = default

    def copy(self) -> Defaulted:
        # LangGraph copies every channel twice a step (for each router's read) and the
        # constructor chain costs more than the copy: the slots are set directly.
        out = _new(type(self))
        out.typ, out.key, out.value, out.default = self.typ, self.key, self.value, self.default
        return out

    def from_checkpoint(self, checkpoint: Any) -> Defaulted:
        out = super().from_checkpoint(checkpoint)
        out.default = self.default
        return out

    def get(self) -> Any:
        value = self.value
        return self.default if value is MISSING else value

    def is_available(self) -> bool:
        return True  # a node's input holds the default too

    def update(self, values: Sequence[Any]) -> bool:
        if not values:
            return False  # every channel is told of every step; most are not written in it
        # Nodes refusing one state each write its stop: equal values (each node mended its own
        # copy of a caller's JSON stop) are one write, not a conflict.
        if len(values) > 1 and all(_equal(v, values[0]) for v in values):
            values = values[:1]
        return LastValue.update(self, values)


_new = object.__new__


def _equal(value: Any, other: Any) -> bool:
    return value is other or (type(value) is type(other) and value == other)


class Coerced(Defaulted):
    """A :class:`Defaulted` channel a router reads: a value of its type (JSON form converted) or
    None, never one a router misreads (a node reading None ends the run ``invalid_state``)."""

    def update(self, values: Sequence[Any]) -> bool:
        return super().update(list(map(reader(self.typ), values)) if values else values)


class Shared(DeltaChannel[Any]):
    """A delta channel whose copies share its value.

    LangGraph copies every channel to route each step (a router reads the state with the
    node's writes applied), and a delta channel's copy copies its value: the repeat counts,
    the result evidence and the conversation, each as long as the run. The reducers here
    never change a value in place, they make a new one, so a copy can share it.
    """

    def copy(self) -> Shared:
        out = _new(type(self))
        out.typ, out.key, out.value = self.typ, self.key, self.value
        out.reducer, out.snapshot_frequency = self.reducer, self.snapshot_frequency
        return out


class Records(Shared):
    """A delta channel that reads as empty (its type's empty value) until first written, for
    the reason :class:`Defaulted` gives, and only ever grows: LangGraph's ``Overwrite`` (in any
    of its forms, ``{"__overwrite__": ...}`` from a JSON client included) is dropped, so no
    state update can take back a receipt or reset a repeat count; nor is a write of another
    type kept (:func:`typed`)."""

    def update(self, values: Sequence[Any]) -> bool:
        if not values:
            return False
        return super().update([v for v in values if not _get_overwrite(v)[0]])

    def replay_writes(self, writes: Sequence[PendingWrite]) -> None:
        super().replay_writes([w for w in writes if not _get_overwrite(w[2])[0]])

    def get(self) -> Any:
        value = self.value
        return self.typ() if value is MISSING else value

    def is_available(self) -> bool:
        return True

    @classmethod
    def appended(cls, typ: Any) -> Records:
        """An append-only record of ``typ`` (``tuple[X, ...]``): each write is the items added."""
        return cls(typed(_append, typ), snapshot_frequency=SNAPSHOT_EVERY)

    @classmethod
    def latest(cls, typ: Any) -> Records:
        """A per-key record of ``typ`` (``dict[str, V]``): each write, the entries changed."""
        return cls(typed(_latest, typ), dict, snapshot_frequency=SNAPSHOT_EVERY)

    @classmethod
    def counted(cls, typ: Any) -> Records:
        """Repeat counts (``dict[str, int]``) that only grow: each write, the counts changed."""
        return cls(typed(_count_up, typ), dict, snapshot_frequency=SNAPSHOT_EVERY)


_BOUNDS: dict[type[Any], Callable[[Check, Any], Check]] = {  # a field with another bound: add it
    Ge: lambda c, m: lambda v: c(v) and v >= m.ge,
    MinLen: lambda c, m: lambda v: c(v) and len(v) >= m.min_length,
    MaxLen: lambda c, m: lambda v: c(v) and len(v) <= m.max_length,
}


def field_check(
    info: FieldInfo, *, deep: bool = True, records: bool = False, within: bool = False
) -> Check:
    """:func:`value_check` of a pydantic field's type, with its bounds (``ge``, lengths)."""
    check = value_check(info.annotation, deep=deep, records=records, within=within)
    return _bounded(check, info.metadata)


def _bounded(check: Check, metadata: Sequence[Any]) -> Check:
    for meta in metadata:
        if isinstance(meta, FieldInfo):
            check = _bounded(check, meta.metadata)
        elif not isinstance(meta, Strict):
            check = _BOUNDS[type(meta)](check, meta)
    return check


@cache
def record_check(cls: type[BaseModel], *, subclasses: bool = False) -> Check:
    """A contract record exactly of ``cls`` (``subclasses``: or of a subclass) whose every field
    of ``cls`` holds a value of its own type.

    LangGraph revives a record it cannot validate with ``model_construct``, and a caller can
    write one so made (``update_state``): its type alone says nothing of its fields (a budget
    view whose ``steps_remaining`` is ``"5"``). A field whose type has no exact check (JSON
    values, a text pattern) is left to the code that reads it."""
    checks: list[tuple[str, Check]] = []
    for name, info in cls.model_fields.items():
        try:
            checks.append((name, field_check(info, records=True, within=True)))
        except (TypeError, KeyError):
            continue
    absent = object()

    def check(v: Any) -> bool:
        if type(v) is not cls and not (subclasses and isinstance(v, cls)):
            return False
        values = v.__dict__
        return all(field(values.get(name, absent)) for name, field in checks)

    return check


@cache
def reader(typ: Any) -> Callable[[Any], Any]:
    """A write to a channel of ``typ`` as it is held: itself, if exactly of ``typ``, else its JSON
    form converted, else None (never raised: a thread's later invokes would raise it again)."""
    exact, adapter = value_check(typ), TypeAdapter(typ)

    def read(write: Any) -> Any:
        if exact(write):
            return write
        try:
            value = adapter.validate_python(write, strict=False)
        except Exception:
            return None  # neither of the type nor its JSON form
        return value if exact(value) else None

    return read


def typed(reduce: Callable[..., Any], typ: Any) -> Callable[..., Any]:
    """``reduce``, given only the writes :func:`reader` reads as ``typ`` (the rest dropped)."""
    accepted = reader(typ)

    def reducer(current: Any, batches: Sequence[Any]) -> Any:
        if type(current) is list:  # a snapshot a checkpoint revived: checked once, as a write
            current = accepted(current) or ()
        kept = [w for w in map(accepted, batches) if w is not None]
        return reduce(current, kept) if kept else current

    return reducer


def _append(current: Sequence[Any], batches: Sequence[Sequence[Any]]) -> tuple[Any, ...]:
    """Append-only reducer for the record channels: each write is the items a node added."""
    out = tuple(current)
    for batch in batches:
        out += tuple(batch)
    return out


# Observations, receipts and manifests only ever grow. As delta channels a checkpoint stores the
# items each step added, not the whole history again: without this, serializing the growing
# tuples at every superstep was two thirds of the loop's cost (see benchmarks/).
# A full snapshot of a record every N updates makes a long run's checkpoints grow with its
# length; at LangGraph's own replay bound a step writes what it added, and a resume replays at
# most that many writes.
SNAPSHOT_EVERY = 5000


def _count_up(current: dict[str, int] | None, batches: Sequence[dict[str, int]]) -> dict[str, int]:
    """Repeat counts per fingerprint: each write carries the counts that changed; counts only
    grow (a write cannot lower one), so a state edit cannot reset the no-progress check."""
    out = dict(current or {})
    for batch in batches:
        for key, count in batch.items():
            if count > out.get(key, 0):
                out[key] = count
    return out


def _latest(current: dict[str, str] | None, batches: Sequence[dict[str, str]]) -> dict[str, str]:
    """Per call fingerprint, the last result hash recorded: each write carries what changed."""
    out = dict(current or {})
    for batch in batches:
        out.update(batch)
    return out
