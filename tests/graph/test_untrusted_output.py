"""Tool errors reach the model only as safe codes; nothing secret lands in manifests or checkpoints."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from langgraph.checkpoint.sqlite import SqliteSaver

import fencepost as fp
from tests.graph.kit import budget, call, context, harness, thread

SECRET = "hunter2"


def test_tool_exception_text_never_reaches_model_manifests_or_checkpoint(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    conn = sqlite3.connect(db, check_same_thread=False)
    saver = SqliteSaver(conn)
    h = harness(
        [call("explode", 1), fp.AbstainProposal(reason="insufficient_evidence")], checkpointer=saver
    )
    config = thread()
    state = fp.run_output(h.graph.invoke(fp.start("q", budget()), config, context=context()))
    conn.commit()
    assert state.observations[0].error_code is fp.ErrorCode.INTERNAL_ERROR
    next_input = h.model.inputs[-1]
    assert SECRET not in next_input.model_dump_json()
    assert all(SECRET not in m.model_dump_json() for m in state.manifests)
    conn.close()
    assert SECRET.encode() not in db.read_bytes()
    wal = db.with_name(db.name + "-wal")
    assert not wal.exists() or SECRET.encode() not in wal.read_bytes()


def test_manifests_hold_no_arguments_or_results() -> None:
    marker = "ARGUMENT-TEXT-XYZ"
    h = harness(
        [call(n=1, query=marker), fp.AbstainProposal(reason="insufficient_evidence")],
        search_result={"hits": ["RESULT-TEXT-XYZ"]},
    )
    state = h.run()
    for m in state.manifests:
        dumped = m.model_dump_json()
        assert marker not in dumped and "RESULT-TEXT-XYZ" not in dumped


def test_manifests_stream_on_custom_mode_and_stay_in_state() -> None:
    h = harness([call(), fp.AbstainProposal(reason="insufficient_evidence")])
    config = thread()
    streamed = [
        chunk
        for chunk in h.graph.stream(
            fp.start("q", budget()), config, context=context(), stream_mode="custom"
        )
        if chunk.get("fencepost") == "manifest"
    ]
    state = fp.run_output(h.graph.get_state(config).values)
    assert [{k: v for k, v in c.items() if k != "fencepost"} for c in streamed] == [
        m.model_dump(mode="json") for m in state.manifests
    ]
    assert [m.phase for m in state.manifests] == [
        fp.policy.Phase.VALIDATE,
        fp.policy.Phase.EXECUTE,
        fp.policy.Phase.DECIDE,
        fp.policy.Phase.TERMINAL,
    ]
