"""The parts every benchmark shares, and nothing that imports fencepost.

fencepost is imported only by ``loop_overhead.py`` (and the parts that need it), so that while
fencepost is broken mid-rewrite the peers, the LangGraph baselines and the harness itself still
run and say why the fencepost rows are missing.

One fake chat model, one trivial tool, one counter of what ran (:data:`TALLY`), the savers, and
the interleaved runner with its per-run verification: a run that did not make exactly N tool
calls and N+1 model calls and end with its final answer is an error, not a sample.
"""

from __future__ import annotations

import asyncio
import gc
import os
import platform
import sqlite3
import statistics
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import StructuredTool
from langgraph._internal._runnable import RunnableCallable
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import ConfigDict

TOOL_NAME = "search_logs"
QUESTION = "Why did checkout return 5xx last night?"
FINAL_TEXT = "done: no 5xx spike found"

# --------------------------------------------------------------------------------------------
# What ran: every fake model and every copy of the tool count here.
# --------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What one run did: model turns and tool bodies actually executed."""

    n: int = 0
    """Tool calls the fake models make before their final answer."""
    model_calls: int = 0
    tool_calls: int = 0
    stamps: list[float] = field(default_factory=list)
    """``perf_counter()`` at every model call: ``stamps[i] - stamps[i-1]`` is iteration ``i``
    (tool ``i``, its checkpoint, the next decision), the same span for every system."""

    def reset(self, n: int) -> None:
        self.n, self.model_calls, self.tool_calls = n, 0, 0
        self.stamps = []

    def tool_ran(self) -> None:
        """Count a tool body run. Under a lock: tool bodies of concurrent runs run on several
        threads at once, and ``+= 1`` from two of them can lose a count (seen: 4,934 of 5,000
        calls counted across 1,000 concurrent runs, each run's receipts all present)."""
        with _TOOL_COUNT:
            self.tool_calls += 1

    def turn(self) -> int | None:
        """Count a model call: the tool-call index it should make, or None for the final answer."""
        i = self.model_calls
        self.model_calls += 1
        self.stamps.append(time.perf_counter())
        return i if i < self.n else None


_TOOL_COUNT = threading.Lock()
TALLY = Tally()
VERIFIED: dict[str, list[int]] = {}
"""Tool calls counted in each verified run, per system label."""


class VerificationError(Exception):
    """A run did not do what it was asked: its timing is not a sample."""


def tool_args(i: int) -> dict[str, str]:
    # Distinct arguments each turn: a repeat would (rightly) end fencepost's run as no_progress.
    return {"query": f"status:5xx page:{i}"}


def call_id(i: int) -> str:
    return f"call-{i:06d}"


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
        i = TALLY.turn()
        if i is None:
            message = AIMessage(content=FINAL_TEXT)
        else:
            message = AIMessage(
                content="",
                tool_calls=[
                    {"name": TOOL_NAME, "args": tool_args(i), "id": call_id(i), "type": "tool_call"}
                ],
            )
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


class PausingChatModel(ToolLoopChatModel):
    """For many concurrent runs: decides from its own input, not from the global turn count.

    With ``k`` tool results in its input it calls the tool again while ``k < n``; at ``k == n``
    it counts the run as in flight and waits on :attr:`gate` before its final answer. Async only.
    """

    n: int = 5
    gate: Any = None
    """An ``asyncio.Event`` set when every run has reached its pause."""
    paused: int = 0

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError("PausingChatModel is async only")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        TALLY.model_calls += 1
        k = sum(isinstance(m, ToolMessage) for m in messages)
        if k < self.n:
            message = AIMessage(
                content="",
                tool_calls=[
                    {"name": TOOL_NAME, "args": tool_args(k), "id": call_id(k), "type": "tool_call"}
                ],
            )
        else:
            self.paused += 1
            await self.gate.wait()
            message = AIMessage(content=FINAL_TEXT)
        return ChatResult(generations=[ChatGeneration(message=message)])


def search_logs(query: str) -> str:
    """Search the logs (trivially)."""
    TALLY.tool_ran()
    return f"0 hits for {query}"


LC_TOOL = StructuredTool.from_function(search_logs, name=TOOL_NAME)

# --------------------------------------------------------------------------------------------
# Savers: the same serializer for every system (fencepost's allowlist serializer when fencepost
# imports, else LangGraph's default, and the report says which).
# --------------------------------------------------------------------------------------------


def _make_serializer() -> tuple[Callable[[], Any], str]:
    # A checkpoint holds plain data: every system runs on LangGraph's own default serializer.
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    return JsonPlusSerializer, "LangGraph's default serializer (JsonPlusSerializer)"


