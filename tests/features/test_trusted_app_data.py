"""Semantic rules see the trusted context: the caller's application data (known payees, allowed
domains) travels in ``RunContext.app_data``, validated as JSON, never from the model or its
arguments; a rule that takes a third argument is given the context, a two-argument rule works
as before."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import BaseModel, ConfigDict, ValidationError

import fencepost as fp
from fencepost.policy import ToolSemanticError, check_semantics
from tests.graph.kit import thread
from tests.policy.factories import SearchArgs, make_spec, make_state

KNOWN = "GB29NWBK60161331926819"


class Pay(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    recipient: str


def known_payee(args: Any, state: fp.AgentState, context: fp.RunContext | None) -> None:
    """The recipient must be one of the caller's known payees."""
    payees = context.app_data.get("known_payees", []) if context is not None else []
    if not isinstance(payees, list) or args.recipient not in payees:
        raise ToolSemanticError("unknown_payee")


def _bank(sent: list[str]) -> fp.ToolSpec:
    @fp.tool(effect="read", capability="bank:pay", semantic_validator=known_payee)
    def send_money(recipient: str, amount: float) -> dict[str, Any]:
        """Send money to a recipient's IBAN."""
        sent.append(recipient)
        return {"sent": amount}

    return send_money


def _payment(recipient: str) -> fp.ToolProposal:
    return fp.ToolProposal(
        call_id="call-0001",
        tool_name="send_money",
        arguments={"recipient": recipient, "amount": 25.0},
    )


def _ctx(**extra: Any) -> fp.RunContext:
    return fp.RunContext(
        tenant_id="acme", principal=fp.Principal(id="u-1", capabilities={"bank:pay"}), **extra
    )


def _run(recipient: str, context: Any) -> tuple[fp.AgentState, list[str]]:
    sent: list[str] = []
    done = fp.FinalProposal(answer=fp.AnswerPayload(text=""))
    # No repair: a refused payment ends the run (given back, the run would end with ``done``).
    graph = fp.build_agent_graph(
        fp.ToolRegistry([_bank(sent)]),
        fp.ScriptedDecisionModel([_payment(recipient), done]),
        repair_attempts=0,
    ).compile(checkpointer=InMemorySaver())
    return fp.run_output(graph.invoke(fp.start("pay my rent"), thread(), context=context)), sent


def test_a_rule_over_the_callers_known_payees_lets_a_known_one_be_paid() -> None:
    state, sent = _run(KNOWN, _ctx(app_data={"known_payees": [KNOWN]}))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert sent == [KNOWN]


def test_a_rule_over_the_callers_known_payees_refuses_any_other_and_it_never_runs() -> None:
    state, sent = _run("ATTACKER00000000", _ctx(app_data={"known_payees": [KNOWN]}))
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert sent == []
    [gated] = [m for m in state.manifests if m.verdict is not None]
    assert gated.verdict is fp.policy.VerdictCode.SEMANTIC_VIOLATION


def test_app_data_given_as_json_by_a_server_client_reaches_the_rule() -> None:
    context = {
        "tenant_id": "acme",
        "principal": {"id": "u-1", "capabilities": ["bank:pay"]},
        "app_data": {"known_payees": [KNOWN]},
    }
    state, sent = _run(KNOWN, context)
    assert state.termination is fp.TerminationReason.COMPLETED and sent == [KNOWN]


@pytest.mark.parametrize("bad", [{"payees": ("a", "b")}, {"payees": {"a"}}, {"db": object()}])
def test_app_data_that_is_not_json_is_refused_when_the_context_is_made(bad: Any) -> None:
    with pytest.raises(ValidationError):
        _ctx(app_data=bad)


def test_a_two_argument_rule_is_given_the_args_and_the_state_as_before() -> None:
    seen: list[int] = []

    def two(args: Any, state: fp.AgentState) -> None:
        seen.append(2)

    def three(args: Any, state: fp.AgentState, context: fp.RunContext | None) -> None:
        seen.append(3 if context is not None else 0)

    for rule in (two, three):
        check_semantics(
            make_spec(semantic_validator=rule), SearchArgs(query="q"), make_state(), _ctx()
        )
    check_semantics(make_spec(semantic_validator=three), SearchArgs(query="q"), make_state())
    assert seen == [2, 3, 0]


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=60)
@given(
    payees=st.lists(st.text(min_size=1, max_size=8), max_size=4, unique=True),
    recipient=st.text(min_size=1, max_size=8),
)
def test_a_rule_over_app_data_allows_exactly_the_known_recipients(
    payees: list[str], recipient: str
) -> None:
    spec = make_spec(semantic_validator=known_payee)
    try:
        check_semantics(
            spec, Pay(recipient=recipient), make_state(), _ctx(app_data={"known_payees": payees})
        )
        allowed = True
    except ToolSemanticError as exc:
        assert exc.rule == "unknown_payee"
        allowed = False
    assert allowed == (recipient in payees)
