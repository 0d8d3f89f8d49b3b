"""The compiled graph nested in a user's own LangGraph graph, as a node's call or as a subgraph.

Run from a parent's node with the parent's config and trusted context, or added as a subgraph
node, a fencepost run pauses for approval on the parent, resumes from its own checkpoint when the
parent resumes (never as a new run), keeps its budget and one ledger account, and ends with a
typed reason. (A nested run resumed under another principal: invariant 5; cancelling one:
``tests/features/test_cancel.py``.)
"""

from __future__ import annotations

import logging
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import get_runtime
from langgraph.types import Command

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.policy import TerminationReason
from tests.graph.kit import (
    Calls,
    budget,
    call,
    context,
    final_citing_last,
    make_registry,
    thread,
)
from tests.graph.nested_kit import Host, nested_paused


class Outer(TypedDict, total=False):
    question: str
    reason: fp.TerminationReason
    answer: str
    steps_used: int


def test_the_graph_nests_in_a_parent_graph_node_and_ends_with_a_typed_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A user's node calls the compiled fencepost graph with the parent's own config (so it
    # checkpoints under the parent's thread) and the parent's trusted context. The approval
    # pause surfaces on the parent; resuming the parent resumes the nested run, not a new one.
    calls = Calls()
    model = ScriptedDecisionModel([call("write_note", 1, note="x"), final_citing_last])
    agent = fp.build_agent_graph(make_registry(calls), model, approval="interrupt").compile()

    def ask_agent(state: Outer, config: RunnableConfig) -> dict[str, Any]:
        parent_context = get_runtime(fp.RunContext).context
        request = fp.start(state["question"], budget(), run_id="run-nested")
        result = fp.run_output(agent.invoke(request, config, context=parent_context))
        answer = result.final_answer.text if result.final_answer else ""
        return {
            "reason": result.termination,
            "answer": answer,
            "steps_used": result.budget.steps_used,
        }

    parent = StateGraph(Outer, context_schema=fp.RunContext)
    parent.add_node("ask_agent", ask_agent)
    parent.add_edge(START, "ask_agent")
    parent.add_edge("ask_agent", END)
    graph: Any = parent.compile(checkpointer=InMemorySaver())
    config, ctx = thread(), context()
    with caplog.at_level(logging.WARNING):
        paused = graph.invoke({"question": "why?"}, config, context=ctx)
        assert paused["__interrupt__"][0].value["calls"][0]["call_id"] == "call-0001"
        assert calls.log == []
        out = graph.invoke(Command(resume="approve"), config, context=ctx)
    assert out["reason"] is fp.TerminationReason.COMPLETED
    assert out["answer"] == "deploy 42 broke checkout"
    assert calls.log == [("write_note", {"note": "x"}, "call-0001")]
    # Two decisions in all: the nested run went on from its checkpoint after the pause.
    assert out["steps_used"] == 2 and model.calls == 2
    assert "Blocked deserialization" not in caplog.text


def test_the_compiled_graph_is_a_subgraph_node_that_pauses_resumes_and_keeps_its_budget() -> None:
    calls = Calls()
    agent = fp.build_agent_graph(
        make_registry(calls),
        ScriptedDecisionModel([call("write_note", 1, note="x"), final_citing_last]),
        approval="interrupt",
    ).compile()

    def audit(state: Host) -> dict[str, Any]:
        return {"audit": f"ended:{fp.run_output(state).termination.value}"}

    parent = StateGraph(Host, context_schema=fp.RunContext)
    parent.add_node("agent", agent)
    parent.add_node("audit", audit)
    parent.add_edge(START, "agent")
    parent.add_edge("agent", "audit")
    parent.add_edge("audit", END)
    graph: Any = parent.compile(checkpointer=InMemorySaver())
    config, ctx = thread(), context()
    paused = graph.invoke(fp.start("q", budget(steps=4, tools=2)), config, context=ctx)
    assert paused["__interrupt__"][0].value["calls"][0]["tool_name"] == "write_note"
    assert calls.log == []
    out = graph.invoke(Command(resume="approve"), config, context=ctx)
    ended = fp.run_output(out)
    assert ended.termination is fp.TerminationReason.COMPLETED
    assert out["audit"] == "ended:completed"
    assert calls.log == [("write_note", {"note": "x"}, "call-0001")]
    # The subgraph's counters went on across the parent's resume; they did not restart.
    assert (ended.budget.steps_used, ended.budget.tool_calls_used) == (2, 1)


def test_a_nested_run_resumed_after_its_approval_keeps_one_account() -> None:
    ledger = fp.InMemoryLedger()
    opened: list[str] = []
    open_account = ledger.open_account

    def spy(account: str, *args: Any, **kwargs: Any) -> Any:
        opened.append(account)
        return open_account(account, *args, **kwargs)

    ledger.open_account = spy  # type: ignore[method-assign]
    parent, _, config, ctx, calls = nested_paused(ledger, InMemorySaver())
    out = parent.invoke(Command(resume="approve"), config, context=ctx)
    assert out == {"out": "completed:None"}
    assert len(set(opened)) == 1
    assert ledger.balance(opened[0]).closed == TerminationReason.COMPLETED.value
    assert calls.count("write_note") == 1
