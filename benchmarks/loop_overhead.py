"""Loop overhead: fencepost vs ``create_agent`` with limit middleware vs a bare LangGraph loop.

Each system runs ``N`` tool iterations (model proposes one tool call, the tool runs, repeat; then
a final text) against the same fake chat model and the same trivial tool, with the same checkpoint
saver and the same serializer (fencepost's allowlist serializer, for all three). Rounds are
interleaved in one process (a, b, c, a, b, c, ...), the first round is a discarded warm-up, and the
median wall time per tool iteration is reported with the ratios the issue sets targets for:

    fencepost <= 0.75x create_agent and <= 1.3x the bare loop, on both savers.

The targets are reported, never asserted: this is a measurement, not a test.

fencepost's decision model is ``fencepost.adapters.chat_model.ChatModelDecider`` around the fake
chat model when that adapter exists and passes a short smoke run, else the benchmark's own
``BenchChatDecider``; the table says which one ran.

A second table answers "how many supersteps per iteration": fencepost as built (decide, execute)
against the same nodes with a pass-through ``gate`` node between them (decide, gate, execute),
i.e. what one more LangGraph node boundary per iteration costs (sync ``invoke``, both savers).

Usage::

    make bench          # both tables (~2 min on 2 cores), written to benchmarks/results.md
    LANGGRAPH_STRICT_MSGPACK=true .venv/bin/python benchmarks/loop_overhead.py --profile
                        # + where fencepost's time goes: a cProfile split of one run and the
                        #   unit costs behind it (adds a few seconds)

Environment knobs: ``FENCEPOST_BENCH_N`` (iterations, default 200), ``FENCEPOST_BENCH_ROUNDS``
(measured rounds after the warm-up, default 5), ``FENCEPOST_BENCH_ASYNC=0`` to skip the
``ainvoke`` rows.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiosqlite
from langchain.agents import create_agent
from langchain.agents.middleware import ModelCallLimitMiddleware, ToolCallLimitMiddleware
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import StructuredTool
from langgraph._internal._runnable import RunnableCallable
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.graph.serde import fencepost_serializer

N = int(os.environ.get("FENCEPOST_BENCH_N", "200"))
ROUNDS = int(os.environ.get("FENCEPOST_BENCH_ROUNDS", "5"))
WITH_ASYNC = os.environ.get("FENCEPOST_BENCH_ASYNC", "1") != "0"
TOOL_NAME = "search_logs"
RESULTS = Path(__file__).with_name("results.md")
SYSTEMS = ("fencepost", "create_agent", "bare")

# --------------------------------------------------------------------------------------------
# The shared parts: one fake chat model class, one trivial tool, one counter of what ran.
# --------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What one run did: model turns and tool bodies actually executed."""

    n: int = N
    model_calls: int = 0
    tool_calls: int = 0

    def reset(self, n: int) -> None:
        self.n, self.model_calls, self.tool_calls = n, 0, 0


TALLY = Tally()
VERIFIED: dict[str, list[int]] = {}
"""Tool calls counted in each verified run, per system (printed with the table)."""
CHECKPOINTS: dict[str, int] = {}
"""Checkpoints written by each fencepost graph's last N-iteration run (one per superstep)."""
WARM_UP_N = min(N, 40)
"""The warm-up round only needs to touch every code path: a short run keeps ``make bench`` fast."""


class ToolLoopChatModel(BaseChatModel):
    """A fake chat model: one tool call per turn until ``TALLY.n`` calls, then a final text.

    It ignores its input (so the cost of the model itself is the same for every system) and
    implements both ``_generate`` and ``_agenerate`` so neither sync nor async invocation pays
    a thread hop inside LangChain.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @property
    def _llm_type(self) -> str:
        return "fencepost-bench-tool-loop"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ToolLoopChatModel:  # type: ignore[override]
        # Binding is free for the fake: every system pays the same nothing.
        return self

    def _turn(self) -> ChatResult:
        i = TALLY.model_calls
        TALLY.model_calls += 1
        if i < TALLY.n:
            message = AIMessage(
                content="",
                tool_calls=[
                    {
                        "name": TOOL_NAME,
                        # Distinct arguments each turn: a repeat would (rightly) end fencepost's
                        # run as no_progress.
                        "args": {"query": f"status:5xx page:{i}"},
                        "id": f"call-{i:06d}",
                        "type": "tool_call",
                    }
                ],
            )
        else:
            message = AIMessage(content="done: no 5xx spike found")
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._turn()

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._turn()


def search_logs(query: str) -> str:
    """Search the logs (trivially)."""
    TALLY.tool_calls += 1
    return f"0 hits for {query}"


LC_TOOL = StructuredTool.from_function(search_logs, name=TOOL_NAME)


class SearchArgs(BaseModel):
    """The trivial tool's arguments, strict as fencepost requires."""

    model_config = ConfigDict(extra="forbid", strict=True)
    query: str


