"""The two bindings of one contract, behind one fixture: fencepost's own graph
(``fp.build_agent_graph``) and LangChain's ``create_agent`` with ``fp.FencepostMiddleware``.

Both get the same LangChain tools, the same scripted chat model and the same settings
(``fp.LoopSettings``: no step kept for answering, no repair of a refused proposal,
which the middleware does not take), so an invariant test written over ``binding`` says the
same thing of both. What one binding cannot do is named in ``docs/middleware.md`` and, as a
strict xfail, in ``tests/test_known_limits.py``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import fencepost as fp
from fencepost.adapters.chat_model import ChatModelDecider
from tests.adapters.fakes import FakeToolChatModel
from tests.middleware.kit import Ran, lc_tools, specs, thread

QUESTION = "why is checkout failing?"


@dataclass
class Outcome:
    """What a run did, as both bindings report it."""

    termination: str | None
    """The TerminationReason value; ``None`` while paused."""
    paused: bool
    bodies: list[str]
    received: list[list[BaseMessage]] = field(default_factory=list)
    """What the model was sent, per call."""


class Binding:
    """One binding, driven the same way: a script of model turns, a budget, answers."""

    name = ""

    def __init__(self, script: Iterator[AIMessage], *, steps: int, tools: int, **settings: Any):
        self.ran = Ran()
        self.tools = lc_tools(self.ran, failing_write=settings.pop("failing_write", False))
        self.model = FakeToolChatModel(messages=script)
        self.budget = fp.RuntimeBudget(steps_remaining=steps, tool_calls_remaining=tools)
        self.config = thread()
        self.settings = settings

    def start(self, ctx: fp.RunContext) -> Outcome:
        raise NotImplementedError

    def resume(self, answer: Any, ctx: fp.RunContext) -> Outcome:
        raise NotImplementedError


class GraphBinding(Binding):
    name = "graph"

    def __init__(self, script: Iterator[AIMessage], **kw: Any) -> None:
        super().__init__(script, **kw)
        self.graph = fp.build_agent_graph(
            fp.ToolRegistry(specs(self.tools)),
            ChatModelDecider(self.model),
            answer_margin=0,
            repair_attempts=0,
            **self.settings,
        ).compile(checkpointer=InMemorySaver())

    def _outcome(self, out: dict[str, Any]) -> Outcome:
        paused = "__interrupt__" in out
        termination = None if paused else fp.run_output(out).termination
        return Outcome(
            termination.value if termination else None, paused, self.ran.bodies, self.model.received
        )

    def start(self, ctx: fp.RunContext) -> Outcome:
        out = self.graph.invoke(fp.start(QUESTION, self.budget), self.config, context=ctx)
        return self._outcome(out)

    def resume(self, answer: Any, ctx: fp.RunContext) -> Outcome:
        return self._outcome(self.graph.invoke(Command(resume=answer), self.config, context=ctx))


class MiddlewareBinding(Binding):
    name = "middleware"

    def __init__(self, script: Iterator[AIMessage], **kw: Any) -> None:
        super().__init__(script, **kw)
        guard = fp.FencepostMiddleware(specs(self.tools), budget=self.budget, **self.settings)
        self.graph = create_agent(
            self.model,
            tools=list(self.tools),
            middleware=[guard],
            checkpointer=InMemorySaver(),
            context_schema=fp.RunContext,
        )

    def _outcome(self, out: dict[str, Any]) -> Outcome:
        paused = "__interrupt__" in out
        termination = None if paused else out.get("termination")
        return Outcome(termination, paused, self.ran.bodies, self.model.received)

    def start(self, ctx: fp.RunContext) -> Outcome:
        ask = {"messages": [HumanMessage(QUESTION)]}
        return self._outcome(self.graph.invoke(ask, self.config, context=ctx))

    def resume(self, answer: Any, ctx: fp.RunContext) -> Outcome:
        return self._outcome(self.graph.invoke(Command(resume=answer), self.config, context=ctx))


BINDINGS: dict[str, type[Binding]] = {"graph": GraphBinding, "middleware": MiddlewareBinding}
