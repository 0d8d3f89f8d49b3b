"""Builders shared by the policy tests: a strict args model, specs, states and proposals."""

from __future__ import annotations

from datetime import date
from typing import Any

from pydantic import BaseModel, ConfigDict

from fencepost.policy import (
    AgentState,
    Effect,
    Principal,
    RuntimeBudget,
    ToolProposal,
    ToolSpec,
)


class Window(BaseModel):
    """A nested args model that forbids extra keys, as every level must."""

    model_config = ConfigDict(extra="forbid", strict=True)

    service: str
    max_hits: int = 10


class SearchArgs(BaseModel):
    """The strict args model most tests gate against."""

    model_config = ConfigDict(extra="forbid", strict=True)

    query: str
    limit: int = 10
    start: date | None = None
    end: date | None = None
    window: Window | None = None


def noop(args: Any, context: Any) -> dict[str, Any]:
    return {"hits": []}


def make_spec(
    name: str = "search_logs",
    *,
    effect: Effect = Effect.READ,
    capability: str = "logs:read",
    args_model: type[BaseModel] = SearchArgs,
    execute: Any = noop,
    **extra: Any,
) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=f"The {name} tool.",
        args_model=args_model,
        effect=effect,
        capability=capability,
        timeout_seconds=5,
        execute=execute,
        **extra,
    )


def make_state(*, steps: int = 6, tool_calls: int = 3, **fields: Any) -> AgentState:
    return AgentState(
        run_id="run-0001",
        tenant_id="tenant-a",
        principal_id="user-1",
        question="Why did checkout fail at 09:00?",
        budget=RuntimeBudget(steps_remaining=steps, tool_calls_remaining=tool_calls),
        **fields,
    )


def make_proposal(
    arguments: dict[str, Any] | None = None,
    *,
    tool_name: str = "search_logs",
    call_id: str = "call-0001",
) -> ToolProposal:
    return ToolProposal(
        call_id=call_id,
        tool_name=tool_name,
        arguments={"query": "checkout 500"} if arguments is None else arguments,
    )


def reader(*capabilities: str) -> Principal:
    return Principal(id="user-1", capabilities=frozenset(capabilities or ("logs:read",)))
