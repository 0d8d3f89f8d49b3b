"""State a caller can write cannot raise a run's budget (nor hide its final turn) or run a write
twice; cancel from another thread stops a run before its next tool. (Reopening a finished run:
invariant 1; rebinding a run to another identity:
``tests/isolation/test_identity_bound_to_the_thread.py``.)

Each test takes the seat of a hostile caller holding the thread's config: it can send any
``Command(update=..., resume=...)`` or ``update_state``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from langgraph.types import Command
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.graph.state import has_run
from tests.graph.kit import (
    ABSTAIN,
    budget,
    call,
    context,
    drive_editing,
    harness,
    thread,
)


def _state(h: Any, config: dict[str, Any]) -> fp.AgentState:
    return fp.run_output(h.graph.get_state(config).values)


def test_raising_the_budget_in_state_does_not_raise_the_limit() -> None:
    script = [call(n=i, query=f"q{i}") for i in range(1, 12)]
    h = harness(script)
    config, ctx = thread(), context()
    h.graph.invoke(
        fp.start("q", budget(steps=20, tools=2)), config, context=ctx, interrupt_before=["execute"]
    )
    generous = fp.RuntimeBudget(steps_remaining=50, tool_calls_remaining=50)
    h.graph.update_state(config, {"run": {"budget": generous}}, as_node="decide")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert h.calls.count("search_logs") == 2
    assert state.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert state.budget.tool_calls_used == 2


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    note: str


def test_two_simultaneous_approvals_run_a_paused_write_once() -> None:
    entered, release = threading.Event(), threading.Event()
    effects: list[str] = []

    def slow_write(args: NoteArgs, ctx: fp.ToolContext) -> dict[str, bool]:
        effects.append(ctx.idempotency_key)
        entered.set()
        release.wait(5)
        return {"saved": True}

    spec = fp.ToolSpec(
        name="slow_write",
        description="Save a note, slowly.",
        args_model=NoteArgs,
        effect=fp.Effect.WRITE,
        capability="notes:write",
        timeout_seconds=10,
        execute=slow_write,
    )
    h = harness(
        [call("slow_write", 1, note="hi"), ABSTAIN, ABSTAIN],
        approval="interrupt",
        registry=fp.ToolRegistry([spec]),
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)

    def approve() -> None:
        h.graph.invoke(Command(resume="approve"), config, context=ctx)

    first = threading.Thread(target=approve)
    first.start()
    assert entered.wait(30)
    second = threading.Thread(target=approve)
    second.start()
    second.join(10)
    release.set()
    first.join(10)
    assert effects == ["call-0001"]


class QueryArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    query: str


def test_cancel_from_another_thread_stops_the_run_before_its_next_tool() -> None:
    started = threading.Event()
    ran: list[str] = []

    def slow_search(args: QueryArgs, ctx: fp.ToolContext) -> dict[str, int]:
        ran.append(args.query)
        started.set()
        time.sleep(0.05)
        return {"hits": len(ran)}

    spec = fp.ToolSpec(
        name="search_logs",
        description="Search logs, slowly.",
        args_model=QueryArgs,
        effect=fp.Effect.READ,
        capability="logs:read",
        timeout_seconds=5,
        execute=slow_search,
    )
    script = [call(n=i, query=f"q{i}") for i in range(1, 30)]
    h = harness(script, registry=fp.ToolRegistry([spec]))
    config, ctx = thread(), context()

    def run() -> None:
        # cancel finds the run through the thread's checkpoints, which the default durability
        # saves in the background: on a busy machine they may lag the tool
        h.graph.invoke(
            fp.start("q", budget(steps=40, tools=40)), config, context=ctx, durability="sync"
        )

    runner = threading.Thread(target=run)
    runner.start()
    assert started.wait(30)
    # LangGraph saves checkpoints in the background: until the first one lands, the thread shows
    # no run and cancel finds nothing to cancel (it returns None, see its docstring).
    deadline = time.monotonic() + 30
    while not has_run(h.graph.get_state(config).values) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert fp.cancel(h.graph, config, context=ctx) is not None
    ran_at_cancel = len(ran)
    runner.join(60)
    assert not runner.is_alive()
    # At most the tool already running when the cancel landed finishes; none starts after it.
    assert len(ran) <= ran_at_cancel + 1
    assert _state(h, config).termination is fp.TerminationReason.CANCELLED


def test_raising_the_step_budget_in_state_does_not_hide_the_final_turn() -> None:
    script = [call(n=i, query=f"q{i}") for i in range(1, 10)]
    h = harness(script)
    config, ctx = thread(), context()
    h.graph.invoke(
        fp.start("q", budget(steps=3, tools=8)), config, context=ctx, interrupt_after=["execute"]
    )
    generous = fp.RuntimeBudget(steps_remaining=50, tool_calls_remaining=50)
    state = drive_editing(h, config, ctx, lambda s: {"run": {"budget": generous}})
    assert [inp.final_turn for inp in h.model.inputs][-1] is True
    assert h.calls.count("search_logs") == 2
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
