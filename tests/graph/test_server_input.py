"""What a LangGraph Server client sends: JSON input and context, checked in-process.

The server passes the run's input and ``context`` as JSON mappings and publishes the graph's
input and context JSON schemas (``assistants.get_schemas``). A mapping context is validated by
fencepost, never by LangGraph, so a missing or malformed one ends the run ``policy_denied``
instead of failing it with a ``ValidationError``.
"""

from __future__ import annotations

from typing import Any

import pytest

import fencepost as fp
from fencepost.graph.context import ContextInput
from fencepost.policy.budget import DEFAULT_STEPS, DEFAULT_TOOL_CALLS, default_budget
from tests.graph.kit import call, final_citing_last, harness, thread

GOOD_CONTEXT = {"tenant_id": "acme", "principal": {"id": "u-1", "capabilities": ["logs:read"]}}


def test_the_input_schema_publishes_both_accepted_inputs() -> None:
    schema = harness([]).graph.get_input_jsonschema()
    assert set(schema["properties"]) == {"request", "messages"}
    assert "required" not in schema  # either one starts a run
    request = schema["$defs"]["StartRequest"]
    assert request["required"] == ["question"]
    assert set(request["properties"]) == {"run_id", "question", "budget"}


def test_the_context_schema_publishes_the_run_context_shape() -> None:
    schema = harness([]).graph.get_context_jsonschema()
    # Injected dependencies are application objects, given in-process: never published as JSON.
    published = set(fp.RunContext.model_fields) - {"injected"}
    assert set(schema["properties"]) == published
    assert sorted(schema["required"]) == ["principal", "tenant_id"]
    # The TypedDict LangGraph sees and the model fencepost validates with name the same fields.
    assert set(ContextInput.__annotations__) == published
    required = {n for n, f in fp.RunContext.model_fields.items() if f.is_required()}
    assert ContextInput.__required_keys__ == required


def test_a_json_request_with_only_a_question_gets_a_run_id_and_the_default_budget() -> None:
    h = harness([call(n=1), final_citing_last])
    out = h.graph.invoke(
        {"request": {"question": "why is checkout failing?"}}, thread(), context=GOOD_CONTEXT
    )
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.run_id.startswith("run-")
    spent = state.budget
    assert spent.steps_remaining + spent.steps_used == DEFAULT_STEPS
    assert spent.tool_calls_remaining + spent.tool_calls_used == DEFAULT_TOOL_CALLS
    assert default_budget() == fp.RuntimeBudget(
        steps_remaining=DEFAULT_STEPS, tool_calls_remaining=DEFAULT_TOOL_CALLS
    )


def test_a_json_request_with_every_field_is_taken_as_given() -> None:
    h = harness([call(n=1), final_citing_last])
    request = {
        "run_id": "run-from-json",
        "question": "why is checkout failing?",
        "budget": {"steps_remaining": 3, "tool_calls_remaining": 1},
    }
    state = fp.run_output(h.graph.invoke({"request": request}, thread(), context=GOOD_CONTEXT))
    assert state.run_id == "run-from-json"
    assert state.budget.steps_used + state.budget.steps_remaining == 3


MALFORMED: list[Any] = [
    {},
    {"tenant_id": "acme"},
    {"tenant_id": 5, "principal": {"id": "u-1"}},
    {"tenant_id": "acme", "principal": "u-1"},
    {"tenant_id": "acme", "principal": {"id": "u-1"}, "smuggled": True},
]


@pytest.mark.parametrize("ctx", MALFORMED)
def test_a_missing_or_malformed_context_ends_policy_denied_not_a_validation_error(
    ctx: Any,
) -> None:
    h = harness([call(n=1), final_citing_last])
    state = fp.run_output(h.graph.invoke({"request": {"question": "why?"}}, thread(), context=ctx))
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    # None or an empty one is missing; anything else given is malformed, and says so.
    assert state.last_error_code == ("missing_context" if ctx == {} else "invalid_context")
    assert h.calls.log == []


@pytest.mark.parametrize("ctx", MALFORMED[:2])
async def test_a_malformed_context_ends_policy_denied_on_the_async_graph_too(ctx: Any) -> None:
    h = harness([call(n=1), final_citing_last])
    out = await h.graph.ainvoke({"messages": [("user", "why?")]}, thread(), context=ctx)
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == ("missing_context" if ctx == {} else "invalid_context")
    assert h.calls.log == []