SERIALIZER, SERIALIZER_NOTE = _make_serializer()


def memory_saver() -> InMemorySaver:
    return InMemorySaver(serde=SERIALIZER())


def sqlite_saver(path: Path) -> SqliteSaver:
    # Sync invoke writes checkpoints from LangGraph's background threads.
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn, serde=SERIALIZER())
    saver.setup()
    return saver


ASYNC_SQLITE_FILES: dict[int, Path] = {}
"""The file each AsyncSqliteSaver made by :func:`async_sqlite_saver` writes: fencepost cannot
read it off an aiosqlite connection, so a graph built with no ledger over such a saver is
refused; the benchmark passes a SqliteLedger on the same file instead (what fencepost's error
says to do)."""


async def async_sqlite_saver(path: Path) -> Any:
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    saver = AsyncSqliteSaver(await aiosqlite.connect(path), serde=SERIALIZER())
    await saver.setup()
    ASYNC_SQLITE_FILES[id(saver)] = path
    return saver


async def close_saver(saver: Any) -> None:
    conn = getattr(saver, "conn", None)
    if conn is None:
        return
    result = conn.close()
    if isinstance(result, Awaitable):
        await result


# --------------------------------------------------------------------------------------------
# A system under test, and the interleaved runner.
# --------------------------------------------------------------------------------------------


def run_config(n: int) -> dict[str, Any]:
    # Generous for all: create_agent spends up to 4 supersteps per iteration.
    return {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 10 * n + 50}


@dataclass
class System:
    """One compiled graph (or a peer framework dressed as one) plus how to start and check it."""

    name: str
    graph: Any
    """Anything with ``invoke(data, config, **kw)`` and ``ainvoke(...)``."""
    make_input: Callable[[int], Any]
    check: Callable[[Any, int], str | None]
    kwargs: dict[str, Any] = field(default_factory=dict)
    before_run: Callable[[], None] = lambda: None
    last_config: dict[str, Any] | None = None
    """The config of the last run, to read its checkpoints."""
    label: str = ""
    """The name in the verification note; defaults to ``name``."""

    def _verify(self, out: Any, n: int) -> None:
        problem = self.check(out, n)
        if TALLY.tool_calls != n:
            problem = f"ran {TALLY.tool_calls} tool calls, expected {n}"
        elif TALLY.model_calls != n + 1:
            problem = problem or f"made {TALLY.model_calls} model calls, expected {n + 1}"
        if problem:
            raise VerificationError(f"{self.label or self.name}: {problem}")
        VERIFIED.setdefault(self.label or self.name, []).append(TALLY.tool_calls)

    def _start(self, n: int) -> tuple[dict[str, Any], Any]:
        self.before_run()
        TALLY.reset(n)
        config, data = run_config(n), self.make_input(n)
        self.last_config = config
        gc.collect()
        return config, data

    def run(self, n: int) -> float:
        """Seconds for one full run of ``n`` tool iterations (sync ``invoke``), verified."""
        config, data = self._start(n)
        t0 = time.perf_counter()
        out = self.graph.invoke(data, config, **self.kwargs)
        elapsed = time.perf_counter() - t0
        self._verify(out, n)
        return elapsed

    async def arun(self, n: int) -> float:
        """Seconds for one full run of ``n`` tool iterations (``ainvoke``), verified."""
        config, data = self._start(n)
        t0 = time.perf_counter()
        out = await self.graph.ainvoke(data, config, **self.kwargs)
        elapsed = time.perf_counter() - t0
        self._verify(out, n)
        return elapsed


def messages_check(out: Any, n: int) -> str | None:
    messages = out["messages"]
    tools = sum(isinstance(m, ToolMessage) for m in messages)
    last = messages[-1]
    if tools != n or not isinstance(last, AIMessage) or last.content != FINAL_TEXT:
        return f"ended with {tools} tool messages and last={type(last).__name__}"
    return None


Key = tuple[str, ...]


@dataclass
class Cell:
    """Per-iteration timings (ms) of one system under one setting, or why there are none."""

    samples: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        return (max(self.samples) - min(self.samples)) if len(self.samples) > 1 else 0.0

    def fmt(self, digits: int = 2) -> str:
        """``median (±half spread)``, or the error in short."""
        if not self.ok:
            return f"error: {self.error}" if self.error else "n/a"
        return f"{self.median:.{digits}f} (±{self.spread / 2:.{digits}f})"


