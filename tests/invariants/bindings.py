"""The two bindings of one contract, behind one fixture: fencepost's own graph
(``fp.build_agent_graph``) and LangChain's ``create_agent`` with ``fp.FencepostMiddleware``.

Both get the same LangChain tools, the same scripted chat model, the same ledger and the same
settings (``fp.LoopSettings``: no step kept for answering, no repair of a refused proposal,
which the middleware does not take), so an invariant test written over ``binding`` says the
same thing of both. What one binding cannot do is named in ``docs/middleware.md`` and, as a
strict xfail, in ``tests/test_known_limits.py`` (``MIDDLEWARE_LIMITS``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import BaseTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import fencepost as fp
from fencepost.adapters.chat_model import ChatModelDecider
from fencepost.policy.keys import call_key, run_account
from fencepost.policy.ledger import Reservation
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
    error_code: str | None = None
    """The safe code of what ended the run (``last_error_code``)."""


class Binding:
    """One binding, driven the same way: a script of model turns, a budget, answers.

    ``extra_tools`` adds LangChain tools to the kit's two (``search_logs``, a read;
    ``write_note``, a write), each given as ``(lc_tool, fp.tool's keywords)``."""

    name = ""

    def __init__(
        self,
        script: Iterator[Any],
        *,
        steps: int,
        tools: int,
        ledger: fp.Ledger | None = None,
        failing_write: bool = False,
        extra_tools: Sequence[tuple[BaseTool, dict[str, Any]]] = (),
        mode: str = "invoke",
        **settings: Any,
    ):
        self.ran = Ran()
        self.tools = lc_tools(self.ran, failing_write=failing_write)
        self.specs = specs(self.tools) + [fp.tool(t, **declared) for t, declared in extra_tools]
        self.tools += [t for t, _ in extra_tools]
        self.model = FakeToolChatModel(messages=script)
        self.budget = fp.RuntimeBudget(steps_remaining=steps, tool_calls_remaining=tools)
        self.ledger = ledger if ledger is not None else fp.InMemoryLedger()
        self.config = thread()
        self.settings = {**settings, "ledger": self.ledger}
        self.saver = InMemorySaver()
        self.mode = mode
        self.graph = self.build()

    def build(self) -> Any:
        """A new agent object of this binding on the same saver, ledger, model and tools."""
        raise NotImplementedError

    def rebuild(self) -> None:
        """Go on with a new agent object (a request's, a restarted worker's)."""
        self.graph = self.build()

    def _invoke(self, input: Any, config: Any, ctx: fp.RunContext | None, **kw: Any) -> Outcome:
        if self.mode == "ainvoke":
            out = asyncio.run(self.graph.ainvoke(input, config, context=ctx, **kw))
        else:
            out = self.graph.invoke(input, config, context=ctx, **kw)
        return self._outcome(out)

    def _outcome(self, out: dict[str, Any]) -> Outcome:
        paused = "__interrupt__" in out
        termination, code = (None, None) if paused else self._ending(out)
        return Outcome(termination, paused, self.ran.bodies, self.model.received, code)

    def _ending(self, out: dict[str, Any]) -> tuple[str | None, str | None]:
        raise NotImplementedError

    def run_id(self) -> str:
        """The id of the thread's current run, from its last checkpoint."""
        raise NotImplementedError

    def account(self) -> str:
        """The ledger account of the thread's first run."""
        return run_account(self.config["configurable"]["thread_id"], self.run_id())

    def reservation(self, call_id: str, attempt: int = 1) -> Reservation | None:
        """The ledger's reservation of ``call_id``'s attempt, on the thread's first run."""
        return self.ledger.get(call_key(self.account(), call_id, attempt))

    def start(self, ctx: fp.RunContext | None, question: str = QUESTION, **invoke: Any) -> Outcome:
        """Start a run; ``invoke`` goes to ``graph.invoke`` (``interrupt_after=[b.TOOLS]``)."""
        self._ctx = ctx
        return self._invoke(self._input(question), self.config, ctx, **invoke)

    def _input(self, question: str) -> Any:
        raise NotImplementedError

    def before_tools(self) -> Outcome:
        """Invoke the thread again from its last checkpoint before its tools ran (a rollback,
        as time travel in LangGraph does it)."""
        for snapshot in self.graph.get_state_history(self.config):
            if snapshot.next == (self.TOOLS,):
                return self._invoke(None, snapshot.config, self._ctx)
        raise AssertionError("no checkpoint before the tools ran")

    TOOLS = ""
    """The node that runs the tools."""
    _ctx: fp.RunContext | None = None

    def resume(self, answer: Any, ctx: fp.RunContext | None) -> Outcome:
        self._ctx = ctx
        return self._invoke(Command(resume=answer), self.config, ctx)

    def go_on(self, ctx: fp.RunContext | None) -> Outcome:
        """Invoke the thread again with no input (``invoke(None)``)."""
        return self._invoke(None, self.config, ctx)


class GraphBinding(Binding):
    name = "graph"

    def build(self) -> Any:
        return fp.build_agent_graph(
            fp.ToolRegistry(self.specs),
            ChatModelDecider(self.model),
            answer_margin=0,
            repair_attempts=0,
            **self.settings,
        ).compile(checkpointer=self.saver)

    def _ending(self, out: dict[str, Any]) -> tuple[str | None, str | None]:
        state = fp.run_output(out)
        return (state.termination.value if state.termination else None), state.last_error_code

    def run_id(self) -> str:
        return fp.run_output(self.graph.get_state(self.config).values).run_id

    TOOLS = "execute"

    def _input(self, question: str) -> Any:
        return fp.start(question, self.budget)


class MiddlewareBinding(Binding):
    name = "middleware"

    def build(self) -> Any:
        guard = fp.FencepostMiddleware(self.specs, budget=self.budget, **self.settings)
        return create_agent(
            self.model,
            tools=list(self.tools),
            middleware=[guard],
            checkpointer=self.saver,
            context_schema=fp.RunContext,
        )

    def _ending(self, out: dict[str, Any]) -> tuple[str | None, str | None]:
        return out.get("termination"), out.get("last_error_code")

    def run_id(self) -> str:
        return str(self.graph.get_state(self.config).values["fencepost_run"]["run_id"])

    TOOLS = "tools"

    def _input(self, question: str) -> Any:
        return {"messages": [HumanMessage(question)]}


READ: dict[str, Any] = {"effect": "read", "capability": "logs:read"}
"""``fp.tool``'s keywords for a read tool anyone with ``logs:read`` may call."""

BINDINGS: dict[str, type[Binding]] = {"graph": GraphBinding, "middleware": MiddlewareBinding}
"""The ``binding`` fixture: each binding of the contract in turn (``conftest.py``)."""


def searches(start: int = 1) -> Iterator[AIMessage]:
    """A model that never stops calling ``search_logs``, with fresh arguments each time."""
    n = start
    while True:
        yield call("search_logs", {"query": f"checkout 500 #{n}"}, n)
        n += 1


def then_answer(*first: Any) -> Iterator[Any]:
    """A model that makes ``first``'s turns, then answers."""
    yield from first
    while True:
        yield AIMessage(content="checkout is down")


def call(name: str, args: dict[str, Any], n: int) -> AIMessage:
    """A model turn with one tool call, id ``call-000n``."""
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{n:04d}"}])


def batch(*calls: tuple[str, dict[str, Any], int]) -> AIMessage:
    """A model turn with parallel tool calls."""
    return AIMessage(
        content="",
        tool_calls=[{"name": n, "args": a, "id": f"call-{i:04d}"} for n, a, i in calls],
    )


def waiting_write(
    binding: type[Binding], note: str = "x", *, ctx: fp.RunContext | None = None, **settings: Any
) -> Binding:
    """A run of ``binding`` paused on its model's one call, ``write_note(note)`` (id
    ``call-0001``), waiting for a person (``approval="interrupt"``); the model answers after."""
    b = binding(
        then_answer(call("write_note", {"note": note}, 1)),
        steps=5,
        tools=5,
        approval="interrupt",
        **settings,
    )
    assert b.start(ctx or _owner()).paused
    return b


def _owner() -> fp.RunContext:
    from tests.middleware.kit import ctx

    return ctx()
