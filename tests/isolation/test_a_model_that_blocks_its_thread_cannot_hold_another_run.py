"""A model that blocks its thread inside ``async def`` cannot hold another run's model step.

Every sync graph's model call runs on the process's one shared model loop
(``graph/containment/shared_loop.py``); one that blocks that loop's thread would keep every other
run's model unasked. A call the loop leaves unstarted for ``STALL_SECONDS`` goes to a fresh loop
that replaces the stalled one, which ends what it holds and closes.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import fencepost as fp
from fencepost.graph.containment import model
from fencepost.graph.containment.model import ModelRun, run_model_blocking
from fencepost.graph.containment.shared_loop import STALL_SECONDS, replace_stalled, shared_loop
from tests.graph.kit import context, thread


def test_a_model_that_blocks_its_thread_never_holds_another_runs_model_step() -> None:
    """DESIGN, "Isolation: runs, tenants, callers" (a blocked or leaked worker cannot starve
    healthy work; what one run's callable does cannot hurt another run) and invariant 1 (the
    model is asked with the deadline). A decision model (or a chat model's async client) that
    calls a blocking API inside its coroutine holds the shared model loop's thread; another
    tenant's sync run, started while it blocks, is still asked (on a loop that replaces the
    stalled one) and completes, and the blocked run gets its own answer when its model
    returns."""
    from concurrent.futures import ThreadPoolExecutor

    from langgraph.checkpoint.memory import InMemorySaver

    from tests.graph.kit import Calls, make_registry
    from tests.graph.test_token_holds import FINAL
    from tests.graph.test_token_holds import budget as holds_budget

    entered = threading.Event()
    other_asked = threading.Event()
    blocked_until_other: list[bool] = []

    class Model:
        async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
            if inp.question == "another tenant's question":
                other_asked.set()
            elif not entered.is_set():
                entered.set()
                # A blocking client: the thread waits, the coroutine never yields.
                start = time.monotonic()
                while not other_asked.is_set() and time.monotonic() - start < 10:
                    other_asked.wait(0.05)
                blocked_until_other.append(other_asked.is_set())
            return fp.Decided(decision=FINAL)

    graph = fp.build_agent_graph(make_registry(Calls()), Model()).compile(
        checkpointer=InMemorySaver()
    )

    def run(question: str, ctx: fp.RunContext) -> fp.AgentState:
        return fp.run_output(
            graph.invoke(fp.start(question, holds_budget()), thread(), context=ctx)
        )

    with ThreadPoolExecutor(max_workers=2) as pool:
        blocking = pool.submit(run, "q", context(seconds=60))
        assert entered.wait(20)
        other = run("another tenant's question", context(tenant="other", seconds=60))
        blocking.result()
    assert other.termination is fp.TerminationReason.COMPLETED
    assert blocked_until_other == [True]


def test_a_call_the_stalled_loop_never_started_runs_on_the_loop_that_replaces_it() -> None:
    """The containment itself: while one model call blocks the shared loop's thread, another
    call is started on a fresh loop within about ``STALL_SECONDS`` and returns its own value;
    the blocked call still returns its value to its caller; the stalled loop, retired, closes
    once what it held has ended, and its thread ends with it."""
    release = threading.Event()
    stalled_loop, stalled_thread = shared_loop()

    async def blocking() -> str:
        release.wait(30)  # a blocking client: the loop's thread waits, nothing yields
        return "blocked model"

    async def other() -> str:
        await asyncio.sleep(0)
        return "other model"

    results: list[ModelRun] = []
    first = threading.Thread(target=lambda: results.append(run_model_blocking(blocking, 60)))
    first.start()
    while not stalled_loop.is_running():
        time.sleep(0.01)
    time.sleep(0.05)  # the blocking call holds the loop's thread now
    began = time.monotonic()
    run = run_model_blocking(other, 60)
    took = time.monotonic() - began
    assert run.finished and run.value == "other model"
    assert took < STALL_SECONDS * 10  # not the 30 s the blocked call would have held it
    new_loop, new_thread = shared_loop()
    assert new_loop is not stalled_loop and new_thread is not stalled_thread
    release.set()
    first.join(30)
    assert [r.value for r in results] == ["blocked model"]
    stalled_thread.join(STALL_SECONDS * 10)
    assert not stalled_thread.is_alive()
    assert stalled_loop.is_closed()
    # Later calls keep using the replacement, which is not replaced while it turns.
    assert run_model_blocking(other, 60).value == "other model"
    assert shared_loop()[0] is new_loop


def test_a_loop_that_turns_is_never_replaced() -> None:
    """Calls that each take longer than ``STALL_SECONDS`` but await (a slow model, not a
    blocking one) never count as a stall: the loop keeps starting new calls while they wait."""
    loop, _ = shared_loop()

    async def slow() -> str:
        await asyncio.sleep(STALL_SECONDS * 1.5)
        return "slow"

    runs: list[ModelRun] = []
    threads = [
        threading.Thread(target=lambda: runs.append(run_model_blocking(slow, 60))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r.value for r in runs] == ["slow"] * 4
    assert shared_loop()[0] is loop


async def _other() -> str:
    await asyncio.sleep(0)
    return "other model"


def _looked_up_before_it_was_replaced(
    monkeypatch: pytest.MonkeyPatch, stale: tuple[asyncio.AbstractEventLoop, threading.Thread]
) -> None:
    """The next call finds ``stale`` as the shared loop: it looked the loop up just before
    another caller replaced it (the race, made certain)."""
    once = iter([stale])
    monkeypatch.setattr(model, "shared_loop", lambda: next(once, None) or shared_loop())


def test_a_call_sent_to_a_loop_retired_and_closed_meanwhile_runs_on_its_replacement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``run_model_blocking`` never raises but the caller's own interruption: a caller that
    looked up the shared loop just before another caller retired it, idle, and it closed,
    sends its call to the loop that replaced it (not ``RuntimeError: Event loop is closed``
    out of invoke)."""
    stale = shared_loop()
    replace_stalled(stale[0])  # another caller saw it stall; idle, it closes
    stale[1].join(STALL_SECONDS * 10)
    assert stale[0].is_closed()
    _looked_up_before_it_was_replaced(monkeypatch, stale)
    run = run_model_blocking(_other, 60)
    assert run.finished and run.value == "other model"


def test_a_call_a_retired_loop_started_as_it_stopped_still_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A retired loop closes only with nothing on it: a call it starts in its last turn (sent
    by a caller that looked it up before it was retired, queued behind the blocked call whose
    end lets it close) runs to its end there, instead of its task dropped with the loop while
    its caller waits out the call's deadline."""
    entered, release = threading.Event(), threading.Event()
    stale = shared_loop()

    async def blocking() -> str:
        entered.set()
        release.wait(30)  # a blocking client: the loop's thread waits, nothing yields
        return "blocked model"

    first = threading.Thread(target=lambda: run_model_blocking(blocking, 60))
    first.start()
    assert entered.wait(30)
    replace_stalled(stale[0])  # retired: its close is queued behind the blocked call
    _looked_up_before_it_was_replaced(monkeypatch, stale)
    # The blocked call returns once the next call is queued behind the close.
    threading.Timer(0.2, release.set).start()
    try:
        run = run_model_blocking(_other, 5)
    finally:
        release.set()
        first.join(30)
    assert run.finished and run.value == "other model"
