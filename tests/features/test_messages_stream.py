"""``stream_mode="messages"`` with a chat model shows a chat UI each model turn once: the
question first, every message under the stable id it keeps in the state's ``messages``, and
none of fencepost's internal ``final_answer`` / ``abstain`` tool calls."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

import fencepost as fp
from fencepost.adapters.chat_model import ABSTAIN_TOOL, FINAL_TOOL
from tests.adapters import fakes

INTERNAL = {FINAL_TOOL, ABSTAIN_TOOL}


def _agent(steps: list[Any], **kw: Any) -> Any:
    decider, _ = fakes.decider(steps, **kw)
    return fakes.build(fakes.langchain_registry(fakes.ToolLog()), decider)


def _turns() -> list[Any]:
    return [
        fakes.ai_call("search_logs", {"query": "checkout"}, "call-search-1"),
        fakes.final_citing_all,
    ]


def _tool_names(message: BaseMessage) -> set[str]:
    calls = list(getattr(message, "tool_calls", None) or [])
    chunks = list(getattr(message, "tool_call_chunks", None) or [])
    return {c.get("name") for c in calls + chunks if c.get("name")}


def assert_one_turn_each(streamed: list[BaseMessage], stored: list[BaseMessage]) -> None:
    ids = [m.id for m in streamed]
    assert all(ids), "every streamed message has an id"
    assert ids == list(dict.fromkeys(ids)), f"a message streamed twice: {ids}"
    assert ids == [m.id for m in stored if m.id in set(ids)]
    assert set(ids) <= {m.id for m in stored}, "a streamed message the state does not keep"
    assert isinstance(streamed[0], HumanMessage)
    for message in streamed:
        assert not _tool_names(message) & INTERNAL, message


def test_a_chat_models_turns_stream_once_each_with_the_states_ids() -> None:
    agent = _agent(_turns())
    config = fakes.thread()
    streamed = [
        m
        for m, _ in agent.stream(
            fp.start("why is checkout failing?"),
            config,
            context=fakes.ctx(),
            stream_mode="messages",
        )
    ]
    stored = agent.get_state(config).values["messages"]
    assert [type(m).__name__ for m in stored] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    assert_one_turn_each(streamed, stored)
    assert [m.id for m in streamed] == [m.id for m in stored]


async def test_the_async_stream_shows_the_same_turns() -> None:
    agent = _agent(_turns())
    config = fakes.thread()
    streamed = [
        m
        async for m, _ in agent.astream(
            fp.start("why is checkout failing?"),
            config,
            context=fakes.ctx(),
            stream_mode="messages",
        )
    ]
    stored = agent.get_state(config).values["messages"]
    assert_one_turn_each(streamed, stored)


def test_a_run_started_from_messages_streams_the_callers_question_first_or_not_at_all() -> None:
    agent = _agent(["deploy 42 broke checkout"])
    config = fakes.thread()
    streamed = [
        m
        for m, _ in agent.stream(
            {"messages": [HumanMessage(content="why is checkout failing?", id="q-1")]},
            config,
            context=fakes.ctx(),
            stream_mode="messages",
        )
    ]
    assert streamed, "the answer is streamed"
    assert all(not isinstance(m, HumanMessage) or m.id == "q-1" for m in streamed)
    answers = [m for m in streamed if isinstance(m, AIMessage)]
    assert [m.content for m in answers] == ["deploy 42 broke checkout"]


def test_raw_tokens_are_there_for_whoever_asks_for_them() -> None:
    agent = _agent(["checkout broke after deploy 42"], stream_tokens=True)
    chunks = [
        m
        for m, meta in agent.stream(
            fp.start("why?"), fakes.thread(), context=fakes.ctx(), stream_mode="messages"
        )
        if meta.get("langgraph_node") == "decide" and type(m).__name__ == "AIMessageChunk"
    ]
    assert len(chunks) > 1
