"""Manifests, logs and spans in the middleware binding, as the graph binding emits them: a
manifest for each call gated and each call run and one for the run's end, kept in the run's
record and streamed in ``custom`` mode; an ``execute_tool`` span per call that ran, with the
graph binding's attributes (the safe code on a failure, never the exception's text); the run's
end on the ``fencepost.run`` logger."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from langgraph.types import Command
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

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
from tests.telemetry_kit import by_name, parent_of


def _looping(tools_budget: int = 2) -> tuple[Any, Ran]:
    ran = Ran()
    tools = lc_tools(ran)
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(tools=tools_budget))
    return agent(chat(search_forever()), tools, [mw]), ran


def test_each_call_gated_and_run_and_the_end_are_manifests_kept_in_the_runs_record() -> None:
    graph, ran = _looping()
    out = graph.invoke(ask(), thread(), context=ctx())
    assert len(ran.bodies) == 2
    kept = [
        (m["phase"], m["outcome"], m["tool_name"], m["code"]) for m in out["fencepost_manifests"]
    ]
    assert kept == [
        ("validate", "allowed", "search_logs", None),
        ("execute", "success", "search_logs", None),
        ("validate", "allowed", "search_logs", None),
        ("execute", "success", "search_logs", None),
        # The gate allows the third call; the ledger refuses to reserve it: the run ends.
        ("validate", "allowed", "search_logs", None),
        ("terminal", "terminal", None, "tool_budget_exhausted"),
    ]
    steps = [m["step"] for m in out["fencepost_manifests"]]
    assert steps == [1, 1, 2, 2, 3, 3]


def test_the_manifests_are_streamed_in_custom_mode_as_they_are_recorded() -> None:
    graph, _ = _looping()
    config = thread()
    streamed = [
        chunk
        for chunk in graph.stream(ask(), config, context=ctx(), stream_mode="custom")
        if isinstance(chunk, dict) and chunk.get("fencepost") == "manifest"
    ]
    kept = graph.get_state(config).values["fencepost_manifests"]
    assert [c["phase"] for c in streamed] == ["validate", "execute"] * 2 + ["validate", "terminal"]
    assert [{k: v for k, v in c.items() if k != "fencepost"} for c in streamed] == kept


def test_a_tool_that_runs_is_an_execute_tool_span_with_the_graph_bindings_attributes(
    spans: InMemorySpanExporter,
) -> None:
    graph, _ = _looping(tools_budget=1)
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("app request") as request:
        graph.invoke(ask(), thread(), context=ctx())
    (span,) = by_name(list(spans.get_finished_spans()), "execute_tool")
    assert span.name == "execute_tool search_logs"
    assert parent_of(span) == request.get_span_context().span_id
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search_logs",
        "gen_ai.tool.call.id": "call-0100",
        "gen_ai.tool.type": "function",
        "fencepost.effect": "read",
        "fencepost.attempt": 1,
        "fencepost.receipt_status": "completed",
    }
    assert span.status.status_code is StatusCode.UNSET


def test_a_failed_call_is_an_execute_tool_span_with_its_safe_code_as_error_type(
    spans: InMemorySpanExporter,
) -> None:
    ran = Ran()
    tools = lc_tools(ran, failing_write=True)
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(), approval="interrupt")
    model = chat(then_answer(call("write_note", {"note": "rollback"}, 1)))
    graph, config = agent(model, tools, [mw]), thread()
    graph.invoke(ask(), config, context=ctx())
    out = graph.invoke(Command(resume="approve"), config, context=ctx())
    assert out["termination"] == fp.TerminationReason.COMPLETED.value
    (span,) = by_name(list(spans.get_finished_spans()), "execute_tool")
    attributes = dict(span.attributes or {})
    assert attributes["error.type"] == "internal_error"
    assert attributes["fencepost.receipt_status"] == "failed"
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is None
    assert all(SECRET not in str(v) for v in attributes.values())
    executed = [m for m in out["fencepost_manifests"] if m["phase"] == "execute"]
    assert [(m["outcome"], m["code"]) for m in executed] == [("error", "internal_error")]


def test_the_runs_end_is_logged_on_the_fencepost_run_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    graph, _ = _looping()
    with caplog.at_level(logging.INFO, logger="fencepost"):
        out = graph.invoke(ask(), thread(), context=ctx())
    run_id = out["fencepost_run"]["run_id"]
    ended = [r for r in caplog.records if r.name == "fencepost.run"]
    assert [r.getMessage() for r in ended] == [
        f"run {run_id} ended tool_budget_exhausted (tool_calls_exhausted)"
    ]
    assert ended[0].run_id == run_id  # type: ignore[attr-defined]
