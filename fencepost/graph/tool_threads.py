"""The pool sync tool bodies run on: bounded, and never filled by bodies left past their deadline.

A thread cannot be stopped, so a body past its deadline keeps its thread. The pool grows by one
thread for each such abandoned body, so the capacity healthy tools need is never consumed by them,
up to a hard cap; at the cap a call fails at once as ``unavailable``. See
:mod:`fencepost.graph.tool_runner` for how a call is run and judged.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from fencepost.graph.timed_wait import within
from fencepost.policy import ErrorCode, error_code_for

_BASE_THREADS = 32
_MAX_THREADS = 256


@dataclass(frozen=True, slots=True)
class _Outcome:
    value: Any = None
    error: ErrorCode | None = None
    finished: float = 0.0
    """``time.monotonic()`` when the body returned or failed."""


def _code_for(exc: BaseException) -> ErrorCode:
    # An Exception is a tool reporting a failure; anything else is control flow escaping it.
    return error_code_for(exc) if isinstance(exc, Exception) else ErrorCode.INTERNAL_ERROR


def _wait_seconds(timeout: float) -> float:
    """Seconds to block a thread for: a wait past ``threading.TIMEOUT_MAX`` (~292 years) raises
    ``OverflowError``, where ``asyncio.wait`` takes any timeout."""
    return min(max(0.0, timeout), threading.TIMEOUT_MAX)


def _returned(value: Any) -> _Outcome:
    if inspect.isawaitable(value):
        # A body that hands back an awaitable did not do its work; nothing will ever await it.
        if inspect.iscoroutine(value):
            value.close()
        return _Outcome(error=ErrorCode.INTERNAL_ERROR, finished=time.monotonic())
    return _Outcome(value=value, finished=time.monotonic())


# ---------------------------------------------------------------------------------------------
# Sync bodies: a bounded pool whose capacity abandoned threads cannot consume
# ---------------------------------------------------------------------------------------------


class _Job:
    """One sync body: run by a worker thread, its outcome handed to the caller by ``notify``
    (onto the caller's loop, or to a blocked caller's event)."""

    def __init__(self, fn: Callable[[], Any], notify: Callable[[_Outcome], None]) -> None:
        self.fn = fn
        self.notify = notify
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
        self.notify(outcome)


class LoopJob(_Job):
    """A job whose caller awaits ``future`` on its event loop."""

    def __init__(self, fn: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> None:
        self.future: asyncio.Future[_Outcome] = loop.create_future()
        super().__init__(fn, partial(_on_loop, loop, _deliver, self.future))


class BlockingJob(_Job):
    """A job whose caller blocks its thread on ``done`` (the sync graph: no event loop)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.done = threading.Event()
        super().__init__(fn, self._notified)

    def _notified(self, _: _Outcome) -> None:
        self.done.set()


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    # A RuntimeError: the caller's loop is closed, nobody is waiting any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


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


class _NoSlot(enum.Enum):
    FULL = "full"
    """Abandoned bodies fill the pool: fail fast, do not queue."""
    WAIT = "wait"
    """Every thread is busy with a healthy body: wait for one until the deadline."""


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
        self._waiters: dict[object, deque[Callable[[], None]]] = {}
        """Calls waiting for a thread, queued per caller (an event loop, or a blocked thread)."""

    def _capacity(self) -> int:
        return min(self.base + self._abandoned, self.cap)

    def stats(self) -> tuple[int, int]:
        """(bodies running, of which abandoned)."""
        with self._lock:
            return self._running, self._abandoned

    def _slot(
        self, wake: Callable[[], None] | None, caller: object = None
    ) -> _Worker | _NoSlot | None:
        """Take a slot: an idle worker, or None for a new thread. Else say why not; when it is
        worth waiting, ``wake`` (if given) is called once a slot may have freed up."""
        with self._lock:
            if self._running < self._capacity():
                self._running += 1
                return self._idle.pop() if self._idle else None
            if self.base + self._abandoned >= self.cap:
                return _NoSlot.FULL
            if wake is not None:
                self._waiters.setdefault(caller, deque()).append(wake)
            return _NoSlot.WAIT

    def _stop_waiting(self, wake: Callable[[], None], caller: object, *, woken: bool) -> None:
        """A waiter leaves the queue. One that was woken for a slot and gives up anyway (its
        deadline, its cancellation) passes the wake-up on, so a free slot never goes unclaimed."""
        with self._lock:
            queue = self._waiters.get(caller)
            if queue is not None and wake in queue:
                queue.remove(wake)
                if not queue:
                    del self._waiters[caller]
                return  # never woken
        if not woken:
            self._wake_callers()

    async def start(self, fn: Callable[[], Any], deadline: float) -> LoopJob | None:
        """Hand ``fn`` to a thread; None when no thread could take it (it never ran)."""
        loop = asyncio.get_running_loop()
        slot = self._slot(None)
        while slot is _NoSlot.WAIT:
            waiter: asyncio.Future[None] = loop.create_future()
            wake = partial(_on_loop, loop, _wake, waiter)
            slot = self._slot(wake, loop)
            if slot is not _NoSlot.WAIT:
                break
            woken = False
            try:
                remaining = deadline - time.monotonic()
                woken = remaining > 0 and await within(waiter, remaining)
            finally:
                self._stop_waiting(wake, loop, woken=woken)
            if not woken:
                return None
            slot = self._slot(None)
        if slot is _NoSlot.FULL:
            return None
        job = LoopJob(fn, loop)
        return job if self._hand(job, slot) else None

    def start_blocking(self, fn: Callable[[], Any], deadline: float) -> BlockingJob | None:
        """As :meth:`start`, for a caller with no event loop: waits for a slot by blocking."""
        slot = self._slot(None)
        while slot is _NoSlot.WAIT:
            freed = threading.Event()
            slot = self._slot(freed.set, freed)
            if slot is not _NoSlot.WAIT:
                break
            woken = False
            try:
                remaining = deadline - time.monotonic()
                woken = remaining > 0 and freed.wait(_wait_seconds(remaining))
            finally:
                self._stop_waiting(freed.set, freed, woken=woken)
            if not woken:
                return None
            slot = self._slot(None)
        if slot is _NoSlot.FULL:
            return None
        job = BlockingJob(fn)
        return job if self._hand(job, slot) else None

    def _hand(self, job: _Job, worker: _Worker | None) -> bool:
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
            self._wake_callers()
            return False
        return True

    def abandon(self, job: _Job) -> bool:
        """Leave ``job`` behind: its thread no longer counts against the pool's capacity."""
        with self._lock:
            if job.finished or job.abandoned:
                return False
            job.abandoned = True
            self._abandoned += 1
        self._wake_callers()
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
        self._wake_callers()
        return keep

    def _wake_callers(self) -> None:
        # A thread freed: the first waiter of each caller is woken. Waking all cost O(waiters) a
        # call (1,000 runs on one loop: ~5% of calls missed their deadline waiting); waking one
        # in all could send the only wake-up to a loop a tenant's tool is blocking.
        with self._lock:
            wakes = [queue.popleft() for queue in self._waiters.values()]
            self._waiters = {caller: queue for caller, queue in self._waiters.items() if queue}
        for wake in wakes:
            wake()


_threads = _ToolThreads()


def _new_pool_in_child() -> None:
    # The parent's workers do not exist in a forked child, and its lock may be held forever.
    global _threads
    _threads = _ToolThreads(_threads.base, _threads.cap)


os.register_at_fork(after_in_child=_new_pool_in_child)
