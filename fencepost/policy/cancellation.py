"""Whose cancellation it is: the caller's, which propagates, or an application callable's own.

Only the caller's own cancellation propagates out of ``invoke`` (invariant 1). An application
callable — a semantic validator, a progress predicate, an arguments model's validator, an
approver — may raise ``CancelledError`` or ``GeneratorExit`` itself while nobody cancelled the
run (a client library's internals, a ``Future`` cancelled elsewhere, a stray ``raise``). That is
its failure, contained with a safe code as any exception it raises is; let through, it would
escape ``invoke`` and leave the thread with no run and no cancel record.

The two are told apart by the running task, not by the exception: asyncio delivers a
cancellation only to a task that was asked to cancel (``Task.cancel`` counts in
``Task.cancelling()``), and a coroutine is closed on a leash only after its task was cancelled.
A callable that raises either while its task was never asked to stop, or with no task at all
(the sync graph), raised it on its own.
"""

from __future__ import annotations

import asyncio

__all__ = ["cancelled_by_caller"]


def cancelled_by_caller(exc: BaseException) -> bool:
    """Whether ``exc``, raised while an application callable ran, is the running task's own
    cancellation or closing (to propagate), rather than the callable's failure (to contain).

    >>> cancelled_by_caller(asyncio.CancelledError())  # no task was cancelled here
    False
    """
    # By its type alone: ``isinstance`` would ask an exception's own ``__class__``.
    if not issubclass(type(exc), (asyncio.CancelledError, GeneratorExit)):
        return False
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop: nothing here can be cancelled but by the callable
        return False
    return task is not None and task.cancelling() > 0
