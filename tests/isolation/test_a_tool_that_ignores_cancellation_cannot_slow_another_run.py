"""A tool that ignores cancellation is abandoned at its deadline, and then cannot slow another
run on the loop it ran on, nor hold that loop's shutdown (DESIGN, "Isolation: runs, tenants,
callers").

An async body runs on its caller's loop (where its clients live), and a task cannot be moved to
another loop: a body that swallows its ``CancelledError`` would go on running there for good. So
a body still running once its cancellation's grace is over is closed (``GeneratorExit`` at its
await) and never stepped again. Each scenario runs its own ``asyncio.run`` under ``finishes``, so
a loop that would never shut down fails the test instead of hanging the suite; the hostile
bodies stop for good when the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fencepost as fp
from fencepost.graph.containment import leash
from fencepost.graph.containment.model import run_model
from fencepost.graph.containment.tools import ToolRun, run_tool
from fencepost.policy import Deadline, ErrorCode, ToolContext
from tests.graph.kit import Calls, call, context, final_citing_last, harness, make_registry, thread
from tests.graph.test_tool_isolation import NoArgs, finishes, spec

A = ToolContext(
    run_id="run-a", tenant_id="tenant-a", principal_id="u-1", deadline=Deadline.after(600)
)


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    """Set when a scenario is over (or the test ends): the one thing the hostile bodies obey."""
    event = threading.Event()
    yield event
    event.set()


def swallows_cancellation(
    stop: threading.Event, steps: list[float], *, hold_loop: float = 0.0
) -> Callable[..., Any]:
    """A body that swallows every cancellation, and (``hold_loop``) holds its loop each step."""

    async def body(_: NoArgs, __: ToolContext) -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)
            steps.append(time.monotonic())
            time.sleep(hold_loop)  # work that holds the loop, as a parser or a sync client does

    return body


def test_fifty_bodies_left_behind_do_not_slow_another_run_on_their_loop(
    stop: threading.Event,
) -> None:
    steps: list[float] = []
    stubborn = spec(swallows_cancellation(stop, steps, hold_loop=0.01))
    calls = Calls()
    script: list[Any] = [call(n=n) for n in range(1, 6)] + [final_citing_last]
    h = harness(script, registry=make_registry(calls), calls=calls)

    async def scenario() -> tuple[list[ToolRun], fp.AgentState, int]:
        # Tenant A's fifty calls, each left behind at its 50 ms; then tenant B's 5-call run
        # on the same loop (about 30 ms alone). Its deadline is generous, as a busy machine
        # runs it late: that no step of a body left behind ran meanwhile is what is judged.
        left = await asyncio.gather(
            *(run_tool(stubborn, NoArgs(), A, timeout_seconds=0.05) for _ in range(50))
        )
        before = len(steps)
        out = await h.graph.ainvoke(
            fp.start(
                "why is checkout failing?",
                fp.RuntimeBudget(steps_remaining=8, tool_calls_remaining=6),
            ),
            thread(),
            context=context(tenant="tenant-b", seconds=60),
        )
        later = len(steps) - before
        stop.set()  # the shutdown is another test's: here only B's run is judged
        return list(left), fp.run_output(out), later

    left, state, later_steps = finishes(lambda: asyncio.run(scenario()), within=120)
    assert left == [ToolRun(error=ErrorCode.TIMEOUT, abandoned=True, cut_off=True)] * 50
    assert state.termination is fp.TerminationReason.COMPLETED
    assert calls.count("search_logs") == 5
    assert later_steps == 0  # not one step of a body left behind ran during B's run


def test_a_loop_with_a_body_left_behind_still_shuts_down(stop: threading.Event) -> None:
    steps: list[float] = []
    stubborn = spec(swallows_cancellation(stop, steps))

    async def main() -> ToolRun:
        return await run_tool(stubborn, NoArgs(), A, timeout_seconds=0.05)

    # asyncio.run cancels what is left on its loop and waits for it: a body that swallows
    # every cancellation would hold it forever.
    result = finishes(lambda: asyncio.run(main()), within=30)
    assert result == ToolRun(error=ErrorCode.TIMEOUT, abandoned=True, cut_off=True)


def test_a_body_left_behind_is_closed_and_runs_no_further_step(stop: threading.Event) -> None:
    steps: list[float] = []
    closed: list[str] = []

    async def stubborn(_: NoArgs, __: ToolContext) -> None:
        try:
            while not stop.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.01)
                steps.append(time.monotonic())
        finally:
            closed.append("finally ran")  # its clean-up still runs when it is closed

    async def scenario() -> tuple[ToolRun, int, int]:
        result = await run_tool(spec(stubborn), NoArgs(), A, timeout_seconds=0.05)
        at_return = len(steps)
        await asyncio.sleep(0.2)  # twenty of its steps, were it still stepped
        later = len(steps)
        stop.set()
        return result, at_return, later

    result, at_return, later = finishes(lambda: asyncio.run(scenario()), within=30)
    assert result == ToolRun(error=ErrorCode.TIMEOUT, abandoned=True, cut_off=True)
    assert later == at_return
    assert closed == ["finally ran"]


def test_a_body_that_ignores_even_its_closing_is_never_stepped_again(
    stop: threading.Event,
) -> None:
    steps: list[float] = []

    async def stubborn(_: NoArgs, __: ToolContext) -> None:
        while not stop.is_set():
            with contextlib.suppress(BaseException):
                await asyncio.sleep(0.01)
            steps.append(time.monotonic())

    async def scenario() -> tuple[ToolRun, int, int]:
        result = await run_tool(spec(stubborn), NoArgs(), A, timeout_seconds=0.05)
        at_return = len(steps)
        await asyncio.sleep(0.2)
        later = len(steps)
        stop.set()
        return result, at_return, later

    earlier = set(leash._zombies)
    result, at_return, later = finishes(lambda: asyncio.run(scenario()), within=30)
    assert result == ToolRun(error=ErrorCode.TIMEOUT, abandoned=True, cut_off=True)
    assert later <= at_return + 1  # at most the one step in which it was told to close
    # Kept suspended where it awaited, so nothing closes it again; the test ends it (``stop``
    # is set) rather than leave the interpreter to close it at exit.
    for zombie in [z for z in leash._zombies if z not in earlier]:
        leash._zombies.remove(zombie)
        zombie.close()


def test_a_model_left_behind_is_closed_and_runs_no_further_step(stop: threading.Event) -> None:
    steps: list[float] = []

    async def stubborn_model() -> str:
        while not stop.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)
            steps.append(time.monotonic())
        return "late"

    async def scenario() -> tuple[bool, int, int]:
        run = await run_model(stubborn_model, 0.05)
        await asyncio.sleep(0.05)  # its cancellation's grace
        at_return = len(steps)
        await asyncio.sleep(0.2)
        later = len(steps)
        stop.set()
        return run.finished, at_return, later

    finished, at_return, later = finishes(lambda: asyncio.run(scenario()), within=30)
    assert not finished
    assert later == at_return
