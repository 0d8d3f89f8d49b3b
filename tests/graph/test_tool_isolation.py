"""A tool cannot hurt another run or the process: ``run_tool`` and ``run_sync``, tested directly.

Every scenario that could hang runs under ``finishes`` (a daemon thread with a generous bound),
so a regression fails the test instead of hanging the suite. Tools that must outlive their
deadline block on an event the test releases, never on a long sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import os
import queue
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import httpx
import pytest
from pydantic import BaseModel, ConfigDict

from fencepost.graph.containment import tool_threads
from fencepost.graph.containment import tools as tool_runner
from fencepost.graph.containment.shared_loop import run_sync, run_sync_shared
from fencepost.graph.containment.tools import ToolRun, run_tool
from fencepost.policy import Deadline, Effect, ErrorCode, ToolContext, ToolError, ToolSpec
from tests.graph.kit import OnTimeThreads

T = TypeVar("T")
SECRET = "password=hunter2"


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


CTX = ToolContext(
    run_id="run-1", tenant_id="acme", principal_id="u-1", deadline=Deadline.after(600)
)


def spec(execute: Callable[..., Any]) -> ToolSpec:
    return ToolSpec(
        name="probe",
        description="A probe.",
        args_model=NoArgs,
        effect=Effect.READ,
        capability="probe",
        timeout_seconds=60,
        execute=execute,
    )


async def arun_tool(execute: Callable[..., Any], timeout: float = 5.0) -> ToolRun:
    return await run_tool(spec(execute), NoArgs(), CTX, timeout_seconds=timeout)


def run(execute: Callable[..., Any], timeout: float = 5.0) -> ToolRun:
    """One tool call the way a sync invoke makes it."""
    return run_sync(arun_tool(execute, timeout))


def finishes(fn: Callable[[], T], within: float = 30.0) -> T:
    """``fn()`` in a daemon thread; fails (instead of hanging) if it is not done ``within``."""
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(("ok", fn()))
        except BaseException as exc:
            box.append(("err", exc))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(within)
    if thread.is_alive():
        pytest.fail(f"did not finish within {within}s (hung)")
    kind, value = box[0]
    if kind == "err":
        raise value
    result: T = value
    return result


def ok(_: NoArgs, __: ToolContext) -> str:
    return "ok"


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Held by tools that must outlive their deadline; set when the test ends."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def small_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[tool_threads.ToolThreads]:
    """A pool of 2 threads that may grow to 4, all of them one tenant's: small enough to fill
    in a test (a tenant's own share is pinned in ``tests/isolation``). Its bodies start before
    their callers wait for them, whatever the machine's load (``OnTimeThreads``)."""
    pool = OnTimeThreads(base=2, cap=4, tenant_cap=4)
    monkeypatch.setattr(tool_runner, "_threads", pool)
    yield pool


def wait_until(predicate: Callable[[], bool], within: float = 60.0) -> None:
    end = time.monotonic() + within
    while not predicate():
        if time.monotonic() > end:
            pytest.fail("condition not reached (hung)")
        time.sleep(0.005)


def assert_child_succeeded(pid: int, within: float = 60.0) -> None:
    """Wait for forked child ``pid``; fail if it hangs (killed) or exits non-zero."""
    end = time.monotonic() + within
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.01)
    assert os.WIFEXITED(done[1]) and os.WEXITSTATUS(done[1]) == 0


class Escape(BaseException):
    """An application's own BaseException."""


# -- 1. BaseException is contained; the runtime never dies ---------------------------------------

BASE_EXCEPTIONS = [
    SystemExit(SECRET),
    KeyboardInterrupt(SECRET),
    GeneratorExit(SECRET),
    Escape(SECRET),
]


