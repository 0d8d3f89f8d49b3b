"""A per-call record (repeat counts, result evidence, answered calls) as one step revised it.

These records grow with a run. Each step changes a few entries, and the checkpoint should store
only those: found by comparing old and new record entry by entry, that costs the run's length
at every step. A :class:`Revised` record carries the changes that made it, so the graph writes
them without a comparison.

A record carries its base only until its changes are written, or until it is revised in turn:
held longer, each record would keep the one before it, and a run in flight every version of
every such record it ever had (a run's length squared).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeVar

V = TypeVar("V")

_RELEASED: Mapping[str, Any] = MappingProxyType({})
"""The base of a record whose changes are written: no record is it, so the next comparison
against it is made in full (correct, only slower)."""


class Revised(dict[str, V]):
    """``base`` with ``changes`` applied; remembers both (read by the graph, never stored)."""

    __slots__ = ("base", "changes")

    base: Mapping[str, V]
    changes: dict[str, V]


def _release(record: Mapping[str, V]) -> None:
    if isinstance(record, Revised):
        record.base = _RELEASED
        record.changes = {}


def revised(base: Mapping[str, V], changes: Mapping[str, V]) -> dict[str, V]:
    """A new record: ``base`` with ``changes`` applied (``base``'s entries are left alone; what
    it remembered of its own base is released)."""
    out: Revised[V] = Revised(base)
    out.update(changes)
    _release(base)
    out.base = base
    out.changes = dict(changes)
    return out


def changes_since(old: Mapping[str, V], new: Mapping[str, V]) -> dict[str, V]:
    """The entries of ``new`` that differ from ``old``: the changes ``new`` carries when it was
    revised from ``old`` itself (then released: a step's changes are written once), else found
    by comparing every entry."""
    if isinstance(new, Revised) and new.base is old:
        found = {k: v for k, v in new.changes.items() if old.get(k) != v}
        _release(new)
        return found
    return {k: v for k, v in new.items() if old.get(k) != v}
