"""A tool the middleware runs contained (on a fencepost thread of its tenant's share, or a task on
a leash) keeps what LangGraph gives a tool: its ``ToolRuntime`` (context, state, call id, stream
writer), ``get_stream_writer()``, ``interrupt()`` and its resume answer, and a ``Command`` it
returns."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.tools import ToolRuntime
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.config import get_stream_writer
from langgraph.types import Command, interrupt

import fencepost as fp
from tests.middleware.kit import agent, ask, budget, call, chat, ctx, then_answer, thread


def _tools(seen: dict[str, Any]) -> list[Any]:
    @tool
    def search_logs(query: str, runtime: ToolRuntime) -> str:
        """Search the service logs."""
        seen["tenant"] = runtime.context.tenant_id
        seen["call_id"] = runtime.tool_call_id
        seen["asked"] = runtime.state["messages"][0].content
        runtime.stream_writer({"progress": "runtime"})
        get_stream_writer()({"progress": "config"})
        return f"found {query}, {interrupt({'confirm': query})}"

    @tool
    def tag_incident(tag: str, runtime: ToolRuntime) -> Command[Any]:
        """Tag the incident."""
        message = ToolMessage(f"tagged {tag}", tool_call_id=runtime.tool_call_id)
        return Command(update={"messages": [message]})

    return [search_logs, tag_incident]


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_contained_tool_keeps_its_runtime_interrupt_stream_and_command(mode: str) -> None:
    seen: dict[str, Any] = {}
    tools = _tools(seen)
    specs = [fp.tool(t, effect="read", capability="logs:read") for t in tools]
    model = chat(
        then_answer(call("search_logs", {"query": "q"}, 1), call("tag_incident", {"tag": "p1"}, 2))
    )
    graph = agent(model, tools, [fp.FencepostMiddleware(specs, budget=budget())])
    config = thread()

    def run(value: Any, **kw: Any) -> Any:
        if mode == "ainvoke":
            return asyncio.run(_collect(graph.astream(value, config, context=ctx(), **kw)))
        return list(graph.stream(value, config, context=ctx(), **kw))

    chunks = run(ask(), stream_mode=["custom", "updates"])
    assert [c for kind, c in chunks if kind == "custom" and "progress" in c] == [
        {"progress": "runtime"},
        {"progress": "config"},
    ]
    assert [i.value for i in graph.get_state(config).interrupts] == [{"confirm": "q"}]
    run(Command(resume="confirmed"))
    out = graph.get_state(config).values
    assert out["termination"] == "completed"
    assert seen == {"tenant": "acme", "call_id": "call-0001", "asked": ask()["messages"][0].content}
    shown = [str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)]
    assert shown == ["found q, confirmed", "tagged p1"]


async def _collect(stream: Any) -> list[Any]:
    return [chunk async for chunk in stream]
