"""Spans for operators: OpenTelemetry GenAI spans of what the loop did, never what it said.

One ``invoke_agent`` span per invoke, stream or resume; one ``execute_tool`` span per call the
executor ran, under it; every refused call, every approval asked and answered, an event on the
agent span; a child run's agent span under its parent's ``execute_tool`` span; a resume in
another process its own trace, found by the thread id. Recorded with opentelemetry-sdk's
``InMemorySpanExporter`` on the global tracer provider (``tests.telemetry_kit``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langgraph.types import Command
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from tests.adapters.fakes import FakeToolChatModel
from tests.graph.child_kit import Family, answer_after, child_call, parent_context, ping
from tests.graph.kit import (
    ABSTAIN,
    budget,
    call,
    context,
    final_citing_last,
    harness,
    thread,
)
from tests.telemetry_kit import by_name, events, parent_of

ROOT = Path(__file__).resolve().parents[2]

AGENT_KEYS = {
    "gen_ai.operation.name",
    "gen_ai.agent.name",
    "gen_ai.conversation.id",
    "fencepost.run_id",
    "fencepost.budget.remaining.steps",
    "fencepost.budget.remaining.tool_calls",
}
TOOL_KEYS = {
    "gen_ai.operation.name",
    "gen_ai.tool.name",
    "gen_ai.tool.call.id",
    "gen_ai.tool.type",
    "fencepost.effect",
    "fencepost.attempt",
    "fencepost.receipt_status",
}


def _finished(spans: InMemorySpanExporter) -> list[ReadableSpan]:
    return list(spans.get_finished_spans())


def _one_agent(found: list[ReadableSpan]) -> ReadableSpan:
    (agent,) = by_name(found, "invoke_agent")
    return agent


def _thread_of(config: dict[str, Any]) -> str:
    return str(config["configurable"]["thread_id"])


# -- the span tree of a run -----------------------------------------------------------------------


def test_a_seed_run_is_one_invoke_agent_span_with_one_execute_tool_child_per_call(
    spans: InMemorySpanExporter,
) -> None:
    h = harness([call("search_logs", 1), call("search_logs", 2), final_citing_last])
    config = thread()
    state = h.run(config=config)
    assert state.termination is fp.TerminationReason.COMPLETED

    found = _finished(spans)
    agent = _one_agent(found)
    assert agent.name == "invoke_agent fencepost"
    assert agent.parent is None and agent.status.status_code is StatusCode.UNSET
    assert dict(agent.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "fencepost",
        "gen_ai.conversation.id": _thread_of(config),
        "fencepost.run_id": state.run_id,
        "fencepost.budget.remaining.steps": state.budget.steps_remaining,
        "fencepost.budget.remaining.tool_calls": state.budget.tool_calls_remaining,
        "fencepost.termination_reason": "completed",
    }
    assert agent.events == ()
    tools = by_name(found, "execute_tool")
    assert [t.name for t in tools] == ["execute_tool search_logs"] * 2
    for n, span in enumerate(tools, start=1):
        assert parent_of(span) == agent.context.span_id
        assert span.context.trace_id == agent.context.trace_id
        assert dict(span.attributes or {}) == {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search_logs",
            "gen_ai.tool.call.id": f"call-{n:04d}",
            "gen_ai.tool.type": "function",
            "fencepost.effect": "read",
            "fencepost.attempt": 1,
            "fencepost.receipt_status": "completed",
        }
        assert span.status.status_code is StatusCode.UNSET
    assert len(found) == 3


def test_a_failed_call_is_an_execute_tool_span_with_its_safe_code_as_error_type(
    spans: InMemorySpanExporter,
) -> None:
    state = harness([call("explode", 1), fp.AbstainProposal(reason="insufficient_evidence")]).run()
    assert state.receipts[0].error_code is fp.ErrorCode.INTERNAL_ERROR
    (span,) = by_name(_finished(spans), "execute_tool")
    assert span.attributes is not None
    assert span.attributes["error.type"] == "internal_error"
    assert span.attributes["fencepost.receipt_status"] == "failed"
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is None  # a code, never the exception's text


def test_the_agent_span_counts_the_tokens_the_model_reported_and_names_the_agent(
    spans: InMemorySpanExporter,
) -> None:
    @fp.tool(effect="read", capability="logs:read")
    def search_logs(query: str) -> dict[str, Any]:
        """Search the logs."""
        return {"hits": []}

    usage = {"input_tokens": 120, "output_tokens": 7, "total_tokens": 127}
    model = FakeToolChatModel(
        messages=iter(
            [
                AIMessage(
                    content="",
                    tool_calls=[
                        {"name": "search_logs", "args": {"query": "500"}, "id": "call-0001"}
                    ],
                    usage_metadata=usage,
                ),
                AIMessage(
                    content="",
                    tool_calls=[
                        {
                            "name": "final_answer",
                            "args": {"text": "no hits", "citations": ["call-0001"]},
                            "id": "call-0002",
                        }
                    ],
                    usage_metadata={"input_tokens": 150, "output_tokens": 9, "total_tokens": 159},
                ),
            ]
        )
    )
    from langgraph.checkpoint.memory import InMemorySaver

    agent_graph = fp.create_agent(
        model, [search_logs], checkpointer=InMemorySaver(), name="log-detective"
    )
    out = agent_graph.invoke(fp.start("why 500?"), thread(), context=context())
    assert fp.run_output(out).termination is fp.TerminationReason.COMPLETED
    agent = _one_agent(_finished(spans))
    assert agent.name == "invoke_agent log-detective"
    assert agent.attributes is not None
    assert agent.attributes["gen_ai.agent.name"] == "log-detective"
    assert agent.attributes["gen_ai.usage.input_tokens"] == 270
    assert agent.attributes["gen_ai.usage.output_tokens"] == 16


def test_a_calls_span_is_under_the_callers_own_span_when_one_is_current(
    spans: InMemorySpanExporter,
) -> None:
    tracer = trace.get_tracer("the-application")
    with tracer.start_as_current_span("POST /ask") as request:
        harness([call("search_logs", 1), final_citing_last]).run()
    agent = _one_agent(_finished(spans))
    assert parent_of(agent) == request.get_span_context().span_id


def test_a_parallel_batch_is_one_execute_tool_span_per_call_all_under_the_agent_span(
    spans: InMemorySpanExporter,
) -> None:
    batch = fp.ToolBatch(calls=(call("search_logs", 1), call("search_logs", 2), call("explode", 3)))
    harness([batch, fp.AbstainProposal(reason="insufficient_evidence")]).run()
    found = _finished(spans)
    agent = _one_agent(found)
    tools = sorted(by_name(found, "execute_tool"), key=lambda s: str(s.attributes))
    assert sorted(str((s.attributes or {})["gen_ai.tool.call.id"]) for s in tools) == [
        "call-0001",
        "call-0002",
        "call-0003",
    ]
    assert {parent_of(s) for s in tools} == {agent.context.span_id}


async def test_ainvoke_and_astream_trace_the_same_tree(spans: InMemorySpanExporter) -> None:
    h = harness([call("search_logs", 1), final_citing_last])
    config = thread()
    await h.graph.ainvoke(fp.start("q", budget()), config, context=context())
    h2 = harness([call("search_logs", 1), final_citing_last])
    chunks = [
        c
        async for c in h2.graph.astream(
            fp.start("q", budget()), thread(), context=context(), stream_mode="custom"
        )
    ]
    assert chunks
    found = _finished(spans)
    agents = by_name(found, "invoke_agent")
    assert len(agents) == 2
    tools = by_name(found, "execute_tool")
    assert sorted(parent_of(t) for t in tools) == sorted(a.context.span_id for a in agents)


def test_the_agent_span_is_current_only_while_the_graph_computes(
    spans: InMemorySpanExporter,
) -> None:
    h = harness([call("search_logs", 1), call("search_logs", 2), final_citing_last])
    seen: list[bool] = []
    stream = h.graph.stream(fp.start("q", budget()), thread(), context=context())
    for _ in stream:
        # Between chunks the caller's context is its own: no agent span is current.
        seen.append(trace.get_current_span().get_span_context().is_valid)
        break
    stream.close()  # a caller that stops reading: the span ends, not as a failure
    assert seen == [False]
    agent = _one_agent(_finished(spans))
    assert agent.status.status_code is StatusCode.UNSET
    assert "error.type" not in (agent.attributes or {})


def test_an_invoke_that_raises_ends_its_span_with_the_exceptions_class_and_no_text(
    spans: InMemorySpanExporter,
) -> None:
    h = harness([call("write_note", 1, note="hi")], approval="interrupt")
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context())
    with pytest.raises(fp.CommandRefused):
        h.graph.invoke(Command(goto=["execute", "decide"]), config, context=context())
    refused = by_name(_finished(spans), "invoke_agent")[-1]
    assert refused.attributes is not None
    assert refused.attributes["error.type"] == "fencepost.graph.compiled.CommandRefused"
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.status.description is None
    assert refused.events == ()


# -- refusals and approvals are events on the agent span -------------------------------------------


def test_a_refused_call_is_an_event_on_the_agent_span_and_no_execute_tool_span(
    spans: InMemorySpanExporter,
) -> None:
    h = harness([call("admin_reset", 1)])
    state = h.run()
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    found = _finished(spans)
    assert by_name(found, "execute_tool") == []
    agent = _one_agent(found)
    assert events(agent) == [
        {
            "name": "fencepost.tool_call.refused",
            "gen_ai.tool.name": "admin_reset",
            "gen_ai.tool.call.id": "call-0001",
            "fencepost.verdict": "capability_denied",
            "error.type": "capability_denied",
            "fencepost.missing_capability": "admin",
        }
    ]
    assert agent.attributes is not None
    assert agent.attributes["fencepost.termination_reason"] == "policy_denied"
    assert agent.attributes["fencepost.error_code"] == "capability_denied"


def test_an_unknown_tool_is_refused_without_the_name_the_model_made_up(
    spans: InMemorySpanExporter,
) -> None:
    made_up = fp.ToolProposal(call_id="call-0001", tool_name="delete_everything", arguments={})
    harness([made_up]).run()
    (event,) = events(_one_agent(_finished(spans)))
    assert event == {
        "name": "fencepost.tool_call.refused",
        "gen_ai.tool.call.id": "call-0001",
        "fencepost.verdict": "unknown_tool",
        "error.type": "unknown_tool",
    }


def test_a_call_the_budget_cannot_cover_is_a_refusal_event(spans: InMemorySpanExporter) -> None:
    batch = fp.ToolBatch(calls=(call("search_logs", 1), call("search_logs", 2)))
    state = harness([batch, final_citing_last]).run(tools=1)
    assert state.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    found = _finished(spans)
    agent = _one_agent(found)
    assert [e["gen_ai.tool.call.id"] for e in events(agent)] == ["call-0002"]
    assert events(agent)[0]["fencepost.verdict"] == "budget_exhausted"
    assert [
        (t.attributes or {})["gen_ai.tool.call.id"] for t in by_name(found, "execute_tool")
    ] == ["call-0001"]
    assert agent.attributes is not None
    assert agent.attributes["fencepost.budget.remaining.tool_calls"] == 0


def test_a_call_the_executor_refused_is_a_refusal_event_with_the_executors_code(
    spans: InMemorySpanExporter,
) -> None:
    after = fp.ToolProposal(
        call_id="call-0002",
        tool_name="search_logs",
        arguments={"query": "after the failure"},
        depends_on=("call-0001",),
    )
    batch = fp.ToolBatch(calls=(call("explode", 1), after))
    state = harness([batch, fp.AbstainProposal(reason="insufficient_evidence")]).run()
    assert [(r.call_id, r.error_code) for r in state.receipts] == [
        ("call-0001", fp.ErrorCode.INTERNAL_ERROR),
        ("call-0002", fp.ErrorCode.DEPENDENCY_FAILED),
    ]
    found = _finished(spans)
    (tool,) = by_name(found, "execute_tool")
    assert (tool.attributes or {})["gen_ai.tool.call.id"] == "call-0001"
    assert events(_one_agent(found)) == [
        {
            "name": "fencepost.tool_call.refused",
            "gen_ai.tool.name": "search_logs",
            "gen_ai.tool.call.id": "call-0002",
            "fencepost.verdict": "allowed",
            "error.type": "dependency_failed",
        }
    ]


@pytest.mark.parametrize("answer", ["approve", "reject"])
def test_an_approval_pause_and_its_resume_are_two_agent_spans_of_one_conversation(
    spans: InMemorySpanExporter, answer: str
) -> None:
    h = harness(
        [call("write_note", 1, note="checkout is down"), final_citing_last, final_citing_last],
        approval="interrupt",
    )
    config, ctx = thread(), context()
    paused = h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    assert "__interrupt__" in paused
    h.graph.invoke(Command(resume=answer), config, context=ctx)

    found = _finished(spans)
    first, second = by_name(found, "invoke_agent")
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["gen_ai.conversation.id"] == _thread_of(config)
    assert second.attributes["gen_ai.conversation.id"] == _thread_of(config)
    assert first.attributes["fencepost.run_id"] == second.attributes["fencepost.run_id"]
    # Paused: not ended, so no termination on the first.
    assert "fencepost.termination_reason" not in first.attributes
    assert events(first) == [
        {
            "name": "fencepost.approval.requested",
            "gen_ai.tool.name": "write_note",
            "gen_ai.tool.call.id": "call-0001",
            "fencepost.verdict": "approval_pending",
            # A write is traced: its note was seen nowhere before (the model's own).
            "fencepost.provenance.note": ("model",),
        }
    ]
    answered = events(second)
    assert answered[0] == {
        "name": "fencepost.approval.answered",
        "gen_ai.tool.name": "write_note",
        "gen_ai.tool.call.id": "call-0001",
        "fencepost.verdict": "allowed" if answer == "approve" else "rejected",
        "fencepost.approval.kind": "human",
        "fencepost.approval.by": "u-1",
    }
    tools = by_name(found, "execute_tool")
    if answer == "approve":
        assert answered[1:] == []
        (tool,) = tools
        assert parent_of(tool) == second.context.span_id
        assert (tool.attributes or {})["fencepost.effect"] == "write"
    else:
        assert tools == []
        assert answered[1:] == [
            {
                "name": "fencepost.tool_call.refused",
                "gen_ai.tool.name": "write_note",
                "gen_ai.tool.call.id": "call-0001",
                "fencepost.verdict": "rejected",
                "error.type": "rejected",
            }
        ]


# -- child runs and resumes ------------------------------------------------------------------------


def _family() -> Family:
    return Family(
        fp.ToolRegistry([ping]),
        ScriptedDecisionModel(
            [fp.ToolProposal(call_id="ping-000001", tool_name="ping", arguments={"n": 1})]
            + [answer_after("ping", 1)] * 2
        ),
        [child_call(1), final_citing_last],
        child_budget=fp.RuntimeBudget(steps_remaining=5, tool_calls_remaining=5),
    )


def _assert_child_under_its_call(found: list[ReadableSpan]) -> None:
    parent_agent = next(s for s in by_name(found, "invoke_agent") if s.parent is None)
    research = next(s for s in by_name(found, "execute_tool research"))
    child_agent = next(s for s in by_name(found, "invoke_agent") if s.parent is not None)
    child_tool = next(s for s in by_name(found, "execute_tool ping"))
    assert parent_of(research) == parent_agent.context.span_id
    assert parent_of(child_agent) == research.context.span_id
    assert parent_of(child_tool) == child_agent.context.span_id
    assert len({s.context.trace_id for s in found}) == 1
    assert (child_agent.attributes or {})["fencepost.termination_reason"] == "completed"
    assert (research.attributes or {})["fencepost.receipt_status"] == "completed"


def test_a_child_runs_agent_span_sits_under_its_parents_execute_tool_span(
    spans: InMemorySpanExporter,
) -> None:
    family = _family()
    state = fp.run_output(
        family.parent.invoke(
            fp.start("q", fp.RuntimeBudget(steps_remaining=10, tool_calls_remaining=5)),
            thread(),
            context=parent_context(),
        )
    )
    assert state.termination is fp.TerminationReason.COMPLETED
    _assert_child_under_its_call(_finished(spans))


async def test_a_child_run_under_ainvoke_sits_under_its_parents_execute_tool_span_too(
    spans: InMemorySpanExporter,
) -> None:
    family = _family()
    out = await family.parent.ainvoke(
        fp.start("q", fp.RuntimeBudget(steps_remaining=10, tool_calls_remaining=5)),
        thread(),
        context=parent_context(),
    )
    assert fp.run_output(out).termination is fp.TerminationReason.COMPLETED
    _assert_child_under_its_call(_finished(spans))


def test_a_crash_and_its_resume_in_another_process_are_separate_traces_of_one_conversation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.graph.crash_worker import IDEMPOTENT_WRITE_TOOL
    from tests.graph.test_crash_resume import Backend, crash_and_resume

    exported = tmp_path / "spans.jsonl"
    monkeypatch.setenv("FENCEPOST_TEST_SPANS", str(exported))
    backend = Backend("sqlite", str(tmp_path / "checkpoints.db"), str(tmp_path / "ledger.db"))
    o = crash_and_resume(backend, tmp_path / "work", tool=IDEMPOTENT_WRITE_TOOL, hang="tool")
    assert o.state.termination is fp.TerminationReason.COMPLETED
    found = [json.loads(line) for line in exported.read_text().splitlines()]
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for span in found:
        by_pid.setdefault(span["pid"], []).append(span)
    crashed, resumed = sorted(by_pid.values(), key=lambda spans: spans[0]["end"])
    # The crashed process exported what ended before the kill: the invoke that paused for the
    # approval. The invoke that approved it was killed inside the tool: never exported.
    assert [s["name"] for s in crashed] == ["invoke_agent fencepost"]
    assert [e["name"] for e in crashed[0]["events"]] == ["fencepost.approval.requested"]
    names = sorted(s["name"] for s in resumed)
    assert names == ["execute_tool record_note", "invoke_agent fencepost"]
    agent = next(s for s in resumed if s["name"].startswith("invoke_agent"))
    tool = next(s for s in resumed if s["name"].startswith("execute_tool"))
    assert agent["parent"] is None and tool["parent"] == agent["span"]
    assert agent["trace"] != crashed[0]["trace"]  # its own trace...
    thread_id = o.spec["thread_id"]
    for span in (crashed[0], agent):  # ...found with the crashed one by the thread id
        assert span["attributes"]["gen_ai.conversation.id"] == thread_id
        assert span["attributes"]["fencepost.run_id"] == o.run_id
    assert tool["attributes"]["fencepost.attempt"] == 2  # the idempotent write, retried
    assert tool["attributes"]["fencepost.receipt_status"] == "completed"
    assert agent["attributes"]["fencepost.termination_reason"] == "completed"
    # The resuming process's developer log says why there was a second attempt.
    logged = Path(f"{exported}.resume.log").read_text()
    assert (
        f"INFO fencepost.run run {o.run_id} call call-0001 (record_note): attempt 1 started and "
        "never reported; retrying as attempt 2"
    ) in logged


# -- without OpenTelemetry: nothing imported, nothing done -----------------------------------------


def test_without_opentelemetry_fencepost_imports_runs_and_never_imports_it() -> None:
    script = textwrap.dedent(
        """
        import importlib.abc, importlib.util, os, sys, traceback

        # The package's directory, found without importing it.
        FENCEPOST = importlib.util.find_spec("fencepost").submodule_search_locations[0] + os.sep

        class NoOpenTelemetry(importlib.abc.MetaPathFinder):
            # As if opentelemetry were not installed (langsmith looks for it too: only the
            # lookups fencepost's own code makes are counted).
            asked = []
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    stack = traceback.extract_stack()[:-1]
                    importer = [f for f in stack if not f.filename.startswith("<frozen")][-1]
                    if importer.filename.startswith(FENCEPOST):
                        self.asked.append(name)
                    raise ModuleNotFoundError(name)
                return None

        blocker = NoOpenTelemetry()
        sys.meta_path.insert(0, blocker)
        import fencepost as fp
        from tests.graph.kit import call, final_citing_last, harness
        state = harness([call("search_logs", 1), final_citing_last]).run()
        again = harness([call("search_logs", 1), final_citing_last]).run()
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        print(state.termination.value, again.termination.value, loaded, len(blocker.asked))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "LANGGRAPH_STRICT_MSGPACK": "true"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # Both runs completed; nothing of opentelemetry was loaded, and it was looked for once.
    assert done.stdout.split() == ["completed", "completed", "[]", "1"]


def test_the_approvers_answers_are_approval_events_and_its_rejection_a_refusal(
    spans: InMemorySpanExporter,
) -> None:
    def only_restarts(request: fp.ApproverInput) -> fp.ApproverDecision:
        if request.proposal.arguments.get("note") == "restart api":
            return fp.ApproverDecision.approve()
        return fp.ApproverDecision.reject("not_a_restart")

    script = [call("write_note", 1, note="wipe db"), call("write_note", 2, note="restart api")]
    harness([*script, ABSTAIN], approver=only_restarts).run()
    agent = _one_agent(_finished(spans))
    assert [
        (e["name"], e["gen_ai.tool.call.id"], e["fencepost.verdict"]) for e in events(agent)
    ] == [
        ("fencepost.approval.answered", "call-0001", "rejected"),
        ("fencepost.tool_call.refused", "call-0001", "rejected"),
        ("fencepost.approval.answered", "call-0002", "allowed"),
    ]