@pytest.mark.parametrize("exc", BASE_EXCEPTIONS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_base_exception_from_a_tool_is_that_calls_internal_error(
    exc: BaseException, kind: str
) -> None:
    def sync_tool(_: NoArgs, __: ToolContext) -> None:
        raise exc

    async def async_tool(_: NoArgs, __: ToolContext) -> None:
        raise exc

    body = sync_tool if kind == "sync" else async_tool
    assert finishes(lambda: run(body)) == ToolRun(error=ErrorCode.INTERNAL_ERROR)
    # The runtime is intact: this thread, a fresh thread and the same tool again all work.
    assert finishes(lambda: run(ok)) == ToolRun(value="ok")
    assert finishes(lambda: run(body)) == ToolRun(error=ErrorCode.INTERNAL_ERROR)
    assert run(ok) == ToolRun(value="ok")


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), Escape()])
@pytest.mark.parametrize("portal", [run_sync, run_sync_shared], ids=lambda f: f.__name__)
def test_a_base_exception_leaving_run_sync_reaches_only_its_caller(
    exc: BaseException, portal: Callable[[Any], Any]
) -> None:
    async def node() -> None:
        raise exc

    async def from_a_running_loop() -> str:
        # A notebook cell: the helper thread sees the exception and must survive it.
        with pytest.raises(type(exc)):
            portal(node())
        result: str = portal(asyncio.sleep(0, "helper ok"))
        return result

    with pytest.raises(type(exc)):
        finishes(lambda: portal(node()))
    assert finishes(lambda: portal(asyncio.sleep(0, "still ok"))) == "still ok"
    assert finishes(lambda: asyncio.run(from_a_running_loop())) == "helper ok"


def test_a_record_finished_before_a_cancel_that_breaks_out_fails_only_its_own_task() -> None:
    # ``finish_before_cancel`` runs the record as a task of its own: raised there, SystemExit
    # (and KeyboardInterrupt, contained the same way; not raised here, where a regression would
    # stop the test session) went out of the event loop, ending every run on it.
    exc = SystemExit(3)

    async def record() -> None:
        await asyncio.sleep(0)
        raise exc

    async def body(_: NoArgs, __: ToolContext) -> str:
        task = tool_runner.finish_before_cancel(record())
        await asyncio.wait([task])
        assert isinstance(task.exception(), RuntimeError)
        assert task.exception().__cause__ is exc  # type: ignore[union-attr]
        return "ok"

    async def beside() -> list[ToolRun]:
        return list(await asyncio.gather(arun_tool(body, 5.0), arun_tool(ok, 5.0)))

    assert finishes(lambda: asyncio.run(beside())) == [ToolRun(value="ok"), ToolRun(value="ok")]


def test_an_async_tool_that_calls_a_sync_invoke_does_not_deadlock() -> None:
    async def reentrant(_: NoArgs, __: ToolContext) -> list[Any]:
        async def inner(_: NoArgs, __: ToolContext) -> str:
            return "inner async"

        # A sync invoke from inside a running run: twice, and nested once more.
        nested = run(reentrant_leaf)
        return [run(ok).value, run(inner).value, nested.value]

    async def reentrant_leaf(_: NoArgs, __: ToolContext) -> str:
        return run(ok).value  # type: ignore[no-any-return]

    expected = ToolRun(value=["ok", "inner async", "ok"])
    assert finishes(lambda: run(reentrant)) == expected
    # Also when the outer call itself comes from a running loop (a notebook).
    assert finishes(lambda: asyncio.run(arun_tool(reentrant))) == expected
    # And from the shared model loop (it cannot wait on itself).
    assert finishes(lambda: run_sync_shared(arun_tool(reentrant))) == expected

    async def model_calls_back() -> str:
        result: str = run_sync_shared(asyncio.sleep(0, "nested model call"))
        return result

    assert finishes(lambda: run_sync_shared(model_calls_back())) == "nested model call"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_builds_its_own_loops_and_the_parent_keeps_working() -> None:
    # The parent has loops in two threads, a tool thread and a helper before it forks.
    requests: queue.Queue[Callable[..., Any] | None] = queue.Queue()
    replies: queue.Queue[ToolRun] = queue.Queue()

    def serve() -> None:
        while (body := requests.get()) is not None:
            replies.put(run(body, timeout=30))

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    requests.put(ok)
    assert replies.get(timeout=5) == ToolRun(value="ok")
    assert run(ok) == ToolRun(value="ok")
    assert asyncio.run(arun_tool(ok)) == ToolRun(value="ok")
    assert run_sync_shared(asyncio.sleep(0, "model")) == "model"

    async def async_ok(_: NoArgs, __: ToolContext) -> str:
        return "async ok"

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status only
        status = 1
        try:
            signal.alarm(10)  # a hang kills the child; the parent sees a signal, not a 0
            gc.collect()  # finalizes the thread-locals of the parent's other threads
            if (
                run(ok) == ToolRun(value="ok")
                and run(async_ok) == ToolRun(value="async ok")
                and run_sync_shared(asyncio.sleep(0, "model")) == "model"
            ):
                status = 0
        finally:
            os._exit(status)

    assert_child_succeeded(pid)
    # The child never closed its copies of the parent's loops: the server thread's loop is
    # still woken by a tool thread's result (a closed copy unregisters the parent's wake-up).
    requests.put(ok)
    assert replies.get(timeout=5) == ToolRun(value="ok")
    requests.put(None)
    server.join(5)
    assert finishes(lambda: run_sync_shared(asyncio.sleep(0.01, "model"))) == "model"


