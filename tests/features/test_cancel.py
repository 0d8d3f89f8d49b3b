"""Cancel: stopping is not undoing, and a cancel reaches the run it names.

Seed 002: a stop is not an undo; it keeps the id and the lookup path of every effect already
started. ``fp.cancel`` closes the run's ledger account first (a run still going is refused its
next step or tool), then writes the durable cancel record through the terminal node, never as a
node that may still be running. A cancel given any config reaches the run it names and no other:
a snapshot's config ends the run, an old one never rewrites a finished run's ending, a stray
namespace closes nothing and says so, a nested run's own config (or its parent graph) ends the
nested run; and a cancel that closed the account first is the run's ending in state too.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.policy import TerminationReason
from tests.graph.kit import (
    ABSTAIN,
    DOCS,
    STATUS,
    UPLOAD,
    Calls,
    budget,
    call,
    context,
    final_citing_all,
    final_citing_last,
    harness,
    make_registry,
    paused_for_approval,
    state_of,
    terminal_manifests,
    thread,
    thread_account,
    upload_graph,
)
from tests.graph.nested_kit import Parent, approved, nested_config, nested_paused


class MessageArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    text: str


def test_a_cancel_while_a_write_runs_keeps_the_writes_id_and_result() -> None:
    entered, release = threading.Event(), threading.Event()
    sent: list[str] = []

    def send_message(args: MessageArgs, ctx: fp.ToolContext) -> dict[str, str]:
        entered.set()
        assert release.wait(20)
        sent.append(ctx.idempotency_key)
        return {"message_id": "msg-42", "lookup": "/messages/msg-42"}

    spec = fp.ToolSpec(
        name="send_message",
        description="Send a message.",
        args_model=MessageArgs,
        effect=fp.Effect.WRITE,
        capability="notes:write",
        timeout_seconds=30,
        execute=send_message,
    )
    model = ScriptedDecisionModel(
        [
            fp.ToolProposal(
                call_id="call-0001", tool_name="send_message", arguments={"text": "hi"}
            ),
            ABSTAIN,
        ]
    )
    graph = fp.build_agent_graph(fp.ToolRegistry([spec]), model, approval="interrupt").compile(
        checkpointer=InMemorySaver()
    )
    config, ctx = thread(), context()
    graph.invoke(fp.start("q", budget()), config, context=ctx)
    assert graph.get_state(config).next == ("approve",)

    runner = threading.Thread(
        target=lambda: graph.invoke(
            Command(resume="approve"), config, context=ctx, durability="sync"
        )
    )
    runner.start()
    try:
        assert entered.wait(20)
        returned = fp.cancel(graph, config, context=ctx)
    finally:
        release.set()
        runner.join(30)
    assert not runner.is_alive()
    assert returned is not None and returned.termination is fp.TerminationReason.CANCELLED
    # Cancel's own record, made while the write ran, keeps the call as started, not never run.
    assert returned.report is not None
    assert [c.call_id for c in returned.report.uncertain] == ["call-0001"]
    assert returned.report.effects_made == ("call-0001",)

    # The run that was going on wrote its own result and ending after the cancel's record.
    state = fp.run_output(graph.get_state(config).values)
    assert sent == ["call-0001"]
    assert state.termination is fp.TerminationReason.CANCELLED
    (observation,) = state.observations
    assert observation.call_id == "call-0001"
    assert observation.result == {"message_id": "msg-42", "lookup": "/messages/msg-42"}
    receipts = {r.call_id: r for r in state.receipts}
    assert receipts["call-0001"].status is fp.ReceiptStatus.COMPLETED
    assert state.report is not None and state.report.effects_made == ("call-0001",)


async def test_an_async_cancel_while_an_async_write_runs_keeps_the_writes_id_and_result() -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    sent: list[str] = []

    async def send_message(args: MessageArgs, ctx: fp.ToolContext) -> dict[str, str]:
        entered.set()
        await asyncio.wait_for(release.wait(), 20)
        sent.append(ctx.idempotency_key)
        return {"message_id": "msg-42", "lookup": "/messages/msg-42"}

    spec = fp.ToolSpec(
        name="send_message",
        description="Send a message.",
        args_model=MessageArgs,
        effect=fp.Effect.WRITE,
        capability="notes:write",
        timeout_seconds=30,
        execute=send_message,
    )
    model = ScriptedDecisionModel(
        [
            fp.ToolProposal(
                call_id="call-0001", tool_name="send_message", arguments={"text": "hi"}
            ),
            ABSTAIN,
        ]
    )
    graph = fp.build_agent_graph(fp.ToolRegistry([spec]), model, approval="interrupt").compile(
        checkpointer=InMemorySaver()
    )
    config, ctx = thread(), context()
    await graph.ainvoke(fp.start("q", budget()), config, context=ctx)
    runner = asyncio.create_task(
        graph.ainvoke(Command(resume="approve"), config, context=ctx, durability="sync")
    )
    try:
        await asyncio.wait_for(entered.wait(), 20)
        returned = await fp.acancel(graph, config, context=ctx)
    finally:
        release.set()
        await asyncio.wait_for(runner, 30)
    assert returned is not None and returned.termination is fp.TerminationReason.CANCELLED
    assert returned.report is not None
    assert [c.call_id for c in returned.report.uncertain] == ["call-0001"]

    state = fp.run_output((await graph.aget_state(config)).values)
    assert sent == ["call-0001"]
    assert state.termination is fp.TerminationReason.CANCELLED
    (observation,) = state.observations
    assert observation.result == {"message_id": "msg-42", "lookup": "/messages/msg-42"}
    receipts = {r.call_id: r for r in state.receipts}
    assert receipts["call-0001"].status is fp.ReceiptStatus.COMPLETED
    assert state.report is not None and state.report.effects_made == ("call-0001",)


# -- a run nested in a parent graph's node ----------------------------------------------------


@pytest.mark.parametrize("own_saver", [True, False], ids=["own-saver", "parents-saver"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_cancelling_a_parent_graph_reaches_its_paused_nested_run(
    own_saver: bool, mode: str
) -> None:
    ledger = fp.InMemoryLedger()
    parent, _, config, ctx, calls = nested_paused(ledger, InMemorySaver(), own_saver=own_saver)
    if mode == "sync":
        returned = fp.cancel(parent, config, context=ctx)
    else:
        returned = await fp.acancel(parent, config, context=ctx)
    # The nested run's account is closed; no node of the parent ran in the cancel.
    assert returned is not None and not returned.is_terminal
    assert parent.get_state(config).next == ("agent",)
    out = parent.invoke(Command(resume="approve"), config, context=ctx)
    assert calls.count("write_note") == 0
    assert out == {"out": "cancelled:cancelled"}


def test_a_parent_whose_nested_graph_langgraph_cannot_list_is_refused_saying_what_to_pass() -> None:
    calls = Calls()
    model = ScriptedDecisionModel([call("write_note", 1, note="a"), final_citing_last])
    built = fp.build_agent_graph(make_registry(calls), model, approval="interrupt")
    saver = InMemorySaver()
    # Held in a list, the nested graph is not among the parent node's subgraphs.
    holder = [built.compile(checkpointer=saver)]
    ctx = context()

    def agent(_: Parent) -> dict[str, str]:
        out = fp.run_output(holder[0].invoke(fp.start("q", budget()), context=ctx))
        return {"out": f"{out.termination}:{out.last_error_code}"}

    parent = StateGraph(Parent)
    parent.add_node("agent", agent)
    parent.add_edge(START, "agent")
    parent.add_edge("agent", END)
    graph = parent.compile(checkpointer=saver)
    config = thread()
    graph.invoke({}, config, context=ctx)
    with pytest.raises(fp.NestedRunUnreachable, match=r"fp\.cancel\(nested_graph") as unreachable:
        fp.cancel(graph, config, context=ctx)
    # What the error names is what reaches the run.
    fp.cancel(holder[0], unreachable.value.config, context=ctx)
    out = graph.invoke(Command(resume="approve"), config, context=ctx)
    assert calls.count("write_note") == 0
    assert out == {"out": "cancelled:cancelled"}


# -- cancel with any config: a snapshot's, a stray namespace, none -----------------------------


def test_a_stray_namespace_on_a_top_level_runs_config_closes_nothing_and_says_so() -> None:
    # A crafted or stray checkpoint_ns turns a top-level cancel into a nested one: it must
    # close no account it does not name, and report that nothing was cancelled.
    ledger = fp.InMemoryLedger()
    h, config, ctx = paused_for_approval(ledger=ledger)
    stray = {"configurable": {**config["configurable"], "checkpoint_ns": "approve:crafted"}}
    assert fp.cancel(h.graph, stray, context=ctx) is None
    assert ledger.balance(thread_account(config)).closed is None
    out = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert out.termination is TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1


def test_cancel_with_a_snapshots_config_ends_the_run_cancelled() -> None:
    h, config, ctx = paused_for_approval()
    snapshot_config = h.graph.get_state(config).config
    returned = fp.cancel(h.graph, snapshot_config, context=ctx)
    head = h.graph.get_state(config)
    assert head.next == ()
    assert state_of(h, config).termination is TerminationReason.CANCELLED
    assert returned is not None and returned.termination is TerminationReason.CANCELLED
    assert h.calls.count("write_note") == 0


def test_cancel_with_an_old_snapshots_config_never_rewrites_a_finished_runs_ending() -> None:
    h, config, ctx = paused_for_approval()
    old = h.graph.get_state(config).config
    done = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert done.termination is TerminationReason.COMPLETED
    fp.cancel(h.graph, old, context=ctx)
    assert h.graph.get_state(config).next == ()
    assert state_of(h, config).termination is TerminationReason.COMPLETED


def test_a_top_level_cancel_still_ends_a_running_thread_cancelled() -> None:
    # The nested branch must not swallow the ordinary cancel: no namespace, or an empty one.
    for configurable in ({}, {"checkpoint_ns": ""}):
        ledger = fp.InMemoryLedger()
        h = harness([call("search_logs", 1), final_citing_last], ledger=ledger)
        config = thread()
        ctx = context()
        h.graph.invoke(fp.start("q", budget()), config, context=ctx, interrupt_after=["execute"])
        cfg = {"configurable": {**config["configurable"], **configurable}}
        out = fp.cancel(h.graph, cfg, context=ctx)
        assert out is not None and out.termination is TerminationReason.CANCELLED
        assert ledger.balance(thread_account(config)).closed == "cancelled"


def test_a_cancel_that_closes_the_account_first_is_the_runs_ending_in_state_and_ledger() -> None:
    # The run's final answer was accepted (its stop is completed) when a cancel from another
    # thread closed the account, before the terminal node ran: the first close stands, so the
    # run ends cancelled in state too, and a later invoke leaves it so.
    ledger = fp.InMemoryLedger()
    h = upload_graph([UPLOAD, STATUS, final_citing_all], ledger=ledger)
    config, ctx = thread(), context(caps=DOCS)
    h.graph.invoke(
        fp.start("upload", budget(steps=6, tools=4)),
        config,
        context=ctx,
        interrupt_before=["terminal"],
    )
    asked = state_of(h, config).stop
    assert asked is not None and asked.reason is TerminationReason.COMPLETED
    ledger.close_account(thread_account(config), TerminationReason.CANCELLED.value)
    h.graph.invoke(None, config, context=ctx)
    state = state_of(h, config)
    assert state.termination is TerminationReason.CANCELLED
    assert ledger.balance(thread_account(config)).closed == TerminationReason.CANCELLED.value
    assert terminal_manifests(state) == 1
    h.graph.invoke(None, config, context=ctx)
    assert state_of(h, config) == state


# -- a nested run's own config -----------------------------------------------------------------


@pytest.mark.parametrize("own_saver", [True, False], ids=["own-saver", "parents-saver"])
def test_cancel_of_a_nested_run_paused_for_approval_returns_and_ends_it_cancelled(
    own_saver: bool,
) -> None:
    saver, ledger = InMemorySaver(), fp.InMemoryLedger()
    parent, nested, config, ctx, calls = nested_paused(ledger, saver, own_saver=own_saver)
    state = fp.cancel(nested, nested_config(parent, config), context=ctx)
    if own_saver:  # its graph reads its state: still paused, the parent ends it
        assert state is not None and not state.is_terminal
    else:
        assert state is None
    assert approved(parent, config, ctx, calls) == ({"out": "cancelled:cancelled"}, 0)


def test_acancel_of_a_nested_run_ends_it_cancelled() -> None:
    saver, ledger = InMemorySaver(), fp.InMemoryLedger()
    parent, nested, config, ctx, calls = nested_paused(ledger, saver, own_saver=True)
    asyncio.run(fp.acancel(nested, nested_config(parent, config), context=ctx))
    assert approved(parent, config, ctx, calls) == ({"out": "cancelled:cancelled"}, 0)


@pytest.mark.parametrize("own_saver", [True, False], ids=["own-saver", "parents-saver"])
def test_cancel_of_a_nested_run_through_its_parent_graph_still_ends_it_cancelled(
    own_saver: bool,
) -> None:
    saver, ledger = InMemorySaver(), fp.InMemoryLedger()
    parent, _, config, ctx, calls = nested_paused(ledger, saver, own_saver=own_saver)
    returned = fp.cancel(parent, nested_config(parent, config), context=ctx)
    # No node of the parent runs in the cancel: the parent's next invoke ends the nested run.
    assert returned is not None and not returned.is_terminal
    assert parent.get_state(config).next == ("agent",)
    assert approved(parent, config, ctx, calls) == ({"out": "cancelled:cancelled"}, 0)


@pytest.mark.parametrize(
    "write",
    [{"budget": "all of it"}, {"step": -1}, {"phase": "terminal"}],
    ids=["budget-of-no-form", "step-out-of-range", "bare-terminal-phase"],
)
def test_a_cancel_ends_a_run_whatever_a_caller_wrote_over_its_record(
    write: dict[str, Any],
) -> None:
    # Before: a value that does not validate raised pydantic's ValidationError out of cancel,
    # before the account was closed; a bare terminal phase made cancel return at once, with
    # the run paused, unended, its account open.
    h, config, ctx = paused_for_approval()
    h.graph.update_state(config, {"run": write}, as_node="decide")
    state = fp.cancel(h.graph, config, context=ctx)
    assert state is not None
    assert state.termination is fp.TerminationReason.CANCELLED
    assert h.graph.get_state(config).next == ()
    assert h.calls.log == []


def test_a_cancel_closes_the_account_of_a_run_a_caller_wrote_as_ended() -> None:
    # An ending the terminal node did not write (its account is open): the run may still be
    # going on elsewhere, and only the closed account stops its next step or tool.
    ledger = fp.InMemoryLedger()
    h, config, ctx = paused_for_approval(ledger=ledger)
    h.graph.update_state(
        config, {"run": {"phase": "terminal", "termination": "failed"}}, as_node="decide"
    )
    fp.cancel(h.graph, config, context=ctx)
    assert ledger.balance(thread_account(config)).closed == "cancelled"
    assert h.calls.log == []
