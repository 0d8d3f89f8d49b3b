"""A node's channel writes: what a node changed, as LangGraph channel updates, and back.

A node computes the next AgentState; :func:`changed` turns the step from one state to the next
into the writes that make it (only the fields that changed, only the items a record gained,
nothing for a field a new run leaves at its default), :func:`started` makes a new run's first
writes safe against values a caller put in the thread first, and :func:`applied` is the inverse.
"""

from __future__ import annotations

from typing import Any, get_type_hints

from fencepost.graph.channels import Defaulted, Records
from fencepost.graph.state import _FIELDS, GraphState
from fencepost.policy import AgentState
from fencepost.policy.revised import changes_since

_FIELD_SET = frozenset(_FIELDS)

_APPENDED = frozenset({"observations", "proposals", "receipts", "manifests"})
_UNSET: dict[str, Any] = {
    name: AgentState.model_fields[name].get_default(call_default_factory=True)
    for name, hint in get_type_hints(GraphState, include_extras=True).items()
    if any(isinstance(m, Defaulted | Records) for m in getattr(hint, "__metadata__", ()))
    and name in AgentState.model_fields
}
"""Fields whose channel reads as the field's default until written: a new run leaves them
unwritten while they hold it."""
_RESET = tuple(
    name
    for name, hint in get_type_hints(GraphState, include_extras=True).items()
    if any(isinstance(m, Defaulted) for m in getattr(hint, "__metadata__", ()))
)


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


def applied(before: AgentState | None, writes: dict[str, Any]) -> AgentState | None:
    """The state ``writes`` (what :func:`changed` returned) turn ``before`` into: its inverse.
    ``None`` when there is still no run (a node that wrote nothing to a fresh thread)."""
    if before is None:
        if "run_id" not in writes:
            return None
        return AgentState.model_construct(**{n: writes[n] for n in _FIELDS if n in writes})
    update: dict[str, Any] = {}
    for name, value in writes.items():
        if name not in _FIELD_SET:
            continue
        if name in _APPENDED:
            update[name] = getattr(before, name) + tuple(value)
        elif name in ("evidence", "answered"):
            update[name] = {**getattr(before, name), **value}
        elif name == "fingerprints":
            counts = dict(before.fingerprints)
            for key, count in value.items():
                counts[key] = max(count, counts.get(key, 0))
            update[name] = counts
        else:
            update[name] = value
    return before.model_copy(update=update)
