"""A ``needs_approval`` callable is contained as an approver is (DESIGN, "Isolation: runs,
tenants, callers"; invariant 2): whatever it raises (its own ``CancelledError``,
``GeneratorExit`` or ``SystemExit`` included), a hang past its timeout, or an answer that is not
a bool means the call needs approval — never that it may run unasked. What it raised is logged
with its traceback on ``fencepost.approval`` and never reaches the checkpoint; one that blocks
or ignores its cancellation is left behind and never holds ``invoke`` or ``ainvoke``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fencepost as fp
from fencepost.policy.conditional_approval import ApprovalQuestion
from tests.graph.kit import ABSTAIN, Calls, budget, call, context, harness, thread
from tests.graph.test_tool_isolation import finishes

SECRET = "password=hunter2"


def graph_with(decider: Callable[[ApprovalQuestion], Any]) -> tuple[Any, Calls]:
    calls = Calls()

    @fp.tool(effect="write", capability="notes:write", needs_approval=decider)
    def write_note(note: str, ctx: fp.ToolContext) -> dict[str, Any]:
        """Write a note."""
        calls.log.append(("write_note", {"note": note}, ctx.idempotency_key))
        return {"written": True}

    script = [call("write_note", 1, note="hi"), ABSTAIN, ABSTAIN]
    return harness(script, registry=fp.ToolRegistry([write_note]), calls=calls), calls


def raising(exc: BaseException) -> Callable[[ApprovalQuestion], bool]:
    def decider(question: ApprovalQuestion) -> bool:
        raise exc

    return decider


def async_raising(exc: BaseException) -> Callable[[ApprovalQuestion], Any]:
    async def decider(question: ApprovalQuestion) -> bool:
        raise exc

    return decider


def answering(value: Any) -> Callable[[ApprovalQuestion], Any]:
    return lambda question: value


MISBEHAVING = {
    "raises": raising(RuntimeError(SECRET)),
    "raises-cancelled": raising(asyncio.CancelledError(SECRET)),
    "raises-generator-exit": raising(GeneratorExit(SECRET)),
    "raises-system-exit": raising(SystemExit(SECRET)),
    "async-raises": async_raising(RuntimeError(SECRET)),
    "async-raises-cancelled": async_raising(asyncio.CancelledError(SECRET)),
    "answers-1": answering(1),
    "answers-none": answering(None),
    "answers-no": answering("no"),
    "answers-0": answering(0),
}


@pytest.mark.parametrize("name", list(MISBEHAVING))
def test_a_needs_approval_that_misbehaves_means_the_call_needs_approval(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    h, calls = graph_with(MISBEHAVING[name])
    config = thread()
    with caplog.at_level(logging.WARNING, logger="fencepost.approval"):
        out = h.graph.invoke(fp.start("q", budget()), config, context=context())
    assert calls.log == []
    assert fp.run_output(out).termination is fp.TerminationReason.APPROVAL_REQUIRED
    logged = [r for r in caplog.records if getattr(r, "code", None) == "needs_approval_failed"]
    assert len(logged) == 1
    assert (logged[0].exc_info is not None) is name.startswith(("raises", "async-raises"))
    assert SECRET not in json.dumps(h.graph.get_state(config).values, default=str)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set when the test ends: the one thing the blocked callables obey."""
    event = threading.Event()
    yield event
    event.set()


def blocks(release: threading.Event) -> Callable[[ApprovalQuestion], bool]:
    def decider(question: ApprovalQuestion) -> bool:
        release.wait()
        return False

    return decider


def ignores_cancellation(release: threading.Event) -> Callable[[ApprovalQuestion], Any]:
    async def decider(question: ApprovalQuestion) -> bool:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)
        return False

    return decider


@pytest.mark.parametrize("kind", ["sync-blocks", "async-ignores-cancellation"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_needs_approval_that_hangs_never_holds_its_caller_and_means_approval(
    release: threading.Event, kind: str, mode: str
) -> None:
    decider = blocks(release) if kind == "sync-blocks" else ignores_cancellation(release)
    h, calls = graph_with(decider)
    request, config, ctx = fp.start("q", budget()), thread(), context(seconds=0.5)

    def run() -> dict[str, Any]:
        if mode == "invoke":
            out: dict[str, Any] = h.graph.invoke(request, config, context=ctx)
            return out
        return asyncio.run(h.graph.ainvoke(request, config, context=ctx))

    out = finishes(run, within=60)
    release.set()  # it would say "no approval needed" now: nobody is listening any more
    assert calls.log == []
    assert fp.run_output(out).termination is not None
    assert fp.run_output(out).termination is not fp.TerminationReason.COMPLETED
