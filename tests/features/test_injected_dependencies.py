"""``@fp.tool`` wraps a function that takes an injected dependency (a database handle, the
environment a tool acts on): the caller supplies it in ``RunContext.injected``; it is never a
schema field nor shown to the model; a signature that cannot become a tool raises
``ToolDefinitionError``, never a raw pydantic ``ValidationError``."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.policy.tool_decorator import ToolDefinitionError
from tests.graph.kit import thread
from tests.strategies import json_tree


class Bank:
    """An application object: no schema, no JSON."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[tuple[str, float]] = []


class Environment(BaseModel):
    """An application model that allows extra keys (as AgentDojo's environments do)."""

    model_config = ConfigDict(extra="allow")
    balance: float = 0.0


@fp.tool(effect="read", capability="bank:pay")
def send_money(recipient: str, amount: float, bank: Annotated[Bank, fp.Injected("bank")]) -> dict:
    """Send money to an IBAN."""
    bank.sent.append((recipient, amount))
    return {"bank": bank.name}


@fp.tool(effect="read", capability="bank:pay")
async def balance(bank: Annotated[Bank, fp.Injected()], /, currency: str = "EUR") -> dict:
    """The account's balance (injected positionally, by its parameter's name)."""
    return {"bank": bank.name, "currency": currency}


@fp.tool(effect="read", capability="bank:pay")
def audit(note: str, log: Annotated[list[str] | None, fp.Injected("log")] = None) -> dict:
    """Note something, in the injected log when there is one."""
    return {"logged": log is not None}


def _pay(n: int = 1, **arguments: Any) -> fp.ToolProposal:
    args = arguments or {"recipient": "GB29NWBK60161331926819", "amount": 5.0}
    return fp.ToolProposal(call_id=f"call-{n:04d}", tool_name="send_money", arguments=args)


def _graph(script: list[Any], *tools: fp.ToolSpec, repair_attempts: int = 1) -> Any:
    return fp.build_agent_graph(
        fp.ToolRegistry(list(tools) or [send_money]),
        fp.ScriptedDecisionModel(script),
        repair_attempts=repair_attempts,
    ).compile(checkpointer=InMemorySaver())


def _ctx(**injected: Any) -> fp.RunContext:
    return fp.RunContext(
        tenant_id="acme",
        principal=fp.Principal(id="u-1", capabilities={"bank:pay"}),
        injected=injected,
    )


DONE = fp.FinalProposal(answer=fp.AnswerPayload(text=""))


def test_an_injected_dependency_is_no_field_of_the_schema_nor_of_the_catalog() -> None:
    assert set(send_money.args_model.model_fields) == {"recipient", "amount"}
    [entry] = fp.ToolRegistry([send_money]).model_catalog()
    assert "bank" not in str(entry["parameters"])
    assert set(balance.args_model.model_fields) == {"currency"}


def test_each_run_acts_on_the_dependency_its_own_context_injects() -> None:
    graph = _graph([_pay(1), DONE, _pay(1), DONE])
    mine, yours = Bank("mine"), Bank("yours")
    for bank in (mine, yours):
        out = graph.invoke(fp.start("pay"), thread(), context=_ctx(bank=bank))
        assert fp.run_output(out).termination is fp.TerminationReason.COMPLETED
    assert len(mine.sent) == 1 and len(yours.sent) == 1


def test_a_positional_injection_and_an_async_body_get_it_too() -> None:
    call = fp.ToolProposal(call_id="call-0001", tool_name="balance", arguments={})
    out = _graph([call, DONE], balance).invoke(
        fp.start("balance?"), thread(), context=_ctx(bank=Bank("mine"))
    )
    state = fp.run_output(out)
    assert state.observations[0].result == {"bank": "mine", "currency": "EUR"}


def test_a_run_that_injects_nothing_fails_the_call_safely_and_its_body_never_runs() -> None:
    out = _graph([_pay(1), DONE]).invoke(fp.start("pay"), thread(), context=_ctx())
    state = fp.run_output(out)
    [observed] = state.observations
    assert observed.kind == "tool_error"
    assert observed.error_code is fp.ErrorCode.INTERNAL_ERROR
    assert "bank" not in repr(observed)


