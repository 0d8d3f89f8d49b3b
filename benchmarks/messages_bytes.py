"""What the ``messages`` view costs in checkpoint bytes, on one long run (issue 11 item 2).

One run of N tool steps (a read tool, distinct arguments each step, then an answer) on a SQLite
checkpointer, three ways:

- ``no messages``: the view switched off (nodes write no messages);
- ``delta``: the shipped channel, a DeltaChannel over ``add_messages`` (a step stores the
  messages it wrote);
- ``binop``: a plain ``Annotated[list, add_messages]`` channel (LangGraph's default), which stores
  the whole conversation again at every step that changes it.

Reported: total bytes of the thread's checkpoints and writes, bytes per iteration over the first
and the last 10% of the run (flat = a step's cost does not grow with the run's length), and the
run's wall time (median). Measured (200 steps, 5 rounds, 2-core machine at load ~4.8,
2026-11-30):

| messages channel | messages | total KB | B/iter first 10% | B/iter last 10% | run s |
|---|---:|---:|---:|---:|---:|
| no messages | 0 | 1799 | 8913 | 8940 | 0.89 |
| delta | 402 | 1960 | 9736 | 9745 | 1.05 |
| binop | 402 | 26869 | 22823 | 249453 | 1.53 |

The delta channel adds ~9% bytes and stays flat per step; the plain channel grows with the run
(quadratic in total: 14x the bytes at 200 steps). The view's CPU cost is ~0.8 ms per step here:
deriving the messages (~90 us per node) and ``add_messages`` itself, which indexes the whole
list on every write (linear in the conversation's length).

    .venv/bin/python benchmarks/messages_bytes.py [N]
"""

from __future__ import annotations

import sqlite3
import statistics
import sys
import tempfile
import time
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any
from unittest import mock

from langchain_core.messages import AnyMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fencepost as fp  # noqa: E402
from fencepost.adapters.scripted import ScriptedDecisionModel  # noqa: E402
from fencepost.graph import builder, node_io, state  # noqa: E402
from fencepost.policy.tool_decorator import tool  # noqa: E402


@tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=5)
def search_logs(query: str) -> dict[str, Any]:
    """Search logs."""
    return {"query": query, "hits": [{"id": "log-1", "line": "500 /checkout after deploy 42"}]}


def script(n: int) -> list[Any]:
    steps: list[Any] = [
        fp.ToolProposal(
            call_id=f"call-{i:05d}", tool_name="search_logs", arguments={"query": f"q{i}"}
        )
        for i in range(1, n + 1)
    ]
    steps.append(fp.FinalProposal(answer=fp.AnswerPayload(text="deploy 42", citations=())))
    return steps


def _with_messages_channel(channel: Any) -> tuple[Any, Any]:
    hints = typing.get_type_hints(state.GraphState, include_extras=True)
    hints["messages"] = Annotated[list[AnyMessage], channel]
    graph_state = TypedDict("GraphState", hints, total=False)  # type: ignore[operator]
    # Functional syntax: the channel is a value chosen at run time, not a name to resolve later.
    input_state = TypedDict(  # type: ignore[operator]  # noqa: UP013
        "InputState",
        {"request": state.StartRequest, "messages": Annotated[list[AnyMessage], channel]},
        total=False,
    )
    return graph_state, input_state


@contextmanager
def variant(name: str) -> Iterator[None]:
    if name == "delta":
        yield
        return
    if name == "no messages":
        with mock.patch.object(node_io, "with_messages", lambda values, update: update):
            yield
        return
    graph_state, input_state = _with_messages_channel(add_messages)
    with (
        mock.patch.object(builder, "GraphState", graph_state),
        mock.patch.object(builder, "InputState", input_state),
    ):
        yield


def step_bytes(db: Path) -> dict[int, int]:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            """
            SELECT json_extract(CAST(c.metadata AS TEXT), '$.step'),
                   length(c.checkpoint) + length(c.metadata)
                   + coalesce((SELECT sum(length(w.value)) FROM writes w
                               WHERE w.thread_id = c.thread_id
                                 AND w.checkpoint_ns = c.checkpoint_ns
                                 AND w.checkpoint_id = c.checkpoint_id), 0)
            FROM checkpoints c WHERE c.checkpoint_ns = ''
            """
        ).fetchall()
    finally:
        conn.close()
    out: dict[int, int] = {}
    for step, size in rows:
        out[int(step)] = out.get(int(step), 0) + int(size)
    return out


def measure(name: str, n: int, workdir: Path) -> tuple[int, float, float, int, float]:
    db = workdir / f"{name.replace(' ', '-')}.db"
    with variant(name), SqliteSaver.from_conn_string(str(db)) as saver:
        graph = fp.build_agent_graph(
            fp.ToolRegistry([search_logs]), ScriptedDecisionModel(script(n)), repeat_limit=n + 1
        ).compile(checkpointer=saver)
        ctx = fp.RunContext(
            tenant_id="acme", principal=fp.Principal(id="u", capabilities={"logs:read"})
        )
        began = time.perf_counter()
        out = graph.invoke(
            fp.start("q", fp.RuntimeBudget(steps_remaining=n + 2, tool_calls_remaining=n)),
            {"configurable": {"thread_id": "t"}, "recursion_limit": 4 * n + 20},
            context=ctx,
        )
        seconds = time.perf_counter() - began
    result = fp.run_output(out)
    assert result.termination is fp.TerminationReason.COMPLETED, result.termination
    assert len(result.observations) == n
    per_step = step_bytes(db)
    tenth = max(1, n // 10)
    # Iteration i (decide + execute) is supersteps 2i-1 .. 2i.
    first = sum(v for s, v in per_step.items() if 1 <= s <= 2 * tenth) / tenth
    last = sum(v for s, v in per_step.items() if 2 * (n - tenth) < s <= 2 * n) / tenth
    return sum(per_step.values()), first, last, len(out.get("messages", [])), seconds


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    names = ("no messages", "delta", "binop")
    print(f"one run of {n} tool steps, SQLite checkpoints (fencepost serializer), median of")
    print(f"{rounds} rounds (variants interleaved)\n")
    results: dict[str, list[tuple[int, float, float, int, float]]] = {k: [] for k in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name in names:
                workdir = Path(tmp) / f"{r}"
                workdir.mkdir(exist_ok=True)
                results[name].append(measure(name, n, workdir))
    print("| messages channel | messages | total KB | B/iter first 10% | B/iter last 10% | run s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        total, first, last, count, _ = results[name][0]
        seconds = statistics.median(r[4] for r in results[name])
        print(
            f"| {name} | {count} | {total / 1024:.0f} | {first:.0f} | {last:.0f} | {seconds:.2f} |"
        )


if __name__ == "__main__":
    main()