def _fp_search(args: SearchArgs, ctx: fp.ToolContext) -> str:
    return search_logs(args.query)


REGISTRY = fp.ToolRegistry(
    [
        fp.ToolSpec(
            name=TOOL_NAME,
            description="Search the logs.",
            args_model=SearchArgs,
            effect=fp.Effect.READ,
            required_capability="logs:read",
            timeout_seconds=30,
            execute=_fp_search,
        )
    ]
)

# --------------------------------------------------------------------------------------------
# Chat model -> fencepost DecisionModel.
# --------------------------------------------------------------------------------------------


class BenchChatDecider:
    """A minimal chat-model adapter for fencepost's DecisionModel port: the fallback when
    ``fencepost.adapters.chat_model.ChatModelDecider`` is missing or fails its smoke run.

    Does what a real adapter must do each turn: render the question and the observations as
    messages (each tool result a ToolMessage joined by call id, marked as data), call the chat
    model, and parse its AIMessage into a proposal. Rendered observations are cached by call id
    (observations are immutable), as ChatModelDecider caches its rendered turns.
    """

    def __init__(self, chat: BaseChatModel) -> None:
        self._chat = chat.bind_tools(REGISTRY.model_catalog())
        self._rendered: dict[str, tuple[AIMessage, ToolMessage]] = {}

    def reset(self) -> None:
        self._rendered.clear()

    @staticmethod
    def _render(obs: fp.Observation) -> tuple[AIMessage, ToolMessage]:
        content = (
            json.dumps({"untrusted_data": obs.result})
            if obs.kind == "tool_result"
            else json.dumps({"error_code": obs.error_code.value if obs.error_code else None})
        )
        return (
            AIMessage(
                content="",
                tool_calls=[{"name": obs.tool_name, "args": {}, "id": obs.call_id}],
            ),
            ToolMessage(content=content, tool_call_id=obs.call_id),
        )

    def messages(self, input: fp.DecisionInput) -> list[BaseMessage]:
        """The conversation the chat model is shown for ``input``."""
        messages: list[BaseMessage] = [HumanMessage(content=input.question)]
        for obs in input.observations:
            pair = self._rendered.get(obs.call_id)
            if pair is None:
                pair = self._rendered[obs.call_id] = self._render(obs)
            messages.extend(pair)
        return messages

    async def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:
        ai = await self._chat.ainvoke(self.messages(input))
        if ai.tool_calls:
            call = ai.tool_calls[0]
            return fp.ToolProposal(
                call_id=str(call["id"]), tool_name=call["name"], arguments=call["args"]
            )
        return fp.FinalProposal(answer=fp.AnswerPayload(text=str(ai.content)))


def _real_adapter() -> Callable[[], Any] | None:
    """A factory of ``fencepost.adapters.ChatModelDecider`` if it exists (smoke-tested later)."""
    try:
        from fencepost.adapters.chat_model import ChatModelDecider
    except ImportError:
        return None
    return lambda: ChatModelDecider(ToolLoopChatModel())


def _bench_adapter() -> BenchChatDecider:
    return BenchChatDecider(ToolLoopChatModel())


DECIDER_FACTORY: Callable[[], Any] = _bench_adapter
"""Makes fencepost's decision model: the real chat-model adapter when it works (see
:func:`choose_decider`), else the benchmark's own. One fresh instance per compiled graph."""


# --------------------------------------------------------------------------------------------
# The three systems.
# --------------------------------------------------------------------------------------------

RUN_CONTEXT = fp.RunContext(
    tenant_id="bench", principal=fp.Principal(id="bench-user", capabilities={"logs:read"})
)
QUESTION = "Why did checkout return 5xx last night?"


def _config(n: int) -> dict[str, Any]:
    # Generous for all three: create_agent spends up to 4 supersteps per iteration.
    return {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 10 * n + 50}


