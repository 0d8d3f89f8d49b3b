"""Shared kit for the middleware binding's tests: LangChain's own ``create_agent``, a scripted
fake chat model with tool calls, real checkpointers, and the tools whose bodies are counted."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from tests.adapters.fakes import FakeToolChatModel
from tests.unhurried import UNHURRIED_SECONDS

SECRET = "password=hunter2"
QUESTION = "why is checkout failing?"


@dataclass
class Ran:
    """Every tool body that actually ran, in order."""

    bodies: list[str] = field(default_factory=list)


def lc_tools(ran: Ran, *, failing_write: bool = False) -> list[BaseTool]:
    """A read tool and a write tool (which raises an error carrying a secret if asked)."""

    @tool
    def search_logs(query: str) -> str:
        """Search the service logs."""
        ran.bodies.append(f"search_logs:{query}")
        return f"500 /checkout ({query})"

    @tool
    def write_note(note: str) -> str:
        """Write an incident note."""
        ran.bodies.append(f"write_note:{note}")
        if failing_write:
            raise RuntimeError(SECRET)
        return "written"

    return [search_logs, write_note]


def specs(tools: Sequence[BaseTool]) -> list[fp.ToolSpec]:
    """The tools' fencepost specs: what each does and who may call it."""
    out = []
    for t in tools:
        if t.name == "write_note":
            out.append(fp.tool(t, effect="write", capability="notes:write"))
        else:
            out.append(fp.tool(t, effect="read", capability="logs:read"))
    return out


def call(name: str, args: dict[str, Any], n: int) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{n:04d}"}])


def search_forever(*, first: Sequence[AIMessage] = ()) -> Iterator[AIMessage]:
    """A model that never stops calling tools (fresh arguments each time, so no repeat)."""
    yield from first
    for n in itertools.count(100):
        yield call("search_logs", {"query": f"checkout 500 #{n}"}, n)


def then_answer(*first: AIMessage) -> Iterator[AIMessage]:
    yield from first
    while True:
        yield AIMessage(content="checkout is down")


def chat(script: Iterator[AIMessage]) -> FakeToolChatModel:
    return FakeToolChatModel(messages=script)


def thread() -> RunnableConfig:
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:12]}"}}


def ctx(*capabilities: str) -> fp.RunContext:
    return fp.RunContext(
        tenant_id="acme",
        principal=fp.Principal(
            id="u-1", capabilities=frozenset(capabilities or ("logs:read", "notes:write"))
        ),
        deadline=fp.Deadline.after(UNHURRIED_SECONDS),
    )


def budget(steps: int = 10, tools: int = 10) -> fp.RuntimeBudget:
    return fp.RuntimeBudget(steps_remaining=steps, tool_calls_remaining=tools)


def agent(
    model: FakeToolChatModel,
    tools: Sequence[BaseTool],
    middleware: Sequence[AgentMiddleware[Any, Any, Any]] = (),
    *,
    saver: Any = None,
) -> Any:
    """LangChain's ``create_agent``, as documented, with ``RunContext`` as its context schema."""
    return create_agent(
        model,
        tools=list(tools),
        middleware=list(middleware),
        checkpointer=saver if saver is not None else InMemorySaver(),
        context_schema=fp.RunContext,
    )


def ask() -> dict[str, Any]:
    return {"messages": [HumanMessage(QUESTION)]}
