"""Child runs: every child ends typed, "completed" means its end state was verified, and no
child starts that its parent cannot fund.

Seed 002: stopping blocks new children and follows the ones started to their real end; a call
is reported completed only when the required end state was verified. A child that did not
complete is an incomplete call of its parent (its own reason kept as data), never a success.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

import fencepost as fp
from fencepost.adapters.child_run import ChildRunResult, child_thread_id
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.graph.state import has_run
from fencepost.policy.stop_report import StopKind
from fencepost.policy.tool_decorator import tool
from tests.graph.child_kit import (
    ABSTAIN,
    Family,
    Greedy,
    answer_after,
    child_call,
    parent_account,
    parent_context,
    ping,
)
from tests.graph.kit import thread


def _citing_the_child(inp: fp.DecisionInput) -> fp.FinalProposal:
    return fp.FinalProposal(
        answer=fp.AnswerPayload(text="see the research", citations=(inp.observations[-1].call_id,))
    )


# -- every child run ends typed -----------------------------------------------------------------


async def test_a_child_whose_parents_task_is_cancelled_ends_cancelled_on_its_own_thread() -> None:
    entered = asyncio.Event()

    @tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=30)
    async def slow(ctx: fp.ToolContext) -> dict[str, bool]:
        """Takes a long time."""
        entered.set()
        await asyncio.sleep(30)
        return {"done": True}

    family = Family(
        fp.ToolRegistry([slow]),
        ScriptedDecisionModel([answer_after("slow", 1)] * 3),
        [child_call(1), ABSTAIN],
        child_budget=fp.RuntimeBudget(steps_remaining=5, tool_calls_remaining=5),
    )
    config, ctx = thread(), parent_context()
    task = asyncio.create_task(
        family.parent.ainvoke(
            fp.start("q", fp.RuntimeBudget(steps_remaining=10, tool_calls_remaining=5)),
            config,
            context=ctx,
        )
    )
    await asyncio.wait_for(entered.wait(), 20)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # As README says: cancel the task, then fp.acancel the parent.
    parent = await fp.acancel(family.parent, config, context=ctx)
    assert parent is not None and parent.termination is fp.TerminationReason.CANCELLED

    child_thread = child_thread_id(
        parent_account(config, parent), "child-call-1", tenant_id="acme", principal_id="u-1"
    )
    child = fp.run_output(family.child_state(child_thread))
    assert child.termination is fp.TerminationReason.CANCELLED
    assert child.last_error_code == "cancelled"
    assert child.report is not None and child.report.kind is StopKind.STOPPED
    # The parent's record keeps the child call as started: its id, not a call never run.
    assert parent.report is not None
    assert [c.call_id for c in parent.report.uncertain] == ["child-call-1"]


class _SlowSaver(InMemorySaver):
    """An in-memory saver whose async writes take longer than a cancelled body's grace: a
    child's cancel record (a stop, then the terminal node's ending) outlasts the grace."""

    async def aput(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.05)
        return await super().aput(*args, **kwargs)

    async def aput_writes(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.05)
        return await super().aput_writes(*args, **kwargs)


async def test_a_childs_cancel_record_is_whole_before_its_callers_cancellation_goes_on() -> None:
    entered = asyncio.Event()

    @tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=30)
    async def slow(ctx: fp.ToolContext) -> dict[str, bool]:
        """Takes a long time."""
        entered.set()
        await asyncio.sleep(30)
        return {"done": True}

    family = Family(
        fp.ToolRegistry([slow]),
        ScriptedDecisionModel([answer_after("slow", 1)] * 3),
        [child_call(1), ABSTAIN],
        child_budget=fp.RuntimeBudget(steps_remaining=5, tool_calls_remaining=5),
        child_checkpointer=_SlowSaver(),
    )
    config, ctx = thread(), parent_context()
    task = asyncio.create_task(
        family.parent.ainvoke(
            fp.start("q", fp.RuntimeBudget(steps_remaining=10, tool_calls_remaining=5)),
            config,
            context=ctx,
        )
    )
    await asyncio.wait_for(entered.wait(), 20)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    parent = await fp.acancel(family.parent, config, context=ctx)
    assert parent is not None
    child_thread = child_thread_id(
        parent_account(config, parent), "child-call-1", tenant_id="acme", principal_id="u-1"
    )
    # Read at once: the record was finished before the caller's CancelledError, not after.
    child = fp.run_output(family.child_state(child_thread))
    assert child.termination is fp.TerminationReason.CANCELLED
    assert child.report is not None and child.report.kind is StopKind.STOPPED


# -- a child graph on a sync-only checkpointer --------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_child_graph_on_a_sync_only_sqlite_saver_runs_its_child(
    mode: str, tmp_path: Path
) -> None:
    searched: list[str] = []

    @tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=5)
    def search(ctx: fp.ToolContext) -> dict[str, str]:
        """Search."""
        searched.append(ctx.run_id)
        return {"hit": "log-1"}

    conn = sqlite3.connect(tmp_path / "children.db", check_same_thread=False)
    try:
        # What open_checkpointer("sqlite:///...") returns: a SqliteSaver, sync methods only.
        saver = SqliteSaver(conn)
        family = Family(
            fp.ToolRegistry([search]),
            ScriptedDecisionModel([answer_after("search", 1)] * 3),
            [child_call(1), _citing_the_child],
            child_budget=fp.RuntimeBudget(steps_remaining=5, tool_calls_remaining=5),
            child_checkpointer=saver,
        )
        config, ctx = thread(), parent_context()
        start = fp.start("q", fp.RuntimeBudget(steps_remaining=10, tool_calls_remaining=5))
        if mode == "sync":
            out = await asyncio.to_thread(family.parent.invoke, start, config, context=ctx)
        else:
            out = await family.parent.ainvoke(start, config, context=ctx)
        state = fp.run_output(out)
        (child,) = family.child_results(state)
        assert child.completed and child.termination is fp.TerminationReason.COMPLETED
        assert len(searched) == 1
        # The child's run is on the SqliteSaver, where its thread id says.
        assert fp.run_output(family.child_state(child.thread_id)).run_id == child.run_id
        assert state.termination is fp.TerminationReason.COMPLETED
    finally:
        conn.close()


# -- completed needs the required end state verified ---------------------------------------------


def test_a_child_that_did_not_complete_is_an_incomplete_call_of_its_parent() -> None:
    shown: list[Any] = []

    def cite_after_looking(inp: fp.DecisionInput) -> fp.FinalProposal:
        shown.append(inp.observations[-1].result)
        return _citing_the_child(inp)

    family = Family(
        fp.ToolRegistry([ping]),
        Greedy(width=1),  # never answers: the child's own steps run out
        [child_call(1), cite_after_looking, ABSTAIN],
        child_budget=fp.RuntimeBudget(steps_remaining=2, tool_calls_remaining=5),
    )
    out = family.parent.invoke(
        fp.start("q", fp.RuntimeBudget(steps_remaining=10, tool_calls_remaining=5)),
        thread(),
        context=parent_context(),
    )
    state = fp.run_output(out)
    (child,) = family.child_results(state)
    assert not child.completed
    assert child.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED

    # The parent's receipt: the call ran and reported, its work was not done.
    (receipt,) = [r for r in state.receipts if r.call_id == "child-call-1"]
    assert receipt.status is fp.ReceiptStatus.FAILED
    assert receipt.error_code is fp.ErrorCode.INCOMPLETE
    # The model was shown that as data: the child's reason, not a success.
    (seen,) = shown
    assert seen["completed"] is False and seen["termination"] == "step_budget_exhausted"
    assert seen["error_code"] == "answer_margin"
    # An answer resting on it is not verified: the parent does not end completed.
    assert state.termination is not fp.TerminationReason.COMPLETED
    report = state.report
    assert report is not None
    assert [(c.call_id, c.error_code) for c in report.failed] == [
        ("child-call-1", fp.ErrorCode.INCOMPLETE)
    ]
    assert report.completed == () and report.cited == ()


def test_a_child_that_completed_is_still_a_completed_call_its_parent_can_cite() -> None:
    family = Family(
        fp.ToolRegistry([ping]),
        ScriptedDecisionModel(
            [fp.ToolProposal(call_id="ping-000001", tool_name="ping", arguments={"n": 1})]
            + [answer_after("ping", 1)] * 2
        ),
        [child_call(1), _citing_the_child],
        child_budget=fp.RuntimeBudget(steps_remaining=5, tool_calls_remaining=5),
    )
    state = fp.run_output(
        family.parent.invoke(
            fp.start("q", fp.RuntimeBudget(steps_remaining=10, tool_calls_remaining=5)),
            thread(),
            context=parent_context(),
        )
    )
    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.report is not None and state.report.cited == ("child-call-1",)


# -- no child starts that its parent cannot fund -------------------------------------------------


@tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=5)
def lookup(ctx: fp.ToolContext) -> dict[str, str]:
    """Look something up."""
    return {"hit": "log-1"}


def test_no_child_run_starts_when_the_parent_cannot_fund_its_first_step() -> None:
    family = Family(
        fp.ToolRegistry([lookup]),
        ScriptedDecisionModel([answer_after("lookup", 2)] * 10),
        [fp.ToolBatch(calls=(child_call(1), child_call(2)))],
        child_budget=fp.RuntimeBudget(steps_remaining=60, tool_calls_remaining=60),
        max_concurrent_tools=1,
    )
    config = thread()
    # The parent's 4 steps: its own decision and the first child's 3 (two lookups, an answer).
    out = family.parent.invoke(
        fp.start("q", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=10)),
        config,
        context=parent_context(),
    )
    state = fp.run_output(out)
    first, second = family.child_results(state)
    assert first.completed and first.budget.steps_used == 3
    # The second call was refused before any child began: no thread, no ledger account.
    assert not second.started and not second.completed
    assert second.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert second.error_code == "steps_exhausted"
    assert not has_run(family.child_state(second.thread_id))
    with pytest.raises(fp.policy.UnknownAccount):
        family.ledger.balance(fp.policy.keys.run_account(second.thread_id, second.run_id))
    receipts = {r.call_id: r for r in state.receipts}
    assert receipts["child-call-2"].status is fp.ReceiptStatus.FAILED
    assert receipts["child-call-2"].error_code is fp.ErrorCode.INCOMPLETE
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert family.ledger.balance(parent_account(config, state)).held["steps"] == 4


async def test_no_child_run_starts_under_a_cancelled_parent() -> None:
    family = Family(
        fp.ToolRegistry([ping]),
        ScriptedDecisionModel([answer_after("ping", 1)] * 3),
        [ABSTAIN],
        child_budget=fp.RuntimeBudget(steps_remaining=5, tool_calls_remaining=5),
    )
    family.ledger.open_account(
        "parent-run", {"steps": 20, "tool_calls": 20}, owner={"tenant": "acme", "principal": "u-1"}
    )
    family.ledger.close_account("parent-run", "cancelled")
    ctx = fp.ToolContext(
        run_id="parent",
        tenant_id="acme",
        principal_id="u-1",
        deadline=fp.Deadline.after(30),
        idempotency_key="child-call-1",
        budget_account="parent-run",
    )
    result = await family.tool.execute(family.tool.args_model(question="what broke?"), ctx)
    assert isinstance(result, ChildRunResult)
    assert not result.started and result.termination is fp.TerminationReason.CANCELLED
    assert not has_run(family.child_state(result.thread_id))
