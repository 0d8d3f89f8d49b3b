"""Run one tool body so that nothing it does can hurt another run or the process.

The execute node calls :func:`run_tool` for each allowed call and gets back a :class:`ToolRun`:
the tool's value, or a safe error code, and whether the body had to be left behind.

- Async bodies run on the caller's loop (where their clients live), as a task of their own, so a
  body that swallows its cancellation can be left behind at its deadline instead of holding the
  run: :func:`run_tool` cancels it at the deadline, waits ``_CANCEL_GRACE_SECONDS`` for it to
  stop, and otherwise returns ``abandoned=True``. The task keeps a strong reference until it ends;
  its late value is dropped and its late exception retrieved (never logged, never recorded).
- Sync bodies run off the loop, on a fencepost-owned pool (:class:`_ToolThreads`), never on the
  loop's default executor: a thread cannot be stopped, so a body past its deadline keeps its
  thread. The pool grows by one thread for each such abandoned body, so the capacity healthy
  tools need is never consumed by them, up to a hard cap (``_MAX_THREADS``); at the cap a call
  fails at once as ``unavailable`` rather than queueing behind threads that may never return.
  Under ordinary load (every thread busy with healthy calls) a call waits for a thread until its
  deadline, then fails as ``unavailable`` without having run.
- ``BaseException`` from a body (``SystemExit`` from argparse, ``KeyboardInterrupt``,
  ``GeneratorExit``, an application's own) is that call's failure, ``internal_error``. Left to
  asyncio, ``SystemExit`` and ``KeyboardInterrupt`` raised in a task escape the event loop itself.
- Nothing here reads an exception's text: codes come from :func:`fencepost.policy.error_code_for`.
- A value that arrives after the deadline is a timeout, even if the body did return it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from fencepost.policy import ErrorCode, ToolContext, ToolSpec, error_code_for

__all__ = ["ToolRun", "run_tool"]

_CANCEL_GRACE_SECONDS = 0.02
"""How long a cancelled async body may take to stop before it is left behind."""
_BASE_THREADS = 32
"""Sync bodies that may run at once while none has been abandoned."""
_MAX_THREADS = 256
"""Threads the pool may ever hold, abandoned ones included."""


@dataclass(frozen=True, slots=True)
class ToolRun:
    """What happened when the runtime ran one tool body."""

    value: Any = None
    """The tool's raw return value, when it returned in time."""
    error: ErrorCode | None = None
    """A safe code when it failed (never exception text)."""
    abandoned: bool = False
    """It ignored cancellation or its timeout and was left behind (it may still act)."""


@dataclass(frozen=True, slots=True)
class _Outcome:
    value: Any = None
    error: ErrorCode | None = None
    finished: float = 0.0
    """``time.monotonic()`` when the body returned or failed."""


def _code_for(exc: BaseException) -> ErrorCode:
    # An Exception is a tool reporting a failure; anything else is control flow escaping it.
    return error_code_for(exc) if isinstance(exc, Exception) else ErrorCode.INTERNAL_ERROR


def _returned(value: Any) -> _Outcome:
    if inspect.isawaitable(value):
        # A body that hands back an awaitable did not do its work; nothing will ever await it.
        if inspect.iscoroutine(value):
            value.close()
        return _Outcome(error=ErrorCode.INTERNAL_ERROR, finished=time.monotonic())
    return _Outcome(value=value, finished=time.monotonic())


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - an object with ``async def __call__``
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(call)


def _timed_out(outcome: _Outcome, deadline: float) -> bool:
    return outcome.finished > deadline


def _result(outcome: _Outcome, deadline: float) -> ToolRun:
    if _timed_out(outcome, deadline):
        return ToolRun(error=ErrorCode.TIMEOUT)
    if outcome.error is not None:
        return ToolRun(error=outcome.error)
    return ToolRun(value=outcome.value)


# ---------------------------------------------------------------------------------------------
# Async bodies: a task on the caller's loop, left behind if it will not stop
# ---------------------------------------------------------------------------------------------

_abandoned_tasks: set[asyncio.Task[Any]] = set()
"""Tasks left behind, referenced until they end so they are not destroyed while pending."""


def _forget(task: asyncio.Task[Any]) -> None:
    _abandoned_tasks.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: a late failure is never logged as "never retrieved"


