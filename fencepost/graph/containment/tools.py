"""Run one tool body so that nothing it does can hurt another run or the process.

The execute node calls :func:`run_tool` for each allowed call and gets back a :class:`ToolRun`:
the tool's value, or a safe error code, whether the body was cut off after it started, and
whether it had to be left behind.

- Async bodies run on the caller's loop (where their clients live), as a task of their own, on a
  :class:`~fencepost.graph.containment.leash.Leash`: :func:`run_tool` cancels the task at the deadline and
  waits ``GRACE_SECONDS`` for it to stop; a body still running then (it swallowed its
  cancellation) is closed and never stepped again, so it cannot go on slowing the loop other
  runs share, nor hold that loop's shutdown; the call returns ``abandoned=True``. The task keeps
  a strong reference until it ends; its late exception is retrieved (never logged or recorded).
- Sync bodies run off the loop, on a fencepost-owned pool (:class:`~fencepost.graph.containment.tool_threads.
  ToolThreads`), never on the loop's default executor: a thread cannot be stopped, so a body
  past its deadline keeps its thread. Each tenant holds a bounded share of the threads and the
  process a bounded total (the rule and how it is keyed: :mod:`fencepost.graph.containment.tool_threads`),
  so one tenant's hung bodies never leave another tenant's tool waiting. A call the pool cannot
  take fails as ``unavailable`` without having run: at once where only bodies left behind stand
  in its way, at its deadline where healthy ones held every thread it may take. A body no
  thread has taken by its deadline (a loaded machine schedules a thread late) is withdrawn: it
  never starts, not even after its run has ended (``never_started``); the worker that takes it
  later drops it. Whether a body starts or is withdrawn is settled under the pool's lock.
- ``cut_off``: the body started and its deadline came before it reported (cut at its await, left
  behind, or its value too late). Whatever it did may have happened: a write's outcome is unknown.
- ``BaseException`` from a body (``SystemExit`` from argparse, ``KeyboardInterrupt``,
  ``GeneratorExit``, an application's own) is that call's failure, ``internal_error``. Left to
  asyncio, ``SystemExit`` and ``KeyboardInterrupt`` raised in a task escape the event loop itself.
- Nothing here reads an exception's text: codes come from :func:`fencepost.policy.error_code_for`.
  What a body raised is logged once, with its traceback, on ``fencepost.tools``
  (:mod:`fencepost.policy.developer_log`): the developer's, and nobody else's. A ``ToolError`` is
  the tool's own typed report (DEBUG). A failure after the call's deadline is not logged: the
  call had ended (``timeout``) and its caller stopped listening.
- A value that arrives after the deadline is a timeout, even if the body did return it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import math
import os
import time
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from fencepost.graph.containment import tool_threads
from fencepost.graph.containment.leash import GRACE_SECONDS, Leash
from fencepost.graph.containment.shared_loop import run_sync
from fencepost.graph.containment.tool_threads import (
    Job,
    Left,
    Outcome,
    ToolThreads,
    returned,
)
from fencepost.graph.containment.waiting import settled_within, within
from fencepost.policy import ErrorCode, ToolContext, ToolError, ToolSpec
from fencepost.policy.developer_log import TOOLS, CallScope, current_call, raised
from fencepost.policy.error_codes import failure_code_for

T = TypeVar("T")

__all__ = [
    "CallableRun",
    "ToolRun",
    "is_async",
    "run_callable",
    "run_callable_blocking",
    "run_callable_watched",
    "run_tool",
    "run_tool_blocking",
]

# The pool in use (tests swap it); a forked child gets the fresh pool tool_threads makes for it.
_threads: ToolThreads = tool_threads.pool()


def _pool_in_child() -> None:
    global _threads
    _threads = tool_threads.pool()


os.register_at_fork(after_in_child=_pool_in_child)


@dataclass(frozen=True, slots=True)
class ToolRun:
    """What happened when the runtime ran one tool body."""

    value: Any = None
    """The tool's raw return value, when it returned in time."""
    error: ErrorCode | None = None
    """A safe code when it failed (never exception text)."""
    abandoned: bool = False
    """It ignored cancellation or its timeout and was left behind (a sync body may still act)."""
    cut_off: bool = False
    """It started, and its deadline came before it reported: what it did may have happened."""
    never_started: bool = False
    """The body was never called: no thread could take it, or its deadline (or its caller's
    cancellation) came before one did. Nothing it would have done happened."""


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - an object with ``async def __call__``
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(call)


