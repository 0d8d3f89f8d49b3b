"""Invariants 6 and 9 in the middleware binding: a failing write runs once, whatever retry
wrapper sits outside fencepost, and the model sees a safe code, never the exception's text."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from langchain.agents.middleware import ToolRetryMiddleware
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
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
    specs,
    then_answer,
    thread,
)


def _write() -> list:
    return [call("write_note", {"note": "rollback deploy 42"}, 1)]


def _retry() -> ToolRetryMiddleware:
    return ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)


def test_tool_retry_runs_a_failing_write_three_times_and_sends_its_text_while_fencepost_runs_it_once_with_a_safe_code(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran = Ran()
    model = chat(then_answer(*_write()))
    agent(model, lc_tools(ran, failing_write=True), [_retry()]).invoke(ask(), thread())
    assert len(ran.bodies) == 3
    assert any(SECRET in str(m.content) for m in model.received[1] if isinstance(m, ToolMessage))

    ran = Ran()
    tools = lc_tools(ran, failing_write=True)
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(), approval="interrupt")
    model = chat(then_answer(*_write()))
    graph, config = agent(model, tools, [_retry(), mw]), thread()
    graph.invoke(ask(), config, context=ctx())
    with caplog.at_level(logging.WARNING, logger="fencepost"):
        out = graph.invoke(Command(resume="approve"), config, context=ctx())
    assert ran.bodies == ["write_note:rollback deploy 42"]
    seen = [m for m in model.received[1] if isinstance(m, ToolMessage)]
    assert [m.content for m in seen] == ['{"error_code": "internal_error"}']
    assert all(SECRET not in repr(m) for turn in model.received for m in turn)
    assert SECRET not in repr(graph.get_state(config).values)
    assert out["termination"] == fp.TerminationReason.COMPLETED.value
    # The developer still gets the traceback, on fencepost's logger.
    assert any(r.exc_info for r in caplog.records if r.name.startswith("fencepost"))


@pytest.mark.parametrize(
    "raised", [asyncio.CancelledError, GeneratorExit, SystemExit, KeyboardInterrupt]
)
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_tool_body_raising_a_base_exception_itself_is_that_calls_failure(
    raised: type[BaseException], mode: str
) -> None:
    # Raised by the body, not by the runtime cancelling the task: the call failed (a safe
    # code), and the run goes on to its answer; nothing leaves invoke.
    ran = Ran()

    @tool
    def search_logs(query: str) -> str:
        """Search the service logs."""
        ran.bodies.append(query)
        raise raised()

    tools = [search_logs, *lc_tools(ran)[1:]]
    mw = fp.FencepostMiddleware(specs(tools), budget=budget())
    graph = agent(chat(then_answer(call("search_logs", {"query": "q"}, 1))), tools, [mw])
    run = graph.ainvoke if mode == "ainvoke" else graph.invoke
    out = run(ask(), thread(), context=ctx())
    out = asyncio.run(out) if mode == "ainvoke" else out
    assert out["termination"] == "completed"
    assert ran.bodies == ["q"]
    answer = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert json.loads(answer.content) == {"error_code": "internal_error"}


async def test_cancelling_the_run_while_a_tool_runs_still_cancels_it() -> None:
    # The runtime's own cancellation is not the tool's failure: it leaves ainvoke as it is.
    started, never = asyncio.Event(), asyncio.Event()

    @tool
    async def search_logs(query: str) -> str:
        """Search the service logs."""
        started.set()
        await never.wait()
        return "unreachable"

    tools = [search_logs, *lc_tools(Ran())[1:]]
    mw = fp.FencepostMiddleware(specs(tools), budget=budget())
    graph = agent(chat(then_answer(call("search_logs", {"query": "q"}, 1))), tools, [mw])
    running = asyncio.ensure_future(graph.ainvoke(ask(), thread(), context=ctx()))
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
