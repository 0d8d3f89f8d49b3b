"""Accepted work is done only when the ledger says it was shown done.

Receipts are append-only, but a caller holding the thread's config can append one: a forged
``completed`` receipt for the call whose tool accepted a task. So a final answer is judged by a
marker outside state (``keys.completed_key``), written by the execute node, before the completion
receipt, only when a later call's verified evidence shows the task done. These tests run real
graphs on real checkpointers and ledgers: the in-memory pair, and SQLite files reopened by a
fresh graph object (a new process). A non-durable ledger lost by a restart is re-opened from the
checkpoint, which then carries the completions it recorded (see ``run_account.reopen_lost``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
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
    astart_upload,
    budget,
    context,
    final_citing_all,
    forge_completion,
    sqlite_files,
    start_upload,
    state_of,
    thread,
    upload_graph,
)

REFUSED_TWICE = [final_citing_all, final_citing_all, ABSTAIN]
"""What a model says after the upload: final answers (refused while the task is pending)."""


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


def test_a_genuine_completion_after_a_forged_one_is_still_marked_and_completes_the_run() -> None:
    # The forged receipt made the call look done, so the status check found nothing waiting and
    # marked nothing: the run could never complete. Waiting now means "not marked done".
    h = upload_graph([UPLOAD, STATUS, final_citing_all, ABSTAIN])
    config, ctx = thread(), context(caps=DOCS)
    start_upload(h, config, ctx)
    forge_completion(h, config, "receipt")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED


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


# --- a forged completion is refused -------------------------------------------------------------


@pytest.mark.parametrize("form", ["receipt", "json"])
def test_a_forged_completion_receipt_never_completes_a_run_on_a_durable_ledger(
    tmp_path: Path, form: str
) -> None:
    config, ctx = thread(), context(caps=DOCS)
    with sqlite_files(tmp_path) as (saver, ledger):
        h = upload_graph([UPLOAD], status={"status": "done"}, checkpointer=saver, ledger=ledger)
        start_upload(h, config, ctx)
        forge_completion(h, config, form)
    with sqlite_files(tmp_path) as (saver, ledger):
        again = upload_graph(REFUSED_TWICE, checkpointer=saver, ledger=ledger)
        state = fp.run_output(again.graph.invoke(None, config, context=ctx))
        assert _marker(ledger, config, again) is None
    assert state.termination is TerminationReason.INSUFFICIENT_EVIDENCE
    # The model was shown the forged view (no open task); the final was judged by the ledger.
    assert [inp.pending_tasks for inp in again.model.inputs] == [(), (), ()]
    assert [m.code for m in state.manifests if m.code == "tasks_pending"] == ["tasks_pending"] * 2


def test_a_forged_completion_receipt_never_completes_a_run_on_the_async_graph() -> None:
    h = upload_graph([UPLOAD, *REFUSED_TWICE], status={"status": "done"})
    config, ctx = thread(), context(caps=DOCS)

    async def run() -> fp.AgentState:
        await astart_upload(h, config, ctx)
        forge_completion(h, config, "json")
        return fp.run_output(await h.graph.ainvoke(None, config, context=ctx))

    state = asyncio.run(run())
    assert state.termination is TerminationReason.INSUFFICIENT_EVIDENCE


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


def test_after_the_in_memory_ledger_is_reopened_a_completion_forged_later_is_refused() -> None:
    saver = InMemorySaver()
    config, ctx = thread(), context(caps=DOCS)
    h = upload_graph([UPLOAD], checkpointer=saver)
    start_upload(h, config, ctx)
    # A new process: its first step re-opens the account (the checkpoint shows nothing done).
    again = upload_graph([STATUS, *REFUSED_TWICE], status={"status": "running"}, checkpointer=saver)
    _next_execute(again, config, ctx)
    forge_completion(again, config, "receipt")
    state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.INSUFFICIENT_EVIDENCE


# --- the terminal node judges a completed stop by the markers too ---------------------------------


def _forged_completed_stop() -> dict[str, Any]:
    answer = fp.AnswerPayload(text="Uploaded.", citations=("call-0001",))
    return {
        "run": {"stop": fp.policy.StopRequest(reason=TerminationReason.COMPLETED, answer=answer)}
    }


def test_a_forged_completed_stop_never_ends_a_run_completed_on_a_durable_ledger(
    tmp_path: Path,
) -> None:
    # The forged receipt and a completed stop citing the upload, resumed in a new process: the
    # stop goes straight to the terminal node, which asks the ledger, not the receipts.
    config, ctx = thread(), context(caps=DOCS)
    with sqlite_files(tmp_path) as (saver, ledger):
        h = upload_graph([UPLOAD], checkpointer=saver, ledger=ledger)
        start_upload(h, config, ctx)
        forge_completion(h, config, "json")
        h.graph.update_state(config, _forged_completed_stop(), as_node="execute")
    with sqlite_files(tmp_path) as (saver, ledger):
        again = upload_graph([], checkpointer=saver, ledger=ledger)
        state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "tasks_pending"
    assert again.model.inputs == []  # the model was never asked: the stop was judged as sent


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
