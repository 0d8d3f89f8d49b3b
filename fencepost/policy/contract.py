"""The base every contract type shares: frozen, strict, no extra keys."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from functools import cache
from typing import Any, Self, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError
from pydantic_core.core_schema import ErrorType

M = TypeVar("M", bound=BaseModel)
_set = object.__setattr__
_new = object.__new__
# BaseModel's own slots, set through their descriptors: ``object.__setattr__`` by name looks each
# up through the model's MRO first, and an instance is made a dozen times a step.
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
_FIELD_SETS: dict[frozenset[str], set[str]] = {}
"""One field-name set per distinct set of names given (a handful per contract type)."""


class Frozen(BaseModel):
    """Frozen, strict pydantic model with extra keys forbidden.

    Fields that must survive a LangGraph checkpoint (tuples come back as lists, enums as their
    values) are annotated with ``Strict(False)`` one by one, so pydantic re-validates them on load
    instead of LangGraph falling back to ``model_construct``.
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    def model_post_init(self, context: Any, /) -> None:
        # Validation gives every instance a set of the field names it was given; a frozen model
        # never changes it, so instances given the same names share one (about 18 KB of a paused
        # run's records, manifests and budget views at 1,000 runs in flight).
        names = self.__pydantic_fields_set__
        shared = _shared(names)
        if shared is not names:
            _set(self, "__pydantic_fields_set__", shared)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """As pydantic's (``update`` is not validated), made directly: a run's state is copied
        a dozen times a step, and pydantic's generic copy costs twice this on the hot path.
        A contract type has no extra keys and no private attributes to carry over."""
        if deep:
            return super().model_copy(update=update, deep=True)
        values = self.__dict__.copy()
        names = self.__pydantic_fields_set__
        if update:
            values.update(update)
            if not names.issuperset(update):
                names = _shared(names | update.keys())
        return _made(type(self), values, names)


def _shared(names: AbstractSet[str]) -> set[str]:
    """The one set of these field names every instance given them shares. A frozen model never
    changes its set in place, and pydantic's own copy copies it before changing it."""
    key = frozenset(names)
    shared = _FIELD_SETS.get(key)
    if shared is None:
        shared = _FIELD_SETS[key] = set(key)
    return shared


def _made(cls: type[M], values: dict[str, Any], names: set[str]) -> M:
    # object's own __new__ (no contract type defines one; pydantic's BaseModel neither), not
    # looked up through the model's MRO.
    made = _new(cls)
    _set_dict(made, values)
    _set_fields_set(made, names)
    _set_extra(made, None)
    _set_private(made, None)
    return made


def assemble(cls: type[M], values: dict[str, Any], given: AbstractSet[str] | None = None) -> M:
    """An instance of the contract type ``cls`` from ``values`` that are already checked and
    name every one of its fields: what ``model_construct`` makes, without its per-field
    alias and default handling (on the hot path, a budget view is assembled at every
    reservation). ``values`` becomes the instance's own: the caller must not keep it.

    ``given`` names the fields the values were given for, the rest being defaults (what
    validation records as the fields set); every field when omitted."""
    return _made(cls, values, _every_field(cls) if given is None else _shared(given))


@cache
def _every_field(cls: type[BaseModel]) -> set[str]:
    return _shared(cls.model_fields.keys())


def no_unknown_keys(cls: type[BaseModel], data: Any) -> Any:
    """``data`` as given, or a ``ValueError`` naming a key ``cls`` has no field for and the
    field it was probably meant to be (a typo otherwise shows as the required field it left
    missing first, and the unknown key last). For a ``mode="before"`` validator."""
    if not isinstance(data, Mapping):
        return data
    fields = cls.model_fields
    unknown = [k for k in data if isinstance(k, str) and k not in fields]
    if not unknown:
        return data
    import difflib

    key = unknown[0]
    close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
    fix = f"did you mean {close[0]}=?" if close else f"its fields are {', '.join(fields)}"
    raise ValueError(f"{cls.__name__} has no field {key[:64]!r}: {fix}")


def field_names(model: type[BaseModel]) -> frozenset[str]:
    """The field names of ``model`` and of every model its fields hold, at any depth of
    containers, unions and optionals."""
    names: set[str] = set()
    seen: set[type[BaseModel]] = set()
    stack: list[Any] = [model]
    while stack:
        item = stack.pop()
        if isinstance(item, type) and issubclass(item, BaseModel):
            if item not in seen:
                seen.add(item)
                for name, info in item.model_fields.items():
                    names.add(name)
                    stack.append(info.annotation)
        else:
            stack.extend(get_args(item))
    return frozenset(names)


_OWN_MESSAGES = frozenset(get_args(ErrorType)) - {"value_error", "assertion_error"}
"""Error types whose message is pydantic's own template, which says what was expected and
never what was given. A validator's own message (``value_error``) may quote what it was given."""


def without_values(exc: ValidationError, known: AbstractSet[str]) -> ValidationError:
    """``exc`` as one that names fields, never values: the same errors by location and type,
    with no input value (not in its text, not in ``errors()``); a path part that is not one of
    the ``known`` field names (a map's key is data) shown as ``*``; a validator's own message
    replaced by its error type. Raise it outside the ``except`` that caught ``exc``, so the
    original is not kept as its ``__context__``."""
    details: list[Any] = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        kind = error["type"]
        message = error["msg"] if kind in _OWN_MESSAGES else kind.replace("_", " ")
        details.append(
            {
                "type": PydanticCustomError(kind, message),
                "loc": tuple(p if isinstance(p, int) or p in known else "*" for p in error["loc"]),
                "input": None,
            }
        )
    return ValidationError.from_exception_data(exc.title, details, hide_input=True)
