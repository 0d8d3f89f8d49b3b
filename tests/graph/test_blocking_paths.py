"""The sync graph's blocking paths keep the contract the event-loop paths kept.

Sync ``invoke`` runs a one-call batch's sync tool body on the pool while the node's thread waits
on a thread event (``tool_runner.run_tool_blocking``), and the model as one task on the shared
model loop while the node's thread waits (``model_call.run_model_blocking``). Each test drives
the real compiled graph through sync ``invoke`` (a direct call only where the graph cannot reach
a case) and is named after the rule it pins.

Already pinned elsewhere for this path, so not repeated here: a ``def`` tool's BaseException
ends its run typed with nothing checkpointed (``tests/invariants/test_1_every_run_ends_typed``),
a model's BaseException ends the run ``failed`` (``tests/fuzz/test_fuzz_regressions``). ``test_tool_isolation`` drives
``run_tool`` through ``run_sync`` (the async path); its helpers and fixtures are reused here.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_config
from langgraph.types import Command

import fencepost as fp
from fencepost.graph.containment import tool_threads
from fencepost.graph.containment.model import run_model, run_model_blocking
from fencepost.graph.containment.shared_loop import run_sync_shared
from fencepost.graph.containment.tools import ToolRun, run_tool_blocking
from tests.graph import test_tool_isolation as isolation
from tests.graph.kit import ABSTAIN, Harness, budget, call, context, harness, saver_bytes, thread
from tests.graph.test_tool_isolation import (
    BASE_EXCEPTIONS,
    CTX,
    SECRET,
    NoArgs,
    finishes,
    ok,
    spec,
    wait_until,
)
from tests.telemetry_kit import assert_only_in_one_traceback

release = isolation.release
"""A fixture: an event tools that must outlive their deadline wait on, set when a test ends."""
small_pool = isolation.small_pool
"""A fixture: a pool of 2 threads that may grow to 4, in place of the process's pool."""

ABSTAIN_ENDS = fp.TerminationReason.INSUFFICIENT_EVIDENCE
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


def _tool(
    name: str,
    execute: Callable[..., Any],
    *,
    timeout: float = 5.0,
    effect: fp.Effect = fp.Effect.READ,
) -> fp.ToolSpec:
    return fp.ToolSpec(
        name=name,
        description=f"The {name} tool.",
        args_model=NoArgs,
        effect=effect,
        capability="logs:read" if effect is fp.Effect.READ else "notes:write",
        timeout_seconds=timeout,
        execute=execute,
    )


def _one_call(tool: fp.ToolSpec, **build_kw: Any) -> Harness:
    """A harness whose model calls ``tool`` once, then abstains."""
    return harness([call(tool.name), ABSTAIN], registry=fp.ToolRegistry([tool]), **build_kw)


async def _until(event: threading.Event, within: float = 5.0) -> None:
    """Poll ``event`` from a coroutine on the shared loop (never blocking it), for a bound."""
    end = time.monotonic() + within
    while not event.is_set() and time.monotonic() < end:
        await asyncio.sleep(0.005)


def _flush_shared_loop() -> None:
    """Let callbacks already queued on the shared model loop run, then collect garbage (where
    asyncio logs an exception nobody retrieved)."""
    assert finishes(lambda: run_sync_shared(asyncio.sleep(0, "flushed"))) == "flushed"
    gc.collect()


def _stuck(gate: threading.Event, ran: list[str] | None = None) -> Callable[..., Any]:
    def stuck(_: NoArgs, ctx: fp.ToolContext) -> str:
        if ran is not None:
            ran.append(ctx.idempotency_key)
        gate.wait(60)  # ignores its deadline, as a blocking call would
        return "late"

    return stuck


def _ctrl_c_once(started: threading.Event) -> None:
    """A real SIGINT to the main thread once ``started`` is set (and the caller is waiting)."""
    main = threading.main_thread().ident
    assert main is not None

    def fire() -> None:
        if started.wait(60):
            time.sleep(0.2)  # the node's thread is in its wait by now
            signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=fire, daemon=True).start()


