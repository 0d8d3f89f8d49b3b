"""Parallel batches are gated and reserved as a whole (their join by call id is invariant 8); sync
and async tools both run."""

from __future__ import annotations

import asyncio
from typing import Any

import fencepost as fp
from tests.graph.kit import Calls, SearchArgs, budget, call, context, harness, make_registry, thread


def test_with_n_calls_left_exactly_n_of_a_batch_run() -> None:
    batch = fp.ToolBatch(calls=tuple(call(n=i) for i in range(1, 4)))
    h = harness([batch])
    state = h.run(tools=2)
    assert h.calls.count("search_logs") == 2
    assert state.budget.tool_calls_used == 2
    assert state.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    # Partial success is reported as such: two done, the third not done and never started.
    assert [(r.call_id, r.status, r.attempts) for r in state.receipts] == [
        ("call-0001", fp.ReceiptStatus.COMPLETED, 1),
        ("call-0002", fp.ReceiptStatus.COMPLETED, 1),
        ("call-0003", fp.ReceiptStatus.DENIED, 0),
    ]


def test_one_denied_call_stops_the_whole_batch_before_any_runs() -> None:
    batch = fp.ToolBatch(calls=(call(n=1), call("admin_reset", 2)))
    h = harness([batch])
    state = h.run()
    assert h.calls.log == []
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.budget.tool_calls_used == 0


def test_duplicate_call_ids_in_a_batch_are_an_invalid_proposal() -> None:
    batch = fp.ToolBatch(calls=(call(n=1), call(n=1, query="other")))
    h = harness([batch])
    state = h.run()
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert h.calls.log == []


async def test_async_invoke_runs_sync_and_async_tools() -> None:
    h = harness([call(n=1), call("write_note", 2, note="x")], approval="interrupt")
    config, ctx = thread(), context()
    await h.graph.ainvoke(fp.start("q", budget()), config, context=ctx)
    from langgraph.types import Command

    await h.graph.ainvoke(Command(resume="approve"), config, context=ctx)
    assert [name for name, _, _ in h.calls.log] == ["search_logs", "write_note"]


def test_sync_invoke_works_inside_a_running_event_loop() -> None:
    # A notebook calls graph.invoke from a thread that already runs a loop.
    h = harness([call(n=1), fp.AbstainProposal(reason="insufficient_evidence")])

    async def inside_loop() -> fp.AgentState:
        return fp.run_output(h.graph.invoke(fp.start("q", budget()), thread(), context=context()))

    state = asyncio.run(inside_loop())
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    assert h.calls.count("search_logs") == 1


def test_accepted_work_is_receipted_as_pending_not_completed() -> None:
    calls = Calls()

    def upload(args: SearchArgs, ctx: fp.ToolContext) -> fp.Accepted:
        return fp.Accepted(task_id="task-17")

    spec = fp.ToolSpec(
        name="upload",
        description="u",
        args_model=SearchArgs,
        effect="read",
        capability="logs:read",
        timeout_seconds=5,
        execute=upload,
    )
    h = harness(
        [call("upload", 1, query="doc"), fp.AbstainProposal(reason="insufficient_evidence")],
        registry=make_registry(calls, extra=[spec]),
    )
    state = h.run()
    assert state.receipts[0].status is fp.ReceiptStatus.ACCEPTED_PENDING
    assert state.observations[0].result == {"task_id": "task-17", "detail": {}}


def test_a_batch_never_has_more_calls_in_flight_than_the_concurrency_limit() -> None:
    calls = Calls()
    in_flight = 0
    peak = 0

    async def slow(args: SearchArgs, ctx: fp.ToolContext) -> dict[str, Any]:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return {"ok": True}

    spec = fp.ToolSpec(
        name="slow",
        description="s",
        args_model=SearchArgs,
        effect="read",
        capability="logs:read",
        timeout_seconds=5,
        execute=slow,
    )
    batch = fp.ToolBatch(calls=tuple(call("slow", i, query=f"q{i}") for i in range(1, 6)))
    h = harness(
        [batch, fp.AbstainProposal(reason="insufficient_evidence")],
        registry=make_registry(calls, extra=[spec]),
        max_concurrent_tools=2,
    )
    state = h.run(tools=5)
    assert len(state.observations) == 5
    assert peak == 2
