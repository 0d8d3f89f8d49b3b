"""AgentDojo functions as fencepost tools: ``@fp.tool`` with the environment injected.

Each AgentDojo function becomes an ``@fp.tool`` whose parameters are the function's own
(AgentDojo's types, defaults and descriptions, made strict by the decorator: no coercion, no
extra keys) plus two injected dependencies the model never sees: the run's AgentDojo
environment and the record of what ran (:class:`Executed`). Each run hands both in its
``fp.RunContext(injected=...)``, so one compiled graph serves every run of a suite.

The per-tool guards (:data:`TOOL_GUARDS`) are written once per suite from its tool list, as least
privilege is, never from a task's ground truth.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field

import fencepost as fp
from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
from agentdojo.functions_runtime import Function, FunctionCall, FunctionsRuntime, TaskEnvironment

READ_PREFIXES = re.compile(r"^(get_|read_|search_|list_|check_)")
"""AgentDojo's reads by name; every other function changes something (a write)."""

TOOL_TIMEOUT_SECONDS = 30.0

ENVIRONMENT = "environment"
"""The name the run's AgentDojo environment is injected under."""
EXECUTED = "executed"
"""The name the run's record of executed calls is injected under."""

TOOL_GUARDS: Mapping[str, Mapping[str, Mapping[str, Any]]] = {
    # Written once per suite from its tools (never from a task's ground truth).
    "banking": {
        # Instalments: the same transfer (or standing order) to the same payee a few times.
        "send_money": {"repeat_limit": 3},
        "schedule_transaction": {"repeat_limit": 3},
    },
    "workspace": {
        # A search by sender (or by date) alone takes an empty query.
        "search_emails": {"allow_empty_query": True},
        "search_calendar_events": {"allow_empty_query": True},
    },
}
"""Per suite and tool: the built-in guards set per tool (``@fp.tool`` keywords)."""


EFFECTS: Mapping[str, Mapping[str, tuple[fp.Effect, str]]] = {
    # Written once per suite from its tools' purpose (never from a task's ground truth): where
    # a function's name says "read" but calling it reaches the world.
    "slack": {
        "get_webpage": (
            fp.Effect.EXTERNAL,
            "fetching a URL is a request to its server: the visit itself tells the server",
        ),
    },
}
"""Per suite: the functions registered with another effect than their name's, and why."""


def default_effect(function_name: str) -> fp.Effect:
    """READ for ``get_``/``read_``/``search_``/``list_``/``check_`` functions, WRITE otherwise."""
    return fp.Effect.READ if READ_PREFIXES.match(function_name) else fp.Effect.WRITE


def effect_of(suite_name: str, function_name: str) -> fp.Effect:
    """The effect a suite's function is registered with: the suite's own choice
    (:data:`EFFECTS`), else its name's (:func:`default_effect`)."""
    chosen = EFFECTS.get(suite_name, {}).get(function_name)
    return chosen[0] if chosen is not None else default_effect(function_name)


def capability(suite_name: str, function_name: str) -> str:
    """One capability per tool: ``<suite>:<function>``."""
    return f"{suite_name}:{function_name}"


@dataclass
class Executed:
    """What actually ran in one run, in order: AgentDojo's function-call trace is built from it."""

    calls: list[FunctionCall] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)


def injected(environment: TaskEnvironment, executed: Executed) -> dict[str, Any]:
    """What a run injects into its tools (``RunContext.injected``)."""
    return {ENVIRONMENT: environment, EXECUTED: executed}


def _parameters(function: Function) -> list[inspect.Parameter]:
    """The function's own parameters (keyword-only, AgentDojo's types and defaults, its
    descriptions on the fields), then the two injected ones and the tool context."""
    out: list[inspect.Parameter] = []
    for name, info in function.parameters.model_fields.items():
        default = inspect.Parameter.empty if info.is_required() else info.default
        annotation = Annotated[info.annotation, Field(description=info.description)]  # type: ignore[name-defined]
        out.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )
    out.append(
        inspect.Parameter(
            "_environment",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=Annotated[TaskEnvironment, fp.Injected(ENVIRONMENT)],
        )
    )
    out.append(
        inspect.Parameter(
            "_executed",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=Annotated[Executed, fp.Injected(EXECUTED)],
        )
    )
    out.append(inspect.Parameter("_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=fp.ToolContext))
    return out


def suite_tool(
    suite_name: str,
    function: Function,
    *,
    effect: fp.Effect,
    guards: Mapping[str, Any],
    declarations: Mapping[str, Any] | None = None,
) -> fp.ToolSpec:
    """One AgentDojo function as an ``@fp.tool``.

    Its body runs the function through AgentDojo's own runtime (its dependency extraction and
    argument validation) on the injected environment, records the call, and returns AgentDojo's
    own text of the result (the YAML a model is shown). A failing function is a ``tool_error``
    with code ``invalid_argument``: its message never reaches the model.
    """
    runtime = FunctionsRuntime([function])
    name = function.name
    parameters = _parameters(function)

    def body(**kwargs: Any) -> str:
        environment = kwargs.pop("_environment")
        executed: Executed = kwargs.pop("_executed")
        ctx: fp.ToolContext = kwargs.pop("_ctx")
        arguments = {k: _plain(v) for k, v in kwargs.items()}
        executed.calls.append(FunctionCall(function=name, args=arguments, id=ctx.idempotency_key))
        result, error = runtime.run_function(environment, name, arguments)
        executed.errors.append(error)
        if error is not None:
            executed.results.append("")
            raise fp.ToolError(fp.ErrorCode.INVALID_ARGUMENT)
        text = str(tool_result_to_str(result))
        executed.results.append(text)
        return text

    # The signature @fp.tool reads: AgentDojo's parameters, not **kwargs.
    body.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    body.__annotations__ = {p.name: p.annotation for p in parameters}
    body.__name__ = name
    return fp.tool(
        body,
        effect=effect,
        capability=capability(suite_name, name),
        timeout_seconds=TOOL_TIMEOUT_SECONDS,
        name=name,
        description=function.description[:4000] or name,
        **guards,
        **(declarations or {}),
    )


def _plain(value: Any) -> Any:
    """An argument as the model gave it (an enum as its value): AgentDojo's trace checks
    compare arguments as plain JSON values."""
    return getattr(value, "value", value) if not isinstance(value, str | int | float) else value


_REGISTRIES: dict[tuple[str, tuple[str, ...], str], fp.ToolRegistry] = {}


def suite_registry(
    suite_name: str,
    functions: Sequence[Function],
    guards: Mapping[str, Mapping[str, Any]] | None = None,
    declarations: Mapping[str, Mapping[str, Any]] | None = None,
) -> fp.ToolRegistry:
    """A suite's functions as one fencepost registry, with per-tool guards (by default the
    suite's :data:`TOOL_GUARDS`). Cached per suite and guards: the tools do not change between
    runs (each run injects its environment). ``declarations``: per tool, fencepost's provenance
    declarations (``output_trust``, ``sensitive``)."""
    guards = TOOL_GUARDS.get(suite_name, {}) if guards is None else guards
    declarations = declarations or {}
    key = (
        suite_name,
        tuple(f.name for f in functions),
        repr((sorted(guards.items()), sorted(declarations.items()))),
    )
    registry = _REGISTRIES.get(key)
    if registry is None:
        registry = _REGISTRIES[key] = fp.ToolRegistry(
            [
                suite_tool(
                    suite_name,
                    f,
                    effect=effect_of(suite_name, f.name),
                    guards=guards.get(f.name, {}),
                    declarations=declarations.get(f.name),
                )
                for f in functions
            ]
        )
    return registry
