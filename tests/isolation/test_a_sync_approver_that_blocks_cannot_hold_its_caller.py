"""A sync approver runs off the caller's thread, as a sync tool body does (DESIGN, "Isolation:
runs, tenants, callers"): one that blocks is left behind at its deadline, so it never holds
``invoke`` or ``ainvoke`` while it blocks, and its late answer is never heard.

Each scenario runs under ``finishes``, so a caller held by the approver fails the test instead
of hanging the suite; the blocked approver is released when the test ends.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import fencepost as fp
from tests.graph.kit import ABSTAIN, budget, call, context, harness, thread
from tests.graph.test_tool_isolation import finishes


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set when the test ends: the one thing the blocked approver waits for."""
    event = threading.Event()
    yield event
    event.set()


def blocks_until(release: threading.Event, asked: list[str]) -> Any:
    """A sync approver that blocks its thread until released, then approves."""

    def approver(request: fp.ApproverInput) -> fp.ApproverDecision:
        asked.append(request.proposal.call_id)
        release.wait()
        return fp.ApproverDecision.approve()

    return approver


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_sync_approver_that_blocks_never_holds_its_caller_past_the_deadline(
    release: threading.Event, mode: str
) -> None:
    asked: list[str] = []
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approver=blocks_until(release, asked))
    # Long enough for a machine whose cores are all busy to reach the approval before the run's
    # deadline; the approver, not the caller, is what waits it out.
    request, config, ctx = fp.start("q", budget()), thread(), context(seconds=3)

    def run() -> dict[str, Any]:
        if mode == "invoke":
            out: dict[str, Any] = h.graph.invoke(request, config, context=ctx)
            return out
        return asyncio.run(h.graph.ainvoke(request, config, context=ctx))

    out = finishes(run, within=60)
    release.set()  # the approver approves now: nobody is listening any more
    state = fp.run_output(out)
    assert asked == ["call-0001"]
    assert state.termination is not None
    assert h.calls.log == []
    assert state.receipts[0].rule == "approver_timeout"
