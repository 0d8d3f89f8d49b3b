"""The run as a conversation: the ``messages`` channel, derived from the policy state.

The policy state is the source of truth; messages are its view, for LangGraph Studio's chat,
Agent Chat UI and ``stream_mode="messages"``. They are derived in one place, here, from what a
node changed: the question when the run starts, one ``AIMessage`` per decision that proposed
tools, one ``ToolMessage`` per observation, and one final ``AIMessage`` when the run ends. Nothing
a model returned goes in except what the policy kept (so a provider's hidden reasoning never
does), and a tool's output is shown exactly as the model is shown it: as untrusted data, or a
failure's safe code.

Message ids are derived from the run id and what the message is about, so a message written again
(an approval that edits a call's arguments) replaces the one before it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from pydantic import BaseModel

from fencepost.graph.settings import Update
from fencepost.graph.writes import Writes
from fencepost.policy import AgentState, Observation
from fencepost.policy.untrusted import observation_content

__all__ = ["messages_for", "with_messages"]

RESULT_KEY = "fencepost"
"""The ``response_metadata`` key of the final message: termination reason, citations, code."""


def _id(state: AgentState, what: str) -> str:
    return f"fp:{state.run_id}:{what}"


M = TypeVar("M", bound=BaseModel)
_new = object.__new__
# BaseModel's own slots, set through their descriptors (see ``policy.contract``).
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def _layout(
    cls: type[BaseModel],
) -> tuple[dict[str, Any], tuple[tuple[str, Callable[[], Any]], ...]]:
    """``cls``'s fields in declared order at their defaults, and the fields whose default is
    made fresh for each instance (a mutable ``{}`` or ``[]``)."""
    fixed: dict[str, Any] = {}
    made: list[tuple[str, Callable[[], Any]]] = []
    for name, info in cls.model_fields.items():
        fixed[name] = None if info.is_required() else info.default
        if info.default_factory is not None:
            made.append((name, info.default_factory))  # type: ignore[arg-type]
    return fixed, tuple(made)


_LAYOUTS: dict[
    type[BaseModel], tuple[dict[str, Any], tuple[tuple[str, Callable[[], Any]], ...]]
] = {cls: _layout(cls) for cls in (AIMessage, ToolMessage)}


def _message(cls: type[M], **given: Any) -> M:
    """A message of ``cls`` holding ``given``, as validating them makes it (the same values,
    in the same order, the same fields given, an empty map of extra keys), without validating
    again: the values are fencepost's own, read from records validated already (a proposal,
    an observation), of the types the message's fields hold. A message is made for every
    step: validation costs five times this."""
    fixed, made = _LAYOUTS[cls]
    values = fixed.copy()
    for name, factory in made:
        values[name] = factory()
    values.update(given)
    message = _new(cls)
    _set_dict(message, values)
    # A set of its own: a message is not frozen, and setting a field adds its name to it.
    _set_fields_set(message, set(given))
    _set_extra(message, {})
    _set_private(message, None)
    return message


def _decision(state: AgentState) -> AIMessage:
    # A tool call as AIMessage's validation writes it (``create_tool_call``): in that key order.
    return _message(
        AIMessage,
        content="",
        tool_calls=[
            {
                "name": e.proposal.tool_name,
                "args": dict(e.proposal.arguments),
                "id": e.proposal.call_id,
                "type": "tool_call",
            }
            for e in state.batch
        ],
        id=_id(state, f"decision-{state.step}"),
    )


def _observation(state: AgentState, obs: Observation) -> ToolMessage:
    # "success" is ToolMessage's default: named only for an error. Each name given is kept in the
    # message's set of fields given, and five names take a set table three times the size of
    # four (about 0.5 KB a message, for as long as a run is in flight).
    failed = {} if obs.kind == "tool_result" else {"status": "error"}
    return _message(
        ToolMessage,
        content=observation_content(obs),
        tool_call_id=obs.call_id,
        name=obs.tool_name,
        id=_id(state, f"observation-{obs.call_id}"),
        **failed,
    )


def _ending(state: AgentState) -> AIMessage:
    reason = state.termination
    answer = state.final_answer
    code = state.last_error_code
    if answer is not None:
        text = answer.text
    else:
        text = f"Run ended: {reason.value if reason else 'unknown'}"
        if code:
            text += f" ({code})"
    return AIMessage(
        content=text,
        id=_id(state, "end"),
        response_metadata={
            RESULT_KEY: {
                "termination": reason.value if reason else None,
                "citations": list(answer.citations) if answer else [],
                "error_code": code,
            }
        },
    )


def messages_for(
    before: AgentState | None, after: AgentState, *, question_given: bool = False
) -> list[BaseMessage]:
    """The messages that show what changed from ``before`` to ``after``.

    ``question_given``: the run was started from messages, so the question is already in the
    channel (as the caller's own human message) and is not repeated.
    """
    out: list[BaseMessage] = []
    if before is None and not question_given:
        out.append(HumanMessage(content=after.question, id=_id(after, "question")))
    if after.batch and (before is None or before.pending != after.pending):
        out.append(_decision(after))
    seen = len(before.observations) if before is not None else 0
    out.extend(_observation(after, obs) for obs in after.observations[seen:])
    if after.is_terminal and (before is None or not before.is_terminal):
        out.append(_ending(after))
    return out


def with_messages(values: dict[str, Any], update: Update) -> Update:
    """A node's channel writes (what :func:`~fencepost.graph.writes.changed` made of its step)
    plus the messages showing them, as the plain dict LangGraph and a stream of updates get."""
    if not update:
        return {}
    if not isinstance(update, Writes):
        # Messages are derived from the two states the writes were made from; a body that
        # wrote a dict of its own would leave the conversation silently behind its state.
        raise TypeError("a node body returns its writes as step_writes(before, after) makes them")
    before = update.before
    shown = messages_for(
        before, update.after, question_given=before is None and not values.get("request")
    )
    return {**update, "messages": shown} if shown else dict(update)
