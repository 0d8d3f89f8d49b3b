"""The graph's reducer channels: append-only records, repeat counts, result evidence and the
messages view, each a LangGraph delta channel (a checkpoint stores what a step wrote)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, cast

from langchain_core.messages import AnyMessage, BaseMessage, RemoveMessage, convert_to_messages
from langgraph.channels.binop import _get_overwrite
from langgraph.channels.delta import DeltaChannel
from langgraph.channels.last_value import LastValue
from langgraph.checkpoint.base import PendingWrite
from langgraph.graph.message import add_messages


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
        out = super().copy()
        out.default = self.default
        return out

    def from_checkpoint(self, checkpoint: Any) -> Defaulted:
        out = super().from_checkpoint(checkpoint)
        out.default = self.default
        return out

    def get(self) -> Any:
        return self.value if LastValue.is_available(self) else self.default

    def is_available(self) -> bool:
        return True  # a node's input holds the default too


class Shared(DeltaChannel[Any]):
    """A delta channel whose copies share its value.

    LangGraph copies every channel to route each step (a router reads the state with the
    node's writes applied), and a delta channel's copy copies its value: the repeat counts,
    the result evidence and the conversation, each as long as the run. The reducers here
    never change a value in place, they make a new one, so a copy can share it.
    """

    def copy(self) -> Shared:
        out = self.__class__(self.reducer, self.typ, snapshot_frequency=self.snapshot_frequency)
        out.key = self.key
        out.value = self.value
        return out


class Records(Shared):
    """A delta channel that reads as empty (its type's empty value) until first written, for
    the reason :class:`Defaulted` gives, and only ever grows: LangGraph's ``Overwrite`` (in any
    of its forms, ``{"__overwrite__": ...}`` from a JSON client included) is dropped, so no
    state update can take back a receipt or reset a repeat count."""

    def update(self, values: Sequence[Any]) -> bool:
        return super().update([v for v in values if not _get_overwrite(v)[0]])

    def replay_writes(self, writes: Sequence[PendingWrite]) -> None:
        super().replay_writes([w for w in writes if not _get_overwrite(w[2])[0]])

    def get(self) -> Any:
        return self.value if DeltaChannel.is_available(self) else self.typ()

    def is_available(self) -> bool:
        return True


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
_SNAPSHOT_EVERY = 5000
Appended: DeltaChannel[tuple[Any, ...]] = Records(_append, snapshot_frequency=_SNAPSHOT_EVERY)


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


Latest: DeltaChannel[dict[str, str]] = Records(_latest, dict, snapshot_frequency=_SNAPSHOT_EVERY)


Counted: DeltaChannel[dict[str, int]] = Records(_count_up, dict, snapshot_frequency=_SNAPSHOT_EVERY)


def _message_id(existing: int, index: int, message: BaseMessage) -> str:
    body = json.dumps([existing, index, message.type, message.content], default=str)
    return "msg-" + hashlib.sha256(body.encode()).hexdigest()[:24]


class _Conversation(list[Any]):
    """The messages list, carrying where each id it holds sits (a map shared with the versions
    it grew from and into: a position is trusted only if the message there has that id)."""

    __slots__ = ("at",)

    at: dict[str, int]

    def __copy__(self) -> _Conversation:
        # Whatever copies the conversation (LangGraph's Overwrite does) gets a plain slice: the
        # default copy of a list subclass goes through __reduce_ex__ in Python.
        out = _Conversation(self)
        out.at = self.at
        return out

    def holds(self, message_id: str) -> bool:
        """Whether this version of the conversation holds a message with ``message_id``."""
        position = self.at.get(message_id)
        return position is not None and position < len(self) and self[position].id == message_id


def _indexed(messages: list[Any]) -> _Conversation:
    out = _Conversation(messages)
    out.at = {m.id: i for i, m in enumerate(out) if m.id is not None}
    return out


def _add_messages(current: list[AnyMessage] | None, batches: Sequence[Any]) -> list[AnyMessage]:
    """LangGraph's ``add_messages``, one write at a time, with deterministic ids.

    ``add_messages`` gives a message without an id a random one; a delta channel replays the raw
    writes each time a checkpoint is loaded, so a caller's id-less input message would get a new
    id on every load. Here it gets one derived from where it lands, the same on every replay.

    ``add_messages`` also re-indexes the whole conversation on every write, which grows with the
    run; a write of messages whose ids are all new (every step's, as fencepost makes them) is
    appended instead, and only a replacement or a removal goes through ``add_messages``.
    """
    if isinstance(current, _Conversation):
        out = _Conversation(current)
        out.at = current.at
    else:
        out = _indexed(list(current or ()))
    for batch in batches:
        given = batch if isinstance(batch, list) else [batch]
        named: list[Any] = [
            m if m.id is not None else m.model_copy(update={"id": _message_id(len(out), i, m)})
            for i, m in enumerate(convert_to_messages(given))
        ]
        fresh = {m.id for m in named}
        if len(fresh) == len(named) and not any(
            isinstance(m, RemoveMessage) or out.holds(m.id) for m in named
        ):
            for message in named:
                out.at[message.id] = len(out)
                out.append(message)
            continue
        out = _indexed(cast(list[Any], add_messages(list(out), named)))
    return out


# The messages view grows by a few messages a step; as a delta channel a checkpoint stores the
# messages a step wrote, not the whole conversation again (see benchmarks/).
Messages: DeltaChannel[list[AnyMessage]] = Shared(
    _add_messages, list, snapshot_frequency=_SNAPSHOT_EVERY
)
