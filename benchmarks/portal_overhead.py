"""What running a coroutine from sync code, and a tool body, costs per call (``python
benchmarks/portal_overhead.py``).

Compares ``fencepost.graph.containment.shared_loop.run_sync`` (a loop per calling thread; a helper thread when
the caller's loop is running) with the shared portal loop it replaced and with ``asyncio.run``;
and ``run_tool`` (task + deadline for async bodies, the bounded pool for sync ones) with the
plain ``asyncio.wait_for`` / ``asyncio.to_thread`` it replaced. Each figure is the median of
interleaved rounds, in microseconds per call, for an empty coroutine or a body returning at once:
pure overhead, to set against a model call or a tool's own work.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import BaseModel, ConfigDict

from fencepost.graph.containment.shared_loop import run_sync
from fencepost.graph.containment.tools import run_tool
from fencepost.policy import Deadline, Effect, ToolContext, ToolSpec

ROUNDS = 7
CALLS = 300


# -- the designs compared ------------------------------------------------------------------------

_shared_loop = asyncio.new_event_loop()
threading.Thread(target=_shared_loop.run_forever, daemon=True).start()


def shared_portal(coro: Coroutine[Any, Any, Any]) -> Any:
    """The replaced design: one process-wide loop on a background thread."""
    return asyncio.run_coroutine_threadsafe(coro, _shared_loop).result()


def fresh_loop(coro: Coroutine[Any, Any, Any]) -> Any:
    """A new loop per call."""
    return asyncio.run(coro)


def helper_path(coro: Coroutine[Any, Any, Any]) -> Any:
    """run_sync called from a thread whose loop is running (a notebook, an async tool)."""
    return _notebook_loop.run_until_complete(_from_running_loop(coro))


async def _from_running_loop(coro: Coroutine[Any, Any, Any]) -> Any:
    return run_sync(coro)


_notebook_loop = asyncio.new_event_loop()


async def noop() -> None:
    return None


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _spec(execute: Callable[..., Any]) -> ToolSpec:
    return ToolSpec(
        name="probe",
        description="A probe.",
        args_model=NoArgs,
        effect=Effect.READ,
        capability="probe",
        timeout_seconds=60,
        execute=execute,
    )


def _sync_body(_: NoArgs, __: ToolContext) -> int:
    return 1


async def _async_body(_: NoArgs, __: ToolContext) -> int:
    return 1


CTX = ToolContext(run_id="r", tenant_id="t", principal_id="p", deadline=Deadline.after(3600))
ARGS = NoArgs()
SYNC_SPEC, ASYNC_SPEC = _spec(_sync_body), _spec(_async_body)


async def old_sync_tool() -> Any:
    return await asyncio.wait_for(asyncio.to_thread(_sync_body, ARGS, CTX), timeout=60)


async def old_async_tool() -> Any:
    return await asyncio.wait_for(_async_body(ARGS, CTX), timeout=60)


async def new_sync_tool() -> Any:
    return await run_tool(SYNC_SPEC, ARGS, CTX, timeout_seconds=60)


async def new_async_tool() -> Any:
    return await run_tool(ASYNC_SPEC, ARGS, CTX, timeout_seconds=60)


# -- measurement ---------------------------------------------------------------------------------


def per_call(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter() - start) / CALLS * 1e6


def tools_per_call(make: Callable[[], Coroutine[Any, Any, Any]]) -> float:
    async def many() -> float:
        start = time.perf_counter()
        for _ in range(CALLS):
            await make()
        return (time.perf_counter() - start) / CALLS * 1e6

    result: float = run_sync(many())
    return result


CASES: dict[str, Callable[[], float]] = {
    "portal: shared loop thread (replaced)": lambda: per_call(lambda: shared_portal(noop())),
    "portal: asyncio.run, a loop per call": lambda: per_call(lambda: fresh_loop(noop())),
    "portal: run_sync, caller's own loop": lambda: per_call(lambda: run_sync(noop())),
    "portal: run_sync, helper (loop running)": lambda: per_call(lambda: helper_path(noop())),
    "sync tool: wait_for + to_thread (replaced)": lambda: tools_per_call(old_sync_tool),
    "sync tool: run_tool, bounded pool": lambda: tools_per_call(new_sync_tool),
    "async tool: wait_for (replaced)": lambda: tools_per_call(old_async_tool),
    "async tool: run_tool, own task": lambda: tools_per_call(new_async_tool),
}


def main() -> None:
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for case in CASES.values():  # warm-up: loops, threads and pools exist before timing
        case()
    for _ in range(ROUNDS):
        for name, case in CASES.items():
            samples[name].append(case())
    width = max(map(len, CASES))
    print(f"{'case':<{width}}  median µs/call  (min-max over {ROUNDS} rounds of {CALLS})")
    for name, values in samples.items():
        print(
            f"{name:<{width}}  {statistics.median(values):>14.1f}  "
            f"({min(values):.1f}-{max(values):.1f})"
        )


if __name__ == "__main__":
    main()
