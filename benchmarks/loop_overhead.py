"""Loop overhead: fencepost vs ``create_agent`` with limit middleware vs a bare LangGraph loop.

Also the home of everything fencepost-specific the other parts share: the tool registry, the
decision models (the chat-model adapter around the fake chat model, and a minimal DecisionModel
with no LangChain in it), and the fencepost systems. Importing this module imports fencepost;
``bench.py`` treats a failure here as "fencepost rows skipped" and runs the rest.

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

A second table answers "how many supersteps per iteration": fencepost as built against the same
nodes with a pass-through ``gate`` node between decide and execute, i.e. what one more LangGraph
node boundary per iteration costs (sync ``invoke``, both savers).

Run it through ``bench.py`` (``make bench``, or ``bench.py --loop``): this module is one of its
parts and imports nothing of it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
from common import (
    FINAL_TEXT,
    LC_TOOL,
    QUESTION,
    TALLY,
    TOOL_NAME,
    VERIFIED,
    Cell,
    Entry,
    Key,
    System,
    ToolLoopChatModel,
    async_sqlite_saver,
    build_bare,
    build_create_agent,
    call_id,
    close_saver,
    describe,
    interleave,
    memory_saver,
    messages_check,
    ratio,
    search_logs,
    sqlite_saver,
    tool_args,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from pydantic import BaseModel, ConfigDict

import fencepost as fp

# --------------------------------------------------------------------------------------------
# The tool, as fencepost registers it.
# --------------------------------------------------------------------------------------------


class SearchArgs(BaseModel):
    """The trivial tool's arguments, strict as fencepost requires."""

    model_config = ConfigDict(extra="forbid", strict=True)
    query: str


def _fp_search(args: SearchArgs, ctx: Any) -> str:
    return search_logs(args.query)


REGISTRY = fp.ToolRegistry(
    [
        fp.ToolSpec(
            name=TOOL_NAME,
            description="Search the logs.",
            args_model=SearchArgs,
            effect=fp.Effect.READ,
            capability="logs:read",
            timeout_seconds=30,
            execute=_fp_search,
        )
    ]
)

RUN_CONTEXT = fp.RunContext(
    tenant_id="bench", principal=fp.Principal(id="bench-user", capabilities={"logs:read"})
)

# --------------------------------------------------------------------------------------------
# Decision models.
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
    def _render(obs: Any) -> tuple[AIMessage, ToolMessage]:
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

    def messages(self, input: Any) -> list[BaseMessage]:
        """The conversation the chat model is shown for ``input``."""
        messages: list[BaseMessage] = [HumanMessage(content=input.question)]
        for obs in input.observations:
            pair = self._rendered.get(obs.call_id)
            if pair is None:
                pair = self._rendered[obs.call_id] = self._render(obs)
            messages.extend(pair)
        return messages

    async def decide(self, input: Any, *, deadline: Any) -> Any:
        ai = await self._chat.ainvoke(self.messages(input))
        if ai.tool_calls:
            call = ai.tool_calls[0]
            return fp.ToolProposal(
                call_id=str(call["id"]), tool_name=call["name"], arguments=call["args"]
            )
        return fp.FinalProposal(answer=fp.AnswerPayload(text=str(ai.content)))


class BenchDecisionModel:
    """A minimal DecisionModel for LangGraph's-floor rows: no LangChain, no messages.

    One tool proposal per turn (from :data:`TALLY`), then a final answer: what is left of an
    iteration is fencepost's own machinery (state, gate, ledger, nodes, checkpoints). Its
    ``decide`` is a plain ``def``, as the floor loop's model node is: it does no I/O, so it runs
    where fencepost runs a sync model (a thread of the tenant's share), not on the model loop.
    """

    def decide(self, input: Any, *, deadline: Any) -> Any:
        i = TALLY.turn()
        if i is None:
            return fp.FinalProposal(answer=fp.AnswerPayload(text=FINAL_TEXT))
        return fp.ToolProposal(call_id=call_id(i), tool_name=TOOL_NAME, arguments=tool_args(i))


def _real_adapter() -> Callable[[BaseChatModel], Any] | None:
    try:
        from fencepost.adapters.chat_model import ChatModelDecider
    except ImportError:
        return None
    return ChatModelDecider