# -- 2. One run's blocked loop does not stall another thread -------------------------------------


def test_an_async_tool_blocking_its_loop_does_not_stall_another_threads_sync_invoke(
    release: threading.Event,
) -> None:
    started = threading.Event()

    async def blocks_its_loop(_: NoArgs, __: ToolContext) -> str:
        started.set()
        release.wait(60)  # as time.sleep would: the loop it runs on is stuck
        return "unblocked"

    blocked: list[ToolRun] = []
    thread = threading.Thread(target=lambda: blocked.append(run(blocks_its_loop, timeout=30)))
    thread.start()
    assert started.wait(5)
    # With one shared loop this would wait for `release`, which only comes after it.
    assert finishes(lambda: run(ok), within=30) == ToolRun(value="ok")
    assert finishes(lambda: run_sync(asyncio.sleep(0.01, "other")), within=30) == "other"
    release.set()
    thread.join(30)
    assert blocked == [ToolRun(value="unblocked")]


def test_each_call_runs_in_a_copy_of_its_callers_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    async def sets_it() -> str:
        var.set("set by an earlier run")
        return var.get()

    def sync_reads(_: NoArgs, __: ToolContext) -> str:
        return var.get()

    async def async_reads(_: NoArgs, __: ToolContext) -> str:
        return var.get()

    assert run_sync(sets_it()) == "set by an earlier run"
    assert run_sync(asyncio.sleep(0, None)) is None
    assert var.get() == "unset"
    assert run(async_reads) == ToolRun(value="unset")  # nothing leaks from the earlier run
    token = var.set("caller's")
    try:
        assert run(sync_reads) == ToolRun(value="caller's")
        assert run(async_reads) == ToolRun(value="caller's")
    finally:
        var.reset(token)


# -- 3. Timed-out sync tools cannot starve healthy ones ------------------------------------------


