"""A fork is a new run: invoking, streaming or updating a thread at one of its earlier checkpoints
(LangGraph's time travel, Studio's "edit and rerun") goes on from the run as it stood there, on a
ledger account of its own under the same tenant and parent accounts, with a stop report naming
the checkpoint it was forked from. The run it branches from keeps its ending, and ``fencepost
runs`` still shows it. A call id that ran, or may have, never runs again on any branch.

Each test runs on LangGraph's ``InMemorySaver``, on a SQLite file and on Postgres (when a test
server is set), each with the durable default ledger beside it.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command
from typer.testing import CliRunner

import fencepost as fp
from fencepost.adapters.checkpointers import open_checkpointer
from fencepost.adapters.default_ledger import durable_ledger
from fencepost.cli import app
from fencepost.policy.keys import run_account
from tests.graph.kit import (
    budget,
    call,
    context,
    final_citing_last,
    harness,
    thread,
)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield InMemorySaver()
    elif request.param == "sqlite":
        conn = sqlite3.connect(tmp_path / "runs.db", check_same_thread=False)
        try:
            yield SqliteSaver(conn)
        finally:
            conn.close()
    else:
        with open_checkpointer(request.getfixturevalue("postgres_schema")) as pg:
            yield pg


def ledger_of(saver: Any) -> fp.Ledger:
    """The ledger a graph built with none keeps its books in, for this saver."""
    ledger = durable_ledger(saver)
    assert ledger is not None
    return ledger


def answer(text: str) -> Any:
    def final(inp: fp.DecisionInput) -> fp.FinalProposal:
        return fp.FinalProposal(answer=fp.AnswerPayload(text=text))

    return final


def checkpoint_id(snapshot: Any) -> str:
    return str(snapshot.config["configurable"]["checkpoint_id"])


def ended_at(graph: Any, config: dict[str, Any], run_id: str) -> Any:
    """The first checkpoint of the thread's history where run ``run_id`` has ended."""
    ended = [
        s
        for s in graph.get_state_history(config)
        if s.values.get("run", {}).get("run_id") == run_id
        and fp.run_output(s.values).termination is not None
    ]
    return ended[-1]


def test_new_input_at_an_ended_run_s_checkpoint_starts_a_new_run_on_its_own_account(
    saver: Any,
) -> None:
    h = harness(
        [answer("first"), answer("second"), answer("forked")],
        checkpointer=saver,
    )
    config, ctx = thread(), context()
    first = fp.run_output(h.graph.invoke({"messages": [HumanMessage("one?")]}, config, context=ctx))
    second = fp.run_output(
        h.graph.invoke({"messages": [HumanMessage("two?")]}, config, context=ctx)
    )
    at = ended_at(h.graph, config, first.run_id)
    forked = fp.run_output(
        h.graph.invoke(
            {"messages": [HumanMessage("two, asked otherwise?")]}, at.config, context=ctx
        )
    )
    assert forked.termination is fp.TerminationReason.COMPLETED
    assert forked.final_answer is not None and forked.final_answer.text == "forked"
    assert forked.run_id not in (first.run_id, second.run_id)
    assert forked.forked_from == checkpoint_id(at)
    assert forked.report is not None and forked.report.forked_from == checkpoint_id(at)
    # The conversation as it stood there: the first run, not the second.
    assert [t.run_id for t in forked.turns] == [first.run_id]
    thread_id = config["configurable"]["thread_id"]
    ledger = ledger_of(saver)
    original = ledger.balance(run_account(thread_id, second.run_id, "", 1))
    fork_account = ledger.balance(run_account(thread_id, forked.run_id, "", 1, forked.branch))
    assert original.closed == "completed" and fork_account.closed == "completed"
    assert fork_account.held.get("steps") == 1 and original.held.get("steps") == 1
    # The original run keeps its ending in the thread's history.
    kept = ended_at(h.graph, config, second.run_id)
    assert fp.run_output(kept.values).termination is fp.TerminationReason.COMPLETED
    assert fp.run_output(kept.values).forked_from is None
    # The fork's branch goes on as a conversation: its next run follows it, and is no fork.
    h.model._script.append(answer("three"))
    third = fp.run_output(
        h.graph.invoke({"messages": [HumanMessage("three?")]}, config, context=ctx)
    )
    assert [t.run_id for t in third.turns] == [first.run_id, forked.run_id]
    assert third.forked_from is None and third.report is not None
    assert third.report.forked_from is None