_CHAT_DECIDER: Callable[[BaseChatModel], Any] = BenchChatDecider
DECIDER_NOTE = "not chosen yet"


def make_decider(chat: BaseChatModel | None = None) -> Any:
    """fencepost's decision model around a chat model (the fake one by default): the real
    adapter when it works (see :func:`choose_decider`), else the benchmark's own."""
    return _CHAT_DECIDER(chat or ToolLoopChatModel())


def choose_decider() -> str:
    """Use the real ChatModelDecider if present and it completes a short run; say which."""
    global _CHAT_DECIDER, DECIDER_NOTE
    real = _real_adapter()
    if real is None:
        _CHAT_DECIDER = BenchChatDecider
        DECIDER_NOTE = (
            "the benchmark's own BenchChatDecider (fencepost.adapters.chat_model not found)"
        )
        return DECIDER_NOTE
    try:
        build_fencepost(memory_saver(), decider=real(ToolLoopChatModel())).run(3)
    except BaseException as exc:  # a broken adapter must not break the benchmark
        _CHAT_DECIDER = BenchChatDecider
        DECIDER_NOTE = (
            "the benchmark's own BenchChatDecider (fencepost.adapters.chat_model.ChatModelDecider "
            f"failed a 3-iteration smoke run: {describe(exc)})"
        )
        return DECIDER_NOTE
    finally:
        VERIFIED.pop("fencepost", None)
    _CHAT_DECIDER = real
    DECIDER_NOTE = "fencepost.adapters.chat_model.ChatModelDecider (the real adapter)"
    return DECIDER_NOTE


# --------------------------------------------------------------------------------------------
# fencepost systems.
# --------------------------------------------------------------------------------------------


def _fencepost_check(out: Any, n: int) -> str | None:
    state = fp.run_output(out)
    if state.termination is not fp.TerminationReason.COMPLETED or len(state.observations) != n:
        return f"ended {state.termination} with {len(state.observations)} observations"
    return None


def fencepost_input(n: int) -> Any:
    return fp.start(QUESTION, fp.RuntimeBudget(steps_remaining=n + 5, tool_calls_remaining=n + 5))


def fencepost_system(name: str, graph: Any, model: Any) -> System:
    return System(
        name=name,
        graph=graph,
        make_input=fencepost_input,
        check=_fencepost_check,
        kwargs={"context": RUN_CONTEXT},
        before_run=getattr(model, "reset", lambda: None),
    )


def build_fencepost(
    saver: BaseCheckpointSaver[Any] | None,
    *,
    decider: Any | None = None,
    name: str = "fencepost",
    **graph_kwargs: Any,
) -> System:
    """(a) fencepost's graph, driven by the chat model through a DecisionModel adapter (or by
    ``decider``)."""
    model = decider or make_decider()
    path = common.ASYNC_SQLITE_FILES.get(id(saver))
    if path is not None and "ledger" not in graph_kwargs:
        graph_kwargs["ledger"] = fp.SqliteLedger(str(path))
    graph = fp.build_agent_graph(REGISTRY, model, **graph_kwargs).compile(checkpointer=saver)
    return fencepost_system(name, graph, model)


def build_create_agent_fencepost(saver: BaseCheckpointSaver[Any], *, limit: int) -> System:
    """(d) ``langchain.agents.create_agent`` with ``fp.FencepostMiddleware`` as its one
    middleware, in place of the limit middlewares; its budget in the ledger (a) gets for the
    same saver: in memory beside ``InMemorySaver``, a SQLite ledger on the saver's file beside
    a SQLite saver."""
    from langchain.agents import create_agent

    from fencepost.adapters.default_ledger import durable_ledger

    path = common.ASYNC_SQLITE_FILES.get(id(saver))
    ledger = fp.SqliteLedger(str(path)) if path is not None else durable_ledger(saver)
    graph = create_agent(
        ToolLoopChatModel(),
        [LC_TOOL],
        middleware=fp.check_middleware(
            [
                fp.FencepostMiddleware(
                    REGISTRY,
                    budget=fp.RuntimeBudget(steps_remaining=limit, tool_calls_remaining=limit),
                    ledger=ledger,
                )
            ]
        ),
        checkpointer=saver,
    )
    return System(
        name="create_agent+fencepost",
        graph=graph,
        make_input=lambda n: {"messages": [HumanMessage(content=QUESTION)]},
        check=_middleware_check,
        kwargs={"context": RUN_CONTEXT},
    )