@dataclass
class System:
    """One compiled graph plus how to start it and how to check what it did."""

    name: str
    graph: Any
    make_input: Callable[[int], Any]
    check: Callable[[Any, int], str | None]
    kwargs: dict[str, Any] = field(default_factory=dict)
    before_run: Callable[[], None] = lambda: None
    last_config: dict[str, Any] | None = None
    """The config of the last run, to read its checkpoint (see :func:`supersteps`)."""

    def _verify(self, out: Any, n: int) -> None:
        problem = self.check(out, n)
        if TALLY.tool_calls != n:
            problem = f"ran {TALLY.tool_calls} tool calls, expected {n}"
        elif TALLY.model_calls != n + 1:
            problem = problem or f"made {TALLY.model_calls} model calls, expected {n + 1}"
        if problem:
            raise SystemExit(f"{self.name}: {problem}")
        VERIFIED.setdefault(self.name, []).append(TALLY.tool_calls)

    def run(self, n: int) -> float:
        """Seconds for one full run of ``n`` tool iterations (sync ``invoke``)."""
        self.before_run()
        TALLY.reset(n)
        config, data = _config(n), self.make_input(n)
        self.last_config = config
        gc.collect()
        t0 = time.perf_counter()
        out = self.graph.invoke(data, config, **self.kwargs)
        elapsed = time.perf_counter() - t0
        self._verify(out, n)
        return elapsed

    async def arun(self, n: int) -> float:
        """Seconds for one full run of ``n`` tool iterations (``ainvoke``)."""
        self.before_run()
        TALLY.reset(n)
        config, data = _config(n), self.make_input(n)
        self.last_config = config
        gc.collect()
        t0 = time.perf_counter()
        out = await self.graph.ainvoke(data, config, **self.kwargs)
        elapsed = time.perf_counter() - t0
        self._verify(out, n)
        return elapsed


def _messages_check(out: Any, n: int) -> str | None:
    messages = out["messages"]
    tools = sum(isinstance(m, ToolMessage) for m in messages)
    last = messages[-1]
    if tools != n or not isinstance(last, AIMessage) or not str(last.content).startswith("done"):
        return f"ended with {tools} tool messages and last={type(last).__name__}"
    return None


def _fencepost_check(out: Any, n: int) -> str | None:
    state = fp.run_output(out)
    if state.termination is not fp.TerminationReason.COMPLETED or len(state.observations) != n:
        return f"ended {state.termination} with {len(state.observations)} observations"
    return None


def build_fencepost(
    saver: BaseCheckpointSaver[Any], *, decider: Any | None = None, **graph_kwargs: Any
) -> System:
    """(a) fencepost's graph, driven by the chat model through a DecisionModel adapter."""
    model = decider or DECIDER_FACTORY()
    graph = fp.build_agent_graph(REGISTRY, model, **graph_kwargs).compile(checkpointer=saver)
    return _fencepost_system("fencepost", graph, model)


def _fencepost_system(name: str, graph: Any, model: Any) -> System:
    return System(
        name=name,
        graph=graph,
        make_input=lambda n: fp.start(
            QUESTION, fp.RuntimeBudget(steps_remaining=n + 5, tool_calls_remaining=n + 5)
        ),
        check=_fencepost_check,
        kwargs={"context": RUN_CONTEXT},
        before_run=getattr(model, "reset", lambda: None),
    )


def _gate(values: dict[str, Any]) -> dict[str, Any]:
    # Pass-through: what a separate gate node costs in LangGraph machinery alone (one more
    # superstep, task, set of channel reads and checkpoint per iteration), with no work in it.
    return {}


async def _agate(values: dict[str, Any]) -> dict[str, Any]:
    return {}


def build_fencepost_gate(saver: BaseCheckpointSaver[Any]) -> System:
    """(a') fencepost with a pass-through ``gate`` node between ``decide`` and ``execute``.

    The nodes are the very ones ``build_agent_graph`` made (same LoopConfig, same decider); only
    the wiring differs: ``decide -> gate``, and ``gate`` routes on with ``route_after_decide``.
    So an iteration is decide, gate, execute: 3 supersteps instead of 2.
    """
    from fencepost.graph.context import RunContext
    from fencepost.graph.routing import (
        route_after_approve,
        route_after_decide,
        route_after_execute,
        route_start,
    )
    from fencepost.graph.state import GraphState, InputState

    model = DECIDER_FACTORY()
    base = fp.build_agent_graph(REGISTRY, model)
    variant: StateGraph[Any, RunContext, Any, Any] = StateGraph(
        GraphState, context_schema=RunContext, input_schema=InputState
    )
    for name, spec in base.nodes.items():
        variant.add_node(name, spec.runnable)
    variant.add_node("gate", RunnableCallable(_gate, _agate, name="gate"))
    variant.add_conditional_edges(START, route_start, ["decide", "approve", "execute", "terminal"])
    variant.add_edge("decide", "gate")
    variant.add_conditional_edges(
        "gate", route_after_decide, ["approve", "execute", "decide", "terminal"]
    )
    variant.add_conditional_edges("approve", route_after_approve, ["execute", "decide", "terminal"])
    variant.add_conditional_edges("execute", route_after_execute, ["decide", "terminal"])
    variant.add_edge("terminal", END)
    return _fencepost_system("fencepost+gate", variant.compile(checkpointer=saver), model)


