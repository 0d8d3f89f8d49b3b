"""The checkpoint serializer allowlist for fencepost's types.

Under ``LANGGRAPH_STRICT_MSGPACK=true`` LangGraph only revives types it was told about; an
unregistered type would come back as a plain dict. Every value type that fencepost keeps in a
checkpoint is listed here, and :func:`fencepost_serializer` returns a serializer that knows them.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal, get_args, get_origin

import ormsgpack
from langgraph.checkpoint.serde.jsonplus import (
    EXT_PYDANTIC_V2,
    JsonPlusSerializer,
    _msgpack_default,
    _option,
)
from pydantic import BaseModel, Strict
from pydantic.fields import FieldInfo

from fencepost import policy
from fencepost.graph.state import StartRequest

_CHECKPOINTED: tuple[type[Any], ...] = (
    StartRequest,
    policy.AgentState,
    policy.RuntimeBudget,
    policy.Observation,
    policy.AnswerPayload,
    policy.ToolProposal,
    policy.FinalProposal,
    policy.AbstainProposal,
    policy.ToolBatch,
    policy.Verdict,
    policy.BatchEntry,
    policy.Receipt,
    policy.StopRequest,
    policy.StopReport,
    policy.ReportedCall,
    policy.Waiting,
    policy.StepManifest,
    policy.Deadline,
    policy.Phase,
    policy.TerminationReason,
    policy.VerdictCode,
    policy.ReceiptStatus,
    policy.ErrorCode,
    policy.Effect,
    policy.BudgetAxis,
    policy.StopKind,
)


# Where types lived in checkpoints written by earlier versions (still importable from there).
_MOVED = (("fencepost.policy.tool", "Effect"),)


def serializer_allowlist() -> frozenset[tuple[str, str]]:
    """``(module, name)`` of every fencepost type that may appear in a checkpoint."""
    return frozenset((cls.__module__, cls.__name__) for cls in _CHECKPOINTED) | frozenset(_MOVED)


def fencepost_serializer(base: JsonPlusSerializer | None = None) -> JsonPlusSerializer:
    """A LangGraph serializer that revives fencepost's types (strict msgpack or not).

    Without ``base``, it also writes fencepost's records compactly (see :class:`_Compact`);
    ``base``, a caller's serializer, keeps its own encoding and gets the allowlist."""
    if base is None:
        # An explicit allowlist, strict mode or not: LangGraph's permissive default would revive
        # fencepost's types with an "unregistered type" warning each.
        return _Compact(allowed_msgpack_modules=tuple(serializer_allowlist()))
    return base.with_msgpack_allowlist(serializer_allowlist())


class _Compact(JsonPlusSerializer):
    """LangGraph's serializer, writing fencepost's records without the fields at their default.

    The format is LangGraph's own: a record is ``(module, name, fields, "model_validate_json")``
    and is revived by validating ``fields``, which fills in every default left out (so a
    checkpoint written with every field, as before, reads the same, and so does this one for a
    reader that writes every field). A field at its default is most of a record: a manifest's
    unused axes and codes, a receipt's task ids; and an enum written as its ``(module, name,
    value)`` costs more than the rest of its field. Each is stored once per step, in every
    checkpoint a run writes, and held by an in-memory saver for as long as the thread is kept.
    What is left out: a field equal to its default (a default is part of the format: changing
    one changes what old checkpoints say), never a ``Literal`` field (a union of records is told
    apart by one); an enum is written as its value where its field validates it from the value
    (``Strict(False)``, as every enum field of a checkpointed record is)."""

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        if obj is None or isinstance(obj, bytes | bytearray):
            return super().dumps_typed(obj)
        try:
            return "msgpack", _pack(obj)
        except ormsgpack.MsgpackEncodeError:
            return super().dumps_typed(obj)  # LangGraph's own answer: a pickle, or the error


_Field = tuple[str, bool, Any, bool]
"""How a record's field is written: (name, left out at its default, the default, an enum field
that takes its value)."""


