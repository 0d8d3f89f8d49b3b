"""The README comparison's last column: ``create_agent`` + ``fp.FencepostMiddleware``, on the same
scenarios as ``test_create_agent_side_by_side.py`` (the same kind of scripted chat model and
``@tool`` functions, real graphs on ``InMemorySaver``). One test per row of the table, each
asserting what the column claims, so the README can claim exactly this and no more."""

from __future__ import annotations

from langchain.agents.middleware import ToolRetryMiddleware
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import fencepost as fp
from tests.middleware.kit import (
    SECRET,
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


def test_a_limit_hit_is_a_typed_termination_in_the_agents_state() -> None:
    for limits, reason, counts in [
        (budget(steps=10, tools=3), "tool_budget_exhausted", (3, 4)),
        (budget(steps=3, tools=10), "step_budget_exhausted", (3, 3)),
    ]:
        ran = Ran()
        tools = lc_tools(ran)
        model = chat(search_forever())
        mw = fp.FencepostMiddleware(specs(tools), budget=limits)
        out = agent(model, tools, [mw]).invoke(ask(), thread(), context=ctx())
        assert out["termination"] == reason
        assert (len(ran.bodies), len(model.received)) == counts


def test_with_no_limit_configured_the_default_budget_ends_the_run_before_the_recursion_limit() -> (
    None
):
    ran = Ran()
    tools = lc_tools(ran)
    out = agent(chat(search_forever()), tools, [fp.FencepostMiddleware(specs(tools))]).invoke(
        ask(), thread(), context=ctx()
    )
    # 8 model steps and 8 tool calls by default: the ninth step is refused.
    assert out["termination"] == fp.TerminationReason.STEP_BUDGET_EXHAUSTED.value
    assert len(ran.bodies) == 8


def test_budgets_continue_across_invoke_none_and_command_resume() -> None:
    ran = Ran()
    tools = lc_tools(ran)
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(tools=2), approval="interrupt")
    script = search_forever(first=[call("write_note", {"note": "rollback"}, 1)])
    graph, config = agent(chat(script), tools, [mw]), thread()
    graph.invoke(ask(), config, context=ctx(), interrupt_before=["tools"])
    graph.invoke(Command(resume="approve"), config, context=ctx(), interrupt_before=["tools"])
    for _ in range(4):
        graph.invoke(None, config, context=ctx(), interrupt_before=["tools"])
    state = graph.get_state(config).values
    assert state["termination"] == fp.TerminationReason.TOOL_BUDGET_EXHAUSTED.value
    assert len(ran.bodies) == 2


def test_a_new_message_on_a_finished_thread_is_its_next_run_with_a_budget_of_its_own() -> None:
    ran = Ran()
    tools = lc_tools(ran)
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(tools=2))
    graph, config = agent(chat(search_forever()), tools, [mw]), thread()
    first = graph.invoke(ask(), config, context=ctx())
    second = graph.invoke(ask(), config, context=ctx())
    assert first["fencepost_run"]["run_id"] != second["fencepost_run"]["run_id"]
    assert second["fencepost_run"]["budget"]["tool_calls_used"] == 2
    assert len(ran.bodies) == 4


def test_a_tool_that_raises_shows_the_model_a_safe_code_under_tool_retry_too_runs_once_and_checkpoints_no_text() -> (
    None
):
    for extra in ([], [ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)]):
        ran = Ran()
        tools = lc_tools(ran, failing_write=True)
        mw = fp.FencepostMiddleware(specs(tools), budget=budget(), approval="interrupt")
        model, saver = (
            chat(then_answer(call("write_note", {"note": "rollback"}, 1))),
            InMemorySaver(),
        )
        graph, config = agent(model, tools, [*extra, mw], saver=saver), thread()
        graph.invoke(ask(), config, context=ctx())
        out = graph.invoke(Command(resume="approve"), config, context=ctx())
        assert out["termination"] == fp.TerminationReason.COMPLETED.value
        assert len(ran.bodies) == 1
        shown = [m.content for m in model.received[1] if isinstance(m, ToolMessage)]
        assert shown == ['{"error_code": "internal_error"}']
        assert SECRET not in "".join(repr(t) for t in saver.list(config))