# -- Whatever a body raises is that call's failure, and the runtime keeps serving -----------------


@pytest.mark.parametrize("exc", BASE_EXCEPTIONS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("source", ["sync tool", "model"])
def test_a_base_exception_from_a_sync_tool_or_the_model_is_that_steps_internal_error_and_the_next_invoke_runs(
    exc: BaseException,
    source: str,
    small_pool: tool_threads.ToolThreads,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)

    def raises(_: NoArgs, __: fp.ToolContext) -> Any:
        raise exc

    def model_raises(_: fp.DecisionInput) -> Any:
        raise exc

    failing = (
        _one_call(_tool("raises", raises))
        if source == "sync tool"
        else harness([model_raises], model_retries=0)
    )

    def failed_then_again() -> tuple[fp.AgentState, fp.AgentState]:
        # The same thread invokes again: its pool worker and the shared loop both survived.
        return failing.run(), _one_call(_tool("fine", ok)).run()

    state, again = finishes(failed_then_again, within=30)
    if source == "sync tool":
        assert state.observations[0].error_code is fp.ErrorCode.INTERNAL_ERROR
        assert state.receipts[0].status is fp.ReceiptStatus.FAILED
        assert state.termination is ABSTAIN_ENDS
    else:
        assert state.termination is fp.TerminationReason.FAILED
        assert state.last_error_code == "internal_error"
    assert SECRET not in repr(state)
    assert again.observations[0].result == "ok"
    wait_until(lambda: small_pool.stats() == (0, 0))
    _flush_shared_loop()
    # The developer sees what was raised once, in a WARNING's traceback, and nowhere else.
    assert_only_in_one_traceback(
        caplog.records, SECRET, "fencepost.tools" if source == "sync tool" else "fencepost.model"
    )


# -- A sync body that ignores its deadline is left behind ------------------------------------------


def test_a_sync_tool_ignoring_its_deadline_is_abandoned_and_its_thread_stops_counting_against_the_pool(
    small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    ran: list[str] = []
    stuck = _tool("stuck", _stuck(release, ran), timeout=0.05)
    for _ in range(2):  # the pool's base is 2: both its threads are now held by stuck bodies
        state = finishes(_one_call(stuck).run)
        assert state.observations[-1].error_code is fp.ErrorCode.TIMEOUT
        assert state.receipts[-1].status is fp.ReceiptStatus.FAILED
    assert ran == ["call-0001"] * 2
    assert small_pool.stats() == (2, 2)
    # Had the abandoned threads still counted, this call would wait for one past its 30 s and
    # fail as unavailable: the pool grew by one thread for each abandoned body instead.
    healthy = finishes(_one_call(_tool("fine", ok, timeout=30)).run, within=50)
    assert healthy.observations[0].result == "ok"
    release.set()
    wait_until(lambda: small_pool.stats() == (0, 0))


def test_a_write_whose_sync_body_ignores_its_deadline_ends_uncertain(
    small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    ran: list[str] = []
    write = _tool("stuck_write", _stuck(release, ran), timeout=0.05, effect=fp.Effect.WRITE)
    h = _one_call(write, approval="interrupt")
    config, ctx = thread(), context()
    assert "__interrupt__" in h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    state = fp.run_output(
        finishes(lambda: h.graph.invoke(Command(resume="approve"), config, context=ctx))
    )
    assert ran == ["call-0001"]  # it started, and may still land: not known, so not guessed
    assert state.receipts[0].status is fp.ReceiptStatus.UNCERTAIN
    assert state.observations[0].error_code is fp.ErrorCode.EXECUTION_UNCERTAIN
    assert small_pool.stats() == (1, 1)


def test_a_pool_full_of_abandoned_threads_fails_a_sync_invoke_fast_as_unavailable(
    small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    stuck = _tool("stuck", _stuck(release), timeout=0.05)
    for _ in range(4):  # the cap is 4
        assert finishes(_one_call(stuck).run).observations[0].error_code is fp.ErrorCode.TIMEOUT
    assert small_pool.stats() == (4, 4)
    ran: list[str] = []

    def patient(_: NoArgs, __: fp.ToolContext) -> str:
        ran.append("patient")
        return "ok"

    # Its own 120 s are not spent queueing behind threads that may never come back.
    state = finishes(_one_call(_tool("patient", patient, timeout=120)).run, within=50)
    assert state.observations[0].error_code is fp.ErrorCode.UNAVAILABLE
    assert ran == []
    release.set()
    wait_until(lambda: small_pool.stats() == (0, 0))
    assert finishes(_one_call(_tool("patient", patient)).run).observations[0].result == "ok"


def test_a_healthy_sync_invoke_beyond_the_pool_waits_for_a_thread(
    small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    ran: list[str] = []

    def busy(_: NoArgs, __: fp.ToolContext) -> str:
        release.wait(60)
        return "busy"

    def quick(_: NoArgs, __: fp.ToolContext) -> str:
        ran.append("quick")
        return "quick"

    results: dict[str, fp.AgentState] = {}

    def invoke(key: str, tool: fp.ToolSpec) -> threading.Thread:
        runner = threading.Thread(
            target=lambda: results.__setitem__(key, _one_call(tool).run()), daemon=True
        )
        runner.start()
        return runner

    runners = [invoke(key, _tool("busy", busy, timeout=30)) for key in ("a", "b")]
    wait_until(lambda: small_pool.stats() == (2, 0))
    runners.append(invoke("c", _tool("quick", quick, timeout=30)))
    wait_until(lambda: len(small_pool._waiting) == 1)
    assert ran == [] and small_pool.stats() == (2, 0)  # waiting for a thread, not failed
    release.set()
    for runner in runners:
        runner.join(30)
    assert {k: s.observations[0].result for k, s in results.items()} == {
        "a": "busy",
        "b": "busy",
        "c": "quick",
    }


# -- A model past its deadline is left behind, and what it does later is nowhere ------------------


def test_a_model_past_its_deadline_under_invoke_ends_its_step_with_timeout_and_its_late_failure_is_nowhere(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    raised = threading.Event()

    async def ignores_its_deadline(_: fp.DecisionInput) -> Any:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(30)
        # Cancelled only once its step has ended with timeout: it fails while the run it was
        # left behind by still runs. At once, as its cancellation's step comes before the end
        # of its grace on the loop; a failure past the grace never happens (it is closed
        # first), and waiting for the next model call made this depend on the machine's load.
        raised.set()
        raise RuntimeError(SECRET)

    async def abstains_once_it_failed(_: fp.DecisionInput) -> Any:
        await _until(raised)
        return ABSTAIN

    saver = InMemorySaver()
    h = harness(
        [ignores_its_deadline, abstains_once_it_failed],
        checkpointer=saver,
        model_timeout_seconds=0.5,
        model_retries=1,
    )
    config = thread()
    modes = ["values", "updates", "debug", "custom", "messages", "tasks"]
    events = finishes(
        lambda: list(
            h.graph.stream(fp.start("q", budget()), config, context=context(), stream_mode=modes)
        ),
        within=30,
    )
    state = fp.run_output(h.graph.get_state(config).values)
    assert raised.is_set()
    assert [(m.outcome, m.code) for m in state.manifests if m.phase.value == "decide"] == [
        ("error", "timeout"),
        ("decided", "insufficient_evidence"),
    ]
    assert state.termination is ABSTAIN_ENDS
    _flush_shared_loop()
    assert SECRET not in repr(state) and SECRET not in repr(events)
    assert SECRET.encode() not in saver_bytes(saver)
    assert SECRET not in caplog.text
    assert "never retrieved" not in caplog.text


def test_a_model_blocking_the_shared_loop_cannot_stop_another_threads_run_from_timing_out(
    release: threading.Event,
) -> None:
    started = threading.Event()

    async def blocks_the_loop(_: fp.DecisionInput) -> Any:
        started.set()
        release.wait(60)  # as time.sleep would: no other model on the shared loop can run
        return ABSTAIN

    blocker = harness([blocks_the_loop], model_timeout_seconds=0.2, model_retries=0)
    other = harness([ABSTAIN], model_timeout_seconds=0.2, model_retries=0)
    blocked: list[fp.AgentState] = []
    runner = threading.Thread(target=lambda: blocked.append(blocker.run()), daemon=True)
    runner.start()
    assert started.wait(30)
    state = finishes(other.run, within=30)
    assert state.termination is fp.TerminationReason.FAILED
    assert state.last_error_code == "timeout"
    runner.join(30)
    assert [s.last_error_code for s in blocked] == ["timeout"]
    release.set()
    _flush_shared_loop()
    assert other.model.calls == 0  # its call, given up on, never starts once the loop is free
    assert finishes(harness([ABSTAIN]).run).termination is ABSTAIN_ENDS


# -- Context, re-entrancy, Ctrl-C, fork --------------------------------------------------------


def test_a_sync_tool_and_the_model_see_their_runs_context_vars_and_leak_none_into_the_next_run(
    small_pool: tool_threads.ToolThreads,
) -> None:
    seen: list[tuple[str, str, str]] = []

    def reads(_: NoArgs, __: fp.ToolContext) -> str:
        seen.append(("tool", REQUEST_ID.get(), get_config()["configurable"]["thread_id"]))
        REQUEST_ID.set("set by the tool")
        return "read"

    def model_reads(inp: fp.DecisionInput) -> Any:
        seen.append(("model", REQUEST_ID.get(), get_config()["configurable"]["thread_id"]))
        REQUEST_ID.set("set by the model")
        return ABSTAIN if inp.observations else call("reads")

    registry = fp.ToolRegistry([_tool("reads", reads)])
    first, second = thread(), thread()
    token = REQUEST_ID.set("caller's")
    try:
        harness([model_reads, model_reads], registry=registry).run(config=first)
    finally:
        REQUEST_ID.reset(token)
    harness([model_reads, model_reads], registry=registry).run(config=second)
    one, two = first["configurable"]["thread_id"], second["configurable"]["thread_id"]
    assert seen == [
        ("model", "caller's", one),
        ("tool", "caller's", one),
        ("model", "caller's", one),
        ("model", "unset", two),
        ("tool", "unset", two),
        ("model", "unset", two),
    ]


def test_a_sync_invoke_from_inside_an_async_tool_or_a_model_on_the_shared_loop_does_not_deadlock() -> (
    None
):
    async def async_ok(_: NoArgs, __: fp.ToolContext) -> str:
        return "async ok"

    inner_registry = fp.ToolRegistry([_tool("leaf", ok), _tool("async_leaf", async_ok)])

    def inner_invoke() -> list[Any]:
        # A whole sync run: its model on the shared loop, a sync and an async tool.
        script = [call("leaf", 1), call("async_leaf", 2), ABSTAIN]
        state = harness(script, registry=inner_registry).run()
        return [o.result for o in state.observations]

    async def nests(_: NoArgs, __: fp.ToolContext) -> list[Any]:
        return inner_invoke()  # blocks this run's loop: a sync invoke from a running loop

    from_model: list[list[Any]] = []

    async def model_nests(_: fp.DecisionInput) -> Any:
        from_model.append(inner_invoke())  # on the shared loop's own thread
        return call("nests")

    h = harness([model_nests, ABSTAIN], registry=fp.ToolRegistry([_tool("nests", nests)]))
    state = finishes(h.run, within=60)
    assert from_model == [["ok", "async ok"]]
    assert state.observations[0].result == ["ok", "async ok"]


def test_ctrl_c_while_invoke_waits_on_a_sync_tool_reaches_the_caller_and_leaves_the_body_behind(
    small_pool: tool_threads.ToolThreads, release: threading.Event, python_sigint: None
) -> None:
    started = threading.Event()

    def waits(_: NoArgs, __: fp.ToolContext) -> str:
        started.set()
        release.wait(60)
        return "late"

    h = _one_call(_tool("waits", waits, timeout=120))
    _ctrl_c_once(started)
    with pytest.raises(KeyboardInterrupt):
        h.run()
    # Not after the body: it is still running (until the test ends), left behind, no longer
    # holding the pool's capacity.
    assert small_pool.stats() == (1, 1)
    release.set()
    wait_until(lambda: small_pool.stats() == (0, 0))
    assert _one_call(_tool("fine", ok)).run().observations[0].result == "ok"


def test_ctrl_c_while_invoke_waits_on_the_model_reaches_the_caller_and_cancels_it(
    caplog: pytest.LogCaptureFixture, python_sigint: None
) -> None:
    caplog.set_level(logging.DEBUG)
    started, cancelled = threading.Event(), threading.Event()

    async def waits(_: fp.DecisionInput) -> Any:
        started.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(600)
            return ABSTAIN
        cancelled.set()
        raise RuntimeError(SECRET)  # its late failure is retrieved, never logged

    h = harness([waits])
    _ctrl_c_once(started)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        h.run(ctx=context(seconds=None))
    # A bound, not a measurement: a caller that waited would first spend the model's 120 s
    # timeout (the run has no deadline), and a machine however busy takes far less than 60.
    assert time.monotonic() - began < 60
    assert cancelled.wait(30)
    _flush_shared_loop()
    assert SECRET not in caplog.text and "never retrieved" not in caplog.text
    assert harness([ABSTAIN]).run().termination is ABSTAIN_ENDS


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_runs_sync_invoke_on_a_pool_and_a_model_loop_of_its_own() -> None:
    fine = _tool("fine", ok)
    # The parent has idle pool workers and a shared model loop: threads a child does not have.
    assert finishes(_one_call(fine).run).observations[0].result == "ok"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status only
        status = 1
        try:
            signal.alarm(50)  # a hang kills the child; the parent sees a signal, not a 0
            gc.collect()
            state = _one_call(fine).run()
            if state.observations[0].result == "ok" and state.termination is ABSTAIN_ENDS:
                status = 0
        finally:
            os._exit(status)
    isolation.assert_child_succeeded(pid)
    assert finishes(_one_call(fine).run).observations[0].result == "ok"


# -- waits longer than a thread can wait, models left behind, freed threads handed on ------------


def test_a_model_timeout_longer_than_a_thread_can_wait_ends_a_sync_invoke_typed(
    small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    # threading waits raise OverflowError past threading.TIMEOUT_MAX (~292 years), where the
    # event-loop paths took any timeout: the model's wait raised out of invoke.
    h = _one_call(_tool("fine", ok), model_timeout_seconds=1e10)
    state = finishes(lambda: h.run(ctx=context(seconds=None)))
    assert state.observations[0].result == "ok"
    assert state.termination is ABSTAIN_ENDS
    direct = finishes(lambda: run_model_blocking(lambda: asyncio.sleep(0, "model"), 1e10))
    assert direct.value == "model"
    # The tool's waits (ToolSpec caps its timeout; a direct caller does not): for the body...
    assert finishes(lambda: run_tool_blocking(spec(ok), NoArgs(), CTX, timeout_seconds=1e10)) == (
        ToolRun(value="ok")
    )

    # ...and for a thread, when every one is busy.
    def busy(_: NoArgs, __: fp.ToolContext) -> str:
        release.wait(60)
        return "busy"

    holders = [
        threading.Thread(
            target=run_tool_blocking,
            args=(spec(busy), NoArgs(), CTX),
            kwargs={"timeout_seconds": 30},
            daemon=True,
        )
        for _ in "ab"
    ]
    for holder in holders:
        holder.start()
    wait_until(lambda: small_pool.stats() == (2, 0))
    threading.Timer(0.1, release.set).start()
    waited = finishes(lambda: run_tool_blocking(spec(ok), NoArgs(), CTX, timeout_seconds=1e10))
    assert waited == ToolRun(value="ok")


async def test_a_model_left_behind_by_its_callers_cancellation_never_logs_its_late_failure() -> (
    None
):
    # The async graph's run_model: cancelled by its caller (ainvoke cancelled), a model that
    # swallows the cancel and fails later had its failure, text and all, logged by asyncio.
    loop = asyncio.get_running_loop()
    logged: list[Any] = []
    loop.set_exception_handler(lambda _, ctx: logged.append(ctx))
    gate, ended = asyncio.Event(), asyncio.Event()

    async def stubborn() -> Any:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(30)
        await gate.wait()
        ended.set()
        raise RuntimeError(SECRET)

    waiting = asyncio.ensure_future(run_model(stubborn, 30))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    gate.set()
    await asyncio.wait_for(ended.wait(), 30)
    await asyncio.sleep(0)
    gc.collect()
    await asyncio.sleep(0)
    assert logged == []


def test_a_model_left_behind_is_kept_until_it_ends_never_logged_as_destroyed_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # asyncio holds tasks weakly: a cancelled model that swallows the cancel and then awaits a
    # future nobody else references would be collected while pending, and asyncio logs that.
    async def stubborn() -> str:
        while True:
            # A new one each time: cancelling the task cancels the future it awaits.
            orphan: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            with contextlib.suppress(asyncio.CancelledError):
                await orphan

    with caplog.at_level(logging.DEBUG):
        for runner in (
            lambda: run_model_blocking(stubborn, 0.05),
            lambda: run_sync_shared(run_model(stubborn, 0.05)),
        ):
            assert not finishes(runner).finished
            for _ in range(3):
                time.sleep(0.05)
                gc.collect()
    assert "destroyed but it is pending" not in caplog.text


def test_a_freed_thread_wakes_one_waiter_per_caller_and_one_that_gives_up_passes_it_on(
    small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    # Waking every waiter for each freed thread cost O(waiters) per call: with 1,000 runs in
    # flight on one loop, calls missed their deadlines waiting (~5% unavailable). The first
    # waiter of each caller (an event loop, a blocked thread) is woken, in arrival order; one
    # that gives up after its wake-up hands it on. So a free thread is never left unclaimed
    # while calls wait, even when one caller's loop is too blocked to take its wake-up.
    one = threading.Event()
    for gate in (release, one):  # the base of 2
        threading.Thread(
            target=run_tool_blocking,
            args=(spec(lambda _, __, gate=gate: gate.wait(60)), NoArgs(), CTX),
            kwargs={"timeout_seconds": 30},
            daemon=True,
        ).start()
    wait_until(lambda: small_pool.stats() == (small_pool.base, 0))
    woken: list[str] = []
    loop_a, loop_b = object(), object()
    first, second, third, other = (
        lambda n=n: woken.append(n) for n in ("first", "second", "third", "other")
    )
    for wake, caller in ((first, loop_a), (second, loop_a), (third, loop_a), (other, loop_b)):
        assert small_pool._slot(CTX.tenant_id, wake, caller) is tool_threads._NoSlot.WAIT
    one.set()  # a thread frees: each caller's first waiter is woken
    wait_until(lambda: len(woken) == 2)
    assert woken == ["first", "other"]
    small_pool._stop_waiting(CTX.tenant_id, first, loop_a, woken=False)  # timed out instead
    assert woken == ["first", "other", "second"]
    small_pool._stop_waiting(CTX.tenant_id, second, loop_a, woken=True)  # it takes the thread
    small_pool._stop_waiting(CTX.tenant_id, other, loop_b, woken=True)
    small_pool._stop_waiting(CTX.tenant_id, third, loop_a, woken=False)  # still queued: leaves
    assert woken == ["first", "other", "second"]
    assert small_pool._waiting == {}