def _middleware_check(out: Any, n: int) -> str | None:
    """(d)'s run as the others': N tool messages and the final text, and it ended ``completed``."""
    problem = messages_check(out, n)
    if problem is None and out.get("termination") != "completed":
        return f"ended {out.get('termination')!r} ({out.get('last_error_code')!r})"
    return problem


def build_fencepost_floor(saver: BaseCheckpointSaver[Any]) -> System:
    """fencepost driven by :class:`BenchDecisionModel` (no LangChain messages)."""
    system = build_fencepost(saver, decider=BenchDecisionModel(), name="fencepost (scripted)")
    return system


@contextlib.contextmanager
def _called_inline() -> Any:
    """The sync graph's model and tool calls made on the calling thread, for as long as the
    block runs: no hop to the shared model loop, no tool worker thread, no deadline enforced."""
    from fencepost.graph.containment.model import ModelRun
    from fencepost.graph.containment.tools import ToolRun
    from fencepost.graph.node_io import SyncIO

    async def run_model(self: Any, make: Any, timeout: float) -> Any:
        try:
            return ModelRun(finished=True, value=await make())
        except Exception as exc:
            return ModelRun(finished=True, error=exc)

    async def run_model_on_thread(self: Any, call: Any, timeout: float, **kw: Any) -> Any:
        try:
            return ModelRun(finished=True, value=call())
        except Exception as exc:
            return ModelRun(finished=True, error=exc)

    async def run_tool(self: Any, spec: Any, args: Any, ctx: Any, **kw: Any) -> Any:
        try:
            return ToolRun(value=spec.execute(args, ctx))
        except Exception:
            return ToolRun(error=fp.ErrorCode.INTERNAL_ERROR)

    saved = SyncIO.run_model, SyncIO.run_model_on_thread, SyncIO.run_tool
    SyncIO.run_model, SyncIO.run_model_on_thread, SyncIO.run_tool = (  # type: ignore[method-assign]
        run_model,
        run_model_on_thread,
        run_tool,
    )
    try:
        yield
    finally:
        SyncIO.run_model, SyncIO.run_model_on_thread, SyncIO.run_tool = saved  # type: ignore[method-assign]


