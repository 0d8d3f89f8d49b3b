"""A capability denial names the capability the principal lacks — to the operator, not the model.

The stop report (each refused call, and "what to do": the capability to grant), the developer
log (``fencepost.gate``) and the span event (``fencepost.tool_call.refused``) say which
capability was missing. The model is told only the safe code ``permission_denied`` (with
``denial="observe"``): the name is in no model input, observation or message of the run.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import fencepost as fp
from fencepost.policy.tool_decorator import tool
from tests.adapters.fakes import FakeToolChatModel, ai_call, ai_final
from tests.graph.kit import Calls, budget, call, context, harness, make_registry, thread
from tests.telemetry_kit import by_name, events

CAPABILITY = "vault:rotate-keys"
"""Distinct from every tool name and code, so finding it anywhere means it was named there."""


@tool(effect=fp.Effect.READ, capability=CAPABILITY, timeout_seconds=5)
def rotate_keys(ctx: fp.ToolContext) -> Any:
    """Rotate the signing keys."""
    return {"rotated": True}


def _registry() -> fp.ToolRegistry:
    return make_registry(Calls(), extra=[rotate_keys])


def _rotate(n: int = 1) -> fp.ToolProposal:
    return fp.ToolProposal(call_id=f"call-{n:04d}", tool_name="rotate_keys", arguments={})


def test_the_stop_report_names_the_missing_capability_and_says_to_grant_it() -> None:
    state = harness([call("search_logs", 1), _rotate(2)], registry=_registry()).run()
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    report = state.report
    assert report is not None
    (refused,) = report.never_started
    assert (refused.call_id, refused.missing_capability) == ("call-0002", CAPABILITY)
    assert report.missing_capabilities == (CAPABILITY,)
    assert report.what_to_do is not None
    assert f"'{CAPABILITY}'" in report.what_to_do and "fp.Principal" in report.what_to_do
    assert f"missing capability {CAPABILITY}" in str(report)
    assert f"what to do     the principal lacks the capability '{CAPABILITY}'" in str(report)


def test_a_call_not_refused_for_a_capability_names_none() -> None:
    state = harness(
        [call("search_logs", 1, query=1)], registry=_registry(), repair_attempts=0
    ).run()
    assert state.report is not None
    assert state.report.missing_capabilities == ()
    assert CAPABILITY not in str(state.report)


def test_the_gate_log_names_the_missing_capability(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fencepost")
    state = harness([_rotate(1)], registry=_registry()).run()
    (record,) = [r for r in caplog.records if r.name == "fencepost.gate"]
    assert record.levelno == logging.INFO
    assert (record.call_id, record.code) == ("call-0001", "capability_denied")  # type: ignore[attr-defined]
    assert record.capability == CAPABILITY  # type: ignore[attr-defined]
    assert record.getMessage() == (
        f"run {state.run_id} call call-0001 (rotate_keys) refused: capability_denied "
        f"(the principal lacks the capability '{CAPABILITY}')"
    )


def test_the_refused_span_event_names_the_missing_capability(
    spans: InMemorySpanExporter,
) -> None:
    harness([_rotate(1)], registry=_registry()).run()
    (agent,) = by_name(list(spans.get_finished_spans()), "invoke_agent")
    assert events(agent) == [
        {
            "name": "fencepost.tool_call.refused",
            "gen_ai.tool.name": "rotate_keys",
            "gen_ai.tool.call.id": "call-0001",
            "fencepost.verdict": "capability_denied",
            "error.type": "capability_denied",
            "fencepost.missing_capability": CAPABILITY,
        }
    ]


def test_observed_the_denial_names_the_capability_in_the_receipt_and_report_never_to_the_model(
    spans: InMemorySpanExporter,
) -> None:
    h = harness(
        [_rotate(1), call("search_logs", 2), fp.AbstainProposal(reason="insufficient_evidence")],
        registry=_registry(),
        denial="observe",
    )
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context())
    snapshot = h.graph.get_state(config)
    state = fp.run_output(snapshot.values)
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    # The operator's view names it: the receipt, the report's call, the span events.
    (denied,) = [r for r in state.receipts if r.call_id == "call-0001"]
    assert (denied.rule, denied.missing_capability) == ("capability_denied", CAPABILITY)
    assert state.report is not None
    (refused,) = state.report.never_started
    assert refused.missing_capability == CAPABILITY
    (agent,) = by_name(list(spans.get_finished_spans()), "invoke_agent")
    assert {e.get("fencepost.missing_capability") for e in events(agent)} == {CAPABILITY}
    # The model's view does not: each input the scripted model was given, the checkpointed
    # observations (what the next input is made from) and the messages view.
    inputs = h.model.inputs
    assert len(inputs) == 3
    assert inputs[1].observations[0].error_code is fp.ErrorCode.PERMISSION_DENIED
    assert all(CAPABILITY not in i.model_dump_json() for i in inputs)
    assert all(CAPABILITY not in o.model_dump_json() for o in state.observations)
    assert CAPABILITY not in json.dumps(
        [m.model_dump(mode="json") for m in snapshot.values["messages"]]
    )


def test_a_chat_model_is_never_shown_the_missing_capability() -> None:
    chat = FakeToolChatModel(
        messages=iter([ai_call("rotate_keys", {}, "call-0001"), ai_final("cannot rotate")])
    )
    agent = fp.create_agent(chat, _registry(), checkpointer=InMemorySaver(), denial="observe")
    config = thread()
    state = fp.run_output(agent.invoke(fp.start("rotate the keys"), config, context=context()))
    assert state.report is not None and state.report.missing_capabilities == (CAPABILITY,)
    assert len(chat.received) == 2
    shown = json.dumps([[m.model_dump(mode="json") for m in ms] for ms in chat.received])
    assert "permission_denied" in shown
    assert CAPABILITY not in shown
