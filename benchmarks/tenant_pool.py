"""100 concurrent runs on one tenant token pool sized for 30 (``python benchmarks/tenant_pool.py``).

Each run takes two model steps (a tool call, then the answer citing it) and its model reports
100 tokens a step, so a run costs 200 tokens and the tenant's pool holds 30 x 200 = 6,000. All
100 start at once (``ainvoke`` under ``asyncio.gather``, one process, ``InMemorySaver``), on an
``InMemoryLedger`` and on a ``SqliteLedger`` file. A step holds a bounded estimate (the input it
sends, counted, plus ``tokens_per_step=150``); a step refused only because other steps hold the
room waits for them (busy is not exhausted), runs under way first.

Reported: how many runs complete and how many end ``tokens_exhausted``, the pool's overshoot
(tokens charged beyond its limit: at most each in-flight step's reply beyond its estimate, here
0 since each report is under its hold), the p95 and max time a model step spent getting its
hold (the reservation plus any wait for room), and the wall time. A run whose step cannot be
held is not retried: it ends, and the pool keeps what the completed runs spent.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
import fencepost.graph.decide as decide_node
from fencepost.adapters import SqliteLedger

RUNS = 100 if not os.environ.get("FENCEPOST_BENCH_QUICK") else 40
FUNDED = 30 if RUNS == 100 else 12
TOKENS_PER_STEP = 100
POOL = FUNDED * 2 * TOKENS_PER_STEP
TENANT = "acme-pool"

_WAITS: list[float] = []
_hold_step = decide_node.hold_step


async def _timed_hold_step(*args: Any, **kwargs: Any) -> Any:
    """The decide node's step hold, timed: what a step spends getting room."""
    t0 = time.perf_counter()
    try:
        return await _hold_step(*args, **kwargs)
    finally:
        _WAITS.append(time.perf_counter() - t0)


decide_node.hold_step = _timed_hold_step  # type: ignore[assignment]


@fp.tool(effect="read", capability="logs:read")
def search_logs(query: str) -> dict[str, Any]:
    """Search the service logs."""
    return {"hits": [query]}


class Model:
    """A tool call, then the answer citing it; 100 tokens a step, 10 ms a call."""

    async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
        await asyncio.sleep(0.01)
        decision: Any
        if inp.observations:
            decision = fp.FinalProposal(
                answer=fp.AnswerPayload(text="ok", citations=(inp.observations[-1].call_id,))
            )
        else:
            decision = fp.ToolProposal(
                call_id="call-0001", tool_name="search_logs", arguments={"query": "q"}
            )
        return fp.Decided(decision=decision, input_tokens=50, output_tokens=50)


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) >= 2 else max(values, default=0)


async def _all(ledger: fp.Ledger) -> tuple[list[fp.AgentState], float]:
    ledger.open_account(TENANT, {"tokens": float(POOL)}, owner={"tenant": "acme"})
    graph = fp.create_agent(
        Model(), [search_logs], ledger=ledger, tokens_per_step=150, checkpointer=InMemorySaver()
    )
    ctx = fp.RunContext(
        tenant_id="acme",
        principal=fp.Principal(id="u-1", capabilities={"logs:read"}),
        budget_account=TENANT,
        deadline=fp.Deadline.after(120),
    )
    budget = fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=4)
    t0 = time.perf_counter()
    outs = await asyncio.gather(
        *(
            graph.ainvoke(
                fp.start("q", budget), {"configurable": {"thread_id": f"t-{n}"}}, context=ctx
            )
            for n in range(RUNS)
        )
    )
    return [fp.run_output(o) for o in outs], time.perf_counter() - t0


def row(name: str, ledger: fp.Ledger) -> str:
    _WAITS.clear()
    states, wall = asyncio.run(_all(ledger))
    done = sum(s.termination is fp.TerminationReason.COMPLETED for s in states)
    exhausted = sum(s.last_error_code == "tokens_exhausted" for s in states)
    other = RUNS - done - exhausted
    spent = ledger.balance(TENANT).held.get("tokens", 0.0)
    waits_ms = [w * 1000 for w in _WAITS]
    return (
        f"| {name} | {RUNS} | {POOL:,} ({FUNDED} runs) | {done} | {exhausted} | {other} | "
        f"{spent:,.0f} | {max(0.0, spent - POOL):,.0f} | {_p95(waits_ms):.1f} | "
        f"{max(waits_ms, default=0):.1f} | {wall:.2f} |"
    )


def main() -> None:
    print(
        f"# {RUNS} concurrent runs on a tenant token pool sized for {FUNDED}\n\n"
        "Two model steps a run, 100 tokens reported a step (200 a run), all started at once "
        "with ainvoke; `tokens_per_step=150`.\n"
    )
    print(
        "| ledger | runs | pool tokens | completed | tokens_exhausted | other ending | "
        "tokens charged | overshoot | p95 step hold ms | max step hold ms | wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(row("InMemoryLedger", fp.InMemoryLedger()))
    with tempfile.TemporaryDirectory() as tmp, SqliteLedger(Path(tmp) / "ledger.db") as durable:
        print(row("SqliteLedger (file)", durable))


if __name__ == "__main__":
    main()
