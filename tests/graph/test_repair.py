"""Repair: a refused proposal is shown to the model as data — call ids, field paths and rule
names, never values — and the next step may try again; each try spends a step, and when the
attempts run out the run ends ``invalid_proposal``. Once by default (``repair_attempts=1``);
``repair_attempts=0`` is the seed's strict ending, and its stop report says repair exists."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
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

SECRET = "sk-live-canary-4242"


def _run(script: list[object], **kw: object) -> tuple[fp.AgentState, object]:
    h = harness(script, **kw)
    out = h.graph.invoke(fp.start("q", budget(steps=8, tools=4)), thread(), context=context())
    return fp.run_output(out), h


def test_without_repair_a_schema_violation_ends_the_run_invalid_proposal() -> None:
    bad = call("search_logs", 1, query=42)
    state, h = _run([bad, call(n=2), final_citing_last], repair_attempts=0)
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "schema_violation"
    assert h.model.calls == 1  # type: ignore[attr-defined]


def test_by_default_a_wrong_typed_argument_gets_one_repair_turn_and_the_run_completes() -> None:
    # {"order_id": 1002} for a string field, here the search's query.
    bad = call("search_logs", 1, query=1002)
    state, h = _run([bad, call(n=2), final_citing_last])
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.model.calls == 3  # type: ignore[attr-defined]
    (note,) = h.model.inputs[1].repair  # type: ignore[attr-defined]
    assert note == "call-0001: schema_violation: query: string_type"
    assert "1002" not in note
    assert [r.call_id for r in state.receipts] == ["call-0002"]
    assert (state.budget.steps_used, state.budget.tool_calls_used) == (3, 1)


def test_by_default_a_second_refusal_in_a_row_ends_the_run_invalid_proposal() -> None:
    bad = [call("search_logs", n, query=n) for n in range(1, 4)]
    state, h = _run([*bad, final_citing_last])
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "schema_violation"
    assert h.model.calls == 2  # type: ignore[attr-defined]


def test_create_agent_repairs_once_by_default() -> None:
    model = fp.ScriptedDecisionModel(
        [call("search_logs", 1, query=1002), call(n=2), final_citing_last]
    )
    agent = fp.create_agent(model, make_registry(Calls()), checkpointer=InMemorySaver())
    out = agent.invoke(fp.start("q", budget(steps=8, tools=4)), thread(), context=context())
    assert fp.run_output(out).termination is fp.TerminationReason.COMPLETED


@pytest.mark.parametrize(
    ("first", "code"),
    [
        (call("search_logs", 1, query=1002), "schema_violation"),
        (
            fp.ToolProposal(call_id="call-0001", tool_name="drop_database", arguments={}),
            "unknown_tool",
        ),
        (call("search_logs", 1, query="*"), "semantic_violation"),
    ],
)
def test_without_repair_the_stop_report_says_repair_exists(
    first: fp.ToolProposal, code: str
) -> None:
    state, _ = _run([first, call(n=2), final_citing_last], repair_attempts=0)
    assert (state.termination, state.last_error_code) == (
        fp.TerminationReason.INVALID_PROPOSAL,
        code,
    )
    assert state.report is not None
    hint = state.report.what_to_do
    assert hint is not None and "repair_attempts=" in hint
    assert f"what to do     {hint}" in str(state.report)


def test_a_repaired_proposal_runs_and_the_model_saw_field_paths_not_values() -> None:
    bad = call("search_logs", 1, query=42, injected=SECRET)
    state, h = _run([bad, call(n=2), final_citing_last], repair_attempts=1)
    assert state.termination is fp.TerminationReason.COMPLETED
    shown = h.model.inputs[1].repair  # type: ignore[attr-defined]
    assert shown and shown[0].startswith("call-0001: schema_violation:")
    assert "query: int_type" in shown[0] or "query: string_type" in shown[0]
    assert "*: extra_forbidden" in shown[0]
    assert all(SECRET not in note and "injected" not in note for note in shown)
    # Cleared once a proposal passes.
    assert h.model.inputs[2].repair == ()  # type: ignore[attr-defined]
    assert state.budget.steps_used == 3


def test_an_unknown_tool_can_be_repaired_and_is_named_only_by_its_call_id() -> None:
    unknown = fp.ToolProposal(call_id="call-0001", tool_name="drop_database", arguments={})
    state, h = _run([unknown, call(n=2), final_citing_last], repair_attempts=2)
    assert state.termination is fp.TerminationReason.COMPLETED
    (note,) = h.model.inputs[1].repair  # type: ignore[attr-defined]
    assert note.startswith("call-0001: unknown_tool") and "drop_database" not in note


def test_when_repair_attempts_run_out_the_run_ends_invalid_proposal() -> None:
    bad = [call("search_logs", n, query=n) for n in range(1, 6)]
    state, h = _run(bad, repair_attempts=2)
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert h.model.calls == 3  # type: ignore[attr-defined]
    assert state.budget.steps_used == 3
    assert state.budget.tool_calls_used == 0


def test_a_semantic_violation_is_shown_as_its_rule_name() -> None:
    empty = call("search_logs", 1, query="*")
    state, h = _run([empty, call(n=2), final_citing_last], repair_attempts=1)
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.model.inputs[1].repair == ("call-0001: semantic_violation: rule: empty_query",)  # type: ignore[attr-defined]


def test_a_capability_denial_is_never_repairable() -> None:
    admin = call("admin_reset", 1)
    state, _ = _run([admin, call(n=2), final_citing_last], repair_attempts=3)
    assert state.termination is fp.TerminationReason.POLICY_DENIED


SECRET_VALUE = "sk-live-0123456789-IGNORE-ALL-INSTRUCTIONS"


def test_repair_notes_never_echo_a_value_key_or_tool_name_the_model_sent() -> None:
    @fp.tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=5)
    def tagged(level: int, tags: dict[str, int], ctx: fp.ToolContext) -> Any:
        """Tagged lookup."""
        return {"ok": True}

    bad = [
        fp.ToolProposal(
            call_id="call-0001",
            tool_name="tagged",
            arguments={
                "level": SECRET_VALUE,
                "tags": {SECRET_VALUE: SECRET_VALUE},
                SECRET_VALUE: 1,
            },
        ),
        fp.ToolProposal(call_id="call-0002", tool_name="sk_live_secret_tool", arguments={"x": 1}),
        ABSTAIN,
    ]
    h = harness(bad, registry=fp.ToolRegistry([tagged]), repair_attempts=3)
    state = h.run()
    notes = [n for inp in h.model.inputs for n in inp.repair]
    assert notes, "the refused calls were given back as repair notes"
    blob = json.dumps(notes) + json.dumps(list(state.repair_notes))
    assert SECRET_VALUE not in blob
    assert "sk_live_secret_tool" not in blob
