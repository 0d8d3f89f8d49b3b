"""``FencepostMiddleware(tool_catalog="permitted")``: LangChain's agent binds the model to only
the tools the run's principal may call, read from each model call's context; ``"all"`` (the
default) leaves the agent's tools as they are; the gate still refuses a tool it was not shown."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.messages import AIMessage

import fencepost as fp
from tests.middleware.kit import (
    Ran,
    agent,
    ask,
    budget,
    call,
    chat,
    ctx,
    lc_tools,
    specs,
    then_answer,
    thread,
)


def shown(tools: list[dict[str, Any]]) -> set[str]:
    return {t["function"]["name"] for t in tools}


def _agent(model: Any, ran: Ran, **settings: Any) -> Any:
    tools = lc_tools(ran)
    return agent(model, tools, [fp.FencepostMiddleware(specs(tools), budget=budget(), **settings)])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_principal_without_the_capability_is_not_shown_the_tool(mode: str) -> None:
    model = chat(then_answer(call("search_logs", {"query": "checkout"}, 1)))
    graph = _agent(model, Ran(), tool_catalog="permitted")
    if mode == "sync":
        out = graph.invoke(ask(), thread(), context=ctx("logs:read"))
    else:
        out = asyncio.run(graph.ainvoke(ask(), thread(), context=ctx("logs:read")))
    assert out["termination"] == "completed"
    assert [shown(tools) for tools in model.bound_tools] == [{"search_logs"}] * 2


def test_all_leaves_the_agents_tools_as_they_are() -> None:
    for settings in ({}, {"tool_catalog": "all"}):
        model = chat(then_answer())
        _agent(model, Ran(), **settings).invoke(ask(), thread(), context=ctx("logs:read"))
        assert shown(model.bound_tools[0]) == {"search_logs", "write_note"}


def test_two_principals_on_one_agent_each_see_their_own_catalog() -> None:
    model = chat(then_answer())
    graph = _agent(model, Ran(), tool_catalog="permitted")
    for caps in [("logs:read",), ("logs:read", "notes:write"), ("logs:read",), ("notes:write",)]:
        graph.invoke(ask(), thread(), context=ctx(*caps))
    assert [shown(tools) for tools in model.bound_tools] == [
        {"search_logs"},
        {"search_logs", "write_note"},
        {"search_logs"},
        {"write_note"},
    ]


def test_a_call_to_a_tool_the_model_was_not_shown_is_still_refused() -> None:
    ran = Ran()
    model = chat(iter([call("write_note", {"note": "restart"}, 1), AIMessage("done")]))
    out = _agent(model, ran, tool_catalog="permitted").invoke(
        ask(), thread(), context=ctx("logs:read")
    )
    assert shown(model.bound_tools[0]) == {"search_logs"}
    assert out["termination"] == "policy_denied"
    assert ran.bodies == []
