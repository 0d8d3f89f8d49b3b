"""tool_spec: LangChain tools as ToolSpecs — strict schemas, trusted injection, safe error codes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import (
    InjectedToolArg,
    InjectedToolCallId,
    StructuredTool,
    ToolException,
    tool,
)
from langgraph.prebuilt import ToolRuntime
from pydantic import BaseModel, Field, ValidationError

import fencepost as fp
from fencepost.adapters import ToolAdapterError, aopen_checkpointer, tool_spec
from fencepost.adapters.scripted import ScriptedDecisionModel
from tests.adapters.fakes import SECRET, arun, build, ctx

READ = {"effect": fp.Effect.READ, "capability": "logs:read", "timeout_seconds": 5}


def proposal(tool_name: str, n: int = 1, **arguments: Any) -> fp.ToolProposal:
    return fp.ToolProposal(call_id=f"call-{n:06d}", tool_name=tool_name, arguments=arguments)


def answer_last(inp: fp.DecisionInput) -> fp.FinalProposal:
    return fp.FinalProposal(answer=fp.AnswerPayload(text="done"))


async def run_one(spec: fp.ToolSpec, arguments: dict[str, Any], **kw: Any) -> fp.AgentState:
    model = ScriptedDecisionModel([proposal(spec.name, **arguments), answer_last])
    # No repair: a call the gate refuses ends the run, so its reason is the refusal's.
    return await arun(build(fp.ToolRegistry([spec]), model, repair_attempts=0), **kw)


# -- required arguments -------------------------------------------------------------------------


@tool
def search_logs(query: str, limit: int = 10) -> dict[str, Any]:
    """Search the service logs."""
    return {"query": query, "limit": limit}


def test_effect_and_capability_have_no_default() -> None:
    with pytest.raises(TypeError, match="effect"):
        tool_spec(search_logs, capability="logs:read", timeout_seconds=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="capability"):
        tool_spec(search_logs, effect=fp.Effect.READ, timeout_seconds=5)  # type: ignore[call-arg]
    with pytest.raises(ToolAdapterError, match="effect"):
        tool_spec(search_logs, effect="harmless", capability="x", timeout_seconds=5)
    with pytest.raises(ToolAdapterError, match="capability"):
        tool_spec(search_logs, effect="read", capability="", timeout_seconds=5)


def test_only_langchain_tools_are_wrapped() -> None:
    with pytest.raises(TypeError, match="BaseTool"):
        tool_spec(lambda query: query, **READ)  # type: ignore[arg-type]


def test_a_name_outside_the_registry_pattern_must_be_renamed() -> None:
    odd = StructuredTool.from_function(
        lambda key: key, name="Get-Note", description="Read a note.", args_schema=None
    )
    with pytest.raises(ToolAdapterError, match="name="):
        tool_spec(odd, **READ)
    assert tool_spec(odd, name="get_note", **READ).name == "get_note"


# -- the strict args model ----------------------------------------------------------------------


class Window(BaseModel):
    service: str
    hours: int = 1


class QueryArgs(BaseModel):
    query: str = Field(description="What to look for.")
    window: Window | None = None
    tags: list[str] = []


@tool(args_schema=QueryArgs)
def windowed(query: str, window: Window | None = None, tags: list[str] | None = None) -> str:
    """Search inside a window."""
    return query


def test_args_model_refuses_extra_keys_at_every_level_and_does_not_coerce() -> None:
    model = tool_spec(windowed, **READ).args_model
    model.model_validate_json('{"query": "5xx", "window": {"service": "checkout"}}', strict=True)
    for bad in (
        '{"query": "5xx", "bogus": 1}',
        '{"query": "5xx", "window": {"service": "checkout", "bogus": 1}}',
        '{"query": 5}',
        '{"query": "5xx", "window": {"service": "checkout", "hours": "2"}}',
        '{"query": "5xx", "tags": "a"}',
    ):
        with pytest.raises(ValidationError):
            model.model_validate_json(bad, strict=True)


def test_catalog_is_the_tools_schema_with_extra_keys_forbidden() -> None:
    [entry] = fp.ToolRegistry([tool_spec(windowed, **READ)]).model_catalog()
    params = entry["parameters"]
    assert entry["description"] == "Search inside a window."
    assert set(params["properties"]) == {"query", "window", "tags"}
    assert params["required"] == ["query"]
    assert params["additionalProperties"] is False
    assert params["properties"]["query"]["description"] == "What to look for."


async def test_a_schema_violation_is_refused_at_the_gate_and_the_tool_never_runs() -> None:
    ran: list[Any] = []

    @tool
    def count(query: str) -> str:
        """Count."""
        ran.append(query)
        return query

    state = await run_one(tool_spec(count, **READ), {"query": "a", "limit": 5})
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "schema_violation"
    assert ran == []


async def test_omitted_optional_arguments_keep_the_tools_own_defaults() -> None:
    state = await run_one(tool_spec(search_logs, **READ), {"query": "5xx"})
    assert state.observations[0].result == {"query": "5xx", "limit": 10}


JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "key": {"type": "string", "minLength": 2, "maxLength": 8, "pattern": "^[a-z-]+$"},
        "count": {"type": "integer", "minimum": 0, "maximum": 10},
        "ratio": {"type": ["number", "null"], "exclusiveMinimum": 0},
        "level": {"enum": ["info", "warn", "error"]},
        "labels": {
            "type": "array",
            "items": {"type": "string"},
            "maxItems": 3,
            "uniqueItems": True,
        },
        "target": {
            "type": "object",
            "properties": {"host": {"type": "string"}, "port": {"type": "integer"}},
            "required": ["host"],
        },
        "meta": {"type": "object", "additionalProperties": {"type": "integer"}},
        "choice": {"anyOf": [{"type": "boolean"}, {"$ref": "#/$defs/Mode"}]},
    },
    "required": ["key"],
    "$defs": {"Mode": {"type": "string", "enum": ["fast", "slow"]}},
}


def _schema_tool(schema: dict[str, Any]) -> StructuredTool:
    async def run(**kwargs: Any) -> str:
        return "ok"

    return StructuredTool(
        name="configure", description="Configure.", args_schema=schema, coroutine=run
    )


def _oracle(instance: Any) -> bool:
    # The tool's own schema, with extra keys forbidden at every object level (fencepost's rule).
    strict = {
        **JSON_SCHEMA,
        "additionalProperties": False,
        "properties": {
            **JSON_SCHEMA["properties"],
            "target": {**JSON_SCHEMA["properties"]["target"], "additionalProperties": False},
        },
    }
    try:
        jsonschema.validate(instance, strict)
    except jsonschema.ValidationError:
        return False
    return True


values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 12)
    | st.floats(-1, 2, allow_nan=False)
    | st.sampled_from(["", "a", "ab", "a-b", "info", "warn", "fast", "slow", "Bad", "abcdefghij"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["host", "port", "x", "n"]), inner, max_size=3)
    ),
    max_leaves=6,
)
instances = st.dictionaries(
    st.sampled_from([*JSON_SCHEMA["properties"], "extra"]), values, max_size=5
)


@settings(max_examples=400, deadline=None)
@given(
    instance=instances
    | st.fixed_dictionaries(
        {"key": st.sampled_from(["ab", "a-b"])},
        optional={
            "count": st.integers(-1, 11),
            "labels": st.lists(st.sampled_from(["a", "b"]), max_size=4),
            "target": st.fixed_dictionaries(
                {"host": st.just("h")}, optional={"port": st.integers(), "x": st.just(1)}
            ),
            "meta": st.dictionaries(
                st.sampled_from(["a", "b"]), st.integers() | st.just("1"), max_size=2
            ),
            "choice": st.sampled_from([True, "fast", "medium", 1]),
            "ratio": st.sampled_from([None, 0, 0.5, -1, 1]),
        },
    )
)
def test_json_schema_tools_accept_exactly_what_their_schema_accepts(
    instance: dict[str, Any],
) -> None:
    import json

    model = tool_spec(_schema_tool(JSON_SCHEMA), **READ).args_model
    try:
        model.model_validate_json(json.dumps(instance), strict=True)
        accepted = True
    except ValidationError:
        accepted = False
    assert accepted == _oracle(instance), instance


@pytest.mark.parametrize(
    "fragment",
    [
        {"not": {"type": "string"}},
        {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
        {"type": "array", "prefixItems": [{"type": "string"}]},
        {"if": {"type": "string"}, "then": {"minLength": 1}},
        {"allOf": [{"type": "string"}, {"minLength": 1}]},
        {"$ref": "#/$defs/Missing"},
    ],
)
def test_schema_keywords_that_cannot_be_enforced_fail_at_registration(
    fragment: dict[str, Any],
) -> None:
    schema = {"type": "object", "properties": {"value": fragment}}
    with pytest.raises(ToolAdapterError, match="configure"):
        tool_spec(_schema_tool(schema), **READ)


def test_property_names_that_are_not_identifiers_keep_their_json_name() -> None:
    schema = {
        "type": "object",
        "properties": {"max-results": {"type": "integer"}, "model_name": {"type": "string"}},
        "required": ["max-results"],
    }
    model = tool_spec(_schema_tool(schema), **READ).args_model
    args = model.model_validate_json('{"max-results": 3, "model_name": "x"}', strict=True)
    assert args.model_dump(by_alias=True) == {"max-results": 3, "model_name": "x"}
    assert set(model.model_json_schema()["properties"]) == {"max-results", "model_name"}


# -- injected arguments -------------------------------------------------------------------------


async def test_injected_arguments_are_hidden_from_the_model_and_filled_from_trusted_context() -> (
    None
):
    seen: dict[str, Any] = {}

    @tool
    def whoami(
        query: str,
        user_id: Annotated[str, InjectedToolArg],
        call_id: Annotated[str, InjectedToolCallId],
        runtime: ToolRuntime[fp.ToolContext],
        config: RunnableConfig,
    ) -> dict[str, Any]:
        """Look something up for the caller."""
        seen.update(
            user_id=user_id,
            call_id=call_id,
            runtime_tenant=runtime.context.tenant_id,
            runtime_call=runtime.tool_call_id,
            configurable=dict(config["configurable"]),
        )
        return {"ok": query}

    spec = tool_spec(whoami, inject={"user_id": lambda c: c.principal_id}, **READ)
    [entry] = fp.ToolRegistry([spec]).model_catalog()
    assert set(entry["parameters"]["properties"]) == {"query"}

    state = await run_one(spec, {"query": "5xx"})
    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.observations[0].result == '{"ok": "5xx"}'  # run as a tool call: message content
    assert seen["user_id"] == "u-1"
    assert seen["call_id"] == "call-000001" == seen["runtime_call"]
    assert seen["runtime_tenant"] == "acme"
    assert seen["configurable"]["tenant_id"] == "acme"
    assert seen["configurable"]["principal_id"] == "u-1"
    assert seen["configurable"]["call_id"] == "call-000001"
    assert "thread_id" not in seen["configurable"]  # not the graph's own configuration


async def test_the_model_cannot_supply_an_injected_argument() -> None:
    ran: list[str] = []

    @tool
    def delete_for(query: str, user_id: Annotated[str, InjectedToolArg]) -> str:
        """Act for a user."""
        ran.append(user_id)
        return user_id

    spec = tool_spec(delete_for, inject={"user_id": lambda c: c.principal_id}, **READ)
    state = await run_one(spec, {"query": "x", "user_id": "admin"})
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert ran == []


def test_an_injected_argument_with_no_source_is_refused_at_registration() -> None:
    @tool
    def needs(query: str, tenant: Annotated[str, InjectedToolArg]) -> str:
        """Needs a tenant."""
        return tenant

    with pytest.raises(ToolAdapterError, match="inject="):
        tool_spec(needs, **READ)


async def test_inject_hides_an_ordinary_property_and_fills_it_from_context() -> None:
    seen: list[str] = []

    @tool
    def put_note(key: str, tenant_id: str = "") -> str:
        """Write a note."""
        seen.append(tenant_id)
        return key

    spec = tool_spec(put_note, inject={"tenant_id": lambda c: c.tenant_id}, **READ)
    assert set(spec.args_model.model_fields) == {"key"}
    state = await run_one(spec, {"key": "k"})
    assert seen == ["acme"]
    denied = await run_one(spec, {"key": "k", "tenant_id": "other"})
    assert denied.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert seen == ["acme"] and state.observations[0].result == "k"


# -- errors become safe codes -------------------------------------------------------------------


def _failing(exc: BaseException, **tool_kw: Any) -> StructuredTool:
    def fail(reason: str) -> str:
        raise exc

    return StructuredTool.from_function(fail, name="fail", description="Fails.", **tool_kw)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ToolException(SECRET), fp.ErrorCode.INTERNAL_ERROR),
        (fp.ToolError(fp.ErrorCode.NOT_FOUND), fp.ErrorCode.NOT_FOUND),
        (ValueError(SECRET), fp.ErrorCode.INVALID_ARGUMENT),
        (PermissionError(SECRET), fp.ErrorCode.PERMISSION_DENIED),
        (RuntimeError(SECRET), fp.ErrorCode.INTERNAL_ERROR),
    ],
)
async def test_tool_failures_become_safe_codes(exc: BaseException, code: fp.ErrorCode) -> None:
    state = await run_one(tool_spec(_failing(exc), **READ), {"reason": "x"})
    assert state.observations[0].kind == "tool_error"
    assert state.observations[0].error_code is code
    assert "hunter2" not in state.model_dump_json()


async def test_a_tool_that_handles_its_own_errors_still_reports_only_a_code(tmp_path: Path) -> None:
    # handle_tool_error=True would turn the exception text into a ToolMessage for the model.
    failing = _failing(ToolException(SECRET), handle_tool_error=True)
    spec = tool_spec(failing, tool_exception_code=fp.ErrorCode.UNAVAILABLE, **READ)
    model = ScriptedDecisionModel([proposal("fail", reason="x"), answer_last])
    async with aopen_checkpointer(f"sqlite:///{tmp_path / 'runs.db'}") as saver:
        state = await arun(build(fp.ToolRegistry([spec]), model, checkpointer=saver))

    assert state.observations[0].error_code is fp.ErrorCode.UNAVAILABLE
    assert "hunter2" not in model.inputs[-1].model_dump_json()
    assert "hunter2" not in state.model_dump_json()
    for path in tmp_path.iterdir():
        assert b"hunter2" not in path.read_bytes()


async def test_a_slow_tool_ends_with_timeout() -> None:
    @tool
    async def slow(query: str) -> str:
        """Slow."""
        await asyncio.sleep(5)
        return query

    spec = tool_spec(slow, effect="read", capability="logs:read", timeout_seconds=0.2)
    state = await run_one(spec, {"query": "x"})
    assert state.observations[0].error_code is fp.ErrorCode.TIMEOUT


async def test_sync_and_async_tools_both_run() -> None:
    @tool
    async def async_echo(query: str) -> dict[str, str]:
        """Echo."""
        return {"echo": query}

    for wrapped in (search_logs, async_echo):
        state = await run_one(tool_spec(wrapped, **READ), {"query": "q"})
        assert state.observations[0].kind == "tool_result"


async def test_a_non_json_result_becomes_unserializable_result() -> None:
    @tool
    def weird(query: str) -> Any:
        """Returns an object."""
        return object()

    state = await run_one(tool_spec(weird, **READ), {"query": "q"})
    assert state.observations[0].error_code is fp.ErrorCode.UNSERIALIZABLE_RESULT


async def test_write_tools_are_gated_like_any_write(tmp_path: Path) -> None:
    ran: list[str] = []

    @tool
    def write_note(note: str) -> str:
        """Write a note."""
        ran.append(note)
        return "ok"

    spec = tool_spec(
        write_note, effect=fp.Effect.WRITE, capability="notes:write", timeout_seconds=5
    )
    state = await run_one(spec, {"note": "n"}, context=ctx(("notes:write",)))
    assert state.termination is fp.TerminationReason.APPROVAL_REQUIRED
    denied = await run_one(spec, {"note": "n"}, context=ctx(("logs:read",)))
    assert denied.termination is fp.TerminationReason.POLICY_DENIED
    assert ran == []


@pytest.mark.parametrize(
    ("prop", "ok", "bad"),
    [
        # JSON equality: true is not 1, but 1 and 1.0 are the same number.
        ({"type": "array", "uniqueItems": True}, [1, True, "1"], [1, 1.0]),
        # Draft 4: a boolean exclusiveMinimum makes minimum strict.
        ({"type": "number", "minimum": 0, "exclusiveMinimum": True}, 0.5, 0),
        ({"type": "integer", "maximum": 5, "exclusiveMaximum": False}, 5, 6),
        ({"type": "string", "pattern": "b+"}, "abba", "aaa"),  # unanchored, as JSON Schema
        ({"nullable": True, "type": "string"}, None, 3),
    ],
)
def test_schema_constraints_follow_json_schema_semantics(
    prop: dict[str, Any], ok: Any, bad: Any
) -> None:
    import json

    model = tool_spec(
        _schema_tool({"type": "object", "properties": {"v": prop}}), **READ
    ).args_model
    model.model_validate_json(json.dumps({"v": ok}), strict=True)
    with pytest.raises(ValidationError):
        model.model_validate_json(json.dumps({"v": bad}), strict=True)