def test_fifty_timed_out_sync_tools_leave_room_for_a_healthy_tool(
    on_time_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    def stuck(_: NoArgs, __: ToolContext) -> None:
        release.wait(60)  # ignores its deadline, as a blocking call would

    async def fifty() -> list[ToolRun]:
        # Two batches of 25: each fits the pool's 32 threads that are not abandoned (a 33rd
        # concurrent call would wait for a thread, and its own 50 ms would be gone).
        runs: list[ToolRun] = []
        for _ in range(2):
            runs += await asyncio.gather(*(arun_tool(stuck, timeout=0.05) for _ in range(25)))
        return runs

    runs = finishes(lambda: run_sync(fifty()), within=30)
    assert runs == [ToolRun(error=ErrorCode.TIMEOUT, abandoned=True, cut_off=True)] * 50
    assert on_time_pool.stats() == (50, 50)
    healthy = finishes(lambda: run(ok, timeout=5))
    assert healthy == ToolRun(value="ok")
    release.set()
    wait_until(lambda: on_time_pool.stats() == (0, 0))


def test_at_the_hard_cap_a_call_fails_fast_as_unavailable_and_then_recovers(
    small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    ran: list[str] = []

    def stuck(_: NoArgs, __: ToolContext) -> None:
        release.wait(60)

    def healthy(_: NoArgs, __: ToolContext) -> str:
        ran.append("healthy")
        return "ok"

    async def two_stuck() -> list[ToolRun]:
        return list(await asyncio.gather(arun_tool(stuck, 0.05), arun_tool(stuck, 0.05)))

    for _ in range(2):  # two rounds of two: each round fills the two threads not abandoned
        runs = finishes(lambda: run_sync(two_stuck()))
        assert runs == [ToolRun(error=ErrorCode.TIMEOUT, abandoned=True, cut_off=True)] * 2
    assert small_pool.stats() == (4, 4)
    # Four abandoned threads are the cap: no waiting for a thread that may never come back.
    assert finishes(lambda: run(healthy, timeout=120), within=60) == ToolRun(
        error=ErrorCode.UNAVAILABLE, never_started=True
    )
    assert ran == []
    release.set()
    wait_until(lambda: small_pool.stats() == (0, 0))
    assert run(healthy) == ToolRun(value="ok")


def test_a_healthy_call_beyond_the_pool_waits_for_a_thread(
    small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    def busy(_: NoArgs, __: ToolContext) -> str:
        release.wait(60)
        return "busy"

    async def three() -> list[ToolRun]:
        calls = [asyncio.ensure_future(arun_tool(b, timeout=10)) for b in (busy, busy, ok)]
        await asyncio.sleep(0.05)
        assert small_pool.stats() == (2, 0)  # the third is waiting, not failed
        release.set()
        return list(await asyncio.gather(*calls))

    assert finishes(lambda: run_sync(three())) == [
        ToolRun(value="busy"),
        ToolRun(value="busy"),
        ToolRun(value="ok"),
    ]


def test_a_call_that_finds_no_thread_before_its_deadline_never_runs(
    small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    ran: list[str] = []

    def busy(_: NoArgs, __: ToolContext) -> str:
        release.wait(60)
        return "busy"

    def late(_: NoArgs, __: ToolContext) -> str:
        ran.append("late")
        return "late"

    async def scenario() -> list[ToolRun]:
        holders = [asyncio.ensure_future(arun_tool(busy, timeout=10)) for _ in "ab"]
        await asyncio.sleep(0.02)
        starved = await arun_tool(late, timeout=0.05)
        release.set()
        return [starved, *await asyncio.gather(*holders)]

    starved, *held = finishes(lambda: run_sync(scenario()))
    assert starved == ToolRun(error=ErrorCode.UNAVAILABLE, never_started=True)
    assert held == [ToolRun(value="busy")] * 2
    assert ran == []


# -- 4. A tool that ignores cancellation is abandoned at its deadline ----------------------------


@pytest.mark.parametrize("late", ["returns", "raises"])
async def test_an_async_tool_that_swallows_cancellation_is_abandoned_at_its_deadline_and_closed(
    late: str,
) -> None:
    loop = asyncio.get_running_loop()
    logged: list[Any] = []
    loop.set_exception_handler(lambda _, context: logged.append(context))
    gate = asyncio.Event()
    finished: list[str] = []
    closed: list[str] = []

    async def stubborn(_: NoArgs, __: ToolContext) -> str:
        try:
            with contextlib.suppress(asyncio.CancelledError):  # swallowed
                await asyncio.sleep(30)
            await gate.wait()
            finished.append(late)
            if late == "raises":
                raise RuntimeError(SECRET)
            return "late value"
        finally:
            closed.append("closed")

    # Tasks other tests (or the fuzz suite) left behind on loops that no longer run are not
    # this test's: only the one it abandons must end and be dropped.
    earlier = set(tool_runner._abandoned_tasks)
    # Waited for, the tool would never return (its gate is set only below).
    result = await asyncio.wait_for(arun_tool(stubborn, timeout=0.05), 60)
    assert result == ToolRun(error=ErrorCode.TIMEOUT, abandoned=True, cut_off=True)
    for _ in range(6000):
        if not tool_runner._abandoned_tasks - earlier:
            break
        await asyncio.sleep(0.01)
    assert not tool_runner._abandoned_tasks - earlier
    gate.set()
    await asyncio.sleep(0.05)
    # Closed at its await once its grace was over: it never got to its late value or failure.
    assert closed == ["closed"] and finished == []
    gc.collect()
    await asyncio.sleep(0)
    assert logged == []  # no "Task exception was never retrieved", nothing recorded


def test_an_abandoned_async_tool_in_a_sync_invoke_is_dropped_when_it_ends() -> None:
    async def stubborn(_: NoArgs, __: ToolContext) -> str:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(30)
        # Past its grace, however late a busy machine runs this loop: a timer short enough to
        # come due before the caller's loop stops would end it there, not left behind.
        await asyncio.sleep(30)
        raise RuntimeError(SECRET)

    earlier = set(tool_runner._abandoned_tasks)  # other tests' leftovers are not this one's
    # On this thread: the task stays on this thread's loop, the only one it can run on.
    assert run(stubborn, timeout=0.05) == ToolRun(
        error=ErrorCode.TIMEOUT, abandoned=True, cut_off=True
    )
    assert tool_runner._abandoned_tasks - earlier  # it was left behind...
    # It goes on only while this thread's loop runs again: closed at its await, it ends.
    for _ in range(600):
        run_sync(asyncio.sleep(0.05))
        if not tool_runner._abandoned_tasks - earlier:
            break
    assert not tool_runner._abandoned_tasks - earlier  # ...and dropped once it ended


async def test_a_tool_that_honours_cancellation_is_cut_without_being_abandoned() -> None:
    cancelled: list[bool] = []

    async def polite(_: NoArgs, __: ToolContext) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    assert await arun_tool(polite, timeout=0.05) == ToolRun(error=ErrorCode.TIMEOUT, cut_off=True)
    assert cancelled == [True]


async def test_a_value_that_arrives_after_the_deadline_is_a_timeout() -> None:
    async def blocks_then_returns(_: NoArgs, __: ToolContext) -> str:
        time.sleep(0.15)  # blocks the loop, so the deadline cannot interrupt it
        return "too late"

    assert await arun_tool(blocks_then_returns, timeout=0.05) == ToolRun(
        error=ErrorCode.TIMEOUT, cut_off=True
    )


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_the_callers_own_cancellation_is_raised(kind: str, release: threading.Event) -> None:
    started = threading.Event()

    def sync_body(_: NoArgs, __: ToolContext) -> None:
        started.set()
        release.wait(60)

    async def async_body(_: NoArgs, __: ToolContext) -> None:
        started.set()
        await asyncio.sleep(30)

    call = asyncio.ensure_future(arun_tool(sync_body if kind == "sync" else async_body, 30))
    while not started.is_set():
        await asyncio.sleep(0.005)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


async def test_no_time_left_never_starts_the_body() -> None:
    ran: list[str] = []

    def body(_: NoArgs, __: ToolContext) -> None:
        ran.append("ran")

    assert await arun_tool(body, timeout=0) == ToolRun(error=ErrorCode.TIMEOUT, never_started=True)
    never = ToolRun(error=ErrorCode.TIMEOUT, never_started=True)
    assert await arun_tool(body, timeout=float("nan")) == never
    assert ran == []


# -- 5. Where bodies run, and what they may return -----------------------------------------------


async def test_sync_tools_run_off_the_loop_thread_and_async_tools_on_it() -> None:
    loop_thread = threading.get_ident()

    def sync_body(_: NoArgs, __: ToolContext) -> int:
        return threading.get_ident()

    async def async_body(_: NoArgs, __: ToolContext) -> int:
        return threading.get_ident()

    class AsyncCallable:
        async def __call__(self, _: NoArgs, __: ToolContext) -> int:
            return threading.get_ident()

    sync_thread = (await arun_tool(sync_body)).value
    assert sync_thread is not None and sync_thread != loop_thread
    assert (await arun_tool(async_body)).value == loop_thread
    assert (await arun_tool(AsyncCallable())).value == loop_thread


async def test_a_sync_tool_returning_an_awaitable_is_a_failure() -> None:
    async def forgotten() -> str:
        return "never awaited"

    def returns_coroutine(_: NoArgs, __: ToolContext) -> Any:
        return forgotten()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = await arun_tool(returns_coroutine)
        gc.collect()
    assert result == ToolRun(error=ErrorCode.INTERNAL_ERROR)
    assert [w for w in caught if "never awaited" in str(w.message)] == []


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ValueError(SECRET), ErrorCode.INVALID_ARGUMENT),
        (ToolError(ErrorCode.NOT_FOUND), ErrorCode.NOT_FOUND),
        (TimeoutError(SECRET), ErrorCode.TIMEOUT),
        (RuntimeError(SECRET), ErrorCode.INTERNAL_ERROR),
    ],
)
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_tool_failure_is_a_safe_code(exc: Exception, code: ErrorCode, kind: str) -> None:
    def sync_body(_: NoArgs, __: ToolContext) -> None:
        raise exc

    async def async_body(_: NoArgs, __: ToolContext) -> None:
        raise exc

    result = await arun_tool(sync_body if kind == "sync" else async_body)
    assert result == ToolRun(error=code)
    assert SECRET not in repr(result)


# -- The model's loop: one per process, for clients that cache loop-bound pools ------------------


class _KeepAlive(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *_: Any) -> None:
        pass


def test_model_calls_from_every_thread_share_one_loop_so_a_process_wide_client_works() -> None:
    # ChatOpenAI caches one httpx.AsyncClient per process; its keep-alive connections are bound
    # to the loop that opened them. Model calls from many threads must all land on one loop.
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    client = httpx.AsyncClient()

    async def model_call() -> str:
        response = await client.get(url)
        return response.text

    try:
        for _ in range(3):
            assert run_sync_shared(model_call()) == "ok"
            assert finishes(lambda: run_sync_shared(model_call())) == "ok"
    finally:
        run_sync_shared(client.aclose())
        server.shutdown()
        server.server_close()
