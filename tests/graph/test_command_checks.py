"""The compiled graph's command checks: a Command that would leave a thread stuck is refused whole.

A caller holding a thread's config can send any ``Command``. One that would make two writers of
one last-value field in one superstep (a goto beside the node the thread waits on, a goto of two
nodes, one field written twice, a write to LangGraph's own channels, a ``Send``) would be saved by
LangGraph and then raise at every later invoke of the thread. Such a Command is refused before
anything of it is saved, with ``fp.CommandRefused``, on the sync and the async graph; the thread
goes on as it was, and a Command that makes no second writer is taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.types import Command, Send

import fencepost as fp
from fencepost.policy import TerminationReason
from tests.graph.kit import (
    ended_typed,
    paused_for_approval,
    state_of,
)

# -- a Command that would make a second writer is refused whole --------------------------------


_JSON_STOP = {"reason": "cancelled", "error_code": "operator"}


@pytest.mark.parametrize("goto", ["terminal", "execute", "decide"])
def test_a_json_stop_and_an_invalid_value_sent_with_a_goto_end_the_run_typed(goto: str) -> None:
    # The approve node still waiting and the node named by goto would both read the state, each
    # mend the caller's JSON stop and write it back: two values for one channel in one step. The
    # goto is refused whole; the same values written as an update end the run typed.
    h, config, ctx = paused_for_approval()
    update = {"run": {"repairs": None, "stop": _JSON_STOP}}
    with pytest.raises(fp.CommandRefused):
        h.graph.invoke(Command(update=update, goto=goto), config, context=ctx)
    h.graph.invoke(Command(update=update), config, context=ctx)
    state = ended_typed(h, config, ctx)
    assert state.termination is TerminationReason.CANCELLED
    assert h.calls.count("write_note") == 0


# Each of these makes two writers of one last-value field in one step (a goto beside the paused
# approve node, a goto of two nodes, one field written twice): LangGraph would save the Command's
# writes and raise InvalidUpdateError applying them, at every later invoke.
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


@pytest.mark.parametrize(
    "command",
    [Command(resume="approve"), Command(goto="approve", resume="approve")],
    ids=["resume-alone", "goto-the-waiting-node"],
)
def test_a_resume_or_a_goto_of_the_waiting_node_is_taken_on_the_async_graph(
    command: Command[Any],
) -> None:
    h, config, ctx = paused_for_approval()
    out = asyncio.run(h.graph.ainvoke(command, config, context=ctx))
    state = fp.run_output(out)
    assert state.termination is TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1
    assert "command refused" not in json.dumps(state.model_dump(mode="json"))


# -- LangGraph's own channels and Send ---------------------------------------------------------


# A goto is only sugar for a write to LangGraph's own channels: `branch:to:<node>` (an
# EphemeralValue that triggers the node), `__pregel_tasks` (a Send) and `__start__`. The same
# second writer sent as an update of those channels would be saved, then raise at every later
# invoke: an update of anything but the state's own fields is refused, as is any Send.
_OWN_CHANNEL_UPDATES = {
    "branch-to-execute": Command(update={"branch:to:execute": "__start__"}),
    "branch-to-terminal": Command(update={"branch:to:terminal": "__start__"}),
    "branch-to-decide": Command(update={"branch:to:decide": "__start__"}),
    "start-twice": Command(update=[("__start__", {}), ("__start__", {})]),
    "send-as-update": Command(update={"__pregel_tasks": Send("execute", {})}),
}


@pytest.mark.parametrize("command", list(_OWN_CHANNEL_UPDATES), ids=list(_OWN_CHANNEL_UPDATES))
def test_a_command_naming_langgraphs_own_channels_never_leaves_the_thread_stuck(
    command: str,
) -> None:
    h, config, ctx = paused_for_approval()
    try:
        h.graph.invoke(_OWN_CHANNEL_UPDATES[command], config, context=ctx)
    except fp.CommandRefused:
        assert h.graph.get_state(config).next == ("approve",)
    if h.graph.get_state(config).next == ("approve",):
        h.graph.invoke(Command(resume="approve"), config, context=ctx)
    h.graph.invoke(None, config, context=ctx)
    assert state_of(h, config).termination is not None


def test_a_send_a_caller_sends_to_an_ended_thread_never_leaves_it_raising() -> None:
    h, config, ctx = paused_for_approval()
    h.graph.invoke(Command(resume="approve"), config, context=ctx)
    assert state_of(h, config).termination is TerminationReason.COMPLETED
    with contextlib.suppress(fp.CommandRefused):
        h.graph.invoke(Command(goto=Send("execute", {})), config, context=ctx)
    h.graph.invoke(None, config, context=ctx)
    assert state_of(h, config).termination is TerminationReason.COMPLETED
