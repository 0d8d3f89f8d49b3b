"""Cancel: stopping is not undoing, and a cancel reaches the run it names.

Seed 002: a stop is not an undo; it keeps the id and the lookup path of every effect already
started. ``fp.cancel`` closes the run's ledger account first (a run still going is refused its
next step or tool), then writes the durable cancel record through the terminal node, never as a
node that may still be running.
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
from typing_extensions import TypedDict

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from tests.graph.kit import (
    ABSTAIN,
    Calls,
    budget,
    call,
    context,
    final_citing_last,
    make_registry,
    paused_for_approval,
    thread,
    thread_account,
)


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


class _Parent(TypedDict, total=False):
    out: str


def _parent_with_nested_paused(
    ledger: fp.InMemoryLedger, *, own_saver: bool
) -> tuple[Any, dict[str, Any], fp.RunContext, Calls]:
    """A plain LangGraph parent whose node runs a fencepost graph paused for a write's approval."""
    calls = Calls()
    model = ScriptedDecisionModel(
        [call("write_note", 1, note="a"), final_citing_last, final_citing_last]
    )
    built = fp.build_agent_graph(make_registry(calls), model, ledger=ledger, approval="interrupt")
    saver = InMemorySaver()
    nested = built.compile(checkpointer=saver) if own_saver else built.compile()
    ctx = context()

    def agent(_: _Parent) -> dict[str, str]:
        out = fp.run_output(nested.invoke(fp.start("q", budget()), context=ctx))
        return {"out": f"{out.termination}:{out.last_error_code}"}

    parent = StateGraph(_Parent)
    parent.add_node("agent", agent)
    parent.add_edge(START, "agent")
    parent.add_edge("agent", END)
    compiled = parent.compile(checkpointer=saver)
    config = thread()
    compiled.invoke({}, config, context=ctx)
    assert compiled.get_state(config).next == ("agent",)
    return compiled, config, ctx, calls


@pytest.mark.parametrize("own_saver", [True, False], ids=["own-saver", "parents-saver"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_cancelling_a_parent_graph_reaches_its_paused_nested_run(
    own_saver: bool, mode: str
) -> None:
    ledger = fp.InMemoryLedger()
    parent, config, ctx, calls = _parent_with_nested_paused(ledger, own_saver=own_saver)
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

    def agent(_: _Parent) -> dict[str, str]:
        out = fp.run_output(holder[0].invoke(fp.start("q", budget()), context=ctx))
        return {"out": f"{out.termination}:{out.last_error_code}"}

    parent = StateGraph(_Parent)
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
