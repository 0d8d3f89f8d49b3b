"""A checkpoint holds plain data: any LangGraph saver with its default serializer works.

Every value fencepost writes to a channel is msgpack-native (dict, list, str, int, float, bool,
None) or a LangChain message, so a plain ``InMemorySaver()`` or ``SqliteSaver(conn)`` stores a
run and revives it in LangGraph's strict mode and in its default mode without a warning, and
``get_state().values`` reads as JSON. A checkpoint written by the first layout (one channel per
field, records as extension types) is refused with a typed error naming its layout, never
half-read. A record that holds a subclass of a contract record (an application's own proposal,
answer or budget) is stored as the type its field declares.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import fencepost as fp
from fencepost.graph.record import plain
from fencepost.graph.state import LAYOUT, LayoutRefused, StartRequest
from fencepost.policy import (
    AnswerPayload,
    BatchEntry,
    ReportedCall,
    RuntimeBudget,
    StopKind,
    StopReport,
    StopRequest,
    TerminationReason,
    ToolProposal,
    Verdict,
    VerdictCode,
)
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


def _rows(conn: sqlite3.Connection) -> dict[str, list[Any]]:
    """Every row of every table of the database (checkpoints, writes, the ledger's)."""
    tables = [t for (t,) in conn.execute("select name from sqlite_master where type = 'table'")]
    return {t: sorted(conn.execute(f"select * from {t}").fetchall(), key=repr) for t in tables}


def _sync(act: Callable[[Any, dict[str, Any]], Any]) -> Callable[[Path, str], Any]:
    def call(path: Path, thread_id: str) -> Any:
        conn = sqlite3.connect(path, check_same_thread=False)
        try:
            return act(_agent(SqliteSaver(conn)), {"configurable": {"thread_id": thread_id}})
        finally:
            conn.close()

    return call


def _async(act: Callable[[Any, dict[str, Any]], Any]) -> Callable[[Path, str], Any]:
    async def run(path: Path, thread_id: str) -> Any:
        async with fp.aopen_checkpointer(f"sqlite:///{path}") as saver:
            return await act(_agent(saver), {"configurable": {"thread_id": thread_id}})

    return lambda path, thread_id: asyncio.run(run(path, thread_id))


async def _collect(chunks: Any) -> list[Any]:
    return [chunk async for chunk in chunks]


_ENTRY_POINTS: dict[str, Callable[[Path, str], Any]] = {
    "invoke-none": _sync(lambda a, c: a.invoke(None, c, context=_USER)),
    "resume": _sync(lambda a, c: a.invoke(Command(resume="approve"), c, context=_USER)),
    "new-input": _sync(lambda a, c: a.invoke(fp.start("q"), c, context=_USER)),
    "update-state": _sync(lambda a, c: a.update_state(c, {"run": {"step": 1}})),
    "stream": _sync(lambda a, c: list(a.stream(None, c, context=_USER))),
    "ainvoke": _async(lambda a, c: a.ainvoke(None, c, context=_USER)),
    "astream-resume": _async(
        lambda a, c: _collect(a.astream(Command(resume="approve"), c, context=_USER))
    ),
    "aupdate-state": _async(lambda a, c: a.aupdate_state(c, {"run": {"step": 1}})),
}


@pytest.mark.parametrize("thread_id", ["layout1-done", "layout1-paused"])
def test_a_checkpoint_of_the_first_layout_reads_as_refused_naming_its_layout(
    thread_id: str, tmp_path: Path
) -> None:
    conn = _layout1_copy(tmp_path)
    try:
        agent = _agent(SqliteSaver(conn))
        with pytest.raises(LayoutRefused) as refused:
            fp.run_output(agent.get_state({"configurable": {"thread_id": thread_id}}).values)
        assert refused.value.layout == 1 and "layout 1" in str(refused.value)
    finally:
        conn.close()
    assert LAYOUT == 2


@pytest.mark.parametrize("entry", list(_ENTRY_POINTS))
@pytest.mark.parametrize("thread_id", ["layout1-done", "layout1-paused"])
def test_every_call_on_a_first_layout_thread_is_refused_and_writes_nothing(
    thread_id: str, entry: str, tmp_path: Path
) -> None:
    # A finished thread ran no node, so invoke(None) and a resume returned its raw values and
    # saved a __resume__ write; a paused one was refused by its node after LangGraph had saved
    # the node's __error__. Refused means refused before anything is saved.
    conn = _layout1_copy(tmp_path)
    # The ledger beside the saver migrates its own tables when a graph opens it (a table added
    # since the fixture was made): that is the ledger's setup, not a write of the refused call.
    fp.SqliteLedger(tmp_path / "layout1.sqlite").close()
    try:
        before = _rows(conn)
    finally:
        conn.close()
    with pytest.raises(LayoutRefused) as refused:
        _ENTRY_POINTS[entry](tmp_path / "layout1.sqlite", thread_id)
    assert refused.value.layout == 1
    conn = sqlite3.connect(tmp_path / "layout1.sqlite")
    try:
        assert _rows(conn) == before
    finally:
        conn.close()


def test_fencepost_runs_refuses_a_store_of_the_first_layout_naming_it(tmp_path: Path) -> None:
    from fencepost.reporting import OlderLayoutStore, load_runs, open_store

    target = tmp_path / "layout1.sqlite"
    shutil.copyfile(FIXTURE, target)
    with open_store(f"sqlite:///{target}") as saver, pytest.raises(OlderLayoutStore) as refused:
        load_runs(saver)
    assert "2 fencepost run(s) written by state layout 1" in str(refused.value)
    assert refused.value.code == "older_state_layout"


# -- records holding a subclass of a contract record -------------------------------------------


class ReasonedProposal(ToolProposal):
    """An application's proposal with a field of its own (its model's stated reason)."""

    why: str = ""


class ConfidentAnswer(AnswerPayload):
    confidence: float = 0.5


class TrackedBudget(RuntimeBudget):
    owner: str = "team-a"


class NotedCall(ReportedCall):
    note: str = ""


def _proposal() -> ReasonedProposal:
    return ReasonedProposal(
        call_id="call-0001", tool_name="write_note", arguments={"note": "hi"}, why="asked to"
    )


_HOLDING_A_SUBCLASS: list[Any] = [
    BatchEntry(
        proposal=_proposal(),
        verdict=Verdict(
            call_id="call-0001",
            tool_name="write_note",
            fingerprint="f" * 64,
            code=VerdictCode.APPROVAL_PENDING,
        ),
    ),
    StopRequest(
        reason=TerminationReason.COMPLETED, answer=ConfidentAnswer(text="done", confidence=0.9)
    ),
    StartRequest(
        run_id="run-1",
        question="q",
        budget=TrackedBudget(steps_remaining=3, tool_calls_remaining=2),
    ),
    StopReport(
        kind=StopKind.COMPLETED,
        reason=TerminationReason.COMPLETED,
        completed=(NotedCall(call_id="call-0001", tool_name="t", note="n"),),
    ),
]


def _types(value: Any) -> Any:
    if hasattr(value, "__dict__") and hasattr(type(value), "model_fields"):
        return (type(value), {k: _types(v) for k, v in value.__dict__.items()})
    if isinstance(value, tuple | list):
        return [_types(v) for v in value]
    return type(value)


@pytest.mark.parametrize("record", _HOLDING_A_SUBCLASS, ids=lambda r: type(r).__name__)
def test_a_record_holding_a_subclass_is_stored_as_the_type_its_field_declares(
    record: Any,
) -> None:
    """A contract record may hold an instance of a subclass of the record a field names (strict
    pydantic accepts one). Its plain form, what a checkpoint stores, holds the fields the
    declared type has, so it reads back as that type, never half-read."""
    serde = JsonPlusSerializer()
    back = type(record).model_validate(serde.loads_typed(serde.dumps_typed(plain(record))))
    declared = type(record).model_validate(plain(record))
    assert back == declared
    assert _types(back) == _types(declared)


def test_a_decision_models_proposal_subclass_survives_an_approval_pause() -> None:
    """A decision model's own ToolProposal subclass, paused for approval and resumed from the
    checkpoint: the batch entry comes back whole, and the approved write runs once."""
    h = harness(
        [_proposal(), final_citing_last],
        approval="interrupt",
        checkpointer=InMemorySaver(),
    )
    config, ctx = thread(), context()
    paused = h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    assert "__interrupt__" in paused
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.log == [("write_note", {"note": "hi"}, "call-0001")]


def test_a_batch_entry_a_checkpoint_half_reads_is_refused_not_acted_on() -> None:
    """A caller writes a batch entry made with ``model_construct`` whose verdict has a field of
    the wrong type: kept by a check of its type alone, it comes back from the checkpoint half
    read (its proposal and verdict as dicts). A half-read entry is an invalid state, never acted
    on: the run ends typed, and nothing runs."""
    h, config, ctx = _paused_with_a_forged_verdict(problems=5)
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.report is not None and state.report.error_code == "invalid_state"
    assert h.calls.log == []


def test_a_decision_models_proposal_subclass_runs_in_the_step_it_was_proposed() -> None:
    """A batch entry's items are checked field by field when a node loads state; the proposal a
    field holds may be of a subclass, as pydantic takes it, so a decision model's own proposal
    class (a read, run without a pause) is not refused as an invalid state."""
    h = harness(
        [
            ReasonedProposal(
                call_id="call-0001", tool_name="search_logs", arguments={"query": "q"}
            ),
            final_citing_last,
        ],
        checkpointer=InMemorySaver(),
    )
    state = fp.run_output(h.graph.invoke(fp.start("q", budget()), thread(), context=context()))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert [name for name, _, _ in h.calls.log] == ["search_logs"]


def _paused_with_a_forged_verdict(**fields: Any) -> tuple[Any, dict[str, Any], fp.RunContext]:
    """A run paused for approval of a write, whose batch entry a caller then rewrote with
    ``update_state``: its verdict made with ``model_construct``, ``fields`` changed."""
    h = harness(
        [call("write_note", 1, note="hi"), final_citing_last],
        approval="interrupt",
        checkpointer=InMemorySaver(),
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    entry = fp.run_output(h.graph.get_state(config).values).batch[0]
    verdict = Verdict.model_construct(**{**entry.verdict.__dict__, **fields})
    forged = BatchEntry.model_construct(proposal=entry.proposal, verdict=verdict)
    h.graph.update_state(config, {"run": {"batch": (forged,)}})
    return h, config, ctx