class _Uncontained:
    """A compiled fencepost graph whose ``invoke`` runs inside :func:`_called_inline`."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.checkpointer = graph.checkpointer

    def invoke(self, *args: Any, **kwargs: Any) -> Any:
        with _called_inline():
            return self.graph.invoke(*args, **kwargs)


def build_fencepost_uncontained(saver: BaseCheckpointSaver[Any]) -> System:
    """fencepost driven by :class:`BenchDecisionModel`, its model and tool called on the calling
    thread (sync ``invoke`` only): what the containment hops cost. A what-if, never a
    configuration fencepost offers: a model or tool that blocks or ignores its deadline would
    hang the run, and a ``SystemExit`` from one would escape it. Built from graph internals
    (``SyncIO.run_model``/``run_tool``): when they move, the row is skipped and says why."""
    from fencepost.graph.node_io import SyncIO

    for name in ("run_model", "run_model_on_thread", "run_tool"):
        if name not in vars(SyncIO):
            raise RuntimeError(f"fencepost.graph.node_io.SyncIO has no {name}")
    system = build_fencepost(saver, decider=BenchDecisionModel(), name="fencepost (uncontained)")
    system.graph = _Uncontained(system.graph)
    return system


def channel_layout() -> tuple[int, int, int]:
    """fencepost's state channels, and how many of them ``decide`` and ``execute`` write in an
    iteration of the loop (counted from the updates of a 3-iteration run, its middle one)."""
    from langgraph.checkpoint.memory import InMemorySaver

    system = build_fencepost_floor(InMemorySaver())
    system.before_run()
    TALLY.reset(3)
    config = {"configurable": {"thread_id": "layout"}}
    written: dict[str, list[int]] = {"decide": [], "execute": []}
    for chunk in system.graph.stream(
        system.make_input(3), config, stream_mode="updates", **system.kwargs
    ):
        for node, update in chunk.items():
            if node in written:
                written[node].append(len(update or {}))
    if len(written["decide"]) < 3 or len(written["execute"]) < 2:
        raise RuntimeError(f"unexpected supersteps in a 3-iteration run: {written}")
    return len(system.graph.builder.channels), written["decide"][1], written["execute"][1]


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
    So an iteration is decide, gate, execute: 3 supersteps instead of 2. Built from graph
    internals: when they move, this variant is skipped and the report says why.
    """
    from langgraph._internal._runnable import RunnableCallable
    from langgraph.graph import END, START, StateGraph

    from fencepost.graph.context import RunContext
    from fencepost.graph.routing import (
        route_after_approve,
        route_after_decide,
        route_after_execute,
        route_start,
    )
    from fencepost.graph.state import GraphState, InputState

    model = make_decider()
    base = fp.build_agent_graph(REGISTRY, model)
    if "gate" in base.nodes or set(base.nodes) != {"decide", "approve", "execute", "terminal"}:
        raise RuntimeError(f"the graph's nodes changed ({sorted(base.nodes)})")
    variant: StateGraph[Any, Any, Any, Any] = StateGraph(
        GraphState, context_schema=RunContext, input_schema=InputState
    )
    for node_name, spec in base.nodes.items():
        variant.add_node(node_name, spec.runnable)
    variant.add_node("gate", RunnableCallable(_gate, _agate, name="gate"))
    variant.add_conditional_edges(START, route_start, ["decide", "approve", "execute", "terminal"])
    variant.add_edge("decide", "gate")
    variant.add_conditional_edges(
        "gate", route_after_decide, ["approve", "execute", "decide", "terminal"]
    )
    variant.add_conditional_edges("approve", route_after_approve, ["execute", "decide", "terminal"])
    variant.add_conditional_edges("execute", route_after_execute, ["decide", "terminal"])
    variant.add_edge("terminal", END)
    return fencepost_system("fencepost+gate", variant.compile(checkpointer=saver), model)


# --------------------------------------------------------------------------------------------
# The loop part: its two tables.
# --------------------------------------------------------------------------------------------

SYSTEMS = ("fencepost", "create_agent", "bare", "create_agent+fencepost")
MIDDLEWARE_ROWS = frozenset({"fencepost", "create_agent", "create_agent+fencepost"})
"""``bench.py --loop --middleware-only``: (d) beside (a) and (b), nothing else."""
SAVER_LABELS = {
    ("memory", "sync"): "InMemorySaver",
    ("memory", "async"): "InMemorySaver",
    ("sqlite", "sync"): "SqliteSaver (file)",
    ("sqlite", "async"): "AsyncSqliteSaver (file)",
}