def _timed_out(outcome: Outcome, deadline: float) -> bool:
    return outcome.finished > deadline


def _result(outcome: Outcome, deadline: float) -> ToolRun:
    if _timed_out(outcome, deadline):
        return ToolRun(error=ErrorCode.TIMEOUT, cut_off=True)
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


def _drop_if_running(leash: Leash, task: asyncio.Task[Any]) -> None:
    if not task.done():
        leash.drop(task)


CLOSING_SECONDS = 5.0
"""How long a caller's cancellation waits for the records a body asked to finish first
(:func:`finish_before_cancel`), once the body has had its grace."""

_CLOSING: ContextVar[list[asyncio.Future[Any]] | None] = ContextVar(
    "fencepost_tool_closing", default=None
)


def finish_before_cancel(work: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """Run ``work`` as a task of its own that the call's cancellation waits for (at most
    :data:`CLOSING_SECONDS`) before it goes on: for a record the body must leave when it is
    cancelled with its caller (a child run's durable cancel record), which would otherwise be
    left running when the body is dropped after its grace. Outside a tool body, just a task.

    ``SystemExit`` or ``KeyboardInterrupt`` from ``work`` is its failure (a ``RuntimeError``
    from it, for whoever awaits the task): raised in a task of its own, asyncio would re-raise
    either out of the event loop, ending every run on it."""
    task = asyncio.ensure_future(_contained(work))
    closing = _CLOSING.get()
    if closing is not None:
        closing.append(task)
    return task


async def _contained(work: Coroutine[Any, Any, T]) -> T:
    try:
        return await work
    except (KeyboardInterrupt, SystemExit) as exc:
        raise RuntimeError(f"{type(exc).__name__} from a record finished before a cancel") from exc


async def _closed(closing: list[asyncio.Future[Any]]) -> None:
    """Wait for ``closing`` to end, through further cancels, within :data:`CLOSING_SECONDS`;
    one still running then is cancelled (it had its time), never left on the loop for good."""
    loop = asyncio.get_running_loop()
    until = loop.time() + CLOSING_SECONDS
    pending = [f for f in closing if not f.done()]
    while pending and loop.time() < until:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([asyncio.shield(f) for f in pending], timeout=until - loop.time())
        pending = [f for f in pending if not f.done()]
    for late in pending:
        late.cancel()


class _AsyncBody:
    """One async body's task: whether it started, the leash it runs on, whether its caller
    stopped waiting for it (what it does after that is not its call's, and is not logged), and
    the records it asked to finish before its cancellation goes on."""

    __slots__ = ("closing", "late", "leash", "started")

    def __init__(self) -> None:
        self.leash = Leash()
        self.started = False
        self.late = False
        self.closing: list[asyncio.Future[Any]] = []

    async def run(
        self, fn: Callable[..., Any], args: BaseModel, ctx: ToolContext, tool: str
    ) -> Outcome:
        self.started = True
        current_call.set(_scope(ctx, tool))  # this task's own context: nothing leaks out
        _CLOSING.set(self.closing)
        try:
            value = fn(args, ctx)
            if inspect.iscoroutine(value):
                value = await self.leash.hold(value)
            elif inspect.isawaitable(value):
                value = await value
        except (KeyboardInterrupt, SystemExit) as exc:
            # asyncio re-raises these two out of the loop after failing the task; caught here
            # they are this call's failure. Other BaseExceptions stay on the task (asyncio keeps
            # them there), and GeneratorExit must propagate when the coroutine is closed.
            _log_failure(exc, ctx, tool, ErrorCode.INTERNAL_ERROR)
            return Outcome(error=ErrorCode.INTERNAL_ERROR, finished=time.monotonic())
        except (asyncio.CancelledError, GeneratorExit):
            raise  # cancelled or closed: the runtime's doing, not the body's failure
        except BaseException as exc:
            if not self.late:
                _log_failure(exc, ctx, tool, failure_code_for(exc))
            raise
        return returned(value)


def _scope(ctx: ToolContext, tool: str) -> CallScope:
    return CallScope(run_id=ctx.run_id, call_id=ctx.idempotency_key, tool=tool)


def _log_failure(exc: BaseException, ctx: ToolContext, tool: str, code: ErrorCode) -> None:
    """Log what a body raised: with its traceback (WARNING), or a ``ToolError`` (the tool's
    own typed report) at DEBUG."""
    if isinstance(exc, ToolError):
        TOOLS.debug(
            "tool %r reported %s (run %s, call %s)",
            tool,
            code.value,
            ctx.run_id,
            ctx.idempotency_key or "-",
            extra={"run_id": ctx.run_id, "call_id": ctx.idempotency_key, "code": code.value},
        )
        return
    raised(
        TOOLS,
        f"tool {tool!r}",
        exc,
        run_id=ctx.run_id,
        call_id=ctx.idempotency_key,
        code=code.value,
    )


def _task_outcome(task: asyncio.Task[Any]) -> Outcome:
    if task.cancelled():
        # Cancelled from inside the body (nothing here had cancelled it yet).
        return Outcome(error=ErrorCode.CANCELLED, finished=time.monotonic())
    exc = task.exception()
    if exc is not None:
        return Outcome(error=failure_code_for(exc), finished=time.monotonic())
    outcome: Outcome = task.result()
    return outcome


async def _run_async(spec: ToolSpec, args: BaseModel, ctx: ToolContext, deadline: float) -> ToolRun:
    body = _AsyncBody()
    task = asyncio.ensure_future(body.run(spec.execute, args, ctx, spec.name))
    try:
        await within(task, deadline - time.monotonic())
        if task.done():
            return _result(_task_outcome(task), deadline)
        body.late = True
        task.cancel()
        await within(task, GRACE_SECONDS)
    except asyncio.CancelledError:
        # The caller's own cancellation: the body is cancelled too and given its grace to stop
        # (through further cancels of the caller); still running then, it is dropped, so it
        # cannot outlive its caller on this loop. What it asked to finish first (its durable
        # record of the stop) is waited for, briefly, before the cancellation goes on.
        body.late = True
        task.cancel()
        _abandon(task)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([task], timeout=GRACE_SECONDS)
        _drop_if_running(body.leash, task)
        if body.closing:
            await _closed(body.closing)
        raise
    if not task.done():
        body.leash.drop(task)  # it swallowed its cancellation: closed, never stepped again
        _abandon(task)
        return ToolRun(error=ErrorCode.TIMEOUT, abandoned=True, cut_off=True)
    _task_outcome(task)  # it stopped when told to; whatever it ended with is dropped
    return ToolRun(error=ErrorCode.TIMEOUT, cut_off=body.started, never_started=not body.started)


async def _run_sync_body(
    spec: ToolSpec, args: BaseModel, ctx: ToolContext, deadline: float
) -> ToolRun:
    pool = _threads
    job = await pool.start(_body(spec, args, ctx, deadline), deadline, _tenant_of(ctx))
    if job is None:
        return ToolRun(error=ErrorCode.UNAVAILABLE, never_started=True)
    try:
        outcome = await settled_within(job.future, deadline - time.monotonic())
    except asyncio.CancelledError:
        pool.abandon(job)
        raise
    if outcome is not None:
        return _result(outcome, deadline)
    return _past_deadline(pool, job, deadline)


def _body(spec: ToolSpec, args: BaseModel, ctx: ToolContext, deadline: float) -> Callable[[], Any]:
    context = contextvars.copy_context()  # the tool sees its run's context vars, as to_thread does
    execute, tool = spec.execute, spec.name
    return lambda: context.run(_run_logged, execute, args, ctx, tool, deadline)


def _run_logged(
    execute: Callable[..., Any], args: BaseModel, ctx: ToolContext, tool: str, deadline: float
) -> Any:
    """A sync body, on its worker thread: what it raises in time is logged there, with its
    traceback, and raised on to the pool, which turns it into the call's code."""
    current_call.set(_scope(ctx, tool))  # the body's own copy of the context
    try:
        return execute(args, ctx)
    except BaseException as exc:
        if time.monotonic() <= deadline:
            _log_failure(exc, ctx, tool, failure_code_for(exc))
        raise


def _tenant_of(ctx: ToolContext) -> str:
    """The share a call's sync body takes threads from: its run's tenant, as an exact ``str``
    (the trusted context's; a ``str`` subclass could hash or compare as another tenant)."""
    return str.__str__(ctx.tenant_id)


def _past_deadline(pool: ToolThreads, job: Job, deadline: float) -> ToolRun:
    """A sync body not heard from by its deadline: withdrawn if no thread had taken it yet
    (on a loaded machine a thread may come after the deadline, even after the run ended: the
    body must then never start), left behind if it is running, and judged by when it finished
    if it finished just now (its outcome on its way to the caller)."""
    left = pool.abandon(job)
    if left is Left.WITHDRAWN:
        return ToolRun(error=ErrorCode.TIMEOUT, never_started=True)
    if left is Left.ABANDONED:
        return ToolRun(error=ErrorCode.TIMEOUT, abandoned=True, cut_off=True)
    return _result(job.outcome or Outcome(error=ErrorCode.TIMEOUT), deadline)


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
        return ToolRun(error=ErrorCode.TIMEOUT, never_started=True)  # no time left
    deadline = time.monotonic() + timeout_seconds
    try:
        if _is_async(spec.execute):
            return await _run_async(spec, args, ctx, deadline)
        return await _run_sync_body(spec, args, ctx, deadline)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        # Only the runtime's own failure can land here (a body's is contained above).
        _runtime_failed(exc, spec, ctx)
        return ToolRun(error=ErrorCode.INTERNAL_ERROR)


def _runtime_failed(exc: BaseException, spec: ToolSpec, ctx: ToolContext) -> None:
    raised(
        TOOLS,
        f"fencepost's runtime, running tool {spec.name!r},",
        exc,
        run_id=ctx.run_id,
        call_id=ctx.idempotency_key,
        code=ErrorCode.INTERNAL_ERROR.value,
    )


def run_tool_blocking(
    spec: ToolSpec, args: BaseModel, ctx: ToolContext, *, timeout_seconds: float
) -> ToolRun:
    """:func:`run_tool` for the sync graph: the calling thread blocks until the result.

    A sync body is handed to the pool and waited for on a thread lock, with no event loop in
    between (a loop turn and a thread-safe wake-up cost several times the thread hop itself);
    an async body runs as :func:`run_tool` does, on the calling thread's own loop.
    """
    if _is_async(spec.execute):
        return run_sync(run_tool(spec, args, ctx, timeout_seconds=timeout_seconds))
    if not timeout_seconds > 0:  # NaN included
        return ToolRun(error=ErrorCode.TIMEOUT, never_started=True)
    deadline = time.monotonic() + timeout_seconds
    try:
        return _run_sync_body_blocking(spec, args, ctx, deadline)
    except Exception as exc:
        _runtime_failed(exc, spec, ctx)
        return ToolRun(error=ErrorCode.INTERNAL_ERROR)


def _run_sync_body_blocking(
    spec: ToolSpec, args: BaseModel, ctx: ToolContext, deadline: float
) -> ToolRun:
    pool = _threads
    job = pool.start_blocking(_body(spec, args, ctx, deadline), deadline, _tenant_of(ctx))
    if job is None:
        return ToolRun(error=ErrorCode.UNAVAILABLE, never_started=True)
    try:
        finished = job.wait(deadline - time.monotonic())
    except BaseException:
        # The caller's own interruption (Ctrl-C while it waits): the body is left behind.
        pool.abandon(job)
        raise
    if not finished:
        return _past_deadline(pool, job, deadline)
    return _result(job.outcome or Outcome(error=ErrorCode.TIMEOUT), deadline)


# ---------------------------------------------------------------------------------------------
# One sync callable with a deadline: an approver, a needs-approval predicate, a sync model
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallableRun:
    """How one sync callable handed to :func:`run_callable` ended."""

    finished: bool
    """It returned or raised by its deadline; ``False``: left behind at it, or never started
    (no time left, or no thread for its tenant)."""
    value: Any = None
    """What it returned in time, as it returned it (an awaitable is not judged here)."""
    raised: BaseException | None = None
    """What it raised in time, for the caller to log and fail closed on; never kept."""
    never_started: bool = False
    """It was never called (no time left, no thread for its tenant, or withdrawn before a thread
    took it): nothing it would have done happened."""


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` makes a coroutine (an ``async def`` function or ``__call__``):
    such a callable runs on the caller's loop, any other on a thread (:func:`run_callable`)."""
    return _is_async(fn)


class _Returned:
    """A callable's value, boxed so the pool hands it back as it is."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _Raised:
    """What a callable raised, boxed: the pool keeps only a code for what a body raises."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _boxed(fn: Callable[[], Any]) -> Callable[[], Any]:
    context = contextvars.copy_context()

    def run() -> Any:
        try:
            return _Returned(context.run(fn))
        except BaseException as exc:  # contained: the caller decides what it means
            return _Raised(exc)

    return run


def _callable_ended(outcome: Outcome, deadline: float) -> CallableRun:
    boxed = outcome.value
    if outcome.finished > deadline or outcome.error is not None:
        return CallableRun(finished=False)
    if isinstance(boxed, _Raised):
        return CallableRun(finished=True, raised=boxed.exc)
    return CallableRun(finished=True, value=boxed.value if isinstance(boxed, _Returned) else None)


_NEVER_STARTED = CallableRun(finished=False, never_started=True)


def run_callable_blocking(
    fn: Callable[[], Any], *, timeout_seconds: float, tenant: str
) -> CallableRun:
    """:func:`run_callable` for a caller with no event loop to wait on (a gate judging a batch,
    a tool's own rule): the calling thread blocks on a thread lock no longer than
    ``timeout_seconds``; past it, ``fn`` is left behind (or withdrawn if no thread took it yet)
    and its late answer is never heard. Never raises except the caller's own interruption."""
    if not timeout_seconds > 0:  # NaN included
        return _NEVER_STARTED
    deadline = time.monotonic() + timeout_seconds
    pool = _threads
    job = pool.start_blocking(_boxed(fn), deadline, str.__str__(tenant))
    if job is None:
        return _NEVER_STARTED
    try:
        finished = job.wait(deadline - time.monotonic())
    except BaseException:
        # The caller's own interruption (Ctrl-C while it waits): the callable is left behind.
        pool.abandon(job)
        raise
    if not finished:
        left = pool.abandon(job)
        if left is not Left.FINISHED:
            return _NEVER_STARTED if left is Left.WITHDRAWN else CallableRun(finished=False)
    return _callable_ended(job.outcome or Outcome(error=ErrorCode.TIMEOUT), deadline)


async def run_callable_watched(
    fn: Callable[[], Any],
    *,
    tenant: str,
    answer_by: Callable[[], float],
    gives_up: Callable[[], bool],
) -> CallableRun:
    """Run the sync callable ``fn`` on a fencepost thread from ``tenant``'s share, as
    :func:`run_callable` does, for as long as ``fn``'s own clock allows: ``answer_by()`` is the
    ``time.monotonic()`` instant to look again (``fn`` may move it while it runs), and
    ``gives_up()``, asked then, says (once and for all) that ``fn`` is past its time: it is left
    behind, its late answer never heard. A thread is waited for no later than the first
    ``answer_by()``. Never raises except the caller's own cancellation."""
    pool = _threads
    job = await pool.start(_boxed(fn), answer_by(), str.__str__(tenant))
    if job is None:
        return _NEVER_STARTED
    future = job.future
    try:
        while not await within(future, min(answer_by(), _FAR) - time.monotonic()):
            if gives_up():
                break
    except asyncio.CancelledError:
        pool.abandon(job)
        raise
    outcome = future.result() if future.done() else None  # never cancelled by `within`
    if outcome is not None:
        return _callable_ended(outcome, math.inf)
    future.cancel()
    if pool.abandon(job) is not Left.FINISHED:
        return CallableRun(finished=False)
    return _callable_ended(job.outcome or Outcome(error=ErrorCode.TIMEOUT), math.inf)


_FAR = 3600.0
"""The longest one wait of :func:`run_callable_watched` before it looks again."""


async def run_callable(
    fn: Callable[[], Any], *, timeout_seconds: float, tenant: str
) -> CallableRun:
    """Run the sync callable ``fn`` on a fencepost thread from ``tenant``'s share, as a sync tool
    body runs, and wait for it no longer than ``timeout_seconds``: past it, it is left behind
    (its thread is abandoned, its late answer never heard) and the caller goes on. Never raises
    except the caller's own cancellation."""
    if not timeout_seconds > 0:  # NaN included
        return _NEVER_STARTED
    deadline = time.monotonic() + timeout_seconds
    pool = _threads
    job = await pool.start(_boxed(fn), deadline, str.__str__(tenant))
    if job is None:
        return _NEVER_STARTED
    try:
        outcome = await settled_within(job.future, deadline - time.monotonic())
    except asyncio.CancelledError:
        pool.abandon(job)
        raise
    if outcome is not None:
        return _callable_ended(outcome, deadline)
    left = pool.abandon(job)
    if left is not Left.FINISHED:  # an enum member is always true: compare it
        return CallableRun(finished=False, never_started=left is Left.WITHDRAWN)
    return _callable_ended(job.outcome or Outcome(error=ErrorCode.TIMEOUT), deadline)
