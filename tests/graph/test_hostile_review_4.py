"""Hostile review of the exact per-step state checks (``state.load_state``, ``MendedState``,
``InvalidState``), the typed record and batch channels, the messages channel's drops and the
approve node's route to itself.

Each probe takes one hostile seat: a caller holding the thread's config (any ``update_state``,
``Command(update=..., resume=..., goto=...)``, JSON forms a LangGraph Server client can send),
before, while paused for approval, and after a run. A probe that found a bug is kept as a strict
xfail whose reason names the repro and a fix; the others pin what was fixed in this review.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command, Overwrite

import fencepost as fp
from fencepost.policy import TerminationReason
from tests.graph.kit import (
    ended_typed,
    final_citing_last,
    harness,
    paused_for_approval,
)

# --- a caller: a JSON stop written with a value of no form, while a second node runs ------------

_JSON_STOP = {"reason": "cancelled", "error_code": "operator"}


@pytest.mark.parametrize("goto", ["terminal", "execute", "decide"])
def test_a_json_stop_and_an_invalid_value_sent_with_a_goto_end_the_run_typed(goto: str) -> None:
    # Before: the approve node still waiting and the node named by goto both read the state,
    # each mended the caller's JSON stop and wrote it back, and LastValue refused two values for
    # one channel in one step, at every later invoke. A goto beside the waiting node is now
    # refused whole (graph.bounded); the same values written as an update end the run typed.
    h, config, ctx = paused_for_approval()
    update = {"run": {"repairs": None, "stop": _JSON_STOP}}
    with pytest.raises(fp.CommandRefused):
        h.graph.invoke(Command(update=update, goto=goto), config, context=ctx)
    h.graph.invoke(Command(update=update), config, context=ctx)
    state = ended_typed(h, config, ctx)
    assert state.termination is TerminationReason.CANCELLED
    assert h.calls.count("write_note") == 0


# --- a caller: what a JSON client can write over the conversation ------------------------------

_CONVERSATION_RESETS: dict[str, Any] = {
    "overwrite-of-a-number": {"__overwrite__": 5},
    "overwrite-of-json-messages": {"__overwrite__": [{"role": "user", "content": "hi"}]},
    "overwrite-in-its-json-dataclass-form": {
        "type": "__overwrite__",
        "value": [{"role": "user", "content": "hi"}],
    },
}


@pytest.mark.parametrize("value", _CONVERSATION_RESETS.values(), ids=_CONVERSATION_RESETS.keys())
@pytest.mark.parametrize("how", ["command", "update_state"])
def test_an_overwrite_of_the_conversation_never_leaves_the_thread_stuck(
    value: Any, how: str
) -> None:
    # The messages channel is a delta channel: an Overwrite bypasses its reducer, so a number
    # or JSON mappings became the conversation, and the next write (or every load of the
    # thread, which replays the saved writes) raised TypeError/AttributeError, at every later
    # invoke of the thread. Now an Overwrite is read as messages, or dropped.
    h, config, ctx = paused_for_approval()
    if how == "command":
        h.graph.invoke(Command(update={"messages": value}, resume="approve"), config, context=ctx)
    else:
        h.graph.update_state(config, {"messages": value}, as_node="decide")
        h.graph.invoke(Command(resume="approve"), config, context=ctx)
    state = ended_typed(h, config, ctx)
    assert state.termination is TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1
    assert all(isinstance(m, BaseMessage) for m in h.graph.get_state(config).values["messages"])


def test_two_overwrites_of_the_conversation_in_one_command_never_leave_the_thread_stuck() -> None:
    # Before: InvalidUpdateError ("only one Overwrite value per super-step") at every invoke.
    h, config, ctx = paused_for_approval()
    update = [
        ("messages", Overwrite([HumanMessage("a", id="m-a")])),
        ("messages", Overwrite([HumanMessage("b", id="m-b")])),
    ]
    h.graph.invoke(Command(update=update, resume="approve"), config, context=ctx)
    state = ended_typed(h, config, ctx)
    assert state.termination is TerminationReason.COMPLETED
    messages = h.graph.get_state(config).values["messages"]
    assert messages[0].id == "m-b" and all(m.id != "m-a" for m in messages)  # the last wins


def test_a_conversation_reset_a_json_client_wrote_reads_back_the_same_from_a_checkpoint_file(
    tmp_path: Path,
) -> None:
    # The replay path: a new graph on the same SQLite file applies the saved writes again.
    db = tmp_path / "runs.db"
    conn = sqlite3.connect(db, check_same_thread=False)
    h, config, ctx = paused_for_approval(checkpointer=SqliteSaver(conn))
    sent = [{"role": "user", "content": "from a client"}]
    h.graph.update_state(config, {"messages": {"__overwrite__": sent}}, as_node="decide")
    held = h.graph.get_state(config).values["messages"]
    assert [(m.type, m.content) for m in held] == [("human", "from a client")]
    conn.close()
    conn2 = sqlite3.connect(db, check_same_thread=False)
    again = harness(
        [final_citing_last],
        checkpointer=SqliteSaver(conn2),
        approval="interrupt",
        calls=h.calls,
    )
    assert again.graph.get_state(config).values["messages"] == held
    out = fp.run_output(again.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert out.termination is TerminationReason.COMPLETED
    conn2.close()


# --- a caller: receipts only grow, but what they grow by decides what is done -------------------


# --- a caller: pre-existing ways out of the loop that skip its one exit --------------------------


# Before (b489934 too): each of these made two writers of one last-value field in one step (a
# goto beside the paused approve node, a goto of two nodes, one field written twice); LangGraph
# saved the Command's writes, raised InvalidUpdateError applying them, and raised again at every
# later invoke: the thread was stuck for good. graph.bounded now refuses such a Command before
# anything of it is saved, with a typed error; the thread goes on as it was.
@pytest.mark.parametrize(
    "command",
    [
        Command(goto="terminal", resume="approve"),
        Command(goto="execute", resume="approve"),
        Command(goto="decide", resume="approve"),
        Command(goto=["decide", "execute"]),
        Command(update=[("stop", None), ("stop", _JSON_STOP)], resume="approve"),
    ],
    ids=["goto-terminal", "goto-execute", "goto-decide", "goto-two-nodes", "one-field-twice"],
)
def test_a_command_a_caller_sends_while_paused_never_leaves_the_thread_stuck(
    command: Command[Any],
) -> None:
    h, config, ctx = paused_for_approval()
    before = h.graph.get_state(config)
    with pytest.raises(fp.CommandRefused):
        h.graph.invoke(command, config, context=ctx)
    after = h.graph.get_state(config)
    assert after.config == before.config and after.next == ("approve",)  # nothing was saved
    h.graph.invoke(Command(resume="approve"), config, context=ctx)
    state = ended_typed(h, config, ctx)
    assert state.termination is TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1


@pytest.mark.parametrize(
    "command",
    [
        Command(goto="approve", resume="approve"),  # the node the thread waits on: one task
        Command(update=[("messages", [HumanMessage("a")]), ("messages", [HumanMessage("b")])]),
    ],
    ids=["goto-the-waiting-node", "a-record-twice"],
)
def test_a_command_that_makes_no_second_writer_is_taken(command: Command[Any]) -> None:
    h, config, ctx = paused_for_approval()
    h.graph.invoke(command, config, context=ctx)
    if h.graph.get_state(config).next == ("approve",):
        h.graph.invoke(Command(resume="approve"), config, context=ctx)
    assert ended_typed(h, config, ctx).termination is TerminationReason.COMPLETED


def test_a_refused_command_is_refused_on_the_async_graph_too() -> None:
    h, config, ctx = paused_for_approval()

    async def send() -> None:
        await h.graph.ainvoke(Command(goto="terminal", resume="approve"), config, context=ctx)

    with pytest.raises(fp.CommandRefused, match="waiting on"):
        asyncio.run(send())
    assert h.graph.get_state(config).next == ("approve",)