def build_create_agent(saver: BaseCheckpointSaver[Any]) -> System:
    """(b) ``langchain.agents.create_agent`` with the two run-limit middlewares."""
    graph = create_agent(
        ToolLoopChatModel(),
        [LC_TOOL],
        middleware=[
            ToolCallLimitMiddleware(run_limit=N + 5),
            ModelCallLimitMiddleware(run_limit=N + 5),
        ],
        checkpointer=saver,
    )
    return System(
        name="create_agent",
        graph=graph,
        make_input=lambda n: {"messages": [HumanMessage(content=QUESTION)]},
        check=_messages_check,
    )


def build_bare(saver: BaseCheckpointSaver[Any]) -> System:
    """(c) A bare two-node loop: model node + ToolNode on MessagesState, no policy at all."""
    model = ToolLoopChatModel().bind_tools([LC_TOOL])

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    async def acall_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", RunnableCallable(call_model, acall_model, name="model"))
    builder.add_node("tools", ToolNode([LC_TOOL]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return System(
        name="bare",
        graph=builder.compile(checkpointer=saver),
        make_input=lambda n: {"messages": [HumanMessage(content=QUESTION)]},
        check=_messages_check,
    )


# --------------------------------------------------------------------------------------------
# Savers.
# --------------------------------------------------------------------------------------------


def memory_saver() -> InMemorySaver:
    return InMemorySaver(serde=fencepost_serializer())


def sqlite_saver(path: Path) -> SqliteSaver:
    # Sync invoke writes checkpoints from LangGraph's background threads.
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn, serde=fencepost_serializer())
    saver.setup()
    return saver


async def async_sqlite_saver(path: Path) -> AsyncSqliteSaver:
    saver = AsyncSqliteSaver(await aiosqlite.connect(path), serde=fencepost_serializer())
    await saver.setup()
    return saver


# --------------------------------------------------------------------------------------------
# The benchmark.
# --------------------------------------------------------------------------------------------

Key = tuple[str, str, str]  # (saver, mode, system)


@dataclass
class Cell:
    """Per-iteration timings (ms) of one system under one saver and mode."""

    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        return (max(self.samples) - min(self.samples)) if len(self.samples) > 1 else 0.0


def choose_decider() -> str:
    """Use the real ChatModelDecider if present and it completes a short run; say which."""
    global DECIDER_FACTORY
    real = _real_adapter()
    if real is None:
        DECIDER_FACTORY = _bench_adapter
        return "the benchmark's own BenchChatDecider (fencepost.adapters.chat_model not found)"
    try:
        build_fencepost(memory_saver(), decider=real()).run(3)
    except BaseException as exc:  # a broken adapter must not break the benchmark
        DECIDER_FACTORY = _bench_adapter
        return (
            "the benchmark's own BenchChatDecider (fencepost.adapters.chat_model.ChatModelDecider "
            f"failed a 3-iteration smoke run: {type(exc).__name__})"
        )
    DECIDER_FACTORY = real
    return "fencepost.adapters.chat_model.ChatModelDecider (the real adapter)"


def run_benchmark(rounds: int, with_async: bool) -> tuple[dict[Key, Cell], str]:
    decider_note = choose_decider()
    cells: dict[Key, Cell] = {}
    with tempfile.TemporaryDirectory(prefix="fencepost-bench-") as tmp:
        root = Path(tmp)
        sync_systems: dict[str, list[System]] = {
            "memory": [
                build_fencepost(memory_saver()),
                build_fencepost_gate(memory_saver()),
                build_create_agent(memory_saver()),
                build_bare(memory_saver()),
            ],
            "sqlite": [
                build_fencepost(sqlite_saver(root / "sync-fencepost.db")),
                build_fencepost_gate(sqlite_saver(root / "sync-fencepost-gate.db")),
                build_create_agent(sqlite_saver(root / "sync-create_agent.db")),
                build_bare(sqlite_saver(root / "sync-bare.db")),
            ],
        }
        with asyncio.Runner() as runner:
            async_systems: dict[str, list[System]] = {}
            if with_async:

                async def make_async() -> dict[str, list[System]]:
                    return {
                        "memory": [
                            build_fencepost(memory_saver()),
                            build_create_agent(memory_saver()),
                            build_bare(memory_saver()),
                        ],
                        "sqlite": [
                            build_fencepost(
                                await async_sqlite_saver(root / "async-fencepost.db"),
                            ),
                            build_create_agent(
                                await async_sqlite_saver(root / "async-create_agent.db")
                            ),
                            build_bare(await async_sqlite_saver(root / "async-bare.db")),
                        ],
                    }

                async_systems = runner.run(make_async())
            for round_no in range(rounds + 1):
                t_round = time.perf_counter()
                n = N if round_no else WARM_UP_N
                for saver_name in ("memory", "sqlite"):
                    for system in sync_systems[saver_name]:
                        ms = system.run(n) * 1000 / n
                        if round_no:  # round 0 is the warm-up
                            cells.setdefault(
                                (saver_name, "sync", system.name), Cell()
                            ).samples.append(ms)
                            if system.name.startswith("fencepost"):
                                cells.setdefault(
                                    (saver_name, "pair", system.name), Cell()
                                ).samples.append(ms)
                    # (a) and (a') once more in the reverse order (a, a', ..., a', a): twice the
                    # samples for the node-boundary table, and run order cancels out of it.
                    for system in reversed(sync_systems[saver_name][:2]):
                        ms = system.run(n) * 1000 / n
                        if round_no:
                            cells.setdefault(
                                (saver_name, "pair", system.name), Cell()
                            ).samples.append(ms)
                    for system in async_systems.get(saver_name, []):
                        ms = runner.run(system.arun(n)) * 1000 / n
                        if round_no:
                            cells.setdefault(
                                (saver_name, "async", system.name), Cell()
                            ).samples.append(ms)
                label = "warm-up" if round_no == 0 else f"round {round_no}/{rounds}"
                print(f"  {label}: {time.perf_counter() - t_round:.1f}s", file=sys.stderr)

            async def close_async() -> None:
                for systems in async_systems.values():
                    for system in systems:
                        saver = system.graph.checkpointer
                        if isinstance(saver, AsyncSqliteSaver):
                            await saver.conn.close()

            runner.run(close_async())
        for system in sync_systems["memory"]:
            if system.name.startswith("fencepost") and system.last_config is not None:
                CHECKPOINTS[system.name] = sum(
                    1 for _ in system.graph.checkpointer.list(system.last_config)
                )
        for systems in sync_systems.values():
            for system in systems:
                saver = system.graph.checkpointer
                if isinstance(saver, SqliteSaver):
                    saver.conn.close()
    return cells, decider_note


def environment() -> str:
    return (
        f"Python {platform.python_version()} ({platform.machine()}), "
        f"langgraph {version('langgraph')}, langchain {version('langchain')}, "
        f"langchain-core {version('langchain-core')}, pydantic {version('pydantic')}, "
        f"{os.cpu_count()} CPUs, LANGGRAPH_STRICT_MSGPACK={os.environ.get('LANGGRAPH_STRICT_MSGPACK', 'unset')}"
    )


def table(cells: dict[Key, Cell], rounds: int, decider_note: str) -> str:
    lines = [
        f"## Loop overhead: {N} tool iterations, median ms per iteration over {rounds} "
        "interleaved rounds (after 1 warm-up)",
        "",
        f"Environment: {environment()}.",
        "",
        f"fencepost's decision model: {decider_note}. Every system: the same fake chat model "
        "(one tool call per turn), the same trivial tool, the same saver kind, fencepost's "
        "serializer. Tool calls and model calls were counted and verified for every run.",
        "",
        "| saver | mode | (a) fencepost | (b) create_agent + limits | (c) bare loop "
        "| a/b (target <= 0.75) | a/c (target <= 1.3) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for saver_name in ("memory", "sqlite"):
        for mode in ("sync", "async"):
            row = {s: cells.get((saver_name, mode, s)) for s in SYSTEMS}
            a, b, c = row["fencepost"], row["create_agent"], row["bare"]
            if a is None or b is None or c is None:
                continue
            ab, ac = a.median / b.median, a.median / c.median
            saver_label = "InMemorySaver" if saver_name == "memory" else "SqliteSaver (file)"
            if mode == "async" and saver_name == "sqlite":
                saver_label = "AsyncSqliteSaver (file)"
            lines.append(
                f"| {saver_label} | {'invoke' if mode == 'sync' else 'ainvoke'} "
                f"| {a.median:.2f} (±{a.spread / 2:.2f}) | {b.median:.2f} (±{b.spread / 2:.2f}) "
                f"| {c.median:.2f} (±{c.spread / 2:.2f}) "
                f"| {ab:.2f} {'met' if ab <= 0.75 else 'MISSED'} "
                f"| {ac:.2f} {'met' if ac <= 1.3 else 'MISSED'} |"
            )
    verified = ", ".join(
        f"{name} {sum(c == N for c in counts)} runs x {N} tool calls"
        for name, counts in VERIFIED.items()
    )
    lines += [
        "",
        "(± is half the spread between the fastest and slowest measured round.) "
        f"Tool calls counted in the tool body and checked after every run: {verified} "
        "(plus the warm-up); each run also made N+1 model calls and ended with its final "
        "answer (fencepost: `completed` with N observations). A run that did not is an error.",
        "",
    ]
    return "\n".join(lines)


def gate_table(cells: dict[Key, Cell], rounds: int) -> str:
    """How much one more node boundary per iteration costs: fencepost as is vs + ``gate``."""
    lines = [
        "### Node boundaries: 2 supersteps per iteration vs 3",
        "",
        "The design question: should the policy gate be its own LangGraph node? (a) is fencepost "
        "as built (the gate runs inside `decide`; an iteration is decide, execute). (a') is the "
        "same graph with a pass-through `gate` node between `decide` and `execute` that returns "
        "`{}` and routes on with `route_after_decide`: the same nodes (built by "
        "`build_agent_graph`), one more superstep and checkpoint per iteration, and no gate "
        "work of its own, so the difference is LangGraph machinery alone. Sync `invoke`, "
        f"{N} tool iterations, median of {2 * rounds} runs each: every round ran (a) and (a') "
        "with the table above, then again in reverse order (so run order cancels out); every "
        "run verified the same "
        "way (N tool calls, N+1 model calls, `completed`).",
        "",
        "| saver | (a) 2 supersteps/iter, ms/iter | (a') 3 supersteps/iter, ms/iter "
        "| a'/a | extra ms/iter (median of paired runs) |",
        "|---|---:|---:|---:|---:|",
    ]
    for saver_name, saver_label in (("memory", "InMemorySaver"), ("sqlite", "SqliteSaver (file)")):
        a = cells.get((saver_name, "pair", "fencepost"))
        g = cells.get((saver_name, "pair", "fencepost+gate"))
        if a is None or g is None:
            continue
        # Each (a) run is paired with the (a') run next to it, so drift between rounds cancels.
        extra = statistics.median(x - y for x, y in zip(g.samples, a.samples, strict=True))
        lines.append(
            f"| {saver_label} | {a.median:.2f} (±{a.spread / 2:.2f}) "
            f"| {g.median:.2f} (±{g.spread / 2:.2f}) | {g.median / a.median:.2f} "
            f"| {extra:+.2f} |"
        )
    a_ck, g_ck = CHECKPOINTS.get("fencepost"), CHECKPOINTS.get("fencepost+gate")
    if a_ck is not None and g_ck is not None:
        lines += [
            "",
            f"Checkpoints written by one {N}-iteration run (InMemorySaver, one per superstep): "
            f"(a) {a_ck}, (a') {g_ck}, i.e. {(g_ck - a_ck) / N:.2f} more per iteration.",
        ]
    lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# --profile: where fencepost's per-iteration time goes, as the code is now. A cProfile split of
# one run, and the unit costs behind it at the end of an N-iteration run.
# --------------------------------------------------------------------------------------------


def _micro(label: str, fn: Callable[[], Any], repeat: int = 200) -> tuple[str, float]:
    try:
        fn()
    except Exception:  # fencepost internals moved: report the row as n/a, keep the rest
        return label, float("nan")
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return label, (time.perf_counter() - t0) / repeat * 1e6


def _real_adapter_micro(decision_input: fp.DecisionInput) -> list[tuple[str, float]]:
    if DECIDER_FACTORY is _bench_adapter:
        return []
    decider = DECIDER_FACTORY()
    n = len(decision_input.observations)
    return [
        _micro(
            f"ChatModelDecider.messages: {n} observations, fresh decider (nothing cached yet)",
            lambda: DECIDER_FACTORY().messages(decision_input),
            20,
        ),
        _micro(
            f"ChatModelDecider.messages: {n} observations, rendered turns cached (every step)",
            lambda: decider.messages(decision_input),
            50,
        ),
        _micro(
            "ChatModelDecider._runnable: catalog json key (every turn)",
            lambda: decider._runnable(decision_input.catalog),
        ),
    ]


async def _to_thread_int() -> None:
    await asyncio.to_thread(int)


def _micro_async(label: str, fn: Callable[[], Any], repeat: int = 200) -> tuple[str, float]:
    async def many() -> float:
        await fn()
        t0 = time.perf_counter()
        for _ in range(repeat):
            await fn()
        return (time.perf_counter() - t0) / repeat * 1e6

    return label, asyncio.run(many())


def micro_costs(n: int) -> list[tuple[str, float]]:
    """Unit costs (µs per call) behind the per-iteration numbers, at the run's final size."""
    from fencepost.graph import nodes as nodes_mod
    from fencepost.graph.portal import run_sync
    from fencepost.graph.state import changed, load_state

    serde = fencepost_serializer()
    manifest = fp.StepManifest(
        run_id="run-0123456789abcdef",
        step=7,
        phase=fp.Phase.EXECUTE,
        decision_kind="tool",
        tool_name=TOOL_NAME,
        effect=fp.Effect.READ,
        verdict=fp.VerdictCode.ALLOWED,
        steps_remaining=10,
        tool_calls_remaining=10,
        deadline_remaining_ms=1000,
        outcome="success",
        code="completed",
    )
    manifests = tuple(manifest for _ in range(2 * n))
    observations = tuple(
        fp.Observation(
            sequence=i,
            call_id=f"call-{i:06d}",
            tool_name=TOOL_NAME,
            kind="tool_result",
            result=f"0 hits for status:5xx page:{i}",
        )
        for i in range(n)
    )
    fingerprints = {f"{i:064x}": 1 for i in range(n)}
    decision_input = fp.DecisionInput(
        run_id="run-0123456789abcdef",
        question=QUESTION,
        observations=observations,
        catalog=tuple(REGISTRY.model_catalog()),
        budget=fp.RuntimeBudget(steps_remaining=n + 5, tool_calls_remaining=n + 5),
        step=n,
    )
    # The history the chat model is shown, as the bare loop keeps it in its messages channel.
    messages = DECIDER_FACTORY().messages(decision_input)

    async def noop() -> None:
        return None

    values = {
        name: getattr(s, name)
        for s in [_sample_state(n, observations, manifests)]
        for name in fp.AgentState.model_fields
    }
    state = load_state(values)
    assert state is not None
    # One iteration's growth: a step, an observation, the decide and execute manifests.
    grown = state.model_copy(
        update={
            "step": state.step + 1,
            "observations": (*state.observations, observations[-1]),
            "manifests": (*state.manifests, manifest, manifest),
        }
    )
    # _decision_input reads only cfg.registry; a stand-in keeps this immune to LoopConfig growing.
    loop_config = SimpleNamespace(registry=REGISTRY)

    def catalog_input() -> Any:
        return nodes_mod._decision_input(state, loop_config)

    return [
        _micro(
            "serialize 2 StepManifests (one iteration's delta write to `manifests`)",
            lambda: serde.dumps_typed(manifests[:2]),
        ),
        _micro(
            f"serialize {2 * n} StepManifests (a `manifests` snapshot, every 100th update)",
            lambda: serde.dumps_typed(manifests),
            20,
        ),
        _micro(
            "serialize 1 Observation (one iteration's delta write to `observations`)",
            lambda: serde.dumps_typed(observations[:1]),
        ),
        _micro(
            f"serialize {n} Observations (an `observations` snapshot, every 100th update)",
            lambda: serde.dumps_typed(observations),
            20,
        ),
        _micro(
            f"serialize {len(messages)} LangChain messages (the bare loop's channel, every "
            "checkpoint)",
            lambda: serde.dumps_typed(messages),
            20,
        ),
        *_real_adapter_micro(decision_input),
        _micro(f"serialize fingerprints dict of {n}", lambda: serde.dumps_typed(fingerprints), 50),
        _micro("portal round trip: run_sync(no-op coroutine)", lambda: run_sync(noop())),
        _micro_async(
            "asyncio.to_thread hop (sync tool body, inside a running loop)", _to_thread_int
        ),
        _micro("load_state (channel values -> AgentState)", lambda: load_state(values)),
        _micro(
            "changed (state diff -> channel writes, appended tails only)",
            lambda: changed(state, grown),
        ),
        _micro("model_copy of AgentState", lambda: state.model_copy(update={"step": 1})),
        _micro("_decision_input (incl. catalog copy)", catalog_input),
    ]


def _sample_state(
    n: int, observations: tuple[Any, ...], manifests: tuple[Any, ...]
) -> fp.AgentState:
    return fp.AgentState(
        run_id="run-0123456789abcdef",
        question=QUESTION,
        budget=fp.RuntimeBudget(steps_remaining=n + 5, tool_calls_remaining=n + 5),
        observations=observations,
        manifests=manifests,
        step=n,
    )


def profile_buckets(n: int) -> list[tuple[str, float]]:
    """cProfile of one fencepost ``ainvoke`` (one thread, so nothing hides in the portal thread):
    cumulative time of the parts that matter, in ms per iteration."""
    import cProfile
    import pstats

    system = build_fencepost(memory_saver())
    asyncio.run(system.arun(n))  # warm
    profiler = cProfile.Profile()
    profiler.enable()
    total = asyncio.run(system.arun(n))
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]

    def cumulative(*names: str, where: tuple[str, ...] = ("",)) -> float:
        return sum(
            row[3]
            for (filename, _, func), row in stats.items()
            if func in names and any(w in filename for w in where)
        )

    nodes = ("fencepost/graph/nodes.py",)
    parts = [
        (
            "checkpoint serialization (serde.dumps_typed, both put and put_writes)",
            cumulative("dumps_typed"),
        ),
        (
            "fencepost decide, around the model (_decide_prepare + _decide_finish)",
            cumulative("_decide_prepare", "_decide_finish", where=nodes),
        ),
        (
            "fencepost execute, around the tool (_execute_prepare + _execute_finish)",
            cumulative("_execute_prepare", "_execute_finish", where=nodes),
        ),
        ("fencepost terminal node", cumulative("terminal", where=nodes)),
        (
            "the model call through the adapter (DecisionModel.decide)",
            cumulative("decide", where=("fencepost/adapters/chat_model.py", "loop_overhead.py")),
        ),
        ("the tool call (_run_one, incl. to_thread)", cumulative("_run_one", where=nodes)),
    ]
    parts.append(
        (
            "everything else (LangGraph pregel loop, channels, asyncio)",
            total - sum(v for _, v in parts),
        )
    )
    parts.append(("total (wall time of the profiled ainvoke)", total))
    return [(k, v * 1000 / n) for k, v in parts]


def run_breakdown() -> str:
    """The ``--profile`` section: a cProfile split of one fencepost run, then unit costs."""
    lines = [
        f"## Where fencepost's time goes (--profile, N={N})",
        "",
        "cProfile of one fencepost `ainvoke` (InMemorySaver, ChatModelDecider when present), "
        "cumulative ms per iteration (cProfile slows Python code ~2-3x: read the shares, not "
        "the absolute numbers). observations/receipts/manifests are LangGraph DeltaChannels: a "
        "checkpoint stores the items a step appended, plus a full snapshot every 100th update "
        "of a channel.",
        "",
    ]
    buckets = profile_buckets(N)
    total = buckets[-1][1]
    lines += ["| where | ms/iter | share |", "|---|---:|---:|"]
    lines += [f"| {k} | {v:.2f} | {v / total:.0%} |" for k, v in buckets]
    lines += ["", f"Unit costs at the end of a {N}-iteration run (µs per call):", ""]
    lines += ["| operation | µs |", "|---|---:|"]
    lines += [
        f"| {k} | {'n/a' if v != v else f'{v:.0f}'} |"  # NaN: that internal moved
        for k, v in micro_costs(N)
    ]
    lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--no-async", action="store_true", help="skip the ainvoke rows")
    parser.add_argument("--profile", action="store_true", help="also profile fencepost")
    args = parser.parse_args(argv)
    print(f"loop_overhead: N={N}, {args.rounds} rounds + warm-up", file=sys.stderr)
    t0 = time.perf_counter()
    cells, decider_note = run_benchmark(args.rounds, WITH_ASYNC and not args.no_async)
    report = table(cells, args.rounds, decider_note) + "\n" + gate_table(cells, args.rounds)
    if args.profile:
        report += "\n" + run_breakdown()
    print(report)
    RESULTS.write_text(report)
    print(f"written to {RESULTS} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)


if __name__ == "__main__":
    main()
