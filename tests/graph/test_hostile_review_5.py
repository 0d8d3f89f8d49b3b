"""Hostile review of completion markers (b67c778: accepted work is done only when the ledger holds
``keys.completed_key``), the chat adapter's reused-id lookup and the channels' copy fast paths.

Three seats: a caller holding the thread's config (any ``update_state``, ``Command``, JSON forms);
another tenant sharing the process and the ledger; the process itself (crashes, a lost in-memory
ledger, a cancel mid-batch, the async graph). A probe that found a bug is a strict xfail whose
reason names the repro and a fix; the others pin a rule worth keeping.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from typing_extensions import TypedDict

import fencepost as fp
from fencepost.adapters import SqliteLedger
from fencepost.policy import Phase, StopRequest, TerminationReason
from fencepost.policy.keys import completed_key
from tests.graph.kit import (
    ABSTAIN,
    DOCS,
    STATUS,
    UPLOAD,
    UPLOAD_DONE,
    StatusArgs,
    budget,
    context,
    final_citing_all,
    harness,
    sqlite_files,
    start_upload,
    state_of,
    thread,
    thread_account,
    upload_graph,
    upload_registry,
)

# === Seat 1: a caller holding the thread's config ===============================================


_FORGED_END: dict[str, Any] = {
    "run": {
        "phase": "terminal",
        "termination": "completed",
        "final_answer": {"text": "Uploaded.", "citations": ["call-0001"]},
    }
}


_ODD_RECEIPTS = {
    # completed receipts a caller appends before the genuine status check: call ids that never
    # existed (empty, NUL, very long), another task id, the same task id twice, junk completed_by
    "unknown-ids": [
        fp.Receipt(call_id=cid, tool_name="upload_document", status="completed", task_id="task-17")
        for cid in ("", "\x00", "x" * 5000, "call-0003")
    ],
    "other-task": [
        fp.Receipt(
            call_id="call-0001",
            tool_name="upload_document",
            status="completed",
            task_id="task-99",
            completed_by="call-0001",
        )
    ],
    "duplicate-task": [
        fp.Receipt(call_id="call-0001", tool_name="upload_document", status="completed"),
        fp.Receipt(call_id="call-0001", tool_name="upload_document", status="completed"),
    ],
}


# === Seat 2: another tenant sharing the process and the ledger ==================================


class _Parent(TypedDict, total=False):
    first: str
    second: str


def _channel_pairs() -> list[tuple[str, Any, Any]]:
    stop = StopRequest(reason=TerminationReason.CANCELLED, error_code="cancelled")
    receipt = fp.Receipt(call_id="call-0001", tool_name="t", status="completed")
    return [
        ("run", {"stop": None}, {"stop": stop}),
        (
            "run",
            {"receipts": (receipt,)},
            {"receipts": (receipt.model_copy(update={"call_id": "call-0002"}),)},
        ),
        ("run", {"answered": {"call-0001": 1}}, {"answered": {"call-0002": 2}}),
        ("run", {"fingerprints": {"f": 1}}, {"fingerprints": {"f": 3, "g": 1}}),
        ("messages", [HumanMessage("q", id="m-1")], [AIMessage("a", id="m-2")]),
    ]


def test_a_write_to_a_routed_copy_of_a_channel_never_changes_the_original_or_its_other_copy() -> (
    None
):
    # The fast copies share the value (object.__new__, slots set directly): sound only while
    # every reducer makes a new value. A write to one copy must not show in the original, in a
    # second copy, or in a channel restored from the same checkpoint.
    h = upload_graph([])
    for name, first, second in _channel_pairs():
        original = h.graph.channels[name].from_checkpoint(None)
        assert original.update([first])
        before = original.get()
        snapshot = json.dumps(before, default=repr) if name != "messages" else len(before)
        routed, sibling = original.copy(), original.copy()
        assert routed.update([second]) is True
        assert routed.get() is not before
        after = original.get()
        assert after is before, name
        assert (json.dumps(after, default=repr) if name != "messages" else len(after)) == snapshot
        assert sibling.get() is before, name
        assert routed.update([]) is False
        assert type(routed) is type(original) and routed.key == original.key


# === Seat 3: the process ========================================================================


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


def test_a_lost_in_memory_ledger_before_the_status_check_still_lets_the_genuine_one_complete() -> (
    None
):
    saver = InMemorySaver()
    config, ctx = thread(), context(caps=DOCS)
    h = upload_graph([UPLOAD], checkpointer=saver)
    start_upload(h, config, ctx)
    again = upload_graph(
        [STATUS, final_citing_all], checkpointer=saver
    )  # a new process's own ledger
    state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED


def _durable_ledger(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> fp.Ledger:
    if kind == "sqlite":
        return SqliteLedger(tmp_path / "ledger.db")
    from fencepost.adapters.ledger_postgres import PostgresLedger

    return PostgresLedger(request.getfixturevalue("postgres_schema"))


def test_a_completed_stop_the_terminal_node_judges_leaves_one_terminal_manifest() -> None:
    # The terminal node's ledger read adds no second ending: one manifest, one reason.
    h = upload_graph([UPLOAD, STATUS, final_citing_all])
    state = h.run(ctx=context(caps=DOCS))
    assert state.termination is TerminationReason.COMPLETED
    assert sum(1 for m in state.manifests if m.phase is Phase.TERMINAL) == 1
