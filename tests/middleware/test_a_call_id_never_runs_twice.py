"""Invariant 9 in the middleware binding: a write runs at most once per call id, however often
an outer middleware calls the tool handler with it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langgraph.types import Command

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


class CallsTwice(AgentMiddleware):  # type: ignore[type-arg]
    """A wrapper that runs every tool call twice (a naive retry, a shadow run)."""

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        handler(request)
        return handler(request)


def test_a_write_handed_twice_to_the_handler_runs_once_and_the_second_is_uncertain() -> None:
    ran = Ran()
    tools = lc_tools(ran)
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(), approval="interrupt")
    model = chat(then_answer(call("write_note", {"note": "pay invoice 7"}, 1)))
    graph, config = agent(model, tools, [CallsTwice(), mw]), thread()
    graph.invoke(ask(), config, context=ctx())
    graph.invoke(Command(resume="approve"), config, context=ctx())
    assert ran.bodies == ["write_note:pay invoice 7"]
    seen = [m for m in model.received[1] if isinstance(m, ToolMessage)]
    assert [m.content for m in seen] == ['{"error_code": "execution_uncertain"}']
