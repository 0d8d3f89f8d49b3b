"""A node's channel writes: the step from one AgentState to the next, as LangGraph updates.

A node computes the next AgentState; :func:`changed` turns the step from one state to the next
into the writes that make it (only the fields that changed, only the items a record gained,
nothing for a field a new run leaves at its default, and whatever a mended state mended),
:func:`started` makes a new run's first writes safe against values a caller put in the thread
first, :func:`refused` is what a node writes that does not run on an invalid state (the
messages view is derived from the two states a :class:`Writes` carries, in
:mod:`fencepost.graph.messages`).
"""

from __future__ import annotations

from typing import Any

from fencepost.graph.channels import Defaulted, Records
from fencepost.graph.state import _FIELDS, MendedState, field_default, fields_on
from fencepost.policy import AgentState
from fencepost.policy.revised import changes_since

_APPENDED = frozenset({"observations", "proposals", "receipts", "manifests"})
_UNSET: dict[str, Any] = {name: field_default(name) for name in fields_on(Defaulted | Records)}
"""Fields whose channel reads as the field's default until written: a new run leaves them
unwritten while they hold it."""
_RESET = fields_on(Defaulted)
"""Of those, the ones a write replaces (a record channel only grows: nothing to reset)."""


class Writes(dict[str, Any]):
    """A node's channel writes (what :func:`changed` returns), with the two states they were
    made from: the messages view is derived from those, not from the writes read back into
    state a second time. Never handed to LangGraph itself (see ``node_io.twins``)."""

    __slots__ = ("after", "before")

    before: AgentState | None
    after: AgentState


def changed(before: AgentState | None, after: AgentState) -> Writes:
    """The channel writes that turn ``before`` into ``after``: fields that changed, and for the
    append-only record channels only the items added."""
    writes = Writes()
    writes.before, writes.after = before, after
    if before is None:
        for name in _FIELDS:
            value = getattr(after, name)
            if name in _UNSET and _same(value, _UNSET[name]):
                continue  # its channel reads as the default unwritten (see channels.Defaulted)
            # Plain dicts: a revised record carries its changes beside it, never into a checkpoint.
            writes[name] = dict(value) if isinstance(value, dict) else value
        return writes
    for name in _FIELDS:
        value = getattr(after, name)
        old = getattr(before, name)
        if value is old:
            continue
        if name in ("fingerprints", "evidence", "answered"):
            added = changes_since(old, value)
            if added:
                writes[name] = added
            continue
        if name in _APPENDED:
            if len(value) < len(old) or value[: len(old)] != old:
                raise ValueError(f"{name} is append-only")
            if len(value) > len(old):
                writes[name] = value[len(old) :]
        elif not _same(value, old):
            # An equal value made again (the budget view after a settlement that changed no
            # balance) is not written: each write is a serialized blob and a new channel
            # version in every checkpoint that follows.
            writes[name] = value
    if type(before) is MendedState:
        # Its channels hold what it mended (a caller's value of the wrong type): written over.
        for name in before.rewrite:
            writes.setdefault(name, getattr(after, name))
    return writes


def refused(state: MendedState) -> Writes:
    """The writes of a node that does not run on ``state`` (see ``state.InvalidState``): the stop
    that ends the run, where its channel holds another. The terminal node writes the rest of
    what was mended; so two nodes that refuse one state together write one field, one stop."""
    writes = Writes()
    writes.before = writes.after = state
    if "stop" in state.rewrite:
        writes["stop"] = state.stop
    return writes


def _same(value: Any, old: Any) -> bool:
    """Equal and of the same type: a caller's ``"terminal"`` equals ``Phase.TERMINAL`` (a str
    enum) but is not it, and the loop tests the phase by identity, so it is written over."""
    return type(value) is type(old) and value == old


def started(values: dict[str, Any], writes: Any) -> Any:
    """A node's writes (what it returned), made safe for a run's first: a field the new run
    leaves at its default is still written when its channel holds something else, a value a
    caller wrote to the thread before the run began (``update_state`` on a fresh thread), so
    no run starts with a stop, a batch or a termination it did not make."""
    if not isinstance(writes, Writes) or writes.before is not None:
        return writes
    after = writes.after
    for name in _RESET:
        value = getattr(after, name)
        if name not in writes and not _same(values.get(name, value), value):
            writes[name] = value
    return writes
