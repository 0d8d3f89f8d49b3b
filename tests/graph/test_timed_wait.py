"""A deadline wait that ends early keeps nothing of its caller alive.

``asyncio.wait(timeout=...)`` leaves its cancelled timer in the loop until the timeout would have
passed, holding the caller's context (for a node: LangGraph's config and the step's writes): with
a two-minute model timeout and many runs in flight that was more memory than the runs themselves.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from fencepost.graph.containment.model import run_model
from fencepost.graph.containment.waiting import within

PAYLOAD: contextvars.ContextVar[object] = contextvars.ContextVar("payload")


class Payload:
    """Stands for a step's context: config, scratchpad, writes."""


def _kept_alive(wait: Callable[[asyncio.Future[Any]], Awaitable[object]]) -> bool:
    async def caller() -> weakref.ref[Payload]:
        payload = Payload()
        PAYLOAD.set(payload)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.set_result, "done")
        await wait(future)
        return weakref.ref(payload)

    async def main() -> bool:
        # Another run's pending timer, due earlier: a cancelled timer at the head of the queue is
        # dropped at once, one behind it stays until it is due (as with many runs in flight).
        other = asyncio.get_running_loop().call_later(1800, lambda: None)
        ref = await asyncio.ensure_future(caller())  # a task: a context of its own
        await asyncio.sleep(0)
        gc.collect()
        other.cancel()
        return ref() is not None

    return asyncio.run(main())


def test_asyncio_wait_keeps_the_callers_context_until_its_timeout_would_have_passed() -> None:
    # Pins why `within` exists: if this stops holding, asyncio.wait is fine again.
    assert _kept_alive(lambda f: asyncio.wait({f}, timeout=3600))


def test_a_deadline_wait_that_ends_early_keeps_nothing_of_its_caller_alive() -> None:
    assert not _kept_alive(lambda f: within(f, 3600))


def test_a_model_call_that_ends_early_keeps_nothing_of_its_caller_alive() -> None:
    async def answer() -> str:
        return "ok"

    async def model(_: asyncio.Future[Any]) -> object:
        return await run_model(answer, 3600)

    assert not _kept_alive(model)


def test_a_deadline_wait_times_out_without_cancelling_the_future() -> None:
    async def main() -> tuple[bool, bool]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done = await within(future, 0.01)
        return done, future.cancelled()

    assert asyncio.run(main()) == (False, False)


def test_the_callers_cancellation_reaches_the_caller_and_leaves_the_future_alone() -> None:
    async def main() -> bool:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = asyncio.ensure_future(within(future, 3600))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return future.cancelled()

    assert asyncio.run(main()) is False
