"""The documented limits of the middleware binding (docs/middleware.md), each pinned: its place
in the list (last), the middleware it composes with, and what it cannot see."""

from __future__ import annotations

import pytest
from langchain.agents.middleware import (
    ModelFallbackMiddleware,
    PIIMiddleware,
    SummarizationMiddleware,
    ToolRetryMiddleware,
)
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.types import Command

import fencepost as fp
from tests.middleware.kit import (
    SECRET,
    Ran,
    agent,
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


def _retry() -> ToolRetryMiddleware:
    return ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)


def _failing_write_run(order: str) -> tuple[Ran, list[ToolMessage]]:
    ran = Ran()
    tools = lc_tools(ran, failing_write=True)
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(), approval="interrupt")
    middleware = [_retry(), mw] if order == "fencepost_last" else [mw, _retry()]
    model = chat(then_answer(call("write_note", {"note": "rollback"}, 1)))
    graph, config = agent(model, tools, middleware), thread()
    graph.invoke({"messages": [HumanMessage("note it")]}, config, context=ctx())
    graph.invoke(Command(resume="approve"), config, context=ctx())
    return ran, [m for m in model.received[1] if isinstance(m, ToolMessage)]


def test_listed_last_a_retry_wrapper_outside_it_runs_a_failing_write_once() -> None:
    ran, seen = _failing_write_run("fencepost_last")
    assert len(ran.bodies) == 1
    assert [m.content for m in seen] == ['{"error_code": "internal_error"}']


def test_listed_before_a_retry_wrapper_the_retry_reruns_the_tool_under_one_reservation_but_the_model_still_sees_only_the_code() -> (
    None
):
    # The limit LangChain's list leaves: a wrapper inside fencepost calls the tool itself, and
    # the list is not visible to refuse. What reaches the model is still the safe code.
    ran, seen = _failing_write_run("fencepost_first")
    assert len(ran.bodies) == 3
    assert [m.content for m in seen] == ['{"error_code": "internal_error"}']
    assert all(SECRET not in str(m.content) for m in seen)


def test_it_composes_with_pii_middleware_which_redacts_what_the_model_sees() -> None:
    ran = Ran()
    tools = lc_tools(ran)
    pii = PIIMiddleware("email", strategy="redact")
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(tools=1))
    model = chat(search_forever())
    out = agent(model, tools, [pii, mw]).invoke(
        {"messages": [HumanMessage("logs of bob@example.com")]}, thread(), context=ctx()
    )
    assert all("bob@example.com" not in str(m.content) for m in model.received[0])
    assert out["termination"] == fp.TerminationReason.TOOL_BUDGET_EXHAUSTED.value
    assert len(ran.bodies) == 1


def test_it_cannot_see_the_model_calls_summarization_middleware_makes_on_its_own() -> None:
    ran = Ran()
    tools = lc_tools(ran)
    summarizer = chat(iter([AIMessage("summary")] * 50))
    summarize = SummarizationMiddleware(summarizer, trigger=("messages", 4), keep=("messages", 2))
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(steps=4, tools=50))
    model = chat(search_forever())
    out = agent(model, tools, [summarize, mw]).invoke(
        {"messages": [HumanMessage("why?")]}, thread(), context=ctx()
    )
    assert out["termination"] == fp.TerminationReason.STEP_BUDGET_EXHAUSTED.value
    # The budget counts the agent's model steps only; the summarizer's calls are not reserved.
    assert len(model.received) == 4
    assert len(summarizer.received) >= 1
    assert out["fencepost_run"]["budget"]["steps_used"] == 4


def test_summarization_middleware_composes_with_the_budget() -> None:
    # The summarizer rewrites what the model is sent every few messages; the tool budget still
    # runs exactly its N calls and ends the run typed.
    ran = Ran()
    tools = lc_tools(ran)
    summarizer = chat(iter([AIMessage("summary")] * 50))
    summarize = SummarizationMiddleware(summarizer, trigger=("messages", 4), keep=("messages", 2))
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(steps=20, tools=3))
    out = agent(chat(search_forever()), tools, [summarize, mw]).invoke(
        {"messages": [HumanMessage("why?")]}, thread(), context=ctx()
    )
    assert len(summarizer.received) >= 1
    assert out["termination"] == fp.TerminationReason.TOOL_BUDGET_EXHAUSTED.value
    assert len(ran.bodies) == 3


def test_it_cannot_see_the_second_model_a_fallback_middleware_calls_within_one_step() -> None:
    ran = Ran()
    tools = lc_tools(ran)
    primary = chat(iter([RuntimeError("provider down")] * 10))
    fallback = ModelFallbackMiddleware(chat(then_answer()))
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(steps=5))
    # Listed after fencepost: inside its wrap_model_call, where the failure reaches it.
    out = agent(primary, tools, fp.check_middleware([mw, fallback])).invoke(
        {"messages": [HumanMessage("why?")]}, thread(), context=ctx()
    )
    assert out["termination"] == fp.TerminationReason.COMPLETED.value
    # Two models were called; one model step was reserved.
    assert len(primary.received) == 1
    assert out["fencepost_run"]["budget"]["steps_used"] == 1


def test_a_fallback_listed_before_fencepost_is_refused_and_would_never_see_the_failure() -> None:
    ran = Ran()
    tools = lc_tools(ran)
    primary = chat(iter([RuntimeError("provider down")] * 10))
    fallback = ModelFallbackMiddleware(chat(then_answer()))
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(steps=5))
    with pytest.raises(fp.MiddlewareOrderError, match="ModelFallbackMiddleware"):
        fp.check_middleware([fallback, mw])
    # Unchecked: fencepost contains the failure first, and the run ends typed.
    out = agent(primary, tools, [fallback, mw]).invoke(
        {"messages": [HumanMessage("why?")]}, thread(), context=ctx()
    )
    assert (out["termination"], out["last_error_code"]) == ("failed", "internal_error")
    assert ran.bodies == []
