"""``@tool``: a ToolSpec from a plain function, its args model strict and derived from the signature.

The properties pin the contract the gate relies on: whatever the signature, the derived model
refuses keys it does not name and values of the wrong type (no coercion), and accepts exactly the
arguments the function declares.
"""

from __future__ import annotations

import asyncio
import inspect
import keyword
from typing import Annotated, Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field, ValidationError

from fencepost.policy import Deadline, Effect, ToolContext, ToolRegistry, ToolSpec
from fencepost.policy.tool_decorator import ToolDefinitionError, tool

CTX = ToolContext(
    run_id="run-1",
    tenant_id="acme",
    principal_id="u-1",
    deadline=Deadline.after(5),
    idempotency_key="call-0001",
)


@tool(effect=Effect.READ, capability="logs:read", timeout_seconds=5)
def search_logs(
    service: Literal["checkout", "payments"],
    ctx: ToolContext,
    window_minutes: Annotated[int, Field(ge=5, le=240)] = 60,
) -> dict[str, Any]:
    """Search a service's error logs.

    Args:
        service: The service whose logs to search.
        window_minutes: How far back to look,
            in minutes.
    """
    return {"service": service, "window": window_minutes, "key": ctx.idempotency_key}


@tool(
    effect="write", capability="notes:write", timeout_seconds=2, name="write_note", idempotent=True
)
async def save(note: str, tags: list[str] | None = None) -> dict[str, Any]:
    """Save a note."""
    await asyncio.sleep(0)
    return {"note": note, "tags": tags}


# --- what the decorator builds ------------------------------------------------------------------


def test_the_decorator_builds_a_tool_spec_from_the_function() -> None:
    assert isinstance(search_logs, ToolSpec)
    assert search_logs.name == "search_logs"
    assert search_logs.effect is Effect.READ
    assert search_logs.capability == "logs:read"
    assert search_logs.timeout_seconds == 5
    assert search_logs.idempotent is True  # a read: retry-safe by default
    # The docstring is the description; its Args section describes the fields instead.
    assert search_logs.description == "Search a service's error logs."
    schema = search_logs.args_model.model_json_schema()
    assert schema["properties"]["service"]["description"] == "The service whose logs to search."
    assert (
        schema["properties"]["window_minutes"]["description"] == "How far back to look, in minutes."
    )
    ToolRegistry([search_logs, save])  # the registry takes them as any other spec


def test_required_and_optional_arguments_follow_the_defaults() -> None:
    schema = search_logs.args_model.model_json_schema()
    assert schema["required"] == ["service"]
    assert schema["properties"]["window_minutes"]["default"] == 60
    assert schema["additionalProperties"] is False
    args = search_logs.args_model.model_validate({"service": "checkout"})
    assert args.window_minutes == 60  # type: ignore[attr-defined]


def test_constraints_from_annotations_are_enforced() -> None:
    with pytest.raises(ValidationError):
        search_logs.args_model.model_validate({"service": "checkout", "window_minutes": 1})
    with pytest.raises(ValidationError):
        search_logs.args_model.model_validate({"service": "billing"})


def test_the_context_parameter_is_filled_from_the_trusted_context_not_from_args() -> None:
    assert "ctx" not in search_logs.args_model.model_fields
    with pytest.raises(ValidationError):
        search_logs.args_model.model_validate({"service": "checkout", "ctx": {"run_id": "x"}})
    args = search_logs.args_model.model_validate({"service": "payments", "window_minutes": 15})
    assert search_logs.execute(args, CTX) == {
        "service": "payments",
        "window": 15,
        "key": "call-0001",
    }


def test_an_async_function_stays_async_and_gets_its_arguments() -> None:
    assert save.name == "write_note"  # name= overrides the function's name
    assert save.effect is Effect.WRITE and save.idempotent is True
    assert inspect.iscoroutinefunction(save.execute)
    args = save.args_model.model_validate({"note": "restart api"})
    assert asyncio.run(save.execute(args, CTX)) == {"note": "restart api", "tags": None}


