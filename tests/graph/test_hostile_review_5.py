"""Hostile review of completion markers (b67c778: accepted work is done only when the ledger holds
``keys.completed_key``), the chat adapter's reused-id lookup and the channels' copy fast paths.

Three seats: a caller holding the thread's config (any ``update_state``, ``Command``, JSON forms);
another tenant sharing the process and the ledger; the process itself (crashes, a lost in-memory
ledger, a cancel mid-batch, the async graph). A probe that found a bug is a strict xfail whose
reason names the repro and a fix; the others pin a rule worth keeping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from typing_extensions import TypedDict

import fencepost as fp
from fencepost.adapters import SqliteLedger
from fencepost.policy import Phase, StopRequest, TerminationReason
from tests.graph.kit import (
    DOCS,
    STATUS,
    UPLOAD,
    context,
    final_citing_all,
    upload_graph,
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


# === Seat 3: the process ========================================================================


class _CrashAfterMarker(SqliteLedger):
    """A SqliteLedger whose process dies right after a completion marker is durable (before the
    completion receipt reaches a checkpoint). The text carries a secret: none may reach state."""

    def reserve(self, account: str, key: str, amounts: Any) -> fp.policy.Reservation:
        held = super().reserve(account, key, amounts)
        if ":done:" in key:
            raise RuntimeError("power cut password=hunter2 at db.internal:5432")
        return held


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
