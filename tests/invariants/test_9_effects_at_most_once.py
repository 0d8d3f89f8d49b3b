"""Invariant 9: a write/external effect runs at most once per call id, and when it is unknown
whether the effect happened the receipt says ``uncertain`` instead of guessing.

A write cut off after its body started — at its timeout, whether the body is a ``def`` left
behind on its thread or an ``async def`` cancelled at its await — may have had its effect: the
outcome is unknown whatever the body's kind, so it is never reported as a plain failure.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from langgraph.types import Command

import fencepost as fp
from fencepost.policy import ErrorCode, ReceiptStatus
from fencepost.policy.batch import BatchEntry
from fencepost.policy.execution import ran
from fencepost.policy.verdict import Verdict, VerdictCode
from tests.graph.kit import ABSTAIN, call, context, harness, thread
from tests.graph.test_tool_isolation import NoArgs
from tests.policy.factories import make_spec


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def _write(kind: str, effect: fp.Effect, started: list[str], gate: threading.Event) -> fp.ToolSpec:
    def sync_body(_: NoArgs, ctx: fp.ToolContext) -> str:
        started.append(ctx.idempotency_key)
        gate.wait(10)  # past its deadline
        return "written"

    async def async_body(_: NoArgs, ctx: fp.ToolContext) -> str:
        started.append(ctx.idempotency_key)
        await asyncio.sleep(30)  # past its deadline; honours its cancellation
        return "written"

    return fp.ToolSpec(
        name="restart_service",
        description="Restart a service.",
        args_model=NoArgs,
        effect=effect,
        capability="notes:write",
        timeout_seconds=0.05,
        execute=sync_body if kind == "sync" else async_body,
    )


@pytest.mark.parametrize("effect", [fp.Effect.WRITE, fp.Effect.EXTERNAL])
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_a_write_cut_off_at_its_timeout_is_uncertain_whatever_its_bodys_kind(
    effect: fp.Effect, kind: str, mode: str, release: threading.Event
) -> None:
    started: list[str] = []
    tool = _write(kind, effect, started, release)
    h = harness([call(tool.name), ABSTAIN], registry=fp.ToolRegistry([tool]), approval="interrupt")
    config, ctx = thread(), context()
    request = fp.start(
        "restart checkout", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=2)
    )
    if mode == "invoke":
        paused = h.graph.invoke(request, config, context=ctx)
        out = h.graph.invoke(Command(resume="approve"), config, context=ctx)
    else:
        paused = await h.graph.ainvoke(request, config, context=ctx)
        out = await h.graph.ainvoke(Command(resume="approve"), config, context=ctx)
    assert "__interrupt__" in paused
    state = fp.run_output(out)
    assert started == ["call-0001"]  # it started: whatever it did may have happened
    assert [(r.status, r.error_code) for r in state.receipts] == [
        (ReceiptStatus.UNCERTAIN, ErrorCode.EXECUTION_UNCERTAIN)
    ]
    assert state.report is not None
    assert state.report.effects_made == ("call-0001",)
    assert [c.call_id for c in state.report.uncertain] == ["call-0001"]


def test_a_read_cut_off_at_its_timeout_is_a_timeout_failure() -> None:
    async def slow(_: NoArgs, __: fp.ToolContext) -> str:
        await asyncio.sleep(30)
        return "late"

    tool = make_spec("slow_read", args_model=NoArgs, execute=slow)
    tool = tool.model_copy(update={"timeout_seconds": 0.05})
    h = harness([call(tool.name), ABSTAIN], registry=fp.ToolRegistry([tool]))
    state = h.run()
    assert [(r.status, r.error_code) for r in state.receipts] == [
        (ReceiptStatus.FAILED, ErrorCode.TIMEOUT)
    ]


@pytest.mark.parametrize("effect", [fp.Effect.WRITE, fp.Effect.EXTERNAL])
def test_the_outcome_of_a_cut_off_write_is_uncertain_and_of_a_write_that_never_started_is_not(
    effect: fp.Effect,
) -> None:
    write = make_spec("restart_service", effect=effect, capability="notes:write")
    entry = _entry(write.name)
    cut = ran(entry, write, 1, error=ErrorCode.TIMEOUT, cut_off=True)
    assert (cut.status, cut.event.error_code) == (  # type: ignore[union-attr]
        ReceiptStatus.UNCERTAIN,
        ErrorCode.EXECUTION_UNCERTAIN,
    )
    never = ran(entry, write, 1, error=ErrorCode.UNAVAILABLE)
    assert (never.status, never.event.error_code) == (  # type: ignore[union-attr]
        ReceiptStatus.FAILED,
        ErrorCode.UNAVAILABLE,
    )
    read = make_spec("search_logs")
    timed_out = ran(_entry(read.name), read, 1, error=ErrorCode.TIMEOUT, cut_off=True)
    assert timed_out.status is ReceiptStatus.FAILED


def _entry(name: str) -> BatchEntry:
    proposal = fp.ToolProposal(call_id="call-0001", tool_name=name, arguments={})
    verdict = Verdict(
        call_id="call-0001", tool_name=name, fingerprint="f", code=VerdictCode.ALLOWED
    )
    return BatchEntry(proposal=proposal, verdict=verdict)
