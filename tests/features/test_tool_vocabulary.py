"""One tool vocabulary: ``@fp.tool``, ``fp.ToolSpec`` and ``fp.tool_spec`` take the same keyword
names (``effect``, ``capability``, ``timeout_seconds``); the old names, past the one release they
were kept for, are refused; what cannot be defaulted safely is named in one sentence."""

from __future__ import annotations

import inspect
import warnings
from typing import Annotated, Any

import pytest
from langchain_core.tools import InjectedToolArg, ToolException
from langchain_core.tools import tool as langchain_tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import BaseModel, ConfigDict, ValidationError

import fencepost as fp
from fencepost.policy.tool_decorator import ToolDefinitionError


class Query(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    query: str


def _body(args: Any, ctx: fp.ToolContext) -> dict[str, Any]:
    return {"hits": []}


@langchain_tool
def search_deploys(service: str) -> dict[str, Any]:
    """Recent deployments of a service."""
    return {"deploys": [service]}


def test_the_three_ways_take_the_same_keyword_names() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @fp.tool(effect="read", capability="logs:read", timeout_seconds=5)
        def search_logs(query: str) -> dict[str, Any]:
            """Search the logs."""
            return {"hits": []}

        spec = fp.ToolSpec(
            name="search_logs",
            description="Search the logs.",
            args_model=Query,
            effect="read",
            capability="logs:read",
            timeout_seconds=5,
            execute=_body,
        )
        wrapped = fp.tool_spec(
            search_deploys, effect="read", capability="deploys:read", timeout_seconds=5
        )
    for made in (search_logs, spec, wrapped):
        assert isinstance(made, fp.ToolSpec)
        assert made.timeout_seconds == 5
        assert made.capability in ("logs:read", "deploys:read")


def test_the_old_keyword_names_past_their_release_are_refused() -> None:
    with pytest.raises(TypeError, match="timeout"):
        fp.tool(effect="read", capability="logs:read", timeout=5)  # type: ignore[call-overload]
    with pytest.raises(ValidationError, match="required_capability"):
        fp.ToolSpec(  # type: ignore[call-arg]
            name="search_logs",
            description="Search the logs.",
            args_model=Query,
            effect="read",
            required_capability="logs:read",
            timeout_seconds=5,
            execute=_body,
        )
    with pytest.raises(TypeError, match="timeout"):
        fp.tool(search_deploys, effect="read", capability="deploys:read", timeout=5)  # type: ignore[call-overload]


def test_a_tool_timeout_has_one_default_in_every_way() -> None:
    from fencepost.policy.tool import DEFAULT_TOOL_TIMEOUT_SECONDS

    @fp.tool(effect="read", capability="logs:read")
    def search_logs(query: str) -> dict[str, Any]:
        """Search the logs."""
        return {"hits": []}

    spec = fp.ToolSpec(
        name="s_logs",
        description="d",
        args_model=Query,
        effect="read",
        capability="logs:read",
        execute=_body,
    )
    wrapped = fp.tool_spec(search_deploys, effect="read", capability="deploys:read")
    assert (
        search_logs.timeout_seconds
        == spec.timeout_seconds
        == wrapped.timeout_seconds
        == DEFAULT_TOOL_TIMEOUT_SECONDS
    )


def test_a_bare_decorator_says_in_one_sentence_what_is_missing() -> None:
    with pytest.raises(TypeError) as raised:

        @fp.tool
        def search_logs(query: str) -> dict[str, Any]:
            """Search the logs."""
            return {"hits": []}

    message = str(raised.value)
    assert "search_logs" in message and "effect=" in message and "capability=" in message
    assert "@fp.tool(effect=" in message
    assert message.count(". ") == 0 and "\n" not in message


@pytest.mark.parametrize(
    ("given", "missing"), [({"effect": "read"}, "capability="), ({"capability": "x:y"}, "effect=")]
)
def test_a_decorator_without_effect_or_capability_names_the_missing_one(
    given: dict[str, Any], missing: str
) -> None:
    with pytest.raises(TypeError, match=missing):

        @fp.tool(**given)
        def search_logs(query: str) -> dict[str, Any]:
            """Search the logs."""
            return {"hits": []}


def test_fp_tool_gives_a_langchain_tool_its_capability() -> None:
    spec = fp.tool(search_deploys, effect="read", capability="deploys:read")
    assert isinstance(spec, fp.ToolSpec)
    assert spec.name == "search_deploys" and spec.capability == "deploys:read"


def test_the_registry_error_for_a_langchain_tool_names_tool_spec() -> None:
    with pytest.raises(TypeError) as raised:
        fp.ToolRegistry([search_deploys])  # type: ignore[list-item]
    message = str(raised.value)
    assert "search_deploys" in message and "tool_spec(" in message and "capability=" in message


def test_the_registry_error_for_a_plain_function_names_the_decorator() -> None:
    def lookup(query: str) -> dict[str, Any]:
        return {}

    with pytest.raises(TypeError, match=r"@fp\.tool\(effect="):
        fp.ToolRegistry([lookup])  # type: ignore[list-item]


def test_a_langchain_tool_given_no_capability_says_in_one_sentence_what_is_missing() -> None:
    with pytest.raises(TypeError) as raised:
        fp.tool(search_deploys, effect="read")
    message = str(raised.value)
    assert "search_deploys" in message and "capability=" in message and "\n" not in message


def _keywords(fn: Any) -> set[str]:
    return {
        name
        for name, param in inspect.signature(fn).parameters.items()
        if param.kind is inspect.Parameter.KEYWORD_ONLY
    }


def test_fp_tool_takes_every_keyword_fp_tool_spec_takes() -> None:
    assert _keywords(fp.tool_spec) <= _keywords(fp.tool)


class _Db:
    """An application object a LangChain tool takes, injected from the run's context."""

    def __init__(self) -> None:
        self.rows: list[str] = []


@langchain_tool
def record_row(row: str, db: Annotated[Any, InjectedToolArg]) -> str:
    """Record a row."""
    db.rows.append(row)
    return "ok"


@langchain_tool
def always_refuses(row: str) -> str:
    """Refuse."""
    raise ToolException("no such row: secret")


def _run(spec: fp.ToolSpec, tool_name: str, ctx: fp.RunContext) -> fp.AgentState:
    call = fp.ToolProposal(call_id="call-0001", tool_name=tool_name, arguments={"row": "r"})
    done = fp.FinalProposal(answer=fp.AnswerPayload(text=""))
    agent = fp.create_agent(
        fp.ScriptedDecisionModel([call, done]), [spec], checkpointer=InMemorySaver()
    )
    config = {"configurable": {"thread_id": f"t-{tool_name}"}}
    return fp.run_output(agent.invoke(fp.start("q"), config, context=ctx))


_CTX = fp.RunContext(tenant_id="acme", principal=fp.Principal(id="u-1", capabilities={"db:write"}))


def test_fp_tool_wraps_a_langchain_tool_with_inject_and_tool_exception_code() -> None:
    db = _Db()
    spec = fp.tool(
        record_row,
        effect="read",
        capability="db:write",
        inject={"db": lambda ctx: ctx.injected["db"]},
    )
    state = _run(spec, "record_row", _CTX.model_copy(update={"injected": {"db": db}}))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert db.rows == ["r"]
    refusing = fp.tool(
        always_refuses,
        effect="read",
        capability="db:write",
        tool_exception_code=fp.ErrorCode.NOT_FOUND,
    )
    state = _run(refusing, "always_refuses", _CTX)
    assert state.receipts[0].error_code is fp.ErrorCode.NOT_FOUND


@pytest.mark.parametrize(
    "keywords",
    [{"inject": {"db": lambda ctx: None}}, {"tool_exception_code": fp.ErrorCode.NOT_FOUND}],
    ids=["inject", "tool_exception_code"],
)
def test_a_langchain_only_keyword_on_a_function_is_a_tool_definition_error(
    keywords: dict[str, Any],
) -> None:
    def lookup(query: str) -> dict[str, Any]:
        """Look up."""
        return {}

    with pytest.raises(ToolDefinitionError) as raised:
        fp.tool(lookup, effect="read", capability="db:read", **keywords)
    assert "fp.Injected" in str(raised.value) and "\n" not in str(raised.value)