def run_loop(
    n: int, rounds: int, with_async: bool, tmp: Path, only: frozenset[str] | None = None
) -> tuple[dict[Key, Cell], dict[str, int], str | None, int]:
    """Interleaved rounds of the three systems (and the +gate variant), both savers, sync and
    async; with ``only``, just the systems it names (and no +gate variant). Returns the cells,
    checkpoints per run, and why the +gate variant is missing."""
    import asyncio

    def kept(systems: list[System]) -> list[System]:
        return [s for s in systems if only is None or s.name in only]

    cells: dict[Key, Cell] = {}
    gate_skip: str | None = None
    sync: dict[str, list[System]] = {}
    for saver_name in ("memory", "sqlite"):

        def saver(tag: str, saver_name: str = saver_name) -> Any:
            if saver_name == "memory":
                return memory_saver()
            return sqlite_saver(tmp / f"loop-sync-{tag}.db")

        systems = [build_fencepost(saver("fencepost"))]
        if only is None:
            try:
                systems.append(build_fencepost_gate(saver("fencepost-gate")))
            except Exception as exc:
                gate_skip = describe(exc)
        else:
            gate_skip = "not run (--middleware-only)"
        systems += [
            build_create_agent(saver("create_agent"), limit=n + 5),
            build_bare(saver("bare")),
            build_create_agent_fencepost(saver("create_agent-fp"), limit=n + 5),
        ]
        sync[saver_name] = kept(systems)
    entries: list[Entry] = []
    with asyncio.Runner() as runner:
        asyncs: dict[str, list[System]] = {}
        if with_async:

            async def make_async() -> dict[str, list[System]]:
                return {
                    "memory": [
                        build_fencepost(memory_saver()),
                        build_create_agent(memory_saver(), limit=n + 5),
                        build_bare(memory_saver()),
                        build_create_agent_fencepost(memory_saver(), limit=n + 5),
                    ],
                    "sqlite": [
                        build_fencepost(await async_sqlite_saver(tmp / "loop-async-fp.db")),
                        build_create_agent(
                            await async_sqlite_saver(tmp / "loop-async-ca.db"), limit=n + 5
                        ),
                        build_bare(await async_sqlite_saver(tmp / "loop-async-bare.db")),
                        build_create_agent_fencepost(
                            await async_sqlite_saver(tmp / "loop-async-ca-fp.db"), limit=n + 5
                        ),
                    ],
                }

            asyncs = {k: kept(v) for k, v in runner.run(make_async()).items()}
        for saver_name in ("memory", "sqlite"):
            pairs = [s for s in sync[saver_name] if s.name.startswith("fencepost")]
            for system in sync[saver_name]:
                keys: tuple[Key, ...] = ((saver_name, "sync", system.name),)
                if system in pairs:
                    keys += ((saver_name, "pair", system.name),)
                entries.append(Entry(keys, system))
            if len(pairs) == 2:
                # (a) and (a') once more in reverse order (a, a', ..., a', a): twice the samples
                # for the node-boundary table, and run order cancels out of it.
                entries += [Entry(((saver_name, "pair", s.name),), s) for s in reversed(pairs)]
            for system in asyncs.get(saver_name, []):
                entries.append(Entry(((saver_name, "async", system.name),), system, "async"))
        rounds = interleave(
            entries, cells, n=n, rounds=rounds, warm_up_n=min(n, 40), runner=runner, label="loop"
        )
        checkpoints: dict[str, int] = {}
        for system in sync["memory"]:
            if system.name.startswith("fencepost") and system.last_config is not None:
                with contextlib.suppress(Exception):
                    checkpoints[system.name] = sum(
                        1 for _ in system.graph.checkpointer.list(system.last_config)
                    )

        async def close_all() -> None:
            for systems in (*sync.values(), *asyncs.values()):
                for system in systems:
                    await close_saver(system.graph.checkpointer)

        runner.run(close_all())
    return cells, checkpoints, gate_skip, rounds


