"""DESIGN.md invariants 1-9, pinned where a mutation probe found no test that noticed.

Each test here was written against a deliberately broken copy of ``fencepost/graph`` and
``fencepost/policy`` (the rule named in the test removed) and fails there; it passes on the real
code. All run on a real compiled graph with an InMemorySaver.

State edits. A caller can edit a thread's state between supersteps in two ways: ``update_state``
(the routers run as if the node named by ``as_node`` had written it) and an input
``Command(update=..., goto=...)``. The executor is the last line: whatever an edit wrote, it runs a
call only for an "allowed" verdict with the same call id and argument fingerprint, for a principal
who holds the capability now, a write only where something could have approved it, and never
twice for one call id. Both forms are tried wherever it matters.

Some of these began as strict xfails for bugs the review found (a state edit through
``update_state`` ended every run; the executor dropped a refused call silently and treated any write
as approved in terminate mode; integers past 64 bits raised out of ``invoke``); those are fixed and
the tests now pin the fixes.
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
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from tests.graph.kit import (
    ABSTAIN,
    Calls,
    budget,
    call,
    context,
    final_citing_last,
    harness,
    make_registry,
    thread,
)
from tests.graph.nested_kit import Host

# -- invariant 2: the executor re-checks what it runs ---------------------------------------------


def test_executor_rechecks_the_capability_with_the_context_it_runs_under() -> None:
    # The gate allowed the call; the principal lost the capability before it ran (same identity,
    # so the context guard passes): the executor's own authorization must refuse it.
    h = harness([call(n=1), ABSTAIN])
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context(), interrupt_before=["execute"])
    revoked = context(caps=frozenset({"notes:write"}))
    h.graph.invoke(None, config, context=revoked)
    assert h.calls.log == []


# -- state edits in interrupt mode cannot make a denied write run ---------------------------------


def test_an_edit_that_is_not_a_valid_proposal_never_runs_the_original_arguments() -> None:
    # NaN is not JSON: the edited proposal cannot even be built. That must never fall back to
    # the arguments the human was editing away from: the edit is asked again.
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    edit = {"decision": "edit", "arguments": {"note": float("nan")}}
    out = h.graph.invoke(Command(resume=edit), config, context=ctx)
    assert h.calls.log == []
    (asked,) = out["__interrupt__"]
    assert asked.value["error"]["code"] == "invalid_arguments"


def test_a_harmless_update_state_edit_does_not_end_the_run() -> None:
    h = harness([call(n=1), final_citing_last])
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx, interrupt_before=["execute"])
    h.graph.update_state(config, {"run": {"last_error_code": None}}, as_node="decide")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert h.calls.count("search_logs") == 1
    assert state.termination is fp.TerminationReason.COMPLETED


# -- invariant 1: model output and tool output that no checkpoint can hold -----------------------


# -- invariant 5: trusted context, never from arguments --------------------------------------------


class CustomerArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    tenant_id: str
    principal_id: str


# -- invariant 7: repeats are counted once per allowed call ---------------------------------------


# -- invariant 3: an attempted call is charged, never refunded ------------------------------------


# -- invariant 8: results joined by call id --------------------------------------------------------


# -- nesting: the fencepost graph inside a user's own StateGraph ----------------------------------


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
