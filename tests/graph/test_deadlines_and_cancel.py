"""Deadlines reach the model and tools as stage deadlines; cancellation is never swallowed."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

import pytest

import fencepost as fp
from tests.graph.kit import budget, call, context, harness, thread


def test_a_hung_tool_is_cut_at_its_stage_deadline_with_a_timeout_code() -> None:
    h = harness([call("hang", 1), fp.AbstainProposal(reason="insufficient_evidence")])
    started = time.monotonic()
    state = h.run(ctx=context(seconds=30))
    assert time.monotonic() - started < 5
    assert state.observations[0].error_code is fp.ErrorCode.TIMEOUT
    assert state.receipts[0].status is fp.ReceiptStatus.FAILED
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE


async def test_run_deadline_ends_the_run_promptly_not_after_the_hung_call() -> None:
    h = harness([call("hang", 1), call(n=2)])
    # The hang tool allows 0.3 s; give the run less than that.
    started = time.monotonic()
    out = await h.graph.ainvoke(fp.start("q", budget()), thread(), context=context(seconds=0.15))
    state = fp.run_output(out)
    assert time.monotonic() - started < 2
    assert state.termination is fp.TerminationReason.DEADLINE_EXCEEDED
    assert h.model.calls == 1


def test_the_model_receives_the_run_deadline_as_its_stage_deadline() -> None:
    seen: list[datetime] = []

    class Model:
        async def decide(
            self, input: fp.DecisionInput, *, deadline: fp.Deadline
        ) -> fp.AbstainProposal:
            seen.append(deadline.at)
            return fp.AbstainProposal(reason="insufficient_evidence")

    from langgraph.checkpoint.memory import InMemorySaver

    from tests.graph.kit import Calls, make_registry

    graph = fp.build_agent_graph(
        make_registry(Calls()), Model(), model_timeout_seconds=600
    ).compile(checkpointer=InMemorySaver())
    ctx = context(seconds=20)
    graph.invoke(fp.start("q", budget()), thread(), context=ctx)
    assert ctx.deadline is not None and seen == [ctx.deadline.at]


def test_a_tool_gets_the_smaller_of_run_deadline_and_its_timeout() -> None:
    got: list[fp.ToolContext] = []
    from tests.graph.kit import Calls, SearchArgs, make_registry

    def probe(args: SearchArgs, ctx: fp.ToolContext) -> dict[str, bool]:
        got.append(ctx)
        return {"ok": True}

    spec = fp.ToolSpec(
        name="probe",
        description="p",
        args_model=SearchArgs,
        effect="read",
        capability="logs:read",
        timeout_seconds=2,
        execute=probe,
    )
    h = harness(
        [call("probe", 1, query="x"), fp.AbstainProposal(reason="insufficient_evidence")],
        registry=make_registry(Calls(), extra=[spec]),
    )
    ctx = context(seconds=60)
    h.run(ctx=ctx)
    assert ctx.deadline is not None
    remaining = (got[0].deadline.at - ctx.deadline.at).total_seconds()
    assert remaining < -50  # two seconds from now, well before the run's sixty


async def test_cancelling_the_ainvoke_task_reraises_cancelled_error() -> None:
    h = harness([call("hang", 1)])
    config = thread()
    task = asyncio.create_task(
        h.graph.ainvoke(fp.start("q", budget()), config, context=context(seconds=30))
    )
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_cancel_closes_the_thread_as_cancelled_with_a_durable_record() -> None:
    h = harness([call(n=1), call(n=2), call(n=3)])
    config, ctx = thread(), context()
    await h.graph.ainvoke(fp.start("q", budget()), config, context=ctx, interrupt_after=["execute"])
    state = await fp.acancel(h.graph, config, context=ctx)
    assert state is not None and state.termination is fp.TerminationReason.CANCELLED
    stored = fp.run_output((await h.graph.aget_state(config)).values)
    assert stored.termination is fp.TerminationReason.CANCELLED
    assert stored.manifests[-1].code == "cancelled"
    # Idempotent: a second cancel changes nothing.
    again = await fp.acancel(h.graph, config, context=ctx)
    assert again == stored
