"""Run the async halves of nodes from sync ``invoke``: tools on a loop per calling thread.

Two entry points, for two kinds of code:

- :func:`run_sync` (tools, and anything that must not share fate with another run): each
  calling thread runs the coroutine on a loop of its own. No two threads share a loop, so one
  run's async tool that blocks its loop (``time.sleep(3)``) cannot stall another thread's invoke.
- :func:`run_sync_shared` (the model call): one process-wide loop, supervised. LangChain chat
  models cache loop-bound connection pools process-wide (``ChatOpenAI``'s default
  ``httpx.AsyncClient``); used from two live loops, the second fails with ``... is bound to a
  different event loop`` on its first call after a switch (measured on the real graph with
  keep-alive: each thread switch failed one model step). No tool body ever runs on this loop.
  A better end state is the sync graph calling the model's sync API (``invoke``): no loop at all.

A stalled shared loop is replaced
---------------------------------
A model that blocks its thread inside ``async def`` (a blocking client, ``time.sleep``) holds
the shared loop until it returns: nothing running on a loop can interrupt that, and every other
run's model call, another tenant's too, would wait behind it. So a call whose work the loop has
not started within :data:`STALL_SECONDS` (:func:`replace_stalled`) retires that loop and hands
its work to a fresh one; the retired loop finishes what it holds (the blocked call returns to
its own caller) and then closes, its thread ending with it. The price is the one above: a
loop-bound client the blocked model shared is bound to the retired loop, so the first call on
the new loop after such a switch may fail, as one model step, rather than every run in the
process waiting: retried under ``model_retries`` only if the client reports it as a retryable
error (the OpenAI SDK retries it itself and then says ``APIConnectionError``, ``unavailable``); a
bare ``RuntimeError`` (``... bound to a different event loop``) is ``internal_error`` and ends
that run ``failed``. A loop held a second or more by work that does not block (a large response
parsed, a slow callback run inline, a thread starved of the GIL) is replaced the same way.

How :func:`run_sync` works
--------------------------
- A thread with no running loop (a script, a web server's worker thread, a pool thread running
  a sync tool) runs the coroutine *itself*, on its own loop kept in a thread-local and reused for
  every later call from that thread (an :class:`asyncio.Runner` with a loop factory, so the
  thread's ``get_event_loop`` policy is left alone). Ctrl-C in the main thread cancels the run as
  ``asyncio.run`` does.
- A thread whose own loop is already running (a notebook cell, or an async tool calling a sync
  ``invoke``: re-entrancy) cannot block on that loop, so the coroutine goes to a helper thread
  owned by that calling thread, which runs it the same way on *its* own loop. A nested call from
  inside the helper gets the helper's own helper: re-entrancy never deadlocks.
- Not a fresh loop per call: ``asyncio.run`` per call broke ``ChatOpenAI``'s cached client on 40
  of 80 calls (``Event loop is closed``), and costs ~3x (below). A loop per thread keeps a
  single-threaded caller on one loop for the process's life.
- Each call runs in a copy of the caller's ``contextvars`` (``asyncio.Runner`` would otherwise
  reuse one context per loop, leaking what one run sets into the next).
- What an abandoned async tool can still do: nothing moves a task between loops, so a task
  left behind stays on the loop of the thread that ran it; its body, once it ignored its
  cancellation, is closed and never stepped again (:mod:`fencepost.graph.containment.leash`). What is left
  of the task ends the next time that thread's loop runs, and never runs on another thread's.

Both entry points
-----------------
- A ``BaseException`` leaving a coroutine (``SystemExit``, ``KeyboardInterrupt``) is that call's
  error, raised to that caller only; loops, helper threads and the shared loop's thread survive
  it and serve every later call (the replaced portal's thread died, and every later invoke hung).
- Fork-safe: each loop records its process id, and a forked child builds its own instead of
  using threads that do not exist there. The parent's loops are kept referenced in the child and
  never closed: their descriptors (epoll, self-pipe) are shared with the parent, and closing them
  in the child unregisters the parent's, leaving its loops deaf to other threads.

Cost per call of an empty coroutine (``benchmarks/portal_overhead.py``; a busy 2-core machine,
medians): the caller's own loop ~50 us, about the replaced shared portal (~55-65 us); the helper
path ~75-95 us; ``asyncio.run`` ~175 us. Small next to one model call or checkpoint write.
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

__all__ = ["STALL_SECONDS", "replace_stalled", "run_sync", "run_sync_shared", "shared_loop"]

STALL_SECONDS = 1.0
"""How long the shared model loop may leave a ready call unstarted before it counts as stalled
(held by a callback that blocks its thread) and is replaced. asyncio's own debug mode calls a
callback slow at 0.1 s; a loop that cannot start ready work for ten times that is not busy, it
is held (a busy machine delays a thread by milliseconds, not a second)."""


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

    def run(self) -> None:
        """Run in the helper thread; never raises (the outcome is the caller's to re-raise)."""
        try:
            self.result = _this_thread_loop().run(self._tracked(), self.context)
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
            job.run()
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


class _SharedLoop:
    """The process's one loop for model calls, on a thread that outlives anything raised there."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.retired = False
        self.thread = threading.Thread(target=self._serve, name="fencepost-models", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                self.loop.run_forever()
            except BaseException:  # noqa: S112 - see below
                # A task's SystemExit/KeyboardInterrupt: asyncio fails the task (its caller gets
                # the exception) and then re-raises it out of the loop. The loop's queue is
                # intact; run it again so that caller, and every later one, hears back.
                continue
            if self.retired:
                # Stopped by `_close_when_idle`, nothing was left on it then; but a call sent by
                # a caller that looked it up before it was retired may have started in that
                # last turn: closed now, its task would never run while its caller waits.
                if asyncio.all_tasks(self.loop):
                    self.loop.call_soon(self._close_when_idle)
                    continue
                self.loop.close()
                return

    def retire(self) -> None:
        """Hand no more work to this loop; once what it holds has ended, it closes."""
        self.retired = True
        with contextlib.suppress(RuntimeError):  # closed already
            self.loop.call_soon_threadsafe(self._close_when_idle)

    def _close_when_idle(self) -> None:
        if asyncio.all_tasks(self.loop):
            # A left-behind model is dropped from its leash after its grace: look again.
            self.loop.call_later(STALL_SECONDS, self._close_when_idle)
        else:
            self.loop.stop()


_shared: _SharedLoop | None = None
_shared_lock = threading.Lock()
_parents_shared: list[_SharedLoop] = []
"""In a forked child: the parent's shared loop, referenced so it is never finalized here."""


def _reset_shared_lock_in_child() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_shared_lock_in_child)


