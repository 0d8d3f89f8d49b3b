"""Invariants 3 and 4 in the middleware binding: a tool budget of N runs exactly N calls, across
an approval's interrupt and resume (LangChain's run counter restarts at each resume)."""

from __future__ import annotations

from langchain.agents.middleware import HumanInTheLoopMiddleware, ToolCallLimitMiddleware
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
    thread,
)


def _write_then_search() -> list:
    return [call("write_note", {"note": "rollback deploy 42"}, 1)]


def test_tool_call_limit_with_hitl_runs_two_calls_on_a_limit_of_one_while_fencepost_runs_exactly_one() -> (
    None
):
    ran = Ran()
    limiter = ToolCallLimitMiddleware(run_limit=1, exit_behavior="end")
    hitl = HumanInTheLoopMiddleware(interrupt_on={"write_note": True})
    graph, config = (
        agent(chat(search_forever(first=_write_then_search())), lc_tools(ran), [hitl, limiter]),
        thread(),
    )
    graph.invoke(ask(), config)
    graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
    assert len(ran.bodies) == 2  # LangChain: the run count was lost with the interrupt

    ran = Ran()
    mw = fp.FencepostMiddleware(specs(lc_tools(ran)), budget=budget(tools=1), approval="interrupt")
    graph, config = (
        agent(chat(search_forever(first=_write_then_search())), lc_tools(ran), [mw]),
        thread(),
    )
    paused = graph.invoke(ask(), config, context=ctx())
    assert "__interrupt__" in paused and ran.bodies == []
    out = graph.invoke(Command(resume="approve"), config, context=ctx())
    assert ran.bodies == ["write_note:rollback deploy 42"]
    assert out["termination"] == fp.TerminationReason.TOOL_BUDGET_EXHAUSTED.value


def test_the_budget_continues_across_a_resume_with_none() -> None:
    ran = Ran()
    mw = fp.FencepostMiddleware(specs(lc_tools(ran)), budget=budget(tools=2))
    graph = agent(chat(search_forever()), lc_tools(ran), [mw])
    config = thread()
    graph.invoke(ask(), config, context=ctx(), interrupt_before=["tools"])
    for _ in range(5):
        graph.invoke(None, config, context=ctx(), interrupt_before=["tools"])
    state = graph.get_state(config).values
    assert len(ran.bodies) == 2
    assert state["termination"] == fp.TerminationReason.TOOL_BUDGET_EXHAUSTED.value
    assert graph.get_state(config).next == ()