def _layout(cls: type[BaseModel]) -> tuple[_Field, ...]:
    out: list[_Field] = []
    for name, info in cls.model_fields.items():
        # A default made by a factory is left out only when it is an empty container: a run id
        # made fresh each time, or the default budget, is no constant a reader can fill in.
        factory = info.default_factory
        optional = (
            not info.is_required()
            and get_origin(info.annotation) is not Literal
            and (factory is None or factory in (dict, list, tuple))
        )
        default = info.get_default(call_default_factory=True) if optional else None
        out.append((name, optional, default, _takes_enum_value(info)))
    return tuple(out)


def _takes_enum_value(info: FieldInfo) -> bool:
    lax = any(isinstance(m, Strict) and not m.strict for m in info.metadata)
    kinds = [a for a in get_args(info.annotation) if a is not type(None)] or [info.annotation]
    return lax and all(isinstance(k, type) and issubclass(k, Enum) for k in kinds)


def _fields(record: BaseModel, layout: tuple[_Field, ...]) -> dict[str, Any]:
    values = record.__dict__
    out: dict[str, Any] = {}
    for name, optional, default, enum_value in layout:
        value = values[name]
        if optional and type(value) is type(default) and value == default:
            continue
        if enum_value and isinstance(value, Enum):
            out[name] = value.value
        else:
            out[name] = _nested(value)
    return out


def _nested(value: Any) -> Any:
    """A field's value as a record's fields hold it: a record inside is its fields (as pydantic's
    ``model_dump`` writes it), compact too. Raises :class:`_Foreign` for a model inside that is
    not exactly a checkpointed record."""
    kind = type(value)
    layout = _LAYOUTS.get(kind)
    if layout is not None:
        return _fields(value, layout)
    if kind is tuple or kind is list:
        return [_nested(v) for v in value] if any(type(v) not in _PLAIN for v in value) else value
    if kind is dict:
        plain = all(type(v) in _PLAIN for v in value.values())
        return value if plain else {k: _nested(v) for k, v in value.items()}
    if kind not in _PLAIN and isinstance(value, BaseModel):
        raise _Foreign
    return value


_PLAIN = frozenset((str, int, float, bool, type(None), dict, list, tuple))
"""Types no model is: a JSON value (a tool's result, a proposal's arguments) is most of what
:func:`_nested` scans for a model inside, by type alone."""


class _Foreign(Exception):
    """A record holds a model that is not exactly a checkpointed record: a subclass of one (an
    application's proposal with a field of its own), which strict pydantic lets a field hold.
    Written as itself, its name is refused by the allowlist on load and its extra fields fail
    the outer record's validation, so LangGraph would revive the outer record with
    ``model_construct`` (raw strings where enums belong, a dict where a record belongs). The
    record is written as LangGraph writes it instead: each field by its declared type."""


def _default(obj: Any) -> Any:
    layout = _LAYOUTS.get(type(obj))
    if layout is None:
        return _msgpack_default(obj)
    try:
        fields = _fields(obj, layout)
    except _Foreign:
        return _msgpack_default(obj)
    cls = type(obj)
    body = (cls.__module__, cls.__name__, fields, "model_validate_json")
    return ormsgpack.Ext(EXT_PYDANTIC_V2, _pack(body))


def _pack(obj: Any) -> bytes:
    return ormsgpack.packb(obj, default=_default, option=_option)


_LAYOUTS: dict[type[Any], tuple[_Field, ...]] = {
    cls: _layout(cls)
    for cls in _CHECKPOINTED
    if isinstance(cls, type) and issubclass(cls, BaseModel)
}
"""The checkpointed records, by exact type: a subclass (``MendedState``) is written as
LangGraph writes it."""


def registered(cls: type[BaseModel]) -> bool:
    """Whether ``cls`` is on the allowlist (used by tests to pin that nothing was forgotten)."""
    return (cls.__module__, cls.__name__) in serializer_allowlist()