def test_positional_only_parameters_and_a_positional_context_are_passed_in_order() -> None:
    @tool(effect="read", capability="c:read", timeout_seconds=1)
    def lookup(ctx: ToolContext, key: str, /, *, limit: int = 3) -> tuple[str, str, int]:
        """Look a key up."""
        return ctx.run_id, key, limit

    args = lookup.args_model.model_validate({"key": "k", "limit": 4})
    assert lookup.execute(args, CTX) == ("run-1", "k", 4)


def test_effect_and_capability_have_no_default() -> None:
    def search(query: str) -> dict[str, str]:
        """Search."""
        return {}

    with pytest.raises(ToolDefinitionError, match="effect="):
        tool(capability="logs:read", timeout_seconds=5)(search)
    with pytest.raises(ToolDefinitionError, match="capability="):
        tool(effect=Effect.READ, timeout_seconds=5)(search)


def test_an_unknown_effect_is_refused_at_decoration() -> None:
    with pytest.raises(ToolDefinitionError, match="'delete' is not one of read, write, external"):

        @tool(effect="delete", capability="c", timeout_seconds=1)
        def wipe(x: int) -> None:
            """Wipe."""


# --- what it refuses, at decoration time ----------------------------------------------------------


def _untyped(service, window: int = 5):  # type: ignore[no-untyped-def]
    """Untyped."""


def test_a_parameter_without_annotation_is_refused_naming_the_parameter() -> None:
    with pytest.raises(ToolDefinitionError, match="parameter 'service' has no type annotation"):
        tool(effect="read", capability="c", timeout_seconds=1, name="untyped")(_untyped)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def fn(x: Any) -> None:\n    'd'", "parameter 'x' is annotated Any"),
        ("def fn(x: object) -> None:\n    'd'", "parameter 'x' is annotated object"),
        ("def fn(*xs: int) -> None:\n    'd'", "parameter 'xs': \\*args and \\*\\*kwargs"),
        ("def fn(**kw: int) -> None:\n    'd'", "parameter 'kw': \\*args and \\*\\*kwargs"),
        ("def fn(_x: int) -> None:\n    'd'", "parameter '_x': a name starting with '_'"),
        ("def fn(x: int) -> None:\n    pass", "needs a description"),
        ("def fn(x: Unknown) -> None:\n    'd'", "parameter 'x': the type 'Unknown' cannot be"),
        ("def fn(x: Callable[[], int]) -> None:\n    'd'", "cannot become a strict schema"),
        ("def fn(a: ToolContext, b: ToolContext) -> None:\n    'd'", "only one parameter"),
        ("def Fn(x: int) -> None:\n    'd'", "tool name 'Fn' must match"),
    ],
)
def test_a_function_that_cannot_be_a_strict_tool_is_refused_with_a_clear_error(
    source: str, message: str
) -> None:
    from collections.abc import Callable

    namespace: dict[str, Any] = {"Any": Any, "Callable": Callable, "ToolContext": ToolContext}
    exec("from __future__ import annotations\n" + source, namespace)  # a test's own code
    fn = next(v for k, v in namespace.items() if k.lower() == "fn")
    with pytest.raises(ToolDefinitionError, match=message):
        tool(effect="read", capability="c", timeout_seconds=1)(fn)


class Loose(BaseModel):
    key: str


def test_a_nested_model_that_allows_extra_keys_is_a_tool_definition_error() -> None:
    with pytest.raises(ToolDefinitionError, match=r"'inner'.*Loose.*allows extra keys"):

        @tool(effect="read", capability="c", timeout_seconds=1)
        def nested(inner: Loose) -> None:
            """Nested."""


# --- properties: the derived model is strict ------------------------------------------------------

