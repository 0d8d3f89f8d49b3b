"""The mistakes a newcomer makes first each get one sentence naming the field and the fix."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

import fencepost as fp


@fp.tool(effect="read", capability="logs:read")
def search_logs(query: str) -> dict[str, Any]:
    """Search the service logs."""
    return {"hits": [query]}


USER = fp.RunContext(tenant_id="acme", principal=fp.Principal(id="u-1", capabilities={"logs:read"}))


def _call(n: int) -> fp.ToolProposal:
    return fp.ToolProposal(
        call_id=f"call-{n:04d}", tool_name="search_logs", arguments={"query": "q"}
    )


def _run(script: list[Any], *, context: Any = USER, steps: int = 4, **kw: Any) -> fp.AgentState:
    agent = fp.create_agent(fp.ScriptedDecisionModel(script), [search_logs], **kw)
    budget = fp.RuntimeBudget(steps_remaining=steps, tool_calls_remaining=4)
    return fp.run_output(agent.invoke(fp.start("why?", budget), context=context))


def test_a_budget_key_typo_is_one_error_naming_the_key_and_the_field_it_meant() -> None:
    with pytest.raises(ValidationError) as raised:
        fp.RuntimeBudget(steps_remaning=6, tool_calls_remaining=3)  # type: ignore[call-arg]
    errors = raised.value.errors()
    assert len(errors) == 1
    assert "'steps_remaning'" in errors[0]["msg"] and "steps_remaining=" in errors[0]["msg"]


def test_a_run_context_key_typo_names_the_field_it_meant() -> None:
    with pytest.raises(ValidationError) as raised:
        fp.RunContext(tenant="acme", principal=fp.Principal(id="u-1"))  # type: ignore[call-arg]
    assert len(raised.value.errors()) == 1 and "tenant_id=" in str(raised.value)


def test_a_context_that_is_no_run_context_is_invalid_not_missing() -> None:
    state = _run([_call(1)], context="acme")
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "invalid_context" and state.observations == ()
    assert state.report is not None and "fp.RunContext(" in (state.report.what_to_do or "")
    missing = _run([_call(1)], context=None)
    assert missing.last_error_code == "missing_context"
    assert "context=fp.RunContext(" in (missing.report.what_to_do or "")  # type: ignore[union-attr]


def test_a_script_that_runs_out_says_so_instead_of_abstaining() -> None:
    state = _run([_call(1)])
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "script_exhausted"
    assert "ScriptedDecisionModel ran out of entries" in str(state.report)


def test_a_stop_in_the_answer_margin_says_what_the_margin_is_and_how_to_change_it() -> None:
    state = _run([_call(1), _call(2)], steps=2)
    assert state.last_error_code == "answer_margin"
    hint = state.report.what_to_do if state.report else None
    assert hint is not None and "answer_margin=0" in hint and "steps_remaining" in hint


def test_postgres_ledger_without_the_extra_names_the_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "import fencepost as fp\n"
        "try:\n"
        "    fp.PostgresLedger\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, '|', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()
    name, message = out.split(" | ")
    assert name == "MissingExtra"
    assert "PostgresLedger" in message and "'postgres' extra" in message
    assert "pip install -e '.[postgres]'" in message


@pytest.mark.parametrize(
    ("given", "code"),
    [
        (None, "missing_context"),
        ({}, "missing_context"),
        ("acme", "invalid_context"),
        ({"tenant_id": "acme"}, "invalid_context"),
        ({"tenant_id": "acme", "principal": "u-1"}, "invalid_context"),
    ],
)
def test_context_refusal_tells_missing_from_malformed(given: object, code: str) -> None:
    from fencepost.policy.may_go_on import context_refusal

    assert context_refusal(given) == code
