"""Run the async halves of nodes from sync ``invoke``: each calling thread on its own event loop.

Why there is no process-wide portal loop any more
-------------------------------------------------
One shared background loop made every sync run in the process share fate: an async tool that
blocked it (``time.sleep(3)``) stalled every other thread's invoke, a ``SystemExit`` escaping a
task stopped it and left every later invoke waiting forever, and a forked child inherited a loop
whose thread did not exist there. Here no two calling threads ever share a loop:

- A thread with no running loop (a script, a worker thread of a web server, a pool thread running
  a sync tool) runs the coroutine *itself*, on a loop of its own kept in a thread-local and reused
  for every later call from that thread (an :class:`asyncio.Runner` built with a loop factory, so
  the thread's ``get_event_loop`` policy is left alone). Ctrl-C in the main thread cancels the
  run the way ``asyncio.run`` does.
- A thread whose own loop is already running (a notebook cell, or an async tool that calls a
  sync ``invoke``: re-entrancy) cannot block on that loop, so the coroutine goes to a helper
  thread owned by that calling thread, which runs it the same way on *its* own loop. The helper
  lives as long as the calling thread; a nested call from inside the helper gets its own helper,
  so re-entrancy never deadlocks.
- Each call runs in a copy of the caller's ``contextvars`` (as ``asyncio.run`` does); nothing a
  run sets in its context is seen by the next run on the same loop.
- Every thread-local records the process id: a forked child never touches its parent's loops or
  helper threads (their file descriptors are shared with the parent; closing them in the child
  would unregister the parent's), it builds its own.
- A ``BaseException`` leaving a coroutine is that call's error, raised to that caller only; the
  loop and the helper thread stay usable for every later call.

Why one loop per thread and not one per call
--------------------------------------------
A fresh loop per call (``asyncio.run``) is the strongest isolation, but LangChain clients cache
loop-bound connection pools process-wide: ``ChatOpenAI``'s default ``httpx.AsyncClient`` fails
about every second call with ``RuntimeError: Event loop is closed`` when each call brings a new
loop (measured: 40 of 80 calls). A loop kept per thread keeps a single-threaded caller (a script,
the CLI, a notebook) on one loop for the process's life, as before.

The price, and what the graph should do about it: a pool shared by *two live loops* fails too
(``... is bound to a different event loop`` on every call of the second thread's loop, measured
with ``ChatOpenAI``'s default client and keep-alive connections). Threads that run sync invokes
concurrently with such a client should either give the model an ``http_async_client`` per
thread, or the sync graph should call the model's sync API (``invoke``), so no loop is involved.

What an abandoned async tool can still do: a tool that ignored its cancellation stays on the loop
of the thread that ran it (nothing can move a task between loops); it advances only while later
calls from that same thread run, and can never stall another thread's loop.

Cost (``benchmarks/portal_overhead.py``, this machine): see the module docstring there and the
README; a call on the caller's own thread is cheaper than the old hop to a shared thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import queue
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["run_sync"]


class _Job:
    """One coroutine handed to a helper thread, and how its caller hears back or cancels it."""

    def __init__(self, coro: Coroutine[Any, Any, Any], context: contextvars.Context) -> None:
        self.coro = coro
        self.context = context
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False

    async def _tracked(self) -> Any:
        with self._lock:
            self._task = asyncio.current_task()
            cancelled = self._cancelled
        if cancelled:
            self.coro.close()
            raise asyncio.CancelledError
        return await self.coro

    def run(self, loop: _ThreadLoop) -> None:
        """Run in the helper thread; never raises (the outcome is the caller's to re-raise)."""
        try:
            self.result = loop.run(self._tracked(), self.context)
        except BaseException as exc:  # delivered to the caller, never kills the helper
            self.error = exc
        finally:
            self.done.set()

    def cancel(self) -> None:
        """Called by the caller's thread when it stops waiting (Ctrl-C in a notebook, say)."""
        with self._lock:
            self._cancelled = True
            task = self._task
        if task is not None and not task.done():
            # A RuntimeError: its loop is already closed, nothing is left to cancel.
            with contextlib.suppress(RuntimeError):
                task.get_loop().call_soon_threadsafe(task.cancel)


class _Helper:
    """A thread that runs coroutines for one calling thread whose own loop is busy running."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="fencepost-portal", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job.run(_this_thread_loop())
            del job

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        job = _Job(coro, contextvars.copy_context())
        self._jobs.put(job)
        try:
            job.done.wait()
        except BaseException:
            job.cancel()
            raise
        if job.error is not None:
            error, job.error = job.error, None
            raise error
        result: T = job.result
        return result

    def stop(self) -> None:
        self._jobs.put(None)


class _ThreadLoop:
    """One thread's own event loop (and, lazily, its helper), for the thread's whole life."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
        self._started = False
        self.helper: _Helper | None = None

    def run(self, coro: Coroutine[Any, Any, T], context: contextvars.Context) -> T:
        self._started = True
        return self._runner.run(coro, context=context)

    def helper_for_caller(self) -> _Helper:
        helper = self.helper
        if helper is None or not helper.thread.is_alive():
            helper = self.helper = _Helper()
        return helper

    def close(self) -> None:
        """Close without running the loop: ``Runner.close()`` would wait for every leftover
        task, and one that ignores cancellation would hold its thread's exit forever."""
        if self.helper is not None:
            self.helper.stop()
        if self._started:
            loop = self._runner.get_loop()
            if not loop.is_running() and not loop.is_closed():
                loop.close()


class _Ticket:
    """What a thread's thread-local holds: closes the thread's loop when the thread ends."""

    def __init__(self, loop: _ThreadLoop) -> None:
        self.loop = loop

    def __del__(self) -> None:
        # In a forked child, CPython finalizes the thread-locals of the parent's other threads.
        # Their loops' descriptors (epoll, self-pipe) are shared with the parent: closing them
        # here would unregister the parent's and leave its loops deaf to other threads. So a
        # child leaves them alone, and `_live` keeps them from ever being finalized.
        if self.loop.pid != os.getpid():
            return
        try:
            with _live_lock:
                _live.discard(self.loop)
            self.loop.close()
        except Exception:  # noqa: S110 - a finalizer must not raise; nothing is left to do
            pass


_local = threading.local()
_live: set[_ThreadLoop] = set()
"""Every thread's loop, referenced until its own thread ends (never, in a forked child)."""
_live_lock = threading.Lock()


def _reset_lock_in_child() -> None:
    global _live_lock
    _live_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_reset_lock_in_child)


def _this_thread_loop() -> _ThreadLoop:
    ticket: _Ticket | None = getattr(_local, "ticket", None)
    if ticket is not None and ticket.loop.pid == os.getpid():
        return ticket.loop
    loop = _ThreadLoop()
    with _live_lock:
        _live.add(loop)
    _local.ticket = _Ticket(loop)
    return loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a loop owned by the calling thread and return its result.

    Raises whatever ``coro`` raises (``BaseException`` included) to this caller only; later
    calls, from this thread or any other, are unaffected. From a thread whose loop is running
    (a notebook, an async tool), the call blocks that thread while a helper runs ``coro``.
    """
    state = _this_thread_loop()
    if asyncio._get_running_loop() is None:
        return state.run(coro, contextvars.copy_context())
    return state.helper_for_caller().call(coro)
