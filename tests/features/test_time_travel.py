"""Time travel: a fork of a fencepost run is refused before anything is written.

LangGraph forks a thread when it is invoked (or its state updated) at a checkpoint that is not
the thread's latest. A fencepost run's budget lives in its ledger account, which the run's
ending closed, so a fork could never be the run it branches from; it would only end
``policy_denied`` / ``run_closed`` and become the thread's head, and ``fencepost runs`` would
list the finished run as denied. :class:`fencepost.ForkRefused` is raised instead, nothing is
saved, and the original ending stays what ``runs`` and ``show`` report. Naming the latest
checkpoint (``get_state(config).config``) is no fork.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command
from typer.testing import CliRunner

import fencepost as fp
from fencepost.cli import app
from tests.graph.kit import budget, call, context, final_citing_last, harness, thread


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[SqliteSaver, Path]]:
    conn = sqlite3.connect(tmp_path / "runs.db", check_same_thread=False)
    try:
        yield SqliteSaver(conn), tmp_path / "runs.db"
    finally:
        conn.close()


def finished(saver: SqliteSaver) -> tuple[Any, dict[str, Any], fp.AgentState]:
    h = harness([call(), final_citing_last], checkpointer=saver)
    config = thread()
    state = h.run(config=config)
    assert state.termination is fp.TerminationReason.COMPLETED
    return h, config, state


def earlier(graph: Any, config: dict[str, Any]) -> dict[str, Any]:
    """The config of a checkpoint before the run's last one (one where decide comes next)."""
    history = list(graph.get_state_history(config))
    return next(s.config for s in history[1:] if s.next == ("decide",))


def count_checkpoints(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0])


def test_invoking_an_earlier_checkpoint_of_a_finished_run_is_refused_before_anything_is_written(
    store: tuple[SqliteSaver, Path],
) -> None:
    saver, path = store
    h, config, state = finished(saver)
    before = count_checkpoints(path)
    with pytest.raises(fp.ForkRefused) as refused:
        h.graph.invoke(None, earlier(h.graph, config), context=context())
    assert "checkpoint" in str(refused.value)
    assert count_checkpoints(path) == before
    head = fp.run_output(h.graph.get_state(config).values)
    assert head.termination is fp.TerminationReason.COMPLETED
    assert head == state
    assert h.calls.count("search_logs") == 1


def test_an_async_fork_and_a_state_update_at_an_earlier_checkpoint_are_refused_too(
    store: tuple[SqliteSaver, Path],
) -> None:
    saver, path = store
    h, config, _ = finished(saver)
    old = earlier(h.graph, config)
    before = count_checkpoints(path)
    with pytest.raises(fp.ForkRefused):
        h.graph.update_state(old, {"run": {"question": "something else"}})
    with pytest.raises(fp.ForkRefused):
        list(h.graph.stream(None, old, context=context()))

    async def fork() -> None:
        from langgraph.checkpoint.memory import InMemorySaver

        a = harness([call(), final_citing_last], checkpointer=InMemorySaver())
        cfg = thread()
        await a.graph.ainvoke(fp.start("q", budget()), cfg, context=context())
        with pytest.raises(fp.ForkRefused):
            await a.graph.ainvoke(None, earlier(a.graph, cfg), context=context())
        with pytest.raises(fp.ForkRefused):
            await a.graph.aupdate_state(earlier(a.graph, cfg), {"run": {"question": "x"}})

    asyncio.run(fork())
    assert count_checkpoints(path) == before


def test_fencepost_runs_and_show_report_the_original_ending_after_a_refused_fork(
    store: tuple[SqliteSaver, Path],
) -> None:
    saver, path = store
    h, config, state = finished(saver)
    with pytest.raises(fp.ForkRefused):
        h.graph.invoke(None, earlier(h.graph, config), context=context())
    url = f"sqlite:///{path.resolve()}"
    runs = json.loads(CliRunner().invoke(app, ["runs", "--db", url, "--json"]).stdout)
    assert [(r["run_id"], r["status"]) for r in runs] == [(state.run_id, "completed")]
    shown = json.loads(
        CliRunner().invoke(app, ["show", state.run_id, "--db", url, "--json"]).stdout
    )
    assert shown["termination"] == "completed"


def test_the_latest_checkpoint_named_explicitly_is_no_fork(
    store: tuple[SqliteSaver, Path],
) -> None:
    saver, _ = store
    h = harness(
        [call("write_note", 1, note="a"), final_citing_last],
        checkpointer=saver,
        approval="interrupt",
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    head = h.graph.get_state(config).config  # names the latest checkpoint
    out = fp.run_output(h.graph.invoke(Command(resume="approve"), head, context=ctx))
    assert out.termination is fp.TerminationReason.COMPLETED
