"""A stored run-record write that is no map ends the run ``invalid_state``, typed, never half-read.

Every caller's write to the ``run`` channel is stored as a map (``update_state``,
``Command(update=...)``, a JSON client's, ``null`` included), and every node's is one. A write
that is no map is one somebody edited into the checkpoint by hand: what it held of the run is
lost. Skipped, the record was half-read (a receipt gone), and where it was the run's first write
there was no run at all: every later ``invoke`` raised ``RuntimeError('no run on this thread')``.
Now the next node ends the run ``policy_denied`` (``invalid_state``), nothing more runs, and the
thread reads back typed at every later invoke.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import fencepost as fp
from fencepost.graph.record import fold, unrepresentable
from fencepost.graph.state import MendedState, load_state
from tests.graph.kit import budget, call, context, final_citing_last, harness, thread


def _edit_run_write(conn: sqlite3.Connection, saver: SqliteSaver, which: int, value: Any) -> None:
    """Replace the ``which``-th stored write of the run record by ``value`` (by hand, in SQL)."""
    rows = conn.execute("select rowid from writes where channel = 'run' order by rowid").fetchall()
    kind, blob = saver.serde.dumps_typed(value)
    conn.execute(
        "update writes set type = ?, value = ? where rowid = ?", (kind, blob, rows[which][0])
    )
    conn.commit()


@pytest.mark.parametrize("value", ["edited", None, [1, 2], 7], ids=["text", "null", "list", "int"])
@pytest.mark.parametrize("which", [0, 1, -1], ids=["first", "middle", "last"])
def test_a_run_write_edited_into_no_map_ends_the_run_invalid_state(
    tmp_path: Path, which: int, value: Any
) -> None:
    conn = sqlite3.connect(tmp_path / "runs.db", check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        h = harness(
            [call("search_logs", 1, query="x"), call("write_note", 2, note="a"), final_citing_last],
            approval="interrupt",
            checkpointer=saver,
        )
        config, ctx = thread(), context()
        h.graph.invoke(fp.start("q", budget()), config, context=ctx)
        assert h.graph.get_state(config).next == ("approve",)
        run_id = fp.run_output(h.graph.get_state(config).values).run_id
        _edit_run_write(conn, saver, which, value)
        for _ in range(2):  # and every later invoke reads the ended run back, typed
            h.graph.invoke(Command(resume="approve"), config, context=ctx)
            snapshot = h.graph.get_state(config)
            state = fp.run_output(snapshot.values)
            assert snapshot.next == ()
            assert state.termination is fp.TerminationReason.POLICY_DENIED
            assert state.last_error_code == "invalid_state"
            assert state.run_id == run_id
        # The approved write never ran on the record it could not read whole.
        assert [name for name, _, _ in h.calls.log] == ["search_logs"]
    finally:
        conn.close()


@pytest.mark.parametrize("value", ["edited", None, [1, 2], 7], ids=["text", "null", "list", "int"])
def test_a_write_of_no_map_is_read_as_a_stop_no_run_can_hold(value: Any) -> None:
    started = fold({}, [{"run_id": "run-1", "question": "q", "step": 2}])
    after = fold(started, [value])
    assert after["stop"] == unrepresentable()
    assert (after["run_id"], after["step"]) == ("run-1", 2)  # what else it holds is kept
    state = load_state({"run": after})
    assert isinstance(state, MendedState) and state.invalid
    assert state.stop is not None and state.stop.error_code == "invalid_state"
    # A run's lost first write: the record still holds a run, which ends.
    lost = fold({}, [value, {"step": 2}])
    assert lost["run_id"] == unrepresentable()
    request = {"run_id": "run-1", "question": "q"}
    state = load_state({"run": lost, "request": request})
    assert isinstance(state, MendedState) and state.invalid and state.run_id == "run-1"
