"""A coroutine on a leash: stepped for its task until dropped, then closed and never stepped again.

An async tool body (and a model call) runs as a task on its caller's loop, where its clients
live, and a task cannot be moved to another loop. Cancelling the task does not stop a body that
swallows its ``CancelledError``: left behind, it would go on running on that loop, slowing
every other run there (fifty such bodies, each holding the loop 10 ms a step, made a 30 ms run
miss its 3 s deadline) and holding the loop's shutdown for ever (``asyncio.run`` cancels what is
left on its loop and waits for it to end).

So the body's coroutine is driven through a :class:`Leash`: a trampoline, run by the task,
that forwards every step (each ``send`` and ``throw``) to the body — transparently: the body sees
its own task, its context and its cancellation, as if it were the task's own coroutine. Once
:meth:`Leash.drop` is called, the next step is not forwarded: the body is closed instead
(``GeneratorExit`` at its ``await``, so its ``finally`` blocks and context managers' exits run)
and the task ends cancelled; ``drop`` cancels the task so that step comes at once.

A body that swallows even its closing (an ``except BaseException`` around an ``await``) stays
suspended where it awaited, and is never stepped again. It is kept referenced (the latest
``_ZOMBIES``): collected, the interpreter would close it again, running its code once more and
reporting (on stderr) that it ignored ``GeneratorExit`` — as it still does for these at exit.

What a leash cannot hold: tasks, threads or callbacks the body started itself, and a body that
holds the loop without awaiting (``time.sleep`` in an ``async def``) until it returns — nothing
running on a loop can interrupt that.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections import deque
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

__all__ = ["GRACE_SECONDS", "Leash"]

T = TypeVar("T")

GRACE_SECONDS = 0.02
"""How long a cancelled body may take to stop (its own clean-up) before it is dropped."""

_ZOMBIES = 1024
_zombies: deque[Coroutine[Any, Any, Any]] = deque(maxlen=_ZOMBIES)
"""Bodies that ignored their closing: suspended for good, referenced so they are not closed
again at collection (an older one beyond the bound is, and the interpreter reports it)."""


class Leash:
    """Holds one coroutine for the task that runs it; :meth:`drop` stops it for good."""

    __slots__ = ("_dropped",)

    def __init__(self) -> None:
        self._dropped = False

    def hold(self, coro: Coroutine[Any, Any, T]) -> _Held[T]:
        """``coro`` as an awaitable to await in the task (in its place)."""
        return _Held(self, coro)

    @property
    def dropped(self) -> bool:
        """Whether the coroutine is no longer stepped."""
        return self._dropped

    def drop(self, task: asyncio.Future[Any]) -> None:
        """Stop stepping the coroutine: ``task`` (the one awaiting it) is cancelled, and at its
        next step the coroutine is closed and the task ends. Call on ``task``'s loop."""
        self._dropped = True
        task.cancel()


class _Held(Generic[T]):
    __slots__ = ("_coro", "_leash")

    def __init__(self, leash: Leash, coro: Coroutine[Any, Any, T]) -> None:
        self._leash = leash
        self._coro = coro

    def __await__(self) -> Generator[Any, Any, T]:
        return _walk(self._leash, self._coro)


def _walk(leash: Leash, coro: Coroutine[Any, Any, T]) -> Generator[Any, Any, T]:
    """Forward each step to ``coro`` until ``leash`` is dropped (``yield from``, checked)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        if leash.dropped:
            _close(coro)
            raise asyncio.CancelledError
        try:
            if error is None:
                step = coro.send(value)
            else:
                thrown, error = error, None
                step = coro.throw(thrown)
        except StopIteration as stop:
            result: T = stop.value
            return result
        try:
            value = yield step
        except GeneratorExit:  # the task itself is being closed (its loop went away)
            _close(coro)
            raise
        except BaseException as exc:  # the task's cancellation, or a future's exception
            value, error = None, exc


def _close(coro: Coroutine[Any, Any, Any]) -> None:
    with contextlib.suppress(BaseException):  # whatever its clean-up raised is dropped with it
        coro.close()
    if inspect.getcoroutinestate(coro) == inspect.CORO_SUSPENDED:
        _zombies.append(coro)  # it awaited again instead of closing: never stepped again