def test_an_injected_parameter_with_a_default_takes_it_when_nothing_is_injected() -> None:
    call = fp.ToolProposal(call_id="call-0001", tool_name="audit", arguments={"note": "x"})
    graph = _graph([call, DONE, call, DONE], audit)
    for ctx, logged in ((_ctx(), False), (_ctx(log=[]), True)):
        state = fp.run_output(graph.invoke(fp.start("note"), thread(), context=ctx))
        assert state.observations[0].result == {"logged": logged}


def test_the_injected_objects_are_never_dumped_with_the_context() -> None:
    ctx = _ctx(bank=Bank("mine"))
    assert "injected" not in ctx.model_dump()
    assert "mine" not in repr(ctx)


_JSON_CONTEXT = {"tenant_id": "acme", "principal": {"id": "u-1", "capabilities": ["bank:pay"]}}


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=30)
@given(
    injected=st.dictionaries(
        st.sampled_from(["log", "bank", "other"]),
        json_tree(st.none() | st.booleans() | st.integers() | st.text(max_size=8), max_leaves=4),
    )
)
def test_a_json_context_never_supplies_the_injected_dependencies(injected: Any) -> None:
    # LangGraph Server hands a client's JSON context to the nodes as a mapping: the client's
    # object (a URL the tool would fetch) would replace the application's dependency.
    call = fp.ToolProposal(call_id="call-0001", tool_name="audit", arguments={"note": "x"})
    graph = _graph([call, DONE], audit)
    out = graph.invoke(fp.start("note"), thread(), context={**_JSON_CONTEXT, "injected": injected})
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "invalid_context"
    assert state.observations == ()


def test_a_json_context_without_injected_runs_on_the_tools_defaults() -> None:
    call = fp.ToolProposal(call_id="call-0001", tool_name="audit", arguments={"note": "x"})
    out = _graph([call, DONE], audit).invoke(fp.start("note"), thread(), context=_JSON_CONTEXT)
    assert fp.run_output(out).observations[0].result == {"logged": False}


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=40)
@given(
    extra=json_tree(st.none() | st.booleans() | st.integers() | st.text(max_size=8), max_leaves=6)
)
def test_a_model_can_never_supply_the_injected_dependency_itself(extra: Any) -> None:
    bank = Bank("trusted")
    arguments = {"recipient": "GB29", "amount": 5.0, "bank": extra}
    # No repair: the schema's refusal is the run's ending (given back, it would be DONE's).
    out = _graph([_pay(1, **arguments), DONE], repair_attempts=0).invoke(
        fp.start("pay"), thread(), context=_ctx(bank=bank)
    )
    state = fp.run_output(out)
    # The injected name is no field: the strict schema refuses it, whatever its value.
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert bank.sent == []


def test_a_parameter_typed_as_an_application_model_is_a_tool_definition_error() -> None:
    with pytest.raises(ToolDefinitionError, match=r"'env'.*Environment.*Injected"):

        @fp.tool(effect="write", capability="bank:pay")
        def pay(env: Environment, recipient: str) -> dict:
            """Pay."""
            return {}


def test_the_same_parameter_marked_injected_makes_a_tool() -> None:
    @fp.tool(effect="write", capability="bank:pay")
    def pay(env: Annotated[Environment, fp.Injected("environment")], recipient: str) -> dict:
        """Pay."""
        return {"balance": env.balance}

    assert set(pay.args_model.model_fields) == {"recipient"}


@pytest.mark.parametrize("keyword", [{"timeout_seconds": 0}, {"repeat_limit": 0}])
def test_a_decorator_keyword_out_of_range_is_a_tool_definition_error(
    keyword: dict[str, Any],
) -> None:
    with pytest.raises(ToolDefinitionError, match=next(iter(keyword))):

        @fp.tool(effect="read", capability="x", **keyword)
        def look(query: str) -> dict:
            """Look."""
            return {}


def test_an_injected_marker_needs_a_name_that_is_text() -> None:
    with pytest.raises(TypeError):
        fp.Injected("")
