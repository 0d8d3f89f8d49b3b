"""An approver that ignores its cancellation is contained as a tool body is (DESIGN, "Isolation:
runs, tenants, callers"): abandoned at its deadline, it never holds ``invoke`` or ``ainvoke``
past the run's deadline, and whatever it answers later is never heard.

Each scenario runs under ``finishes``, so a caller held by the approver fails the test instead
of hanging the suite; the hostile approver stops for good when the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import fencepost as fp
from tests.graph.kit import ABSTAIN, budget, call, context, harness, thread
from tests.graph.test_tool_isolation import finishes


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    """Set when the test ends: the one thing the hostile approver obeys."""
    event = threading.Event()
    yield event
    event.set()


def never_answers(stop: threading.Event, asked: list[str]) -> Any:
    """An async approver that swallows every cancellation and approves only once told to stop."""

    async def approver(request: fp.ApproverInput) -> fp.ApproverDecision:
        asked.append(request.proposal.call_id)
        while not stop.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)
        return fp.ApproverDecision.approve()

    return approver


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_an_approver_that_ignores_cancellation_never_holds_its_caller_past_the_deadline(
    stop: threading.Event, mode: str
) -> None:
    asked: list[str] = []
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approver=never_answers(stop, asked))
    # Long enough for a machine whose cores are all busy to reach the approval before the run's
    # deadline; the approver, not the caller, is what waits it out.
    request, config, ctx = fp.start("q", budget()), thread(), context(seconds=3)

    def run() -> dict[str, Any]:
        if mode == "invoke":
            out: dict[str, Any] = h.graph.invoke(request, config, context=ctx)
            return out
        return asyncio.run(h.graph.ainvoke(request, config, context=ctx))

    out = finishes(run, within=60)
    stop.set()  # the approver would approve now: nobody is listening any more
    state = fp.run_output(out)
    assert asked == ["call-0001"]
    assert state.termination is not None
    assert h.calls.log == []
    assert state.receipts[0].rule == "approver_timeout"
