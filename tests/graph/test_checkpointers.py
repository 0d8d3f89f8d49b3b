"""The same scenarios on InMemorySaver, SqliteSaver on a file, and PostgresSaver."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import fencepost as fp
from fencepost.adapters import aopen_checkpointer, open_checkpointer
from tests.graph.kit import budget, call, context, final_citing_last, harness, thread


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield InMemorySaver()
    elif request.param == "sqlite":
        conn = sqlite3.connect(tmp_path / "runs.db", check_same_thread=False)
        yield SqliteSaver(conn)
        conn.close()
    else:
        # fencepost's opener: a graph built with no ledger keeps its budget in the same database
        # (a PostgresSaver built by hand needs ledger=PostgresLedger(dsn)).
        with open_checkpointer(request.getfixturevalue("postgres_schema")) as pg:
            yield pg


def test_search_then_final_completes(saver: Any) -> None:
    h = harness([call(), final_citing_last], checkpointer=saver)
    config = thread()
    state = h.run(config=config)
    assert state.termination is fp.TerminationReason.COMPLETED
    stored = fp.run_output(h.graph.get_state(config).values)
    assert stored == state
    assert isinstance(h.graph.get_state(config).values["run"]["budget"], dict)


def _paused_at_a_write(saver: Any) -> tuple[Any, dict[str, Any], fp.RunContext]:
    """A run that searched once and is paused at the approval of a write."""
    h = harness(
        [call(n=1), call("write_note", 2, note="x"), final_citing_last],
        checkpointer=saver,
        approval="interrupt",
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget(steps=5, tools=5)), config, context=ctx)
    return h, config, ctx


def test_approval_pause_and_resume_keeps_budget_and_runs_once(saver: Any) -> None:
    h, config, ctx = _paused_at_a_write(saver)
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.budget.steps_used == 3 and state.budget.tool_calls_used == 2
    assert [n for n, _, _ in h.calls.log] == ["search_logs", "write_note"]
    # A finished thread stays finished.
    again = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert again == state and len(h.calls.log) == 2


_LEFT_AT_DEFAULT = (
    "final_answer",
    "termination",
    "last_error_code",
    "open_tasks",
    "repairs",
    "repair_notes",
    "model_failures",
    "stop",
    "report",
)


def _record_writes(saver: Any, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every write to the run record the thread's checkpoints hold, oldest first."""
    out: list[dict[str, Any]] = []
    for tup in reversed(list(saver.list(config))):
        saved = saver.get_tuple(tup.config)
        out += [value for _, channel, value in saved.pending_writes or () if channel == "run"]
    return out


def test_a_field_left_at_its_default_is_never_written_yet_every_field_reads_back(
    saver: Any,
) -> None:
    h, config, ctx = _paused_at_a_write(saver)
    written = _record_writes(saver, config)
    assert written and not set(_LEFT_AT_DEFAULT) & {k for w in written for k in w}
    # A server client and get_state still see every field of the paused run, at its default.
    record = h.graph.get_state(config).values["run"]
    assert set(fp.AgentState.model_fields) <= set(record)
    assert record["termination"] is None and record["stop"] is None and record["repairs"] == 0
    # Another graph over the same saver (a new process) reads the defaults back and resumes.
    again = harness([final_citing_last], checkpointer=saver, approval="interrupt")
    state = fp.run_output(again.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert [n for n, _, _ in again.calls.log] == ["write_note"]
    assert state.repairs == 0 and state.model_failures == 0 and state.report is not None
    ended = {k for w in _record_writes(saver, config) for k in w}
    assert {"final_answer", "termination", "report"} <= ended


def test_no_progress_and_denials_end_the_same_way(saver: Any) -> None:
    h = harness([call(n=i, query="same") for i in range(1, 5)], checkpointer=saver)
    assert h.run().termination is fp.TerminationReason.NO_PROGRESS
    h2 = harness([call("admin_reset", 1)], checkpointer=saver)
    assert h2.run().termination is fp.TerminationReason.POLICY_DENIED


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_async_savers_run_pause_and_resume(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # fencepost's opener, so a graph built with no ledger keeps its budget in the same store.
    url = f"sqlite:///{tmp_path / 'runs.db'}" if kind == "sqlite" else None
    async with aopen_checkpointer(url or request.getfixturevalue("postgres_schema")) as saver:
        h = harness(
            [call(n=1), call("write_note", 2, note="x"), final_citing_last],
            checkpointer=saver,
            approval="interrupt",
        )
        config, ctx = thread(), context()
        await h.graph.ainvoke(fp.start("q", budget()), config, context=ctx)
        out = await h.graph.ainvoke(Command(resume="approve"), config, context=ctx)
        state = fp.run_output(out)
        assert state.termination is fp.TerminationReason.COMPLETED
        assert [n for n, _, _ in h.calls.log] == ["search_logs", "write_note"]
