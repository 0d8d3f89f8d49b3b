"""AgentDojo functions as fencepost tools: strict args models, the environment bound in.

:func:`bind_tools` is the one place the AgentDojo environment reaches a tool body. fencepost's
``ToolSpec.execute(args, context)`` has no way to be handed an application object the model
never sees, so each tool is a closure over the run's environment. When ``@fp.tool`` takes
injected dependencies, :func:`bind_tools` is what it replaces: the environment becomes the
dependency, given per run, never part of the args model or the catalog.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import fencepost as fp
from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
from agentdojo.functions_runtime import Function, FunctionCall, FunctionsRuntime, TaskEnvironment
from pydantic import BaseModel, ConfigDict, Field, create_model

READ_PREFIXES = re.compile(r"^(get_|read_|search_|list_|check_)")
"""AgentDojo's reads by name; every other function changes something (a write)."""

TOOL_TIMEOUT_SECONDS = 30.0


def default_effect(function_name: str) -> fp.Effect:
    """READ for ``get_``/``read_``/``search_``/``list_``/``check_`` functions, WRITE otherwise."""
    return fp.Effect.READ if READ_PREFIXES.match(function_name) else fp.Effect.WRITE


def capability(suite_name: str, function_name: str) -> str:
    """One capability per tool: ``<suite>:<function>``."""
    return f"{suite_name}:{function_name}"


_ARGS_MODELS: dict[tuple[str, str], type[BaseModel]] = {}


def strict_args_model(suite_name: str, function: Function) -> type[BaseModel]:
    """The function's own parameters, re-declared strict: no coercion, no extra keys.

    AgentDojo's parameter models coerce (``"5"`` becomes ``5.0``) and ignore unknown keys; a
    fencepost tool's schema must do neither. Fields, types, defaults and descriptions are
    AgentDojo's. Cached per suite and function: the schema does not change between runs.
    """
    key = (suite_name, function.name)
    model = _ARGS_MODELS.get(key)
    if model is None:
        fields: dict[str, Any] = {}
        for name, info in function.parameters.model_fields.items():
            default = ... if info.is_required() else info.default
            fields[name] = (info.annotation, Field(default=default, description=info.description))
        model = create_model(
            f"{function.name}_args",
            __config__=ConfigDict(extra="forbid", strict=True),
            **fields,
        )
        _ARGS_MODELS[key] = model
    return model


@dataclass
class Executed:
    """What actually ran in one run, in order: AgentDojo's function-call trace is built from it."""

    calls: list[FunctionCall] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)


EffectChoice = Callable[[str], fp.Effect]


def bind_tools(
    suite_name: str,
    functions: Sequence[Function],
    environment: TaskEnvironment,
    executed: Executed,
    *,
    effect_of: EffectChoice = default_effect,
) -> fp.ToolRegistry:
    """The suite's functions as a registry whose bodies act on ``environment``.

    A body runs the function through AgentDojo's own runtime (its dependency extraction and
    argument validation), records the call in ``executed``, and returns AgentDojo's own text of
    the result (the YAML a model is shown). A failing function is a ``tool_error`` with code
    ``invalid_argument``: its message never reaches the model.
    """
    runtime = FunctionsRuntime(list(functions))

    def body(name: str) -> Callable[[BaseModel, fp.ToolContext], str]:
        def execute(args: BaseModel, ctx: fp.ToolContext) -> str:
            # exclude_unset: the call as proposed, defaults left to the function (AgentDojo's
            # trace checks compare arguments as a model gave them).
            kwargs = args.model_dump(mode="json", exclude_unset=True)
            executed.calls.append(FunctionCall(function=name, args=kwargs, id=ctx.idempotency_key))
            result, error = runtime.run_function(environment, name, kwargs)
            executed.errors.append(error)
            if error is not None:
                executed.results.append("")
                raise fp.ToolError(fp.ErrorCode.INVALID_ARGUMENT)
            text = tool_result_to_str(result)
            executed.results.append(text)
            return text

        return execute

    specs = []
    for function in functions:
        specs.append(
            fp.ToolSpec(
                name=function.name,
                description=function.description[:4000] or function.name,
                args_model=strict_args_model(suite_name, function),
                effect=effect_of(function.name),
                required_capability=capability(suite_name, function.name),
                timeout_seconds=TOOL_TIMEOUT_SECONDS,
                execute=body(function.name),
            )
        )
    return fp.ToolRegistry(specs)
