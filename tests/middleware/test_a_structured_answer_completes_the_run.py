"""Invariant 1 in the middleware binding, with ``create_agent``'s structured output: the model's
answer given as the ``response_format`` tool (``ToolStrategy``) ends the run ``completed``; one
that does not parse is asked again, as a model step of the budget; a call of the agent's tools
before it is gated and runs as any."""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain.agents.structured_output import ToolStrategy
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import BaseModel

import fencepost as fp
from tests.middleware.kit import Ran, ask, budget, call, chat, ctx, lc_tools, specs, thread


class Cause(BaseModel):
    """Why checkout fails."""

    cause: str


def answer(n: int, **args: Any) -> AIMessage:
    return AIMessage(
        content="", tool_calls=[{"name": "Cause", "args": args, "id": f"call-9{n:03d}"}]
    )


def structured_run(*script: AIMessage, steps: int = 5) -> tuple[Ran, dict[str, Any]]:
    ran = Ran()
    tools = lc_tools(ran)
    graph = create_agent(
        chat(iter(script)),
        tools=tools,
        middleware=[fp.FencepostMiddleware(specs(tools), budget=budget(steps=steps))],
        checkpointer=InMemorySaver(),
        context_schema=fp.RunContext,
        response_format=ToolStrategy(Cause),
    )
    out: dict[str, Any] = graph.invoke(ask(), thread(), context=ctx())
    return ran, out


def test_a_structured_answer_ends_the_run_completed() -> None:
    ran, out = structured_run(call("search_logs", {"query": "checkout"}, 1), answer(2, cause="db"))
    assert (out["termination"], out["last_error_code"]) == ("completed", None)
    assert out["structured_response"] == Cause(cause="db")
    assert ran.bodies == ["search_logs:checkout"]


def test_a_structured_answer_that_does_not_parse_is_asked_again_as_a_step() -> None:
    _, out = structured_run(answer(1, reason="db"), answer(2, cause="db"))
    assert out["termination"] == "completed"
    assert out["structured_response"] == Cause(cause="db")
    assert out["fencepost_run"]["step"] == 2
    _, out = structured_run(*[answer(n, reason="db") for n in range(5)], steps=3)
    assert out["termination"] == "step_budget_exhausted"