def loop_table(cells: dict[Key, Cell], n: int, rounds: int) -> str:
    lines = [
        f"## Loop overhead: {n} tool iterations, median ms per iteration over {rounds} "
        "interleaved rounds (after 1 warm-up)",
        "",
        f"fencepost's decision model: {DECIDER_NOTE}. Every system: the same fake chat model "
        "(one tool call per turn), the same trivial tool, the same saver kind, the same "
        "serializer. Tool calls and model calls were counted and verified for every run.",
        "",
        "(d) is `create_agent` with `fp.FencepostMiddleware` in place of the two limit "
        "middlewares (its budget in the ledger (a) gets for the same saver: in memory, or "
        "SQLite on the saver's file), verified as the others and ended `completed`.",
        "",
        "| saver | mode | (a) fencepost | (b) create_agent + limits | (c) bare loop "
        "| (d) create_agent + fp.FencepostMiddleware "
        "| a/b (target <= 0.75) | a/c (target <= 1.3) | d/b |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for saver_name in ("memory", "sqlite"):
        for mode in ("sync", "async"):
            a, b, c, d = (cells.get((saver_name, mode, s)) for s in SYSTEMS)
            if a is None and b is None and c is None and d is None:
                continue
            lines.append(
                f"| {SAVER_LABELS[saver_name, mode]} | {'invoke' if mode == 'sync' else 'ainvoke'} "
                f"| {a.fmt() if a else 'n/a'} | {b.fmt() if b else 'n/a'} "
                f"| {c.fmt() if c else 'n/a'} | {d.fmt() if d else 'n/a'} "
                f"| {ratio(a, b, 0.75)} | {ratio(a, c, 1.3)} | {ratio(d, b, None)} |"
            )
    lines += [
        "",
        "(± is half the spread between the fastest and slowest measured round.) Every run was "
        "verified: N tool calls counted in the tool body, N+1 model calls, and the final answer "
        "(fencepost: `completed` with N observations). A run that did not is an error, shown "
        "in its cell instead of a time.",
        "",
    ]
    return "\n".join(lines)


def gate_table(
    cells: dict[Key, Cell], n: int, rounds: int, checkpoints: dict[str, int], skip: str | None
) -> str:
    """How much one more node boundary per iteration costs: fencepost as is vs + ``gate``."""
    lines = ["### Node boundaries: 2 supersteps per iteration vs 3", ""]
    if skip is not None:
        return "\n".join([*lines, f"skipped: the +gate variant could not be built: {skip}", ""])
    lines += [
        "The design question: should the policy gate be its own LangGraph node? (a) is fencepost "
        "as built (the gate runs inside `decide`; an iteration is decide, execute). (a') is the "
        "same graph with a pass-through `gate` node between `decide` and `execute` that returns "
        "`{}` and routes on with `route_after_decide`: the same nodes (built by "
        "`build_agent_graph`), one more superstep and checkpoint per iteration, and no gate "
        "work of its own, so the difference is LangGraph machinery alone. Sync `invoke`, "
        f"{n} tool iterations, median of {2 * rounds} runs each: every round ran (a) and (a') "
        "with the table above, then again in reverse order (so run order cancels out); every "
        "run verified the same way (N tool calls, N+1 model calls, `completed`).",
        "",
        "| saver | (a) 2 supersteps/iter, ms/iter | (a') 3 supersteps/iter, ms/iter "
        "| a'/a | extra ms/iter (median of paired runs) |",
        "|---|---:|---:|---:|---:|",
    ]
    import statistics

    for saver_name, saver_label in (("memory", "InMemorySaver"), ("sqlite", "SqliteSaver (file)")):
        a = cells.get((saver_name, "pair", "fencepost"))
        g = cells.get((saver_name, "pair", "fencepost+gate"))
        if a is None or g is None:
            continue
        if not (a.ok and g.ok) or len(a.samples) != len(g.samples):
            lines.append(f"| {saver_label} | {a.fmt()} | {g.fmt()} | n/a | n/a |")
            continue
        # Each (a) run is paired with the (a') run next to it, so drift between rounds cancels.
        extra = statistics.median(x - y for x, y in zip(g.samples, a.samples, strict=True))
        lines.append(
            f"| {saver_label} | {a.fmt()} | {g.fmt()} | {g.median / a.median:.2f} | {extra:+.2f} |"
        )
    a_ck, g_ck = checkpoints.get("fencepost"), checkpoints.get("fencepost+gate")
    if a_ck is not None and g_ck is not None:
        lines += [
            "",
            f"Checkpoints written by one {n}-iteration run (InMemorySaver, one per superstep): "
            f"(a) {a_ck}, (a') {g_ck}, i.e. {(g_ck - a_ck) / n:.2f} more per iteration.",
        ]
    lines.append("")
    return "\n".join(lines)


def loop_part(n: int, rounds: int, with_async: bool, middleware_only: bool = False) -> str:
    """The loop part of ``make bench``: both tables, as markdown; with ``middleware_only``,
    the loop table's (a), (b) and (d) columns alone."""
    t0 = time.perf_counter()
    only = MIDDLEWARE_ROWS if middleware_only else None
    with tempfile.TemporaryDirectory(prefix="fencepost-bench-loop-") as tmp:
        cells, checkpoints, gate_skip, rounds = run_loop(n, rounds, with_async, Path(tmp), only)
    print(f"  loop: {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    if middleware_only:
        return loop_table(cells, n, rounds)
    return (
        loop_table(cells, n, rounds) + "\n" + gate_table(cells, n, rounds, checkpoints, gate_skip)
    )
