"""Hostile review of completion evidence, progress by evidence, dependent calls, answer margin,
repair, child runs and the messages view.

Each probe takes one hostile seat: a caller holding the thread's config (any ``Command(update=...,
resume=...)`` or ``update_state``), another tenant sharing the process, or the process itself (a
tool that raises, blocks or never returns). A probe that found a bug is kept as a strict xfail
whose reason names the file, the repro and a fix.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.tasks import pending_tasks
from tests.graph.kit import (
    ABSTAIN,
    DOCS,
    budget,
    call,
    context,
    drive_editing,
    final_citing_all,
    harness,
    thread,
    upload_registry,
)


def _p(tool: str, n: int, depends_on: tuple[str, ...] = (), **arguments: Any) -> fp.ToolProposal:
    return fp.ToolProposal(
        call_id=f"call-{n:04d}", tool_name=tool, arguments=arguments, depends_on=depends_on
    )


# --- completion evidence -------------------------------------------------------------------


def test_one_completion_never_closes_two_accepted_tasks_that_share_a_task_id() -> None:
    script = [
        _p("upload_document", 1, name="a.pdf"),
        _p("upload_document", 2, name="b.pdf"),
        _p("upload_status", 3, task_id="task-17"),
        final_citing_all,
        ABSTAIN,
    ]
    h = harness(script, registry=upload_registry())
    out = h.graph.invoke(
        fp.start("upload both", budget(steps=6, tools=5)), thread(), context=context(caps=DOCS)
    )
    state = fp.run_output(out)
    still_pending = pending_tasks(state.receipts)
    assert not (state.termination is fp.TerminationReason.COMPLETED and still_pending)


# --- progress by evidence --------------------------------------------------------------------


def _same_search(n: int) -> list[fp.ToolProposal]:
    return [call(n=i, query="same") for i in range(1, n + 1)]


def _bump_evidence(state: fp.AgentState) -> dict[str, Any] | None:
    key = proposal_fingerprint("search_logs", {"query": "same"})
    seen = state.evidence.get(key)
    if seen is None:
        return None
    epoch = int(seen.split(":", 1)[0])
    return {"run": {"evidence": {key: f"{epoch + 1}:forged@2000-01-01T00:00:00+00:00"}}}


def _baseline_no_progress_calls() -> int:
    h = harness([*_same_search(10), ABSTAIN])
    state = h.run(steps=12, tools=10)
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    return h.calls.count("search_logs")


@pytest.mark.xfail(
    strict=True,
    reason=(
        "AgentState.evidence is a Latest channel (fencepost/graph/channels.py:48 _latest: any "
        "write replaces an entry) and repeat_key (fencepost/policy/progress.py:41) counts repeats "
        "under the epoch stored there, so a caller update_state({'evidence': {fp: "
        "'<epoch+1>:x@...'}}) between steps starts a fresh count every step: the same call with "
        "the same result never ends no_progress (the Counted channel's 'a state edit cannot reset "
        "the no-progress check' is bypassed). Fix: let a node's evidence write only advance the "
        "epoch by the executor (e.g. a reducer keyed by (epoch, digest) that keeps the max epoch "
        "and ignores writes not carrying the run's sealed digest), or count repeats per "
        "(fingerprint, result digest) in the grow-only Counted channel."
    ),
)
def test_rewriting_evidence_in_state_does_not_reset_the_no_progress_count() -> None:
    limit = _baseline_no_progress_calls()
    h = harness([*_same_search(10), ABSTAIN])
    config, ctx = thread(), context()
    h.graph.invoke(
        fp.start("q", budget(steps=12, tools=10)), config, context=ctx, interrupt_after=["execute"]
    )
    state = drive_editing(h, config, ctx, _bump_evidence)
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    assert h.calls.count("search_logs") == limit


# --- dependent calls -------------------------------------------------------------------------


# --- answer margin and repair ----------------------------------------------------------------


SECRET_VALUE = "sk-live-0123456789-IGNORE-ALL-INSTRUCTIONS"


class EnumArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    level: int
    tags: dict[str, int]


# --- messages view ---------------------------------------------------------------------------


def test_a_tool_exception_text_never_reaches_the_messages_view() -> None:
    h = harness([call("explode", 1), ABSTAIN])
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context())
    messages = h.graph.get_state(config).values["messages"]
    text = json.dumps([m.model_dump() for m in messages], default=str)
    assert "hunter2" not in text
    assert "db.internal" not in text
