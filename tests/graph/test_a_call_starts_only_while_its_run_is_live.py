"""A call starts only while its run is live, and a report that says ``never_started`` is true.

On a loaded machine a worker thread can be scheduled after a sync body's deadline: the caller
has given up on the call and its run goes on, ends and returns. Such a body must then never
start, and the call is reported as one that never started (not a failure, not an uncertain
write). A call of a batch still queued for a slot when another call fails the batch never
starts either, not even the next time its thread's loop runs.

The interleavings are forced, never waited for: a pool whose workers take a job only once the
test lets them (a scheduler that is late), and a ledger that fails one call's claim.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.graph.containment import tool_threads
from fencepost.graph.containment import tools as tool_runner
from fencepost.graph.containment.shared_loop import run_sync
from fencepost.policy.keys import started_key
from fencepost.policy.tool_decorator import tool
from tests.graph.kit import ABSTAIN, context, thread
from tests.graph.test_tool_isolation import wait_until


class LateWorkers(tool_threads.ToolThreads):
    """A pool whose workers take a job only once ``go`` is set: a machine so loaded that no
    worker thread is scheduled before the body's deadline, nor before its run returns."""

    def __init__(self) -> None:
        super().__init__(base=2, cap=4, tenant_cap=4)
        self.go = threading.Event()
        self.handing: list[threading.Thread] = []

    def _hand(self, job: tool_threads.Job, slot: Any) -> bool:
        def later() -> None:
            self.go.wait(120)
            tool_threads.ToolThreads._hand(self, job, slot)

        handing = threading.Thread(target=later, daemon=True)
        self.handing.append(handing)
        handing.start()
        return True

    def catch_up(self) -> None:
        """Let the late workers take their jobs, and wait until every one has ended."""
        self.go.set()
        for handing in self.handing:
            handing.join(60)
        wait_until(lambda: self.stats() == (0, 0), within=60)


@pytest.fixture
def late_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[LateWorkers]:
    pool = LateWorkers()
    monkeypatch.setattr(tool_runner, "_threads", pool)
    yield pool
    pool.go.set()


started: list[str] = []


@tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=0.05)
def probe(n: int, ctx: fp.ToolContext) -> dict[str, str]:
    """Read a probe."""
    started.append(ctx.idempotency_key)
    return {"probe": "ok"}


@tool(effect=fp.Effect.WRITE, capability="notes:write", timeout_seconds=0.05)
def write_probe(n: int, ctx: fp.ToolContext) -> dict[str, str]:
    """Write a probe."""
    started.append(ctx.idempotency_key)
    return {"written": "ok"}


def _graph(*calls: fp.ToolProposal, max_concurrent_tools: int = 8) -> Any:
    model = ScriptedDecisionModel(
        [fp.ToolBatch(calls=calls) if len(calls) > 1 else calls[0], ABSTAIN]
    )
    return fp.build_agent_graph(
        fp.ToolRegistry([probe, write_probe]),
        model,
        max_concurrent_tools=max_concurrent_tools,
    ).compile(checkpointer=InMemorySaver())


def _drive(graph: Any, mode: str) -> fp.AgentState:
    payload = fp.start("q", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=4))
    config, ctx = thread(), context()
    if mode == "invoke":
        return fp.run_output(graph.invoke(payload, config, context=ctx))
    if mode == "ainvoke":
        return fp.run_output(asyncio.run(graph.ainvoke(payload, config, context=ctx)))
    for _ in graph.stream(payload, config, context=ctx, stream_mode=["updates", "custom"]):
        pass
    return fp.run_output(graph.get_state(config).values)


def _proposal(n: int, name: str = "probe") -> fp.ToolProposal:
    return fp.ToolProposal(call_id=f"call-{n:04d}", tool_name=name, arguments={"n": n})


@pytest.mark.parametrize("mode", ["invoke", "ainvoke", "stream"])
@pytest.mark.parametrize("batch", [1, 2], ids=["one-call", "batch"])
def test_a_body_no_thread_took_by_its_deadline_never_starts_after_its_run_returned(
    late_pool: LateWorkers, mode: str, batch: int
) -> None:
    started.clear()
    calls = [_proposal(n) for n in range(1, batch + 1)]
    state = _drive(_graph(*calls), mode)
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    late_pool.catch_up()  # the run has returned: now the workers come
    assert started == []
    report = state.report
    assert report is not None
    # What the report says never started, never did; nothing is a failure it did not have.
    assert [c.call_id for c in report.never_started] == [c.call_id for c in calls]
    assert [c.error_code for c in report.never_started] == [fp.ErrorCode.TIMEOUT] * batch
    assert report.failed == () and report.uncertain == ()
    # The model is told it may try again: a timeout is retryable.
    assert all(o.retryable for o in state.observations)


def test_a_write_no_thread_took_is_reported_never_started_not_uncertain(
    late_pool: LateWorkers,
) -> None:
    started.clear()

    async def approves(request: fp.ApproverInput) -> fp.ApproverDecision:
        # On the run's loop: a sync approver runs on the pool, whose late workers would hold it
        # past the run's deadline, and the write would end denied, never approved (30 s).
        return fp.ApproverDecision.approve()

    graph = fp.build_agent_graph(
        fp.ToolRegistry([probe, write_probe]),
        ScriptedDecisionModel([_proposal(1, "write_probe"), ABSTAIN]),
        approval="terminate",
        approver=approves,
    ).compile(checkpointer=InMemorySaver())
    state = _drive(graph, "invoke")
    late_pool.catch_up()
    assert started == []
    assert [r.rule for r in state.receipts] != ["approver_timeout"]  # approved, then not run
    report = state.report
    assert report is not None and report.effects_made == ()
    assert [c.call_id for c in report.never_started] == ["call-0001"]


class FailingClaim(fp.InMemoryLedger):
    """A ledger whose store fails as one call's start is claimed (a database gone away)."""

    def __init__(self, failing: str) -> None:
        super().__init__()
        self.failing = failing

    def reserve(self, account: str, key: str, amounts: Any) -> Any:
        if key.endswith(self.failing):
            raise RuntimeError("the ledger's database went away")
        return super().reserve(account, key, amounts)

    async def areserve(self, account: str, key: str, amounts: Any) -> Any:
        return self.reserve(account, key, amounts)

    def begin_attempt(self, account: str, marker: str, *, claim: str | None = None) -> Any:
        if marker.endswith(self.failing):
            raise RuntimeError("the ledger's database went away")
        return super().begin_attempt(account, marker, claim=claim)


def test_a_call_queued_for_a_slot_never_starts_once_its_batch_failed() -> None:
    started.clear()
    first, second, third = _proposal(1), _proposal(2), _proposal(3)
    ledger = FailingClaim(started_key("", first.call_id, 1))  # the account is the key's prefix
    model = ScriptedDecisionModel([fp.ToolBatch(calls=(first, second, third)), ABSTAIN])
    graph = fp.build_agent_graph(
        fp.ToolRegistry([probe]), model, ledger=ledger, max_concurrent_tools=1
    ).compile(checkpointer=InMemorySaver())
    with pytest.raises(RuntimeError):
        graph.invoke(
            fp.start("q", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=4)),
            thread(),
            context=context(),
        )
    # The first call's claim failed the batch; the slot it freed went to the second at once,
    # while the third still waited for it. This thread's loop runs again (the next run's tools
    # would run on it): the third call, of a run that has ended, must not start there.
    run_sync(asyncio.sleep(0.01))
    wait_until(lambda: tool_runner._threads.stats()[0] == 0)
    assert third.call_id not in started
