"""A checkpoint holds plain data: any LangGraph saver with its default serializer works.

Every value fencepost writes to a channel is msgpack-native (dict, list, str, int, float, bool,
None) or a LangChain message, so a plain ``InMemorySaver()`` or ``SqliteSaver(conn)`` stores a
run and revives it in LangGraph's strict mode and in its default mode without a warning, and
``get_state().values`` reads as JSON. A checkpoint written by the first layout (one channel per
field, records as extension types) is refused with a typed error naming its layout, never
half-read.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import fencepost as fp
from fencepost.graph.state import LAYOUT, LayoutRefused
from tests.graph.kit import budget, call, context, final_citing_last, harness, thread

FIXTURE = Path(__file__).parent.parent / "fixtures" / "layout1.sqlite"
_PLAIN = (dict, list, str, int, float, bool, type(None))


def _ext_codes(blob: bytes) -> list[tuple[int, bytes]]:
    """The msgpack extension types in ``blob``, each with its raw body."""
    found: list[tuple[int, bytes]] = []

    def hook(code: int, data: bytes) -> Any:
        found.append((code, data))
        return ormsgpack.unpackb(data, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)

    ormsgpack.unpackb(blob, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
    return found


def _stored_blobs(saver: InMemorySaver) -> list[tuple[str, bytes]]:
    """Every (type, bytes) an in-memory saver holds: channel blobs and pending writes."""
    blobs = [typed for typed in saver.blobs.values()]
    blobs += [(t, b) for writes in saver.writes.values() for (_, _, (t, b), _) in writes.values()]
    for checkpoints in saver.storage.values():
        for by_id in checkpoints.values():
            for checkpoint, metadata, _ in by_id.values():
                blobs += [checkpoint, metadata]
    return blobs


def _approval_round_trip(saver: Any) -> dict[str, Any]:
    h = harness(
        [call(n=1), call("write_note", 2, note="hi"), final_citing_last],
        approval="interrupt",
        checkpointer=saver,
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    out = h.graph.invoke(Command(resume="approve"), config, context=ctx)
    assert fp.run_output(out).termination is fp.TerminationReason.COMPLETED
    return h.graph.get_state(config).values


def test_every_value_a_run_stores_is_plain_data_or_a_langchain_message() -> None:
    saver = InMemorySaver()
    _approval_round_trip(saver)
    for kind, blob in _stored_blobs(saver):
        if kind != "msgpack":
            assert kind in ("empty", "null"), kind
            continue
        for code, body in _ext_codes(blob):
            # LangChain messages and LangGraph's own records (an interrupt, a snapshot) are
            # stored as LangGraph stores them; no type of fencepost's is.
            assert b"fencepost." not in body, body[:160]
            assert b"langchain_core." in body or b"langgraph." in body or code == 7, body[:160]


def test_get_state_values_read_as_json() -> None:
    values = _approval_round_trip(InMemorySaver())
    assert set(values) == {"request", "run", "messages"}
    text = json.dumps({"request": values["request"], "run": values["run"]})
    assert json.loads(text)["run"]["termination"] == "completed"
    assert fp.run_output(values).termination is fp.TerminationReason.COMPLETED


def test_a_sqlite_saver_as_it_comes_stores_and_resumes_a_run(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "runs.db", check_same_thread=False)
    try:
        values = _approval_round_trip(SqliteSaver(conn))
    finally:
        conn.close()
    assert values["run"]["phase"] == "terminal"


_CHILD = r"""
import json, logging, sqlite3, sys, warnings
records = []
class Grab(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger().addHandler(Grab())
logging.getLogger().setLevel(logging.DEBUG)
warnings.simplefilter("always")
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command
import fencepost as fp

@fp.tool(effect="write", capability="notes:write")
def write_note(note: str) -> dict:
    "Write a note."
    return {"written": True}

user = fp.RunContext(tenant_id="acme", principal=fp.Principal(id="u-1", capabilities={"notes:write"}))
ends = []
with warnings.catch_warnings(record=True) as caught:
    for saver in (InMemorySaver(), SqliteSaver(sqlite3.connect(sys.argv[1], check_same_thread=False))):
        model = fp.ScriptedDecisionModel([
            fp.ToolProposal(call_id="call-0001", tool_name="write_note", arguments={"note": "n"}),
            fp.FinalProposal(answer=fp.AnswerPayload(text="Noted.", citations=("call-0001",))),
        ])
        agent = fp.create_agent(model, [write_note], checkpointer=saver, approval="interrupt")
        config = {"configurable": {"thread_id": "t-1"}}
        agent.invoke(fp.start("note it"), config, context=user)
        agent.invoke(Command(resume="approve"), config, context=user)
        ends.append(fp.run_output(agent.get_state(config).values).termination.value)
quiet = list(records)
# The control: the capture does see LangGraph's message for a record no allowlist names.
import pydantic
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
class Unlisted(pydantic.BaseModel):
    value: int = 1
serde = JsonPlusSerializer()
serde.loads_typed(serde.dumps_typed(Unlisted()))
print(json.dumps({"ends": ends, "logged": quiet, "warned": [str(w.message) for w in caught],
                  "control": records[len(quiet):]}))
"""


@pytest.mark.parametrize("strict", ["true", None], ids=["strict", "default-mode"])
def test_a_plain_saver_runs_an_approval_round_trip_without_a_warning(
    strict: str | None, tmp_path: Path
) -> None:
    # LangGraph reads LANGGRAPH_STRICT_MSGPACK at import: each mode in an interpreter of its own.
    env = {k: v for k, v in os.environ.items() if k != "LANGGRAPH_STRICT_MSGPACK"}
    if strict is not None:
        env["LANGGRAPH_STRICT_MSGPACK"] = strict
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "runs.db")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent.parent.parent,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["ends"] == ["completed", "completed"]
    noise = [
        m
        for m in report["logged"] + report["warned"]
        if "nregistered" in m or "locked" in m or "erializ" in m
    ]
    assert noise == []
    assert any("nregistered" in m or "locked" in m for m in report["control"]), report["control"]


# -- a checkpoint of another layout --------------------------------------------------------------


def _layout1_copy(tmp_path: Path) -> sqlite3.Connection:
    target = tmp_path / "layout1.sqlite"
    shutil.copyfile(FIXTURE, target)
    return sqlite3.connect(target, check_same_thread=False)


def _agent(saver: Any) -> Any:
    @fp.tool(effect="read", capability="logs:read")
    def search_logs(query: str) -> dict[str, Any]:
        """Search the service logs."""
        return {"hits": []}

    @fp.tool(effect="write", capability="notes:write")
    def write_note(note: str) -> dict[str, Any]:
        """Write a note."""
        return {"written": True}

    model = fp.ScriptedDecisionModel([fp.AbstainProposal(reason="insufficient_evidence")])
    return fp.create_agent(
        model, [search_logs, write_note], checkpointer=saver, approval="interrupt"
    )


_USER = fp.RunContext(
    tenant_id="acme",
    principal=fp.Principal(id="u-1", capabilities=frozenset({"logs:read", "notes:write"})),
)


@pytest.mark.parametrize("thread_id", ["layout1-done", "layout1-paused"])
def test_a_checkpoint_of_the_first_layout_is_refused_naming_its_layout(
    thread_id: str, tmp_path: Path
) -> None:
    conn = _layout1_copy(tmp_path)
    try:
        agent = _agent(SqliteSaver(conn))
        config = {"configurable": {"thread_id": thread_id}}
        with pytest.raises(LayoutRefused) as refused:
            fp.run_output(agent.get_state(config).values)
        assert refused.value.layout == 1 and "layout 1" in str(refused.value)
        before = conn.execute("select count(*) from checkpoints").fetchone()
        if thread_id == "layout1-paused":
            # The approval's node reads the run first: refused, nothing of it run or written.
            with pytest.raises(LayoutRefused):
                agent.invoke(Command(resume="approve"), config, context=_USER)
        else:
            # A finished thread runs no node; what it returns is refused as the state was.
            with pytest.raises(LayoutRefused):
                fp.run_output(agent.invoke(None, config, context=_USER))
        assert conn.execute("select count(*) from checkpoints").fetchone() == before
    finally:
        conn.close()
    assert LAYOUT == 2


def test_fencepost_runs_refuses_a_store_of_the_first_layout_naming_it(tmp_path: Path) -> None:
    from fencepost.reporting import OlderLayoutStore, load_runs, open_store

    target = tmp_path / "layout1.sqlite"
    shutil.copyfile(FIXTURE, target)
    with open_store(f"sqlite:///{target}") as saver, pytest.raises(OlderLayoutStore) as refused:
        load_runs(saver)
    assert "2 fencepost run(s) written by state layout 1" in str(refused.value)
    assert refused.value.code == "older_state_layout"
