"""Invariant 1 in the middleware binding: every run ends with one TerminationReason in the
agent's state, a step budget long before LangGraph's recursion limit, never GraphRecursionError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import fencepost as fp
from tests.middleware.kit import (
    Ran,
    agent,
    ask,
    budget,
    call,
    chat,
    ctx,
    lc_tools,
    search_forever,
    specs,
    then_answer,
    thread,
)


def test_a_model_that_never_stops_ends_step_budget_exhausted_before_the_recursion_limit() -> None:
    ran = Ran()
    mw = fp.FencepostMiddleware(specs(lc_tools(ran)), budget=budget(steps=4, tools=50))
    model = chat(search_forever())
    out = agent(model, lc_tools(ran), [mw]).invoke(
        ask(), {**thread(), "recursion_limit": 40}, context=ctx()
    )
    assert out["termination"] == fp.TerminationReason.STEP_BUDGET_EXHAUSTED.value
    assert len(model.received) == 4
    assert len(ran.bodies) == 4


def test_a_final_answer_ends_completed() -> None:
    ran = Ran()
    mw = fp.FencepostMiddleware(specs(lc_tools(ran)), budget=budget())
    out = agent(chat(then_answer()), lc_tools(ran), [mw]).invoke(ask(), thread(), context=ctx())
    assert out["termination"] == fp.TerminationReason.COMPLETED.value


def test_a_run_without_a_trusted_context_ends_policy_denied_before_the_model_is_called() -> None:
    ran = Ran()
    model = chat(then_answer())
    mw = fp.FencepostMiddleware(specs(lc_tools(ran)), budget=budget())
    out = agent(model, lc_tools(ran), [mw]).invoke(ask(), thread())
    assert out["termination"] == fp.TerminationReason.POLICY_DENIED.value
    assert model.received == []


def test_new_input_on_an_ended_thread_is_a_new_run_with_its_own_budget() -> None:
    ran = Ran()
    mw = fp.FencepostMiddleware(specs(lc_tools(ran)), budget=budget(steps=10, tools=2))
    graph, config = agent(chat(search_forever()), lc_tools(ran), [mw]), thread()
    first = graph.invoke(ask(), config, context=ctx())
    second = graph.invoke(ask(), config, context=ctx())
    assert first["termination"] == second["termination"] == "tool_budget_exhausted"
    assert first["fencepost_run"]["run_id"] != second["fencepost_run"]["run_id"]
    assert len(ran.bodies) == 4


async def test_under_ainvoke_the_same_budget_ends_the_run_with_its_reason() -> None:
    ran = Ran()
    mw = fp.FencepostMiddleware(specs(lc_tools(ran)), budget=budget(steps=10, tools=2))
    out = await agent(chat(search_forever()), lc_tools(ran), [mw]).ainvoke(
        ask(), thread(), context=ctx()
    )
    assert out["termination"] == fp.TerminationReason.TOOL_BUDGET_EXHAUSTED.value
    assert len(ran.bodies) == 2


def _paused_on_a_write() -> tuple[Any, Any, Ran]:
    ran = Ran()
    tools = lc_tools(ran)
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(), approval="interrupt")
    model = chat(then_answer(call("write_note", {"note": "rollback deploy 42"}, 1)))
    graph, config = agent(model, tools, [mw]), thread()
    graph.invoke(ask(), config, context=ctx())
    return graph, config, ran


@pytest.mark.parametrize(
    "hold", [{"tokens": "x", "sent": 1}, {"tokens": -5}, {"sent": True}, [1, 2], "held"]
)
def test_a_step_hold_a_caller_rewrote_ends_the_run_typed_and_runs_nothing(hold: object) -> None:
    # The resume re-runs the gate hook, which settles the step from what it held: a hold no
    # hook wrote is not settled half-read, nor does its error escape invoke.
    graph, config, ran = _paused_on_a_write()
    out = graph.invoke(
        Command(resume="approve", update={"fencepost_step": hold}), config, context=ctx()
    )
    assert (out["termination"], out["last_error_code"]) == ("policy_denied", "invalid_state")
    assert ran.bodies == []


@pytest.mark.parametrize("written", ["x", {"step": 1}, 7])
def test_a_manifests_write_that_is_no_list_never_escapes_invoke(written: object) -> None:
    graph, config, ran = _paused_on_a_write()
    graph.update_state(config, {"fencepost_manifests": written})
    out = graph.invoke(Command(resume="approve"), config, context=ctx())
    assert out["termination"] == "completed"
    assert ran.bodies == ["write_note:rollback deploy 42"]
    assert all(isinstance(m, dict) and "phase" in m for m in out["fencepost_manifests"])


def test_a_resume_through_a_new_middleware_on_its_own_ledger_ends_typed(tmp_path: Path) -> None:
    # An app that builds its agent per request on one saver: the middleware that resumes
    # holds a ledger (its own in-memory one) that never held the paused run's step.
    ran = Ran()
    tools = lc_tools(ran)

    def per_request(saver: Any) -> Any:
        mw = fp.FencepostMiddleware(specs(tools), budget=budget(), approval="interrupt")
        model = chat(then_answer(call("write_note", {"note": "rollback deploy 42"}, 1)))
        return agent(model, tools, [mw], saver=saver)

    with SqliteSaver.from_conn_string(str(tmp_path / "saver.db")) as saver:
        config = thread()
        paused = per_request(saver).invoke(ask(), config, context=ctx())
        assert "__interrupt__" in paused
        out = per_request(saver).invoke(Command(resume="approve"), config, context=ctx())
    assert (out["termination"], out["last_error_code"]) == (
        "policy_denied",
        "unknown_budget_account",
    )
    assert ran.bodies == []
