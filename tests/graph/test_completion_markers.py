"""Accepted work is done only when the ledger says it was shown done.

Receipts are append-only, but a caller holding the thread's config can append one: a forged
``completed`` receipt for the call whose tool accepted a task. So a final answer is judged by a
marker outside state (``keys.completed_key``), written by the execute node, before the completion
receipt, only when a later call's verified evidence shows the task done. These tests run real
graphs on real checkpointers and ledgers: the in-memory pair, and SQLite files reopened by a
fresh graph object (a new process). Every graph built with no ledger on one ``InMemorySaver``
shares that saver's ledger, so a second graph object finds the markers the first wrote; a ledger
that never saw the run (lost with its process) re-opens nothing from the checkpoint: the run is
refused, ``unknown_budget_account``, and nothing completes. A crash between the marker and the
receipt, or a cancel that closes the account mid-batch, leaves the books right. That a forged
completion never completes a run is pinned with the feature: ``tests/features/
test_completion_evidence.py``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

import fencepost as fp
from fencepost.adapters import SqliteLedger
from fencepost.policy import TerminationReason
from fencepost.policy.keys import completed_key, run_account
from fencepost.policy.tasks import pending_tasks
from tests.graph.kit import (
    ABSTAIN,
    DOCS,
    STATUS,
    UPLOAD,
    UPLOAD_DONE,
    Harness,
    StatusArgs,
    astart_upload,
    budget,
    context,
    final_citing_all,
    harness,
    sqlite_files,
    start_upload,
    state_of,
    terminal_manifests,
    thread,
    thread_account,
    upload_graph,
    upload_registry,
)


def _next_execute(h: Harness, config: dict[str, Any], ctx: fp.RunContext) -> None:
    h.graph.invoke(None, config, context=ctx, interrupt_after=["execute"])


def _marker(ledger: fp.Ledger, config: dict[str, Any], h: Harness) -> fp.policy.Reservation | None:
    account = run_account(config["configurable"]["thread_id"], state_of(h, config).run_id)
    return ledger.get(completed_key(account, "call-0001"))


# --- a genuine completion still completes -------------------------------------------------------


def test_a_task_its_status_tool_shows_done_lets_the_final_answer_complete_and_is_marked() -> None:
    ledger = fp.InMemoryLedger()
    h = upload_graph([UPLOAD, STATUS, final_citing_all], ledger=ledger)
    config, ctx = thread(), context(caps=DOCS)
    state = h.run(steps=6, tools=4, ctx=ctx, config=config)
    assert state.termination is TerminationReason.COMPLETED
    assert _marker(ledger, config, h) is not None
    assert terminal_manifests(state) == 1  # the terminal node's ledger read adds no second end


def test_a_completion_shown_before_a_resume_completes_the_run_in_a_fresh_graph_on_sqlite_files(
    tmp_path: Path,
) -> None:
    config, ctx = thread(), context(caps=DOCS)
    with sqlite_files(tmp_path) as (saver, ledger):
        h = upload_graph([UPLOAD, STATUS], checkpointer=saver, ledger=ledger)
        start_upload(h, config, ctx)
        _next_execute(h, config, ctx)
        assert not pending_tasks(state_of(h, config).receipts)
        assert _marker(ledger, config, h) is not None
    with sqlite_files(tmp_path) as (saver, ledger):
        again = upload_graph([final_citing_all, ABSTAIN], checkpointer=saver, ledger=ledger)
        state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED


def test_a_completion_shown_before_a_resume_completes_the_run_in_a_fresh_graph_in_memory() -> None:
    saver, ledger = InMemorySaver(), fp.InMemoryLedger()
    config, ctx = thread(), context(caps=DOCS)
    h = upload_graph([UPLOAD, STATUS], checkpointer=saver, ledger=ledger)
    start_upload(h, config, ctx)
    _next_execute(h, config, ctx)
    again = upload_graph([final_citing_all, ABSTAIN], checkpointer=saver, ledger=ledger)
    state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED
    assert _marker(ledger, config, again) is not None


def test_an_early_marker_a_crash_left_gets_its_receipt_when_the_task_is_shown_done_again() -> None:
    # A crash between the marker and the checkpoint leaves the marker early: the re-run (here a
    # later status check) still records the completion receipt, naming the call that showed it.
    ledger = fp.InMemoryLedger()
    h = upload_graph([UPLOAD, STATUS, final_citing_all], ledger=ledger)
    config, ctx = thread(), context(caps=DOCS)
    start_upload(h, config, ctx)
    account = run_account(config["configurable"]["thread_id"], state_of(h, config).run_id)
    ledger.reserve(account, completed_key(account, "call-0001"), {})  # as the lost attempt did
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED
    history = [(r.status, r.completed_by) for r in state.receipts if r.call_id == "call-0001"]
    assert history == [
        (fp.ReceiptStatus.ACCEPTED_PENDING, None),
        (fp.ReceiptStatus.COMPLETED, "call-0002"),
    ]


# --- a second graph object on the same saver, and a ledger that never saw the run -------------


def test_a_second_graph_on_the_same_saver_completes_a_completion_the_first_recorded() -> None:
    # An app that builds its agent per request: each graph object is new, the saver is one, and
    # so is its ledger, which holds the completion marker the first graph wrote.
    saver = InMemorySaver()
    config, ctx = thread(), context(caps=DOCS)
    h = upload_graph([UPLOAD, STATUS], checkpointer=saver)
    start_upload(h, config, ctx)
    _next_execute(h, config, ctx)
    again = upload_graph([final_citing_all, ABSTAIN], checkpointer=saver)
    state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED


def test_a_ledger_that_lost_the_run_never_completes_it_from_the_checkpoints_receipts() -> None:
    # A new process: the checkpoint records the completion, the new ledger holds nothing of the
    # run. Nothing is re-opened from state: the run is refused, typed, and no model is asked.
    saver = InMemorySaver()
    config, ctx = thread(), context(caps=DOCS)
    h = upload_graph([UPLOAD, STATUS], checkpointer=saver, ledger=fp.InMemoryLedger())
    start_upload(h, config, ctx)
    _next_execute(h, config, ctx)
    again = upload_graph(
        [final_citing_all, ABSTAIN], checkpointer=saver, ledger=fp.InMemoryLedger()
    )
    state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.POLICY_DENIED
    assert state.last_error_code == "unknown_budget_account"
    assert again.model.calls == 0


# --- a completed stop the terminal node judges ----------------------------------------------------


def test_a_genuine_completed_stop_ends_the_run_completed_through_a_second_graph_on_the_saver() -> (
    None
):
    # decide accepted the final answer (the task shown done, marked) and the graph object was
    # dropped before the terminal node ran: the next one on the saver judges by its markers.
    saver = InMemorySaver()
    config, ctx = thread(), context(caps=DOCS)
    h = upload_graph([UPLOAD, STATUS, final_citing_all], checkpointer=saver)
    h.graph.invoke(
        fp.start("upload", budget(steps=6, tools=4)),
        config,
        context=ctx,
        interrupt_before=["terminal"],
    )
    assert state_of(h, config).stop is not None
    again = upload_graph([], checkpointer=saver)
    state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED


def test_a_completed_stop_the_ledger_never_saw_ends_unknown_budget_account_not_completed() -> None:
    # The same stop, reached by a new process whose ledger holds no account and no markers: the
    # terminal node cannot verify it, and says why (receipts in state are no proof).
    saver = InMemorySaver()
    config, ctx = thread(), context(caps=DOCS)
    h = upload_graph(
        [UPLOAD, STATUS, final_citing_all], checkpointer=saver, ledger=fp.InMemoryLedger()
    )
    h.graph.invoke(
        fp.start("upload", budget(steps=6, tools=4)),
        config,
        context=ctx,
        interrupt_before=["terminal"],
    )
    assert state_of(h, config).stop is not None
    again = upload_graph([], checkpointer=saver, ledger=fp.InMemoryLedger())
    state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.POLICY_DENIED
    assert state.last_error_code == "unknown_budget_account"


# -- crashes, cancels and lost ledgers ---------------------------------------------------------


class _CrashAfterMarker(SqliteLedger):
    """A SqliteLedger whose process dies right after a completion marker is durable (before the
    completion receipt reaches a checkpoint). The text carries a secret: none may reach state."""

    def reserve(self, account: str, key: str, amounts: Any) -> fp.policy.Reservation:
        held = super().reserve(account, key, amounts)
        if ":done:" in key:
            raise RuntimeError("power cut password=hunter2 at db.internal:5432")
        return held


def test_a_crash_between_the_marker_and_the_receipt_completes_on_the_rerun_with_no_error_text(
    tmp_path: Path,
) -> None:
    config, ctx = thread(), context(caps=DOCS)
    conn = sqlite3.connect(tmp_path / "runs.db", check_same_thread=False)
    crashing = _CrashAfterMarker(tmp_path / "ledger.db")
    try:
        saver = SqliteSaver(conn)
        h = upload_graph([UPLOAD, STATUS], checkpointer=saver, ledger=crashing)
        start_upload(h, config, ctx)
        with pytest.raises(RuntimeError):
            h.graph.invoke(None, config, context=ctx)
    finally:
        crashing.close()
        conn.close()
    with sqlite_files(tmp_path) as (saver, ledger):
        assert ledger.get(completed_key(thread_account(config), "call-0001")) is not None
        again = upload_graph([final_citing_all, ABSTAIN], checkpointer=saver, ledger=ledger)
        assert [r.status for r in state_of(again, config).receipts] == [
            fp.ReceiptStatus.ACCEPTED_PENDING
        ]
        state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED
    done = [r.completed_by for r in state.receipts if r.call_id == "call-0001"]
    assert done == [None, "call-0002"]
    text = json.dumps(state.model_dump(mode="json"))
    assert "hunter2" not in text and "power cut" not in text


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_account_closed_mid_batch_records_no_completion_and_ends_cancelled(mode: str) -> None:
    # A cancel closes the account while the status check runs: the marker is refused, so no
    # completion receipt is recorded, and the run ends cancelled as data.
    ledger = fp.InMemoryLedger()
    config, ctx = thread(), context(caps=DOCS)
    account = thread_account(config)

    def status(args: StatusArgs, tool_ctx: fp.ToolContext) -> Any:
        ledger.close_account(account, TerminationReason.CANCELLED.value)
        return UPLOAD_DONE

    base = upload_registry()
    spec = base.get("upload_status")
    assert spec is not None
    registry = fp.ToolRegistry(
        [base.get("upload_document"), spec.model_copy(update={"execute": status})]
    )
    h = harness([UPLOAD, STATUS, final_citing_all, ABSTAIN], registry=registry, ledger=ledger)
    if mode == "sync":
        state = h.run(ctx=ctx, config=config)
    else:
        request = fp.start("upload", budget(steps=6, tools=4))
        state = fp.run_output(asyncio.run(h.graph.ainvoke(request, config, context=ctx)))
    assert state.termination is TerminationReason.CANCELLED
    assert ledger.get(completed_key(account, "call-0001")) is None
    assert not [r for r in state.receipts if r.call_id == "call-0001" and r.completed_by]
    assert h.model.calls == 2


def test_a_second_graph_on_the_saver_before_the_status_check_lets_the_genuine_one_complete() -> (
    None
):
    saver = InMemorySaver()
    config, ctx = thread(), context(caps=DOCS)
    h = upload_graph([UPLOAD], checkpointer=saver)
    start_upload(h, config, ctx)
    again = upload_graph([STATUS, final_citing_all], checkpointer=saver)  # the next request's
    state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED


def test_a_second_async_graph_on_the_saver_after_an_accepted_call_still_completes() -> None:
    # The saver's ledger holds the started marker of the accepted upload: the genuine status
    # check completes it, and a final answer before it is still held up.
    saver = InMemorySaver()
    config, ctx = thread(), context(caps=DOCS)
    asyncio.run(astart_upload(upload_graph([UPLOAD], checkpointer=saver), config, ctx))
    again = upload_graph([final_citing_all, STATUS, final_citing_all], checkpointer=saver)
    state = fp.run_output(asyncio.run(again.graph.ainvoke(None, config, context=ctx)))
    assert state.termination is TerminationReason.COMPLETED
    assert [m.code for m in state.manifests if m.code == "tasks_pending"] == ["tasks_pending"]
    done = [r.completed_by for r in state.receipts if r.call_id == "call-0001"]
    assert done == [None, "call-0002"]
