"""The registry is the allowlist: only registered specs, looked up by exact name."""

from __future__ import annotations

from typing import Any

import pytest

from fencepost.policy import (
    ToolRegistry,
    UnknownTool,
    VerdictCode,
    gate_proposal,
)
from tests.policy.factories import (
    SearchArgs,
    Window,
    make_proposal,
    make_spec,
    make_state,
    reader,
)

dangerous_called = False


def delete_everything(args: Any, context: Any) -> None:
    """Reachable by name through this module's globals, so a lookup by name could find it."""
    global dangerous_called
    dangerous_called = True


def test_unknown_tool_never_executes() -> None:
    global dangerous_called
    dangerous_called = False
    registry = ToolRegistry((make_spec(),))

    with pytest.raises(UnknownTool):
        registry.get("delete_everything")
    verdict = gate_proposal(
        registry,
        make_proposal({}, tool_name="delete_everything"),
        make_state(),
        reader("logs:read", "admin"),
    )

    assert verdict.code is VerdictCode.UNKNOWN_TOOL
    assert not verdict.allowed
    assert "delete_everything" not in registry
    assert dangerous_called is False


@pytest.mark.parametrize(
    "name",
    [
        "get",
        "names",
        "model_catalog",
        "_by_name",
        "__class__",
        "__init__",
        "os.system",
        "SEARCH_LOGS",
    ],
)
def test_model_supplied_names_are_never_resolved_as_attributes(name: str) -> None:
    registry = ToolRegistry((make_spec(),))
    with pytest.raises(UnknownTool):
        registry.get(name)
    assert name not in registry


@pytest.mark.parametrize("name", [None, 1, b"search_logs", ("search_logs",)])
def test_non_string_names_are_unknown(name: Any) -> None:
    registry = ToolRegistry((make_spec(),))
    with pytest.raises(UnknownTool):
        registry.get(name)
    assert name not in registry


def test_unknown_tool_message_bounds_the_model_supplied_name() -> None:
    with pytest.raises(UnknownTool) as caught:
        ToolRegistry(()).get("x" * 10_000)
    assert len(caught.value.name) == 64
    assert len(str(caught.value)) < 100


def test_registered_tool_is_found_by_its_exact_name() -> None:
    spec = make_spec()
    registry = ToolRegistry((spec,))
    assert registry.get("search_logs") is spec
    assert "search_logs" in registry
    assert list(registry) == [spec]
    assert len(registry) == 1


def test_duplicate_tool_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate tool name 'search_logs'"):
        ToolRegistry((make_spec(), make_spec()))


def test_registry_accepts_only_tool_specs() -> None:
    with pytest.raises(TypeError, match="ToolSpec"):
        ToolRegistry([{"name": "search_logs"}])  # type: ignore[list-item]


def test_model_catalog_returns_exactly_name_description_parameters() -> None:
    search = make_spec()
    other = make_spec("fetch_window", args_model=Window, capability="secret:capability")
    catalog = ToolRegistry((search, other)).model_catalog()

    assert [entry["name"] for entry in catalog] == ["search_logs", "fetch_window"]
    for entry, spec in zip(catalog, (search, other), strict=True):
        assert set(entry) == {"name", "description", "parameters"}
        assert entry["description"] == spec.description
        assert entry["parameters"] == spec.args_model.model_json_schema()
    # Trusted configuration (effect, capability) is never shown to the model.
    assert "secret:capability" not in repr(catalog)
    assert catalog[0]["parameters"] == SearchArgs.model_json_schema()


def test_model_catalog_entries_cannot_be_altered_by_the_caller() -> None:
    registry = ToolRegistry((make_spec(),))
    first = registry.model_catalog()
    first[0]["name"] = "delete_everything"
    first.append({"name": "injected"})
    assert registry.model_catalog() == [
        {
            "name": "search_logs",
            "description": "The search_logs tool.",
            "parameters": SearchArgs.model_json_schema(),
        }
    ]
