"""AgentDojo functions as fencepost tools: strict args models, the environment bound in.

:class:`SuiteTools` is the one place the AgentDojo environment reaches a tool body. fencepost's
``ToolSpec.execute(args, context)`` has no way to be handed an application object the model
never sees, so each tool body reads the environment of the run it is bound to
(:meth:`SuiteTools.bound`). When ``@fp.tool`` takes injected dependencies, :class:`SuiteTools`
is what it replaces: the environment becomes the dependency, given per run, never part of the
args model or the catalog.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

import fencepost as fp
from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
from agentdojo.functions_runtime import Function, FunctionCall, FunctionsRuntime, TaskEnvironment

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


@dataclass
class _Run:
    environment: TaskEnvironment | None = None
    executed: Executed | None = None


class SuiteTools:
    """A suite's functions as one fencepost registry; each run binds its own environment.

    A body runs the function through AgentDojo's own runtime (its dependency extraction and
    argument validation) on the environment of the run bound now (:meth:`bound`), records the
    call, and returns AgentDojo's own text of the result (the YAML a model is shown). A failing
    function is a ``tool_error`` with code ``invalid_argument``: its message never reaches the
    model. A call with no run bound is ``internal_error``.

    Why a slot and not a closure per run: compiling a fencepost graph costs far more than a
    replayed run (LangGraph collects the serializer's allowlist from the state's types on every
    compile), so the graph is compiled once per suite and policy and runs one at a time. With
    injected dependencies the slot goes: the environment is handed to each call by the run.
    """

    def __init__(
        self, suite_name: str, functions: Sequence[Function], *, effect_of: EffectChoice
    ) -> None:
        self._runtime = FunctionsRuntime(list(functions))
        self._run = _Run()
        self.registry = fp.ToolRegistry(
            [
                fp.ToolSpec(
                    name=function.name,
                    description=function.description[:4000] or function.name,
                    args_model=strict_args_model(suite_name, function),
                    effect=effect_of(function.name),
                    capability=capability(suite_name, function.name),
                    timeout_seconds=TOOL_TIMEOUT_SECONDS,
                    execute=self._body(function.name),
                )
                for function in functions
            ]
        )

    @contextmanager
    def bound(self, environment: TaskEnvironment, executed: Executed) -> Iterator[None]:
        """Within the block, the tools act on ``environment`` and record into ``executed``."""
        if self._run.environment is not None:
            raise RuntimeError("one run at a time: these tools are already bound to a run")
        self._run = _Run(environment, executed)
        try:
            yield
        finally:
            self._run = _Run()

    def _body(self, name: str) -> Callable[[BaseModel, fp.ToolContext], str]:
        def execute(args: BaseModel, ctx: fp.ToolContext) -> str:
            run = self._run
            if run.environment is None or run.executed is None:
                raise fp.ToolError(fp.ErrorCode.INTERNAL_ERROR)
            executed = run.executed
            # exclude_unset: the call as proposed, defaults left to the function (AgentDojo's
            # trace checks compare arguments as a model gave them).
            kwargs = args.model_dump(mode="json", exclude_unset=True)
            executed.calls.append(FunctionCall(function=name, args=kwargs, id=ctx.idempotency_key))
            result, error = self._runtime.run_function(run.environment, name, kwargs)
            executed.errors.append(error)
            if error is not None:
                executed.results.append("")
                raise fp.ToolError(fp.ErrorCode.INVALID_ARGUMENT)
            text = str(tool_result_to_str(result))
            executed.results.append(text)
            return text

        return execute