def _shared_loop() -> _SharedLoop:
    global _shared
    with _shared_lock:
        shared = _shared
        if shared is None or shared.pid != os.getpid():
            if shared is not None:
                _parents_shared.append(shared)
            shared = _shared = _SharedLoop()
        return shared


def shared_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """The shared model loop and the thread running it (made on first use)."""
    shared = _shared_loop()
    return shared.loop, shared.thread


def replace_stalled(
    loop: asyncio.AbstractEventLoop,
) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """The shared model loop in place of ``loop``, which left a ready call unstarted for
    :data:`STALL_SECONDS`: ``loop`` is retired (it ends what it holds, then closes) and a fresh
    one is made, unless another caller replaced it first."""
    global _shared
    with _shared_lock:
        shared = _shared
        if shared is not None and shared.loop is loop and shared.pid == os.getpid():
            shared.retire()
            _shared = None
    return shared_loop()


def run_sync_shared(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the process's one shared loop; for model calls only, never tool bodies.

    Raises whatever ``coro`` raises to this caller only. Called from the shared loop's own thread
    (it cannot wait on itself), it runs ``coro`` as :func:`run_sync` would.
    """
    shared = _shared_loop()
    if threading.current_thread() is shared.thread:
        return run_sync(coro)
    future = asyncio.run_coroutine_threadsafe(coro, shared.loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise
