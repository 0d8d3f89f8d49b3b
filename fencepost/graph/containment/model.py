"""Run the decision model contained: a task of its own, waited for no longer than its deadline.

Whatever the model does — return, raise any exception or ``BaseException``, raise its own
``CancelledError``, ignore its deadline — comes back as a :class:`ModelRun`; a model past its
deadline is cancelled and left behind, its late end retrieved and dropped (never logged, never
recorded). It runs on a :class:`~fencepost.graph.containment.leash.Leash`: one that is still running
``GRACE_SECONDS`` after its cancellation (it swallowed it) is closed and never stepped again, so
it cannot go on slowing the loop it shares with other runs. Only the caller's own cancellation or
interruption propagates.

- :func:`run_model` (the async graph): a task on the caller's loop. An ``async`` approver runs
  here too (:func:`fencepost.graph.gate.ask_approver`), on its caller's loop in either graph.
- :func:`run_model_blocking` (the sync graph): a task on the process's shared model loop (see
  :mod:`fencepost.graph.containment.shared_loop` for why models share one loop), while the
  calling thread waits on a lock released as the call ends (woken once per call); no loop runs
  on the calling thread and no second task wraps the first. A call the shared loop does not
  start within ``STALL_SECONDS`` (another run's model blocks the loop's thread) is taken back
  and started on a fresh loop that replaces the stalled one.
- :func:`run_model_on_thread` and :func:`run_model_on_thread_blocking`: a model whose ``decide``
  is a plain ``def`` runs on a thread of the run's tenant's share, as a sync tool body does
  (:func:`fencepost.graph.containment.tools.run_callable`), in either graph: no event loop runs
  it, so none is hopped through (in the sync graph a thread hop costs about half a loop hop),
  and none is blocked by it. Past its deadline it is left behind on its thread, which then no
  longer counts against the tenant's healthy share; what it raises, ``BaseException`` included,
  is this call's failure; no thread for its tenant: it never ran (``unavailable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any

from fencepost.graph.containment.leash import GRACE_SECONDS, Leash
from fencepost.graph.containment.shared_loop import (
    STALL_SECONDS,
    replace_stalled,
    run_sync,
    shared_loop,
)
from fencepost.graph.containment.tools import (
    CallableRun,
    run_callable,
    run_callable_blocking,
)
from fencepost.graph.containment.waiting import settled_within, thread_wait_seconds

__all__ = [
    "ModelRun",
    "run_model",
    "run_model_blocking",
    "run_model_on_thread",
    "run_model_on_thread_blocking",
]

ModelCall = Callable[[], Coroutine[Any, Any, Any]]


@dataclass(frozen=True, slots=True)
class ModelRun:
    """How one model call ended."""

    finished: bool
    """False: it did not end before its deadline and was left behind."""
    cancelled: bool = False
    """It ended cancelled from inside (nothing here had cancelled it)."""
    error: BaseException | None = None
    value: Any = None
    unavailable: bool = False
    """With ``finished`` false: no thread of its tenant's share could take it before its
    deadline (only a model run on a thread waits for one); it never ran."""


_left_behind: set[asyncio.Future[Any]] = set()
"""Model tasks cancelled and not waited for, referenced until they end: asyncio holds tasks only
weakly, and one collected while pending is logged as destroyed."""


def _leave_behind(task: asyncio.Future[Any], leash: Leash) -> None:
    """Cancel ``task`` without waiting; its late end is retrieved and dropped. Given its grace
    to stop, it is then dropped from its leash."""
    task.cancel()
    if task.done() or task in _left_behind:
        return
    _left_behind.add(task)
    task.add_done_callback(_forget)
    task.get_loop().call_later(GRACE_SECONDS, _drop_if_running, leash, task)


def _drop_if_running(leash: Leash, task: asyncio.Future[Any]) -> None:
    if not task.done():
        leash.drop(task)


async def _reporting(make: ModelCall, leash: Leash, report: Callable[[ModelRun], None]) -> None:
    """The model call's task: how it ended is reported from the task's own last step, so its
    caller wakes a loop turn sooner than a done callback on the task would wake it.

    Whatever it raises is reported. An exception, or a ``GeneratorExit`` (the model's own, or
    the task being closed with its loop, which a return satisfies), ends here: nothing is left
    on the task for asyncio to log. Its own ``CancelledError`` is re-raised (the task ends
    cancelled), and so are ``SystemExit`` and ``KeyboardInterrupt``, which asyncio then raises
    out of the loop, as it did before this wrapper: Ctrl-C landing in a model's code on the
    caller's own loop still reaches the caller (the shared loop's thread runs on after it).
    """
    try:
        # The call is made in the task, so a task cancelled before it starts never makes it.
        value = await leash.hold(make())
    except asyncio.CancelledError:
        report(ModelRun(finished=True, cancelled=True))
        raise
    except (KeyboardInterrupt, SystemExit) as exc:
        report(ModelRun(finished=True, error=exc))
        task = asyncio.current_task()
        if task is not None:
            task.add_done_callback(_retrieved)  # never logged by asyncio as unretrieved
        raise
    except BaseException as exc:  # contained: the caller decides what it means
        report(ModelRun(finished=True, error=exc))
        return
    report(ModelRun(finished=True, value=value))


def _forget(task: asyncio.Future[Any]) -> None:
    _left_behind.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio never logs it


async def run_model(make: ModelCall, timeout: float) -> ModelRun:
    """Run ``make()`` as a task on the running loop; wait at most ``timeout`` seconds."""
    leash = Leash()
    ended: asyncio.Future[ModelRun | None] = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(_reporting(make, leash, partial(_settle, ended)))
    try:
        run = await settled_within(ended, timeout)
    except asyncio.CancelledError:
        _leave_behind(task, leash)  # one that ignores the cancel may still fail later
        raise
    if run is None:
        # A model that swallows its cancellation is not waited for; its late end is dropped.
        _leave_behind(task, leash)
        return ModelRun(finished=False)
    return run


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _settle(ended: asyncio.Future[ModelRun | None], run: ModelRun) -> None:
    if not ended.done():  # else its caller stopped waiting (its deadline, its cancellation)
        with contextlib.suppress(RuntimeError):  # its loop closed: nobody is waiting
            ended.set_result(run)


class _Watched:
    """A task on another thread's loop, watched from the calling thread.

    The caller blocks on one lock, released once when the call has ended (or was given up
    before it started): it is woken once per call. Whether the call started is read only once
    a wait of ``STALL_SECONDS`` has passed without its end: a wake-up as it starts would wake
    the caller a second time, mid-call, for nothing in the common case.
    """

    __slots__ = ("_cancelled", "_ended_lock", "_lock", "_on", "_task", "leash", "run", "started")

    def __init__(self) -> None:
        self.started = False
        """Set (under the lock) by the loop that took the call: it stays there from then on."""
        self.run = ModelRun(finished=False)
        self.leash = Leash()
        self._lock = threading.Lock()
        self._ended_lock = threading.Lock()
        self._ended_lock.acquire()  # released once, as the call ends: the caller's wake-up
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False
        self._on: asyncio.AbstractEventLoop | None = None

    def wait(self, seconds: float) -> bool:
        """Block up to ``seconds`` for the call's end; whether it has ended. Once true, the
        caller stops waiting (a second wait after a true one would block)."""
        return self._ended_lock.acquire(timeout=thread_wait_seconds(seconds))

    def start(self, make: ModelCall, on: asyncio.AbstractEventLoop) -> None:
        """On the loop's thread: start the task, unless the caller already gave up or took it
        to another loop (``on`` is no longer where it is to run)."""
        with self._lock:
            if self._on is not on or self.started:
                return
            self.started = True
            if self._cancelled:
                self._ended_lock.release()
                return
            self._task = asyncio.ensure_future(_reporting(make, self.leash, self._ended))

    def send(self, make: ModelCall, loop: asyncio.AbstractEventLoop) -> bool:
        """From the calling thread: have ``loop`` start the call, unless a loop started it
        already (False)."""
        with self._lock:
            if self.started:
                return False
            self._on = loop
        loop.call_soon_threadsafe(self.start, make, loop)
        return True

    def _ended(self, run: ModelRun) -> None:
        # Called once, from the task's last step (see `_reporting`).
        self.run = run
        self._ended_lock.release()

    def cancel(self) -> None:
        """From the calling thread: cancel the task; its end is still retrieved and dropped."""
        with self._lock:
            self._cancelled = True
            task = self._task
        if task is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nothing to cancel
                task.get_loop().call_soon_threadsafe(_leave_behind, task, self.leash)


def _sent(
    watched: _Watched, make: ModelCall, loop: asyncio.AbstractEventLoop
) -> asyncio.AbstractEventLoop:
    """Send the call to ``loop``, or, if another caller retired it and it closed since it was
    looked up, to the loop that replaced it; the loop it was sent to."""
    while True:
        try:
            watched.send(make, loop)
        except RuntimeError:  # closed: retired, idle, and closed since it was looked up
            loop = replace_stalled(loop)[0]
        else:
            return loop


def run_model_blocking(make: ModelCall, timeout: float) -> ModelRun:
    """Run ``make()`` as a task on the shared model loop; block at most ``timeout`` seconds."""
    loop, thread = shared_loop()
    if threading.current_thread() is thread:  # a sync graph invoked from a model: re-entrancy
        return run_sync(run_model(make, timeout))
    watched = _Watched()
    until = time.monotonic() + thread_wait_seconds(timeout)
    loop = _sent(watched, make, loop)
    try:
        # A loop that does not start the call in time is held by a callback that blocks its
        # thread (another run's model): the call goes to a loop that replaces it.
        while not (finished := watched.wait(min(STALL_SECONDS, until - time.monotonic()))):
            if watched.started:
                finished = watched.wait(until - time.monotonic())
                break
            if time.monotonic() >= until:
                break
            loop = _sent(watched, make, replace_stalled(loop)[0])
    except BaseException:
        watched.cancel()  # the caller's own interruption (Ctrl-C while it waits)
        raise
    if not finished:
        watched.cancel()
        return ModelRun(finished=False)
    return watched.run


def _thread_ended(ran: CallableRun, deadline: float) -> ModelRun:
    if not ran.finished:
        # Never started with time left: no thread for its tenant, not a slow model.
        unavailable = ran.never_started and time.monotonic() < deadline
        return ModelRun(finished=False, unavailable=unavailable)
    if isinstance(ran.raised, asyncio.CancelledError):
        return ModelRun(finished=True, cancelled=True)  # its own, as a task's would be
    if ran.raised is not None:
        return ModelRun(finished=True, error=ran.raised)
    return ModelRun(finished=True, value=ran.value)


async def run_model_on_thread(call: Callable[[], Any], timeout: float, *, tenant: str) -> ModelRun:
    """Run the sync model call ``call`` on a thread of ``tenant``'s share; wait at most
    ``timeout`` seconds (the async graph: the caller's loop is never blocked by it)."""
    deadline = time.monotonic() + timeout
    return _thread_ended(await run_callable(call, timeout_seconds=timeout, tenant=tenant), deadline)


def run_model_on_thread_blocking(
    call: Callable[[], Any], timeout: float, *, tenant: str
) -> ModelRun:
    """:func:`run_model_on_thread` for the sync graph: the calling thread blocks on a lock
    released as the call ends, no longer than ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    return _thread_ended(
        run_callable_blocking(call, timeout_seconds=timeout, tenant=tenant), deadline
    )