# Each argument type, values of it, and values of other types. Strict: no coercion ("5" is not
# an int, 1 is not a bool); an int is a float, as in JSON.
TYPES: dict[str, tuple[Any, st.SearchStrategy[Any]]] = {
    "int": (int, st.integers()),
    "float": (float, st.floats(allow_nan=False) | st.integers(-(2**53), 2**53)),
    "str": (str, st.text(max_size=8)),
    "bool": (bool, st.booleans()),
    "list_int": (list[int], st.lists(st.integers(), max_size=3)),
}


def _fits(kind: str, value: Any) -> bool:
    if kind == "int":
        return type(value) is int
    if kind == "float":
        return type(value) in (int, float)
    if kind == "str":
        return type(value) is str
    if kind == "bool":
        return type(value) is bool
    return type(value) is list and all(type(v) is int for v in value)


ANY_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=5,
)
NAMES = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True).filter(
    lambda n: n != "ctx" and not keyword.iskeyword(n)
)
SIGNATURES = st.dictionaries(
    NAMES, st.tuples(st.sampled_from(sorted(TYPES)), st.booleans()), min_size=1, max_size=5
)


def _spec(params: dict[str, tuple[str, bool]]) -> ToolSpec:
    """A decorated function whose signature is ``params`` (name -> (type, has a default))."""

    def body(**kwargs: Any) -> dict[str, Any]:
        return kwargs

    ordered = sorted(params.items(), key=lambda kv: kv[1][1])  # required ones first
    body.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=TYPES[kind][0] | None if optional else TYPES[kind][0],
                default=None if optional else inspect.Parameter.empty,
            )
            for name, (kind, optional) in ordered
        ]
    )
    body.__annotations__ = {
        name: TYPES[kind][0] | None if optional else TYPES[kind][0]
        for name, (kind, optional) in params.items()
    }
    body.__doc__ = "Generated."
    return tool(effect="read", capability="c", timeout_seconds=1, name="generated")(body)


@st.composite
def valid_call(draw: st.DrawFn) -> tuple[dict[str, tuple[str, bool]], dict[str, Any]]:
    params = draw(SIGNATURES)
    args = {
        name: draw(TYPES[kind][1])
        for name, (kind, optional) in params.items()
        if not optional or draw(st.booleans())
    }
    return params, args


@given(call=valid_call())
def test_arguments_the_signature_declares_are_accepted_and_passed_through(
    call: tuple[dict[str, tuple[str, bool]], dict[str, Any]],
) -> None:
    params, args = call
    spec = _spec(params)
    validated = spec.args_model.model_validate(args)
    received = spec.execute(validated, CTX)
    assert {k: received[k] for k in args} == args
    assert all(received[k] is None for k in params if k not in args)  # defaults filled


@given(call=valid_call(), key=NAMES, value=ANY_VALUE)
def test_a_key_the_signature_does_not_name_is_rejected(
    call: tuple[dict[str, tuple[str, bool]], dict[str, Any]], key: str, value: Any
) -> None:
    params, args = call
    if key in params:
        key = key + "_extra"
    with pytest.raises(ValidationError) as err:
        _spec(params).args_model.model_validate({**args, key: value})
    assert any(e["type"] == "extra_forbidden" for e in err.value.errors())


@given(call=valid_call(), data=st.data())
def test_a_value_of_the_wrong_type_is_rejected_without_coercion(
    call: tuple[dict[str, tuple[str, bool]], dict[str, Any]], data: st.DataObject
) -> None:
    params, args = call
    name = data.draw(st.sampled_from(sorted(params)))
    kind, optional = params[name]
    wrong = data.draw(
        ANY_VALUE.filter(lambda v: not _fits(kind, v) and not (optional and v is None))
    )
    with pytest.raises(ValidationError):
        _spec(params).args_model.model_validate({**args, name: wrong})


@given(call=valid_call())
def test_a_missing_required_argument_is_rejected(
    call: tuple[dict[str, tuple[str, bool]], dict[str, Any]],
) -> None:
    params, args = call
    required = [n for n, (_, optional) in params.items() if not optional]
    for name in required:
        with pytest.raises(ValidationError):
            _spec(params).args_model.model_validate({k: v for k, v in args.items() if k != name})
