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
import contextvars
import inspect
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from fencepost.graph import tool_threads
from fencepost.graph.portal import run_sync
from fencepost.graph.timed_wait import within
from fencepost.graph.tool_threads import _code_for, _Outcome, _returned, _wait_seconds
from fencepost.policy import ErrorCode, ToolContext, ToolSpec

__all__ = ["ToolRun", "run_tool", "run_tool_blocking"]

# The pool in use (tests swap it); a forked child gets the fresh pool tool_threads makes for it.
_threads = tool_threads._threads


def _pool_in_child() -> None:
    global _threads
    _threads = tool_threads._threads


os.register_at_fork(after_in_child=_pool_in_child)

_CANCEL_GRACE_SECONDS = 0.02
"""How long a cancelled async body may take to stop before it is left behind."""


@dataclass(frozen=True, slots=True)
class ToolRun:
    """What happened when the runtime ran one tool body."""

    value: Any = None
    """The tool's raw return value, when it returned in time."""
    error: ErrorCode | None = None
    """A safe code when it failed (never exception text)."""
    abandoned: bool = False
    """It ignored cancellation or its timeout and was left behind (it may still act)."""


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
        await within(task, deadline - time.monotonic())
        if task.done():
            return _result(_task_outcome(task), deadline)
        task.cancel()
        await within(task, _CANCEL_GRACE_SECONDS)
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


async def _run_sync_body(
    spec: ToolSpec, args: BaseModel, ctx: ToolContext, deadline: float
) -> ToolRun:
    pool = _threads
    job = await pool.start(_body(spec, args, ctx), deadline)
    if job is None:
        return ToolRun(error=ErrorCode.UNAVAILABLE)
    try:
        await within(job.future, deadline - time.monotonic())
    except asyncio.CancelledError:
        pool.abandon(job)
        raise
    if job.future.done():
        return _result(job.future.result(), deadline)
    job.future.cancel()
    return _past_deadline(pool, job, deadline)


def _body(spec: ToolSpec, args: BaseModel, ctx: ToolContext) -> Callable[[], Any]:
    context = contextvars.copy_context()  # the tool sees its run's context vars, as to_thread does
    execute = spec.execute
    return lambda: context.run(execute, args, ctx)


def _past_deadline(
    pool: tool_threads._ToolThreads, job: tool_threads._Job, deadline: float
) -> ToolRun:
    """A sync body not heard from by its deadline: left behind, unless it finished just now
    (its outcome on its way to the caller), when it is judged by when it finished."""
    if pool.abandon(job):
        return ToolRun(error=ErrorCode.TIMEOUT, abandoned=True)
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


def run_tool_blocking(
    spec: ToolSpec, args: BaseModel, ctx: ToolContext, *, timeout_seconds: float
) -> ToolRun:
    """:func:`run_tool` for the sync graph: the calling thread blocks until the result.

    A sync body is handed to the pool and waited for on a thread event, with no event loop in
    between (a loop turn and a thread-safe wake-up cost several times the thread hop itself);
    an async body runs as :func:`run_tool` does, on the calling thread's own loop.
    """
    if _is_async(spec.execute):
        return run_sync(run_tool(spec, args, ctx, timeout_seconds=timeout_seconds))
    if not timeout_seconds > 0:  # NaN included
        return ToolRun(error=ErrorCode.TIMEOUT)
    deadline = time.monotonic() + timeout_seconds
    try:
        return _run_sync_body_blocking(spec, args, ctx, deadline)
    except Exception:
        return ToolRun(error=ErrorCode.INTERNAL_ERROR)


def _run_sync_body_blocking(
    spec: ToolSpec, args: BaseModel, ctx: ToolContext, deadline: float
) -> ToolRun:
    pool = _threads
    job = pool.start_blocking(_body(spec, args, ctx), deadline)
    if job is None:
        return ToolRun(error=ErrorCode.UNAVAILABLE)
    try:
        finished = job.done.wait(_wait_seconds(deadline - time.monotonic()))
    except BaseException:
        # The caller's own interruption (Ctrl-C while it waits): the body is left behind.
        pool.abandon(job)
        raise
    if not finished:
        return _past_deadline(pool, job, deadline)
    return _result(job.outcome or _Outcome(error=ErrorCode.TIMEOUT), deadline)
