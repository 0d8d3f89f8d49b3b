"""A node's channel writes: the step from one AgentState to the next, as a write to the record.

A node computes the next AgentState; :func:`step_writes` turns the step from one state to the next
into the run record's write (only the fields that changed, only the items a record gained, only
the entries a map changed, and whatever a mended state mended), :func:`reset_prerun_values` makes a new
run's first write safe against values a caller put in the thread first, :func:`refusal_writes` is what
a node writes that does not run on an invalid state (the messages view is derived from the two
states a :class:`Writes` carries, in :mod:`fencepost.graph.messages`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fencepost.graph.record import (
    APPENDED,
    COUNTED,
    FIELDS,
    FOLLOWS_KEY,
    FORK_FIELDS,
    FORK_KEY,
    LATEST,
    REPLACED,
    TURNS_KEPT_KEY,
    plain,
    record_of,
    step_write,
)
from fencepost.graph.state import MendedState, field_default
from fencepost.policy import AgentState
from fencepost.policy.revised import changes_since

_DEFAULTS: dict[str, Any] = {
    name: field_default(name)
    for name, info in AgentState.model_fields.items()
    if not info.is_required()
}
"""A new run leaves a field at its default unwritten: the record reads it as the default."""


class Writes(dict[str, Any]):
    """A node's channel writes (what :func:`step_writes` returns), with the two states they were
    made from: the messages view is derived from those, not from the record read back a second
    time. Never handed to LangGraph itself (see ``builder.loop_node``)."""

    __slots__ = ("after", "before")

    before: AgentState | None
    after: AgentState


def step_writes(before: AgentState | None, after: AgentState) -> Writes:
    """The writes that turn ``before`` into ``after``: the run record's changes, plain."""
    writes = Writes()
    writes.before, writes.after = before, after
    changes: dict[str, Any] = {}
    if before is None:
        for name in FIELDS:
            value = getattr(after, name)
            if name in _DEFAULTS and _same(value, _DEFAULTS[name]):
                continue  # the record reads it as the default unwritten
            changes[name] = plain(value)
    else:
        # A state's fields are its instance dict's (validated, copied or assembled alike).
        now, then = after.__dict__, before.__dict__
        for name in FIELDS:
            value = now[name]
            old = then[name]
            if value is old:
                continue
            if name in COUNTED or name in LATEST:
                added = changes_since(old, value)
                if added:
                    changes[name] = added
            elif name in APPENDED:
                kept = len(old)
                if not _extends(value, old, kept):
                    raise ValueError(f"{name} is append-only")
                if len(value) > kept:
                    changes[name] = plain(value[kept:])
            elif not _same(value, old):
                # An equal value made again (the budget view after a settlement that changed
                # no balance) is not written: each write is stored in every checkpoint after.
                changes[name] = plain(value)
        if type(before) is MendedState:
            # The record holds what it mended (a value of no field's type): written over.
            for name in before.rewrite:
                changes.setdefault(name, plain(getattr(after, name)))
    if changes:
        if not FORK_FIELDS.isdisjoint(changes):
            # Stored, then read back by the record as a node's write that may set them.
            changes[FORK_KEY] = True
        writes["run"] = step_write(before, after, changes)
    return writes


def refusal_writes(state: MendedState) -> Writes:
    """The writes of a node that does not run on ``state`` (see ``state.InvalidState``): the stop
    that ends the run, where the record holds another. The terminal node writes the rest of what
    was mended."""
    writes = Writes()
    writes.before = writes.after = state
    if "stop" in state.rewrite:
        writes["run"] = step_write(state, state, {"stop": plain(state.stop)})
    return writes


def _extends(value: Any, old: Any, kept: int) -> bool:
    """Whether ``value`` is ``old`` with items added after it. A record's items are only ever
    added (``old + added``, every item kept as the same object), so the check is its length
    and its first and last kept items, by identity: a record rebuilt, reordered at either end
    or cut short is refused. Comparing every item would cost the run's length at each step."""
    if type(value) is not tuple or type(old) is not tuple or len(value) < kept:
        return isinstance(value, tuple | list) and value[:kept] == old
    return kept == 0 or (value[0] is old[0] and value[kept - 1] is old[kept - 1])


def _same(value: Any, old: Any) -> bool:
    """Equal and of the same type: a caller's ``"terminal"`` equals ``Phase.TERMINAL`` (a str
    enum) but is not it."""
    return type(value) is type(old) and value == old


def reset_prerun_values(values: Mapping[str, Any], writes: Any) -> Any:
    """A node's writes (what it returned), made safe for a run's first: a field the new run
    leaves at its default is still written when the record holds something else for it, a value
    a caller wrote to the thread before the run began (``update_state`` on a fresh thread), so
    no run starts with a stop, a batch or a termination it did not make."""
    if not isinstance(writes, Writes) or writes.before is not None:
        return writes
    record = record_of(values)
    if not record:
        return writes
    after = writes.after
    ended = record.get("run_id")
    if isinstance(ended, str) and writes.get("run") is not None:
        # A first write on a thread a run has ended on: the new run's, naming the run it
        # follows, so the record starts over from it (the ended run is in its ``turns``).
        changes = {**writes["run"], FOLLOWS_KEY: ended}
        kept = record.get("turns")
        if isinstance(kept, list) and kept and len(after.turns) > len(kept):
            # The earlier turns are in the record already: only the run it follows is written,
            # so each run's first write stays one turn long however long the conversation.
            changes["turns"] = plain(after.turns[len(kept) :])
            changes[TURNS_KEPT_KEY] = len(kept)
        writes["run"] = step_write(None, after, changes)
        return writes
    resets: dict[str, Any] = {}
    for name in REPLACED:
        if name in record and name in _DEFAULTS:
            value = plain(getattr(after, name))
            if record[name] != value:
                resets[name] = value
    if not resets:
        return writes
    write = writes.get("run")
    changes = {**resets, **(write or {})}
    writes["run"] = step_write(None, after, changes)
    return writes