def _abandon(task: asyncio.Task[Any]) -> None:
    _abandoned_tasks.add(task)
    task.add_done_callback(_forget)


async def _contained(fn: Callable[..., Any], args: BaseModel, ctx: ToolContext) -> _Outcome:
    try:
        value = fn(args, ctx)
        if inspect.isawaitable(value):
            value = await value
    except (KeyboardInterrupt, SystemExit):
        # asyncio re-raises these two out of the loop after failing the task; caught here they
        # are this call's failure. Other BaseExceptions stay on the task (asyncio keeps them
        # there), and GeneratorExit must propagate when the coroutine is closed.
        return _Outcome(error=ErrorCode.INTERNAL_ERROR, finished=time.monotonic())
    return _returned(value)


def _task_outcome(task: asyncio.Task[Any]) -> _Outcome:
    if task.cancelled():
        # Cancelled from inside the body (nothing here had cancelled it yet).
        return _Outcome(error=ErrorCode.CANCELLED, finished=time.monotonic())
    exc = task.exception()
    if exc is not None:
        return _Outcome(error=_code_for(exc), finished=time.monotonic())
    outcome: _Outcome = task.result()
    return outcome


async def _run_async(spec: ToolSpec, args: BaseModel, ctx: ToolContext, deadline: float) -> ToolRun:
    task = asyncio.ensure_future(_contained(spec.execute, args, ctx))
    try:
        await asyncio.wait({task}, timeout=max(0.0, deadline - time.monotonic()))
        if task.done():
            return _result(_task_outcome(task), deadline)
        task.cancel()
        await asyncio.wait({task}, timeout=_CANCEL_GRACE_SECONDS)
    except asyncio.CancelledError:
        # The caller's own cancellation: the body is cancelled too and never waited for.
        task.cancel()
        _abandon(task)
        raise
    if not task.done():
        _abandon(task)
        return ToolRun(error=ErrorCode.TIMEOUT, abandoned=True)
    _task_outcome(task)  # it stopped when told to; whatever it ended with is dropped
    return ToolRun(error=ErrorCode.TIMEOUT)


# ---------------------------------------------------------------------------------------------
# Sync bodies: a bounded pool whose capacity abandoned threads cannot consume
# ---------------------------------------------------------------------------------------------


class _Job:
    """One sync body: run by a worker thread, its outcome delivered to the caller's loop."""

    def __init__(
        self, fn: Callable[[], Any], loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]
    ) -> None:
        self.fn = fn
        self.loop = loop
        self.future = future
        self.finished = False
        self.abandoned = False
        self.outcome: _Outcome | None = None

    def run(self) -> None:
        try:
            outcome = _returned(self.fn())
        except BaseException as exc:  # contained: a tool cannot end its worker, or the process
            outcome = _Outcome(error=_code_for(exc), finished=time.monotonic())
        del self.fn
        self.outcome = outcome  # read by the caller once `finished` is set under the pool's lock
        # A RuntimeError: the caller's loop is closed, nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(_deliver, self.future, outcome)


def _deliver(future: asyncio.Future[Any], outcome: _Outcome) -> None:
    if not future.done():
        future.set_result(outcome)