def test_a_fork_of_a_run_paused_before_a_write_never_runs_the_write_twice(saver: Any) -> None:
    h = harness(
        [call("write_note", 1, note="a"), final_citing_last, answer("fork: done")],
        checkpointer=saver,
        approval="interrupt",
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    paused = h.graph.get_state(config)
    assert paused.next == ("approve",)
    out = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert out.termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1
    # Approving the same pause again on a fork: the call id ran, so it never runs again.
    forked = fp.run_output(h.graph.invoke(Command(resume="approve"), paused.config, context=ctx))
    assert h.calls.count("write_note") == 1
    (receipt,) = [r for r in forked.receipts if r.call_id == "call-0001"]
    assert receipt.status is fp.ReceiptStatus.UNCERTAIN
    assert receipt.error_code is fp.ErrorCode.EXECUTION_UNCERTAIN
    assert forked.forked_from == checkpoint_id(paused)
    assert forked.report is not None and forked.report.forked_from == checkpoint_id(paused)
    assert forked.run_id == out.run_id  # the same run, gone on on another branch
    thread_id = config["configurable"]["thread_id"]
    ledger = ledger_of(saver)
    fork_account = ledger.balance(run_account(thread_id, out.run_id, "", 0, forked.branch))
    original = ledger.balance(run_account(thread_id, out.run_id, "", 0))
    assert original.closed == "completed"
    assert fork_account.closed is not None
    # Nothing ran on the fork's account: the refused call was given back.
    assert fork_account.held.get("tool_calls", 0) == 0


def test_whichever_branch_answers_a_paused_write_first_runs_it_and_only_that_one(
    saver: Any,
) -> None:
    h = harness(
        [call("write_note", 1, note="a"), final_citing_last, answer("original: done")],
        checkpointer=saver,
        approval="interrupt",
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    paused = h.graph.get_state(config)
    # The thread goes on from the pause (its state edited there: the latest), and the pause
    # itself is answered on a fork first.
    edited = h.graph.update_state(paused.config, {"run": {"question": "q, edited"}})
    forked = fp.run_output(h.graph.invoke(Command(resume="approve"), paused.config, context=ctx))
    assert forked.termination is fp.TerminationReason.COMPLETED
    assert forked.forked_from == checkpoint_id(paused)
    assert h.calls.count("write_note") == 1
    # The edited line's pause, answered afterwards (no longer the latest either: a fork too).
    again = fp.run_output(h.graph.invoke(Command(resume="approve"), edited, context=ctx))
    assert again.question == "q, edited"
    assert again.forked_from == edited["configurable"]["checkpoint_id"]
    assert h.calls.count("write_note") == 1
    (receipt,) = [r for r in again.receipts if r.call_id == "call-0001"]
    assert receipt.status is fp.ReceiptStatus.UNCERTAIN


def test_a_replay_from_a_checkpoint_before_a_call_ran_never_runs_it_again(saver: Any) -> None:
    h = harness(
        [call(n=1), final_citing_last, call(n=1), answer("replayed")],
        checkpointer=saver,
    )
    config, ctx = thread(), context()
    first = h.run(config=config, ctx=ctx)
    assert first.termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("search_logs") == 1
    start = [s for s in h.graph.get_state_history(config) if s.next == ("decide",)][-1]
    replayed = fp.run_output(h.graph.invoke(None, start.config, context=ctx))
    assert replayed.forked_from == checkpoint_id(start)
    assert replayed.termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("search_logs") == 1
    (receipt,) = [r for r in replayed.receipts if r.call_id == "call-0001"]
    assert receipt.status is fp.ReceiptStatus.UNCERTAIN


def test_a_fork_is_charged_under_the_same_parent_account(saver: Any) -> None:
    ledger = ledger_of(saver)
    pool = f"pool-{thread()['configurable']['thread_id']}"
    ledger.open_account(pool, {"steps": 3}, owner={"tenant": "acme"})
    h = harness([answer("one"), answer("two"), answer("three")], checkpointer=saver)
    config = thread()
    ctx = context().model_copy(update={"budget_account": pool})
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    start = [s for s in h.graph.get_state_history(config) if s.next == ("decide",)][-1]
    forked = fp.run_output(h.graph.invoke(None, start.config, context=ctx))
    assert forked.termination is fp.TerminationReason.COMPLETED
    assert ledger.balance(pool).held.get("steps") == 2
    h.graph.invoke(None, start.config, context=ctx)
    # The pool funds three steps in all, whichever branch takes them: the fourth is refused.
    assert ledger.balance(pool).held.get("steps") == 3
    last = fp.run_output(h.graph.invoke(None, start.config, context=ctx))
    assert last.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert ledger.balance(pool).held.get("steps") == 3


def test_fencepost_runs_shows_the_original_run_as_it_ended_beside_its_fork(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        h = harness([answer("first"), answer("second"), answer("forked")], checkpointer=saver)
        config, ctx = thread(), context()
        first = fp.run_output(
            h.graph.invoke({"messages": [HumanMessage("one?")]}, config, context=ctx)
        )
        second = fp.run_output(
            h.graph.invoke({"messages": [HumanMessage("two?")]}, config, context=ctx)
        )
        at = ended_at(h.graph, config, first.run_id)
        forked = fp.run_output(
            h.graph.invoke({"messages": [HumanMessage("two again?")]}, at.config, context=ctx)
        )
    finally:
        conn.close()
    url = f"sqlite:///{path.resolve()}"
    runs = json.loads(CliRunner().invoke(app, ["runs", "--db", url, "--json"]).stdout)
    shown = sorted((r["run_id"], r["status"]) for r in runs)
    assert shown == sorted(
        [
            (first.run_id, "completed"),
            (second.run_id, "completed"),
            (forked.run_id, "completed"),
        ]
    )


def test_no_caller_writes_where_a_branch_was_forked(saver: Any) -> None:
    h = harness([answer("one")], checkpointer=saver)
    config, ctx = thread(), context()
    out = fp.run_output(h.graph.invoke(fp.start("q", budget()), config, context=ctx))
    with pytest.raises(fp.CommandRefused):
        h.graph.update_state(config, {"fork": "ck-forged"})
    h.graph.update_state(config, {"run": {"branch": "ck-forged", "forked_from": "ck-forged"}})
    kept = fp.run_output(h.graph.get_state(config).values)
    assert kept.branch is None and kept.forked_from is None
    assert kept.run_id == out.run_id


def test_the_latest_checkpoint_named_explicitly_is_no_fork(saver: Any) -> None:
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
    assert out.forked_from is None and out.branch is None
    assert h.calls.count("write_note") == 1


def test_an_async_fork_and_a_streamed_one_are_new_runs_too() -> None:
    h = harness([call(n=1), final_citing_last, answer("async"), answer("streamed")])
    config, ctx = thread(), context()
    first = h.run(config=config, ctx=ctx)
    start = [s for s in h.graph.get_state_history(config) if s.next == ("decide",)][-1]

    async def fork() -> fp.AgentState:
        return fp.run_output(await h.graph.ainvoke(None, start.config, context=ctx))

    forked = asyncio.run(fork())
    assert forked.forked_from == checkpoint_id(start) and forked.branch is not None
    assert forked.final_answer is not None and forked.final_answer.text == "async"
    list(h.graph.stream(None, start.config, context=ctx))
    streamed = fp.run_output(h.graph.get_state(config).values)
    assert streamed.forked_from == checkpoint_id(start)
    assert streamed.branch not in (None, forked.branch)  # two forks of one checkpoint: two runs
    assert streamed.final_answer is not None and streamed.final_answer.text == "streamed"
    assert first.termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("search_logs") == 1


def copy_thread(saver: Any, source: str, target: str) -> None:
    """What ``copy_thread`` (langgraph-checkpoint 4.3) makes, through the saver's public
    methods (no installed saver implements it): every checkpoint of ``source``, and its pending
    writes, under ``target``."""
    saved = sorted(
        saver.list({"configurable": {"thread_id": source}}),
        key=lambda t: t.config["configurable"]["checkpoint_id"],
    )
    for tup in saved:
        at = tup.config["configurable"]
        parent = ((tup.parent_config or {}).get("configurable") or {}).get("checkpoint_id")
        config = {"configurable": {"thread_id": target, "checkpoint_ns": at["checkpoint_ns"]}}
        if parent is not None:
            config["configurable"]["checkpoint_id"] = parent
        stored = saver.put(
            config, tup.checkpoint, tup.metadata, dict(tup.checkpoint["channel_versions"])
        )
        by_task: dict[str, list[tuple[str, Any]]] = {}
        for task, channel, value in tup.pending_writes or ():
            by_task.setdefault(task, []).append((channel, value))
        for task, writes in by_task.items():
            saver.put_writes(stored, writes, task)


def test_a_copy_of_a_thread_paused_before_a_write_runs_it_at_most_once_in_total(
    saver: Any,
) -> None:
    h = harness(
        [call("write_note", 1, note="a"), final_citing_last, answer("copy"), answer("more")],
        checkpointer=saver,
        approval="interrupt",
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    source = config["configurable"]["thread_id"]
    copy = {"configurable": {"thread_id": f"{source}-copy"}}
    copy_thread(saver, source, copy["configurable"]["thread_id"])
    paused = h.graph.get_state(copy)
    assert paused.next == ("approve",)
    # The copy is history: its paused run has no account on the copy's thread.
    refused = fp.run_output(h.graph.invoke(Command(resume="approve"), copy, context=ctx))
    assert refused.termination is fp.TerminationReason.POLICY_DENIED
    assert refused.last_error_code == "unknown_budget_account"
    assert h.calls.count("write_note") == 0
    ran = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert ran.termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1
    # A fork of the copy's pause is a run with an account of its own: the call id was claimed
    # on the thread the conversation began on, so it never runs there again.
    forked = fp.run_output(h.graph.invoke(Command(resume="approve"), paused.config, context=ctx))
    assert forked.forked_from == checkpoint_id(paused)
    assert h.calls.count("write_note") == 1
    (receipt,) = [r for r in forked.receipts if r.call_id == "call-0001"]
    assert receipt.status is fp.ReceiptStatus.UNCERTAIN
    # New input on the copy starts a run of its own there.
    more = fp.run_output(h.graph.invoke({"messages": [HumanMessage("more?")]}, copy, context=ctx))
    assert more.termination is fp.TerminationReason.COMPLETED
    assert more.final_answer is not None and more.final_answer.text == "more"


def test_a_later_run_of_the_conversation_runs_its_own_call_ids_whatever_they_are_named(
    saver: Any,
) -> None:
    # A model that numbers its calls from 1 in each run (a scripted or fake chat model): the
    # second run's call-0001 is its own call, not a branch of the first run's, and it runs.
    h = harness([call(n=1), final_citing_last, call(n=1), final_citing_last], checkpointer=saver)
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    assert h.calls.count("search_logs") == 1
    later = fp.run_output(h.graph.invoke(fp.start("again", budget()), config, context=ctx))
    assert h.calls.count("search_logs") == 2
    assert later.termination is fp.TerminationReason.COMPLETED


def test_a_fork_of_a_pause_replayed_pauses_as_the_fork_and_cancels_on_its_own_account(
    saver: Any,
) -> None:
    h = harness(
        [call("write_note", 1, note="a"), final_citing_last],
        checkpointer=saver,
        approval="interrupt",
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    paused = h.graph.get_state(config)
    done = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    # Replayed from the pause with no answer: the fork pauses there again, as the fork.
    h.graph.invoke(None, paused.config, context=ctx)
    assert h.graph.get_state(config).next == ("approve",)
    waiting = fp.run_output(h.graph.get_state(config).values)
    assert waiting.forked_from == checkpoint_id(paused)
    assert waiting.report is not None and waiting.report.forked_from == checkpoint_id(paused)
    cancelled = fp.cancel(h.graph, config, context=ctx)
    assert cancelled is not None
    assert cancelled.termination is fp.TerminationReason.CANCELLED
    assert cancelled.forked_from == checkpoint_id(paused)
    thread_id = config["configurable"]["thread_id"]
    ledger = ledger_of(saver)
    assert ledger.balance(run_account(thread_id, done.run_id, "", 0)).closed == "completed"
    fork_account = run_account(thread_id, done.run_id, "", 0, cancelled.branch)
    assert ledger.balance(fork_account).closed == "cancelled"
    assert h.calls.count("write_note") == 1


def test_a_replay_of_an_ended_run_s_checkpoint_moves_the_head_there_and_the_next_run_forks(
    saver: Any,
) -> None:
    h = harness([answer("one"), answer("two"), answer("three")], checkpointer=saver)
    config, ctx = thread(), context()
    first = fp.run_output(h.graph.invoke({"messages": [HumanMessage("1?")]}, config, context=ctx))
    second = fp.run_output(h.graph.invoke({"messages": [HumanMessage("2?")]}, config, context=ctx))
    at = ended_at(h.graph, config, first.run_id)
    # Nothing is left to run there: LangGraph makes that state the thread's head, as it is.
    out = fp.run_output(h.graph.invoke(None, at.config, context=ctx))
    assert out.run_id == first.run_id and out.termination is fp.TerminationReason.COMPLETED
    # The next message there is a run of the fork, on an account of its own.
    third = fp.run_output(h.graph.invoke({"messages": [HumanMessage("3?")]}, config, context=ctx))
    assert third.termination is fp.TerminationReason.COMPLETED
    assert third.forked_from == checkpoint_id(at)
    assert [t.run_id for t in third.turns] == [first.run_id]
    thread_id = config["configurable"]["thread_id"]
    ledger = ledger_of(saver)
    assert ledger.balance(run_account(thread_id, second.run_id, "", 1)).held.get("steps") == 1
