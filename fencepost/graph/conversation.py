"""The messages view's channel: the run as a conversation, grown by what each step wrote."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, cast

from langchain_core.messages import AnyMessage, BaseMessage, RemoveMessage, convert_to_messages
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import PendingWrite
from langgraph.graph.message import add_messages
from langgraph.types import Overwrite

from fencepost.graph.record import SNAPSHOT_EVERY, overwrite_of


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
        try:
            # A node's own write is messages already (every step's): nothing to convert.
            converted = (
                given
                if all(isinstance(m, BaseMessage) for m in given)
                else convert_to_messages(given)
            )
        except Exception:  # noqa: S112 - dropped, see below
            # No message (a number, an unknown role): dropped. LangGraph saves a Command's
            # writes before it applies them, so raising here would fail every later invoke.
            continue
        named: list[Any] = [
            m if m.id is not None else m.model_copy(update={"id": _message_id(len(out), i, m)})
            for i, m in enumerate(converted)
        ]
        fresh = {m.id for m in named}
        if len(fresh) == len(named) and not any(
            isinstance(m, RemoveMessage) or out.holds(m.id) for m in named
        ):
            for message in named:
                out.at[message.id] = len(out)
                out.append(message)
            continue
        try:
            merged = add_messages(list(out), named)
        except ValueError:
            continue  # a removal of a message the conversation does not hold: dropped, as above
        out = _indexed(cast(list[Any], merged))
    return out


def _as_taken(write: Any) -> Any:
    """A write as the conversation takes it. An ``Overwrite`` (any of its forms, a JSON client's
    ``{"__overwrite__": ...}`` included) bypasses the reducer, so it is read here: of messages,
    it becomes an ``Overwrite`` of those messages, named as an append names them; of anything
    else, None (dropped, as a write that is no message is: kept, it raised at every load)."""
    is_overwrite, value = overwrite_of(write)
    if not is_overwrite or value is None:  # None: LangGraph's reset to an empty conversation
        return write
    given = value if isinstance(value, list) else [value]
    try:
        convert_to_messages(given)
    except Exception:
        return None
    return Overwrite(_add_messages(None, [given]))


class Conversation(DeltaChannel[Any]):
    """The messages channel: every write it keeps is messages (see :func:`_as_taken`).

    LangGraph copies every channel to route each step, and a delta channel's copy copies its
    value: here the conversation, as long as the run. The reducer never changes a conversation
    in place (it makes a new one), so a copy shares it."""

    def copy(self) -> Conversation:
        out = _new(type(self))
        out.typ, out.key, out.value = self.typ, self.key, self.value
        out.reducer, out.snapshot_frequency = self.reducer, self.snapshot_frequency
        return out

    def update(self, values: Sequence[Any]) -> bool:
        if not values:
            return False
        taken = [w for w in map(_as_taken, values) if w is not None]
        resets = [i for i, w in enumerate(taken) if overwrite_of(w)[0]]
        # Two resets in one step: the last wins, as across steps (LangGraph raises, again at
        # every later invoke of the thread when a caller's Command wrote them).
        for i in reversed(resets[:-1]):
            del taken[i]
        return super().update(taken)

    def replay_writes(self, writes: Sequence[PendingWrite]) -> None:
        taken = ((task, channel, _as_taken(value)) for task, channel, value in writes)
        super().replay_writes([w for w in taken if w[2] is not None])


_new = object.__new__

# The messages view grows by a few messages a step; as a delta channel a checkpoint stores the
# messages a step wrote, not the whole conversation again (see benchmarks/).
Messages: DeltaChannel[list[AnyMessage]] = Conversation(
    _add_messages, list, snapshot_frequency=SNAPSHOT_EVERY
)