def describe(exc: BaseException) -> str:
    """One line for the report: the exception and, for a crash, where in fencepost/ it was."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    if isinstance(exc, VerificationError):
        return f"verification failed: {exc}"
    frames = [
        f"{Path(f.filename).name}:{f.lineno}"
        for f in traceback.extract_tb(exc.__traceback__)
        if f"{os.sep}fencepost{os.sep}" in f.filename
    ]
    return text + (f" (in fencepost/ at {frames[-1]})" if frames else "")


SOFT_DEADLINE: float | None = None
"""``perf_counter()`` past which a part starts no new round (set per part by bench.py): on a
busy machine a part measures fewer rounds and says so, rather than being cut off."""


def out_of_time() -> bool:
    return SOFT_DEADLINE is not None and time.perf_counter() > SOFT_DEADLINE


def settle() -> None:
    """Collect, then freeze what survives: the imported frameworks (the peers bring a few
    hundred thousand objects) and earlier parts' savers stay out of every later collection, so
    the ``gc.collect()`` before each run is cheap and a collection inside a timed run costs the
    same whichever part runs first."""
    gc.collect()
    gc.freeze()


@dataclass
class Entry:
    """One slot in a round: a system run in a mode, whose samples go to one or more cells."""

    keys: tuple[Key, ...]
    system: System
    mode: str = "sync"
    """``sync`` (``invoke``) or ``async`` (``ainvoke``)."""


def interleave(
    entries: Sequence[Entry],
    cells: dict[Key, Cell],
    *,
    n: int,
    rounds: int,
    warm_up_n: int,
    runner: asyncio.Runner | None = None,
    label: str = "",
    progress_every: int = 1,
) -> int:
    """Rounds of every entry in order (a, b, c, a, b, c, ...), round 0 a short discarded
    warm-up. A system that crashes or fails verification records the error in its cells and
    sits out the remaining rounds; the others go on. Past the part's soft deadline no new
    round starts (at least one is measured). Returns the measured rounds."""
    failed: dict[int, str] = {}
    settle()
    for entry in entries:
        for key in entry.keys:
            cells.setdefault(key, Cell())
    for round_no in range(rounds + 1):
        t_round = time.perf_counter()
        size = n if round_no else warm_up_n
        for entry in entries:
            if id(entry.system) in failed:
                for key in entry.keys:
                    cells[key].error = cells[key].error or failed[id(entry.system)]
                continue
            try:
                if entry.mode == "async":
                    assert runner is not None
                    seconds = runner.run(entry.system.arun(size))
                else:
                    seconds = entry.system.run(size)
            except Exception as exc:
                why = describe(exc)
                print(f"  {label} {entry.system.name} ({entry.mode}): {why}", file=sys.stderr)
                failed[id(entry.system)] = why
                for key in entry.keys:
                    cells[key].error = why
                continue
            if round_no:
                for key in entry.keys:
                    cells[key].samples.append(seconds * 1000 / size)
        if round_no % progress_every == 0 or round_no == rounds:
            what = "warm-up" if round_no == 0 else f"round {round_no}/{rounds}"
            print(f"  {label} {what}: {time.perf_counter() - t_round:.1f}s", file=sys.stderr)
        if round_no and round_no < rounds and out_of_time():
            print(f"  {label}: time budget spent after {round_no} rounds", file=sys.stderr)
            return round_no
    return rounds


def ratio(a: Cell | None, b: Cell | None, target: float | None = None) -> str:
    """``a/b`` as a table cell, with ``met``/``MISSED`` against ``target`` when given."""
    if a is None or b is None or not a.ok or not b.ok:
        return "n/a"
    r = a.median / b.median
    if target is None:
        return f"{r:.2f}"
    return f"{r:.2f} {'met' if r <= target else 'MISSED'}"


# --------------------------------------------------------------------------------------------
# The LangGraph baselines.
# --------------------------------------------------------------------------------------------


def build_create_agent(saver: BaseCheckpointSaver[Any], *, limit: int) -> System:
    """(b) ``langchain.agents.create_agent`` with the two run-limit middlewares."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import ModelCallLimitMiddleware, ToolCallLimitMiddleware

    graph = create_agent(
        ToolLoopChatModel(),
        [LC_TOOL],
        middleware=[
            ToolCallLimitMiddleware(run_limit=limit),
            ModelCallLimitMiddleware(run_limit=limit),
        ],
        checkpointer=saver,
    )
    return System(
        name="create_agent",
        graph=graph,
        make_input=lambda n: {"messages": [HumanMessage(content=QUESTION)]},
        check=messages_check,
    )


