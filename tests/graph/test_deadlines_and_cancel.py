"""Deadlines reach the model and tools as stage deadlines; cancellation is never swallowed."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest

import fencepost as fp
from fencepost.policy.deadline import FakeClock
from fencepost.policy.tool_decorator import tool
from tests.graph.kit import Calls, budget, call, context, harness, make_registry, thread


def _stalls(timeout: float, cut: list[str], seen: list[fp.ToolContext]) -> fp.ToolSpec:
    """A tool that would take a minute; records its context, and its cut if it is cancelled."""

    @tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=timeout)
    async def stalls(ctx: fp.ToolContext) -> dict[str, bool]:
        """Takes a minute."""
        seen.append(ctx)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cut.append(ctx.idempotency_key)
            raise
        return {"never": True}

    return stalls


def test_a_hung_tool_is_cut_at_its_stage_deadline_with_a_timeout_code() -> None:
    # Cut, not waited for: a late value would be a timeout too, but the body is cancelled at
    # its await. Proved by the cancellation, not by a stopwatch a busy machine would stop.
    cut: list[str] = []
    registry = make_registry(Calls(), extra=[_stalls(0.3, cut, [])])
    h = harness(
        [call("stalls", 1), fp.AbstainProposal(reason="insufficient_evidence")], registry=registry
    )
    state = h.run(ctx=context(seconds=30))
    assert cut == ["call-0001"]
    assert state.observations[0].error_code is fp.ErrorCode.TIMEOUT
    assert state.receipts[0].status is fp.ReceiptStatus.FAILED
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE


async def test_run_deadline_ends_the_run_promptly_not_after_the_hung_call() -> None:
    # The run has 0.15 s left, the call allows itself 30: the call gets the run's deadline, is
    # cut there, and the model is not asked again. The run's deadline is on a fake clock the
    # call moves past it, so a busy machine cannot spend the run's time before it starts.
    clock = FakeClock()
    cut: list[str] = []
    seen: list[fp.ToolContext] = []
    stalls = _stalls(30, cut, seen)
    original = stalls.execute

    async def moves_the_clock(args: Any, ctx: fp.ToolContext) -> Any:
        clock.advance(1)
        return await original(args, ctx)

    registry = make_registry(
        Calls(), extra=[stalls.model_copy(update={"execute": moves_the_clock})]
    )
    h = harness([call("stalls", 1), call(n=2)], registry=registry, clock=clock)
    ctx = context(deadline=fp.Deadline.after(0.15, clock=clock))
    out = await h.graph.ainvoke(fp.start("q", budget()), thread(), context=ctx)
    state = fp.run_output(out)
    assert ctx.deadline is not None and [c.deadline.at for c in seen] == [ctx.deadline.at]
    assert cut == ["call-0001"]
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

    graph = fp.build_agent_graph(
        make_registry(Calls()), Model(), model_timeout_seconds=600
    ).compile(checkpointer=InMemorySaver())
    ctx = context(seconds=20)
    graph.invoke(fp.start("q", budget()), thread(), context=ctx)
    assert ctx.deadline is not None and seen == [ctx.deadline.at]


def test_a_tool_gets_the_smaller_of_run_deadline_and_its_timeout() -> None:
    got: list[fp.ToolContext] = []
    from tests.graph.kit import SearchArgs

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
    clock = FakeClock()  # "now" stays put, however long the machine takes to get there
    h = harness(
        [call("probe", 1, query="x"), fp.AbstainProposal(reason="insufficient_evidence")],
        registry=make_registry(Calls(), extra=[spec]),
        clock=clock,
    )
    h.run(ctx=context(deadline=fp.Deadline.after(60, clock=clock)))
    assert [c.deadline.at for c in got] == [clock.now() + timedelta(seconds=2)]


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
