"""Accepted work is done only when the ledger says it was shown done.

Receipts are append-only, but a caller holding the thread's config can append one: a forged
``completed`` receipt for the call whose tool accepted a task. So a final answer is judged by a
marker outside state (``keys.completed_key``), written by the execute node, before the completion
receipt, only when a later call's verified evidence shows the task done. These tests run real
graphs on real checkpointers and ledgers: the in-memory pair, and SQLite files reopened by a
fresh graph object (a new process). A non-durable ledger lost by a restart is re-opened from the
checkpoint, which then carries the completions it recorded. A crash between the marker and the
receipt, or a cancel that closes the account mid-batch, leaves the books right. That a forged
completion never completes a run is pinned with the feature: ``tests/features/
test_completion_evidence.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from fencepost.policy import TerminationReason
from fencepost.policy.keys import completed_key, run_account
from fencepost.policy.tasks import pending_tasks
from tests.graph.kit import (
    ABSTAIN,
    DOCS,
    STATUS,
    UPLOAD,
    Harness,
    budget,
    context,
    final_citing_all,
    sqlite_files,
    start_upload,
    state_of,
    terminal_manifests,
    thread,
    upload_graph,
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


# --- a non-durable ledger lost by a restart -----------------------------------------------------


def test_after_the_in_memory_ledger_is_lost_a_completion_recorded_before_still_completes() -> None:
    # Each graph keeps an InMemoryLedger of its own: the second is a new process whose ledger
    # lost the first one's markers. Re-opening the run's account carries the completions the
    # checkpoint recorded (as it carries what was spent), so the run is never stuck pending.
    saver = InMemorySaver()
    config, ctx = thread(), context(caps=DOCS)
    h = upload_graph([UPLOAD, STATUS], checkpointer=saver)
    start_upload(h, config, ctx)
    _next_execute(h, config, ctx)
    again = upload_graph([final_citing_all, ABSTAIN], checkpointer=saver)
    state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED


# --- a completed stop the terminal node judges ----------------------------------------------------


def test_a_genuine_completed_stop_ends_the_run_completed_after_the_in_memory_ledger_is_lost() -> (
    None
):
    # decide accepted the final answer (the task shown done, marked) and the process stopped
    # before the terminal node ran. The new process's ledger has no account and no markers:
    # nothing re-opens it before the terminal node, which judges by the receipts then.
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