def build_bare(saver: BaseCheckpointSaver[Any], chat: BaseChatModel | None = None) -> System:
    """(c) A bare two-node loop: model node + ToolNode on MessagesState, no policy at all."""
    model = (chat or ToolLoopChatModel()).bind_tools([LC_TOOL])

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
        check=messages_check,
    )


def build_counter_loop(saver: BaseCheckpointSaver[Any]) -> System:
    """LangGraph's floor: two nodes bouncing a counter, no model, no messages, no policy.

    ``decide`` counts a "model call" and routes to ``execute`` while tool calls are left;
    ``execute`` calls the trivial tool's Python body. Both add one to the counter. So a run has
    the same supersteps as fencepost's (N+1 decides, N executes) and is verified the same way.
    """
    from typing import TypedDict

    class Counter(TypedDict):
        count: int
        more: bool

    def decide(state: Counter) -> dict[str, Any]:
        return {"count": state["count"] + 1, "more": TALLY.turn() is not None}

    def execute(state: Counter) -> dict[str, Any]:
        search_logs(f"status:5xx page:{state['count']}")
        return {"count": state["count"] + 1}

    async def adecide(state: Counter) -> dict[str, Any]:
        return decide(state)

    async def aexecute(state: Counter) -> dict[str, Any]:
        return execute(state)

    builder = StateGraph(Counter)
    builder.add_node("decide", RunnableCallable(decide, adecide, name="decide"))
    builder.add_node("execute", RunnableCallable(execute, aexecute, name="execute"))
    builder.add_edge(START, "decide")
    builder.add_conditional_edges("decide", lambda s: "execute" if s["more"] else END)
    builder.add_edge("execute", "decide")

    def check(out: Any, n: int) -> str | None:
        return None if out["count"] == 2 * n + 1 else f"counter ended at {out['count']}"

    return System(
        name="counter loop",
        graph=builder.compile(checkpointer=saver),
        make_input=lambda n: {"count": 0, "more": True},
        check=check,
    )


def build_channel_loop(
    saver: BaseCheckpointSaver[Any], channels: int, decide_writes: int, execute_writes: int
) -> System:
    """The empty two-node loop with fencepost's channel layout: ``channels`` integer channels,
    of which ``decide`` writes ``decide_writes`` and ``execute`` ``execute_writes`` per
    iteration (counter included), and a conditional edge after each node as fencepost has.
    What LangGraph's machinery costs for that many channels and writes, with no payload,
    no policy and no serialization beyond integers."""
    from typing import TypedDict

    names = ["count", "more", *(f"c{i}" for i in range(max(0, channels - 2)))]
    layout = TypedDict("layout", dict.fromkeys(names, int), total=False)  # type: ignore[misc]
    extra = names[2:]
    by_decide, by_execute = extra[: max(0, decide_writes - 2)], extra[max(0, decide_writes - 2) :]
    by_execute = by_execute[: max(0, execute_writes - 1)]

    def decide(state: Any) -> dict[str, Any]:
        out = {"count": state["count"] + 1, "more": int(TALLY.turn() is not None)}
        out.update(dict.fromkeys(by_decide, state["count"]))
        return out

    def execute(state: Any) -> dict[str, Any]:
        search_logs(f"status:5xx page:{state['count']}")
        out = {"count": state["count"] + 1}
        out.update(dict.fromkeys(by_execute, state["count"]))
        return out

    builder = StateGraph(layout)
    builder.add_node("decide", RunnableCallable(decide, name="decide"))
    builder.add_node("execute", RunnableCallable(execute, name="execute"))
    builder.add_edge(START, "decide")
    builder.add_conditional_edges("decide", lambda s: "execute" if s["more"] else END)
    builder.add_conditional_edges("execute", lambda s: "decide")

    def check(out: Any, n: int) -> str | None:
        return None if out["count"] == 2 * n + 1 else f"counter ended at {out['count']}"

    return System(
        name=f"{channels}-channel loop",
        graph=builder.compile(checkpointer=saver),
        make_input=lambda n: {"count": 0, "more": 1},
        check=check,
    )


def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def environment() -> str:
    packages = (
        "langgraph",
        "langgraph-checkpoint",
        "langchain",
        "langchain-core",
        "pydantic",
        "pydantic-ai-slim",
        "openai-agents",
    )
    return (
        f"Python {platform.python_version()} ({platform.machine()}), "
        + ", ".join(f"{p} {package_version(p)}" for p in packages)
        + f", {os.cpu_count()} CPUs, "
        f"LANGGRAPH_STRICT_MSGPACK={os.environ.get('LANGGRAPH_STRICT_MSGPACK', 'unset')}, "
        f"checkpoint serializer: {SERIALIZER_NOTE}"
    )
