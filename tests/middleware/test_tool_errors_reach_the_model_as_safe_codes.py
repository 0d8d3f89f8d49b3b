"""Invariants 6 and 9 in the middleware binding: a failing write runs once, whatever retry
wrapper sits outside fencepost, and the model sees a safe code, never the exception's text."""

from __future__ import annotations

import logging

import pytest
from langchain.agents.middleware import ToolRetryMiddleware
from langchain_core.messages import ToolMessage
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