def _wake(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_result(None)


class _Worker:
    def __init__(self, pool: _ToolThreads) -> None:
        self.pool = pool
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # Daemon: an abandoned body may never return, and must not hold the interpreter's exit.
        self.thread = threading.Thread(target=self._work, name="fencepost-tool", daemon=True)

    def _work(self) -> None:
        job = self.jobs.get()
        while job is not None:
            job.run()
            keep = self.pool._finished(self, job)
            del job
            job = self.jobs.get() if keep else None


class _ToolThreads:
    """Threads for sync tool bodies: ``base`` at once, plus one for each abandoned body, never
    more than ``cap`` in all."""

    def __init__(self, base: int = _BASE_THREADS, cap: int = _MAX_THREADS) -> None:
        self.base = base
        self.cap = cap
        self._lock = threading.Lock()
        self._running = 0
        """Bodies in progress, abandoned ones included."""
        self._abandoned = 0
        self._idle: list[_Worker] = []
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    def _capacity(self) -> int:
        return min(self.base + self._abandoned, self.cap)

    def stats(self) -> tuple[int, int]:
        """(bodies running, of which abandoned)."""
        with self._lock:
            return self._running, self._abandoned

    async def start(self, fn: Callable[[], Any], deadline: float) -> _Job | None:
        """Hand ``fn`` to a thread; None when no thread could take it (it never ran)."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._running < self._capacity():
                    self._running += 1
                    worker = self._idle.pop() if self._idle else None
                    break
                if self.base + self._abandoned >= self.cap:
                    return None  # abandoned bodies fill the pool: fail fast, do not queue
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, waiter))
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    return None
                await asyncio.wait({waiter}, timeout=remaining)
                if not waiter.done():
                    return None
            finally:
                with self._lock, contextlib.suppress(ValueError):
                    self._waiters.remove((loop, waiter))
        job = _Job(fn, loop, loop.create_future())
        try:
            if worker is None:
                worker = _Worker(self)
                worker.jobs.put(job)
                worker.thread.start()
            else:
                worker.jobs.put(job)
        except BaseException:  # no thread could be started: give the slot back
            with self._lock:
                self._running -= 1
            self._wake_all()
            return None
        return job

    def abandon(self, job: _Job) -> bool:
        """Leave ``job`` behind: its thread no longer counts against the pool's capacity."""
        with self._lock:
            if job.finished or job.abandoned:
                return False
            job.abandoned = True
            self._abandoned += 1
        self._wake_all()
        return True

    def _finished(self, worker: _Worker, job: _Job) -> bool:
        """Called by ``worker`` after ``job``: True to park and wait for more work."""
        with self._lock:
            job.finished = True
            self._running -= 1
            if job.abandoned:
                self._abandoned -= 1
            keep = len(self._idle) < self.base
            if keep:
                self._idle.append(worker)
        self._wake_all()
        return keep

    def _wake_all(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for loop, waiter in waiters:
            with contextlib.suppress(RuntimeError):  # that caller's loop is closed
                loop.call_soon_threadsafe(_wake, waiter)


_threads = _ToolThreads()


def _new_pool_in_child() -> None:
    # The parent's workers do not exist in a forked child, and its lock may be held forever.
    global _threads
    _threads = _ToolThreads(_threads.base, _threads.cap)


os.register_at_fork(after_in_child=_new_pool_in_child)


async def _run_sync_body(
    spec: ToolSpec, args: BaseModel, ctx: ToolContext, deadline: float
) -> ToolRun:
    pool = _threads
    context = contextvars.copy_context()  # the tool sees its run's context vars, as to_thread does
    execute = spec.execute
    job = await pool.start(lambda: context.run(execute, args, ctx), deadline)
    if job is None:
        return ToolRun(error=ErrorCode.UNAVAILABLE)
    try:
        await asyncio.wait({job.future}, timeout=max(0.0, deadline - time.monotonic()))
    except asyncio.CancelledError:
        pool.abandon(job)
        raise
    if job.future.done():
        return _result(job.future.result(), deadline)
    job.future.cancel()
    if pool.abandon(job):
        return ToolRun(error=ErrorCode.TIMEOUT, abandoned=True)
    # It finished while its outcome was on its way to this loop: judged by when it finished.
    return _result(job.outcome or _Outcome(error=ErrorCode.TIMEOUT), deadline)


# ---------------------------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------------------------


async def run_tool(
    spec: ToolSpec, args: BaseModel, ctx: ToolContext, *, timeout_seconds: float
) -> ToolRun:
    """Run one tool body; never raises except the CALLER's own cancellation.

    Sync bodies run on a fencepost thread, async bodies on the caller's loop. The body gets
    ``timeout_seconds`` from now; past it, the result is ``timeout`` whatever the body does.
    """
    if not timeout_seconds > 0:  # NaN included
        return ToolRun(error=ErrorCode.TIMEOUT)  # no time left: the body never starts
    deadline = time.monotonic() + timeout_seconds
    try:
        if _is_async(spec.execute):
            return await _run_async(spec, args, ctx, deadline)
        return await _run_sync_body(spec, args, ctx, deadline)
    except asyncio.CancelledError:
        raise
    except Exception:
        # Only the runtime's own failure can land here (a body's is contained above).
        return ToolRun(error=ErrorCode.INTERNAL_ERROR)
