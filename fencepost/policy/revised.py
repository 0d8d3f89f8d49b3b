"""A per-call record (repeat counts, result evidence, answered calls) as one step revised it.

These records grow with a run. Each step changes a few entries, and the checkpoint should store
only those: found by comparing old and new record entry by entry, that costs the run's length
at every step. A :class:`Revised` record carries the changes that made it, so the graph writes
them without a comparison.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

V = TypeVar("V")


class Revised(dict[str, V]):
    """``base`` with ``changes`` applied; remembers both (read by the graph, never stored)."""

    __slots__ = ("base", "changes")

    base: Mapping[str, V]
    changes: dict[str, V]


def revised(base: Mapping[str, V], changes: Mapping[str, V]) -> dict[str, V]:
    """A new record: ``base`` with ``changes`` applied (``base`` is left alone)."""
    out: Revised[V] = Revised(base)
    out.update(changes)
    out.base = base
    out.changes = dict(changes)
    return out


def changes_since(old: Mapping[str, V], new: Mapping[str, V]) -> dict[str, V]:
    """The entries of ``new`` that differ from ``old``: the changes ``new`` carries when it was
    revised from ``old`` itself, else found by comparing every entry."""
    if isinstance(new, Revised) and new.base is old:
        return {k: v for k, v in new.changes.items() if old.get(k) != v}
    return {k: v for k, v in new.items() if old.get(k) != v}
