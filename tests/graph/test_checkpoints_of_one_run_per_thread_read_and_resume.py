"""Checkpoints written while a thread held one run (state layout 2, before conversations) still
read and resume, and new input on such a thread starts its next run.

The fixture ``tests/fixtures/layout2-one-run-per-thread.sqlite`` was written by main at commit
145075a (the script is in ``tests/fixtures/README.md``), with the default durable ledger in the
same file: a thread whose run completed, and one whose run is paused for approval of a write. A
thread's first run keeps its ledger account (named from the thread alone), so the paused run
resumes on the account it reserved from.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import fencepost as fp

FIXTURE = Path(__file__).parent.parent / "fixtures" / "layout2-one-run-per-thread.sqlite"

USER = fp.RunContext(
    tenant_id="acme", principal=fp.Principal(id="u-1", capabilities={"logs:read", "notes:write"})
)

written: list[str] = []


@fp.tool(effect="read", capability="logs:read")
def search_logs(query: str) -> dict[str, Any]:
    """Search the service logs."""
    return {"hits": ["500 on /checkout after deploy 42"]}


@fp.tool(effect="write", capability="notes:write")
def write_note(note: str) -> dict[str, Any]:
    """Write a note."""
    written.append(note)
    return {"written": True}


@pytest.fixture
def saver(tmp_path: Path) -> Iterator[SqliteSaver]:
    target = tmp_path / FIXTURE.name
    shutil.copyfile(FIXTURE, target)
    conn = sqlite3.connect(target, check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


def _agent(saver: SqliteSaver, script: list[Any], **kw: Any) -> Any:
    model = fp.ScriptedDecisionModel(script)
    return fp.create_agent(model, [search_logs, write_note], checkpointer=saver, **kw)


def test_a_completed_run_reads_and_a_new_message_starts_the_threads_next_run(
    saver: SqliteSaver,
) -> None:
    config = {"configurable": {"thread_id": "layout2-done"}}
    agent = _agent(
        saver,
        [
            fp.ToolProposal(call_id="call-0001", tool_name="search_logs", arguments={"query": "x"}),
            lambda inp: fp.FinalProposal(
                answer=fp.AnswerPayload(text="roll back", citations=("call-0001",))
            ),
        ],
    )
    first = fp.run_output(agent.get_state(config).values)
    assert first.termination is fp.TerminationReason.COMPLETED
    assert first.turns == ()
    out = agent.invoke({"messages": [HumanMessage("what now?")]}, config, context=USER)
    second = fp.run_output(out)
    assert second.termination is fp.TerminationReason.COMPLETED
    assert second.run_id != first.run_id
    assert [t.run_id for t in second.turns] == [first.run_id]
    assert agent.get_state(config).values["messages"][0].content == "Why is checkout failing?"
    earlier = fp.run_output(out, run_id=first.run_id)
    assert earlier.final_answer == first.final_answer


def test_a_paused_run_refuses_new_input_and_resumes_once(saver: SqliteSaver) -> None:
    config = {"configurable": {"thread_id": "layout2-paused"}}
    agent = _agent(
        saver,
        [fp.FinalProposal(answer=fp.AnswerPayload(text="Noted.", citations=("call-0001",)))],
        approval="interrupt",
    )
    assert agent.get_state(config).next == ("approve",)
    with pytest.raises(fp.RunInProgress):
        agent.invoke({"messages": [HumanMessage("and?")]}, config, context=USER)
    written.clear()
    out = agent.invoke(Command(resume="approve"), config, context=USER)
    state = fp.run_output(out)
    assert state.run_id == "run-layout2-paused"
    assert state.termination is fp.TerminationReason.COMPLETED
    assert written == ["deploy 42"]
