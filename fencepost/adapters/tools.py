"""LangChain tools (``@tool``, ``StructuredTool``, MCP tools) as fencepost :class:`ToolSpec`.

A LangChain tool describes what it accepts; fencepost decides whether it may run. The tool's
argument schema becomes a strict pydantic model (extra keys forbidden, no coercion) that the gate
validates proposals against, and that the model is shown as the catalog. Arguments LangChain
injects at run time (``InjectedToolArg``, ``ToolRuntime``, ``RunnableConfig``) are filled from the
trusted :class:`ToolContext`, never from the model, and never appear in the catalog. Whatever the
tool raises becomes a safe code: its own text never reaches the model, nor any callback, tracer
or `astream_events` consumer (see `_sanitize_failures`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import keyword
import re
from collections.abc import Callable, Mapping
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Literal,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, create_model

from fencepost.policy import (
    Effect,
    ErrorCode,
    ToolContext,
    ToolError,
    ToolSpec,
    error_code_for,
)
from fencepost.policy.decision import TOOL_NAME_PATTERN
from fencepost.policy.developer_log import TOOLS, current_call, raised
from fencepost.policy.tool import (
    DEFAULT_TOOL_TIMEOUT_SECONDS,
    NeedsApproval,
    ProgressPredicate,
    SemanticValidator,
)
from fencepost.policy.trust import Trust

if TYPE_CHECKING:
    from langchain_core.tools import BaseTool

__all__ = ["ToolAdapterError", "has_async_body", "tool_spec"]

Injector = Callable[[ToolContext], Any]
"""Makes an injected argument's value from the trusted tool context."""


class ToolAdapterError(ValueError):
    """A LangChain tool could not be wrapped as a ToolSpec; the message says which tool and why."""

    def __init__(self, tool: str, problem: str) -> None:
        super().__init__(f"tool {tool!r}: {problem}")
        self.tool = tool


# ---------------------------------------------------------------------------------------------
# JSON schema -> strict pydantic model
# ---------------------------------------------------------------------------------------------

# Keywords that only describe a value: safe to carry over (or drop) without changing what passes.
_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "examples",
        "example",
        "default",
        "format",
        "$schema",
        "$id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentMediaType",
        "contentEncoding",
    }
)
# Keywords this converter enforces. Anything else is refused: an unknown validation keyword
# silently dropped would let through values the tool's author meant to reject.
_HANDLED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "$defs",
        "definitions",
        "nullable",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
        "uniqueItems",
    }
)
_STRICT = ConfigDict(extra="forbid", strict=True, regex_engine="python-re")
_IDENT = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def _json_key(value: Any) -> str:
    # JSON equality, not Python's: true is not 1, but 1 and 1.0 are the same number.
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return f"n:{float(value)!r}"
    return json.dumps(value, sort_keys=True, default=str)


def _unique(values: list[Any]) -> list[Any]:
    seen: set[str] = set()
    for value in values:
        key = _json_key(value)
        if key in seen:
            raise ValueError("items must be unique")
        seen.add(key)
    return values


def _drop_default(schema: dict[str, Any]) -> None:
    # An optional property with no default is left out of the call; the tool applies its own.
    schema.pop("default", None)


class _SchemaConverter:
    """Builds strict pydantic types from one tool's JSON schema (``$defs`` resolved once each)."""

    def __init__(self, tool: str, root: dict[str, Any]) -> None:
        self.tool = tool
        self.root = root
        self.models: dict[str, type[BaseModel]] = {}
        self.resolving: set[str] = set()

    def fail(self, path: str, problem: str) -> ToolAdapterError:
        return ToolAdapterError(self.tool, f"argument schema at {path or '<root>'}: {problem}")

    def check_keywords(self, schema: dict[str, Any], path: str) -> None:
        unknown = sorted(set(schema) - _ANNOTATIONS - _HANDLED)
        if unknown:
            raise self.fail(path, f"unsupported JSON schema keyword(s) {unknown}")

    def resolve(self, ref: str, path: str) -> tuple[str, dict[str, Any]]:
        for prefix in ("#/$defs/", "#/definitions/"):
            if ref.startswith(prefix):
                name = ref[len(prefix) :]
                defs = self.root.get(prefix[2:-1]) or {}
                target = defs.get(name)
                if isinstance(target, dict):
                    return name, target
        raise self.fail(path, f"unresolvable $ref {ref!r}")

    def annotation(self, schema: Any, path: str) -> Any:
        """The strict type for ``schema``."""
        if schema is True or schema == {}:
            return JsonValue
        if not isinstance(schema, dict):
            raise self.fail(path, "schema must be an object")
        self.check_keywords(schema, path)
        if schema.get("nullable") is True:
            inner = {k: v for k, v in schema.items() if k != "nullable"}
            return Union[self.annotation(inner, path), None]  # noqa: UP007 - built at run time
        if "$ref" in schema:
            extra = set(schema) - _ANNOTATIONS - {"$ref"}
            if extra:
                raise self.fail(path, f"$ref with sibling keywords {sorted(extra)}")
            name, target = self.resolve(schema["$ref"], path)
            if name in self.models:
                return self.models[name]
            if name in self.resolving:
                raise self.fail(path, f"recursive schema {name!r} is not supported")
            self.resolving.add(name)
            try:
                resolved = self.annotation(target, f"{path}->{name}")
            finally:
                self.resolving.discard(name)
            if isinstance(resolved, type) and issubclass(resolved, BaseModel):
                self.models[name] = resolved
            return resolved
        if "allOf" in schema:
            parts = schema["allOf"]
            if not isinstance(parts, list) or len(parts) != 1:
                raise self.fail(path, "allOf with more than one schema is not supported")
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            part = parts[0]
            if isinstance(part, dict) and "$ref" in part and len(part) == 1:
                return self.annotation({**merged, **part}, path)
            if not isinstance(part, dict):
                raise self.fail(path, "allOf entry must be an object")
            return self.annotation({**part, **merged}, path)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = schema[key]
                if not isinstance(options, list) or not options:
                    raise self.fail(path, f"{key} must be a non-empty list")
                rest = {k: v for k, v in schema.items() if k != key and k not in _ANNOTATIONS}
                types = tuple(
                    self.annotation(
                        {**rest, **option} if isinstance(option, dict) else option, f"{path}|{i}"
                    )
                    for i, option in enumerate(options)
                )
                return types[0] if len(types) == 1 else Union[types]  # noqa: UP007
        if "const" in schema:
            return Literal[schema["const"]]
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise self.fail(path, "enum must be a non-empty list")
            if any(isinstance(v, dict | list) for v in values):
                raise self.fail(path, "enum values must be JSON scalars")
            return Literal[tuple(values)]
        kind = schema.get("type")
        if isinstance(kind, list):
            rest = {k: v for k, v in schema.items() if k != "type"}
            types = tuple(self.annotation({**rest, "type": t}, path) for t in kind)
            return types[0] if len(types) == 1 else Union[types]  # noqa: UP007
        if kind is None:
            if "properties" in schema:
                kind = "object"
            elif "items" in schema:
                kind = "array"
            else:
                return JsonValue
        return self.typed(kind, schema, path)

    def typed(self, kind: str, schema: dict[str, Any], path: str) -> Any:
        if kind == "string":
            return Annotated[
                str,
                Field(
                    min_length=schema.get("minLength"),
                    max_length=schema.get("maxLength"),
                    pattern=schema.get("pattern"),
                ),
            ]
        if kind in ("integer", "number"):
            base: type[Any] = int if kind == "integer" else float
            low, high = schema.get("minimum"), schema.get("maximum")
            gt, lt = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
            # Draft 4 spells exclusiveness as a boolean that turns minimum/maximum strict.
            if isinstance(gt, bool):
                gt, low = (low, None) if gt else (None, low)
            if isinstance(lt, bool):
                lt, high = (high, None) if lt else (None, high)
            return Annotated[
                base,
                Field(ge=low, le=high, gt=gt, lt=lt, multiple_of=schema.get("multipleOf")),
            ]
        if kind == "boolean":
            return bool
        if kind == "null":
            return None
        if kind == "array":
            item = self.annotation(schema.get("items", True), f"{path}[]")
            parts: list[Any] = [
                Field(min_length=schema.get("minItems"), max_length=schema.get("maxItems"))
            ]
            if schema.get("uniqueItems") is True:
                parts.append(AfterValidator(_unique))
            return Annotated[(list[item], *parts)]  # type: ignore[valid-type]
        if kind == "object":
            if "properties" in schema:
                return self.model(schema, path)
            extra = schema.get("additionalProperties", True)
            return dict[str, self.annotation(extra, f"{path}{{}}")]  # type: ignore[misc]
        raise self.fail(path, f"unsupported type {kind!r}")

    def model(
        self,
        schema: dict[str, Any],
        path: str,
        *,
        name: str | None = None,
        hidden: frozenset[str] = frozenset(),
    ) -> type[BaseModel]:
        """A strict model for an object schema with ``properties`` (``hidden`` ones left out)."""
        self.check_keywords(schema, path)
        properties = schema.get("properties") or {}
        if not isinstance(properties, dict):
            raise self.fail(path, "properties must be an object")
        required = set(schema.get("required") or ())
        fields: dict[str, Any] = {}
        for index, (key, prop) in enumerate(properties.items()):
            if key in hidden:
                continue
            annotation = self.annotation(prop, f"{path}.{key}")
            kwargs: dict[str, Any] = {}
            if isinstance(prop, dict):
                for src, dst in (("description", "description"), ("title", "title")):
                    if isinstance(prop.get(src), str):
                        kwargs[dst] = prop[src]
                if isinstance(prop.get("examples"), list):
                    kwargs["examples"] = prop["examples"]
            if key in required:
                default: Any = ...
            elif isinstance(prop, dict) and "default" in prop:
                default = prop["default"]
            else:
                default = None
                kwargs["json_schema_extra"] = _drop_default
            field_name = key
            # A key that is not a plain identifier, or would shadow pydantic's own attributes,
            # is kept as the JSON name through an alias.
            if (
                not _IDENT.match(key)
                or keyword.iskeyword(key)
                or key.startswith("model_")
                or hasattr(BaseModel, key)
            ):
                field_name = f"field_{index}"
                kwargs["alias"] = key
            fields[field_name] = (annotation, Field(default, **kwargs))
        title = name or schema.get("title") or path.replace(".", "_") or self.tool
        config = ConfigDict(**_STRICT, title=str(title))
        model_name = re.sub(r"\W", "_", str(title)) or "Args"
        model: type[BaseModel] = create_model(model_name, __config__=config, **fields)
        if isinstance(schema.get("description"), str):
            model.__doc__ = schema["description"]
        return model


def strict_args_model(
    tool_name: str, schema: Mapping[str, Any], *, hidden: frozenset[str] = frozenset()
) -> type[BaseModel]:
    """A strict pydantic model (extra keys forbidden at every level, no coercion) for ``schema``.

    Raises :class:`ToolAdapterError` for a schema keyword it cannot enforce, rather than dropping
    it and letting through values the tool's author meant to reject.
    """
    root = dict(schema)
    if root.get("type", "object") != "object":
        raise ToolAdapterError(tool_name, "argument schema must be an object")
    converter = _SchemaConverter(tool_name, root)
    body = {k: v for k, v in root.items() if k not in ("$defs", "definitions", "description")}
    body.setdefault("properties", {})
    # The top level is always an object whose extra keys are refused, whatever it said.
    body.pop("additionalProperties", None)
    return converter.model(body, "", name=str(root.get("title") or tool_name), hidden=hidden)


# ---------------------------------------------------------------------------------------------
# Injected arguments
# ---------------------------------------------------------------------------------------------


def _is_tool_runtime(annotation: Any) -> bool:
    try:
        from langgraph.prebuilt import ToolRuntime
    except ImportError:  # pragma: no cover - langgraph ships it
        return False
    candidates = [annotation, get_origin(annotation), *get_args(annotation)]
    return any(isinstance(c, type) and issubclass(c, ToolRuntime) for c in candidates if c)


def _is_call_id(annotation: Any) -> bool:
    from langchain_core.tools import InjectedToolCallId

    metadata = getattr(annotation, "__metadata__", ())
    if not metadata:
        metadata = get_args(annotation)[1:]
    return any(
        m is InjectedToolCallId
        or isinstance(m, InjectedToolCallId)
        or (isinstance(m, type) and issubclass(m, InjectedToolCallId))
        for m in metadata
    )


def _injected_fields(tool: BaseTool) -> dict[str, tuple[Any, bool]]:
    """Injected argument names -> (annotation, has a default)."""
    out: dict[str, tuple[Any, bool]] = {}
    visible = tool.tool_call_schema
    # A JSON-schema tool (MCP) has no pydantic input model to compare: its injected arguments
    # are only those of the function it wraps, found below.
    full = tool.get_input_schema()
    if (
        not isinstance(tool.args_schema, dict)
        and isinstance(visible, type)
        and issubclass(visible, BaseModel)
        and issubclass(full, BaseModel)
    ):
        for name, info in full.model_fields.items():
            if name in visible.model_fields or name in ("args", "kwargs"):
                continue
            annotation: Any = info.annotation
            if info.metadata:
                annotation = Annotated[(annotation, *info.metadata)]
            out[name] = (annotation, not info.is_required())
    # Directly injected parameters (``runtime: ToolRuntime``) that the args schema leaves out:
    # read from the signature of the function the tool wraps.
    extra = [n for n in getattr(tool, "_injected_args_keys", frozenset()) if n not in out]
    if extra:
        fn = getattr(tool, "coroutine", None) or getattr(tool, "func", None) or tool._run
        try:
            hints = get_type_hints(fn, include_extras=True)
        except Exception:
            hints = {}
        params = inspect.signature(fn).parameters
        for name in extra:
            param = params.get(name)
            has_default = param is not None and param.default is not inspect.Parameter.empty
            out[name] = (hints.get(name, Any), has_default)
    return out


def _tool_runtime(ctx: ToolContext, config: dict[str, Any]) -> Any:
    from langgraph.prebuilt import ToolRuntime

    # ``state`` is empty on purpose: the run's state holds untrusted observations, and a tool
    # gets the trusted ToolContext as its ``context`` instead.
    return ToolRuntime(
        state={},
        context=ctx,
        config=config,  # type: ignore[arg-type]
        stream_writer=lambda _chunk: None,
        tool_call_id=ctx.idempotency_key or None,
        store=None,
    )


def _trusted_config(ctx: ToolContext, tool_name: str) -> dict[str, Any]:
    # Replaces (not merges with) the surrounding graph node's ``configurable``: a tool sees the
    # trusted identity of its run, not the graph's internals. Callbacks are still inherited.
    return {
        "run_name": tool_name,
        "configurable": {
            "run_id": ctx.run_id,
            "tenant_id": ctx.tenant_id,
            "principal_id": ctx.principal_id,
            "call_id": ctx.idempotency_key,
            "attempt": ctx.attempt,
        },
        "metadata": {"fencepost_run_id": ctx.run_id, "fencepost_call_id": ctx.idempotency_key},
    }


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


def _content_value(content: Any) -> Any:
    """A ToolMessage's content as JSON data: text blocks joined, other blocks kept as dicts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for block in content:
            if isinstance(block, str):
                texts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text":
                texts.append(str(block.get("text", "")))
            else:
                # Images and files stay as blocks (without the adapter's random block ids).
                return [
                    {k: v for k, v in b.items() if k != "id"} if isinstance(b, dict) else b
                    for b in content
                ]
        return "\n".join(texts)
    return content


# ---------------------------------------------------------------------------------------------
# tool_spec
# ---------------------------------------------------------------------------------------------


_TRANSPORT_NAMES = ("connecterror", "networkerror", "transporterror", "closedresourceerror")


def _group_code(group: BaseExceptionGroup[Any]) -> ErrorCode:
    """The safe code of the first failure in a group, by type and name like any other error."""
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
        leaf = leaf.exceptions[0]
    code = error_code_for(leaf)
    names = {cls.__name__.lower() for cls in type(leaf).__mro__}
    if code is ErrorCode.INTERNAL_ERROR and names & set(_TRANSPORT_NAMES):
        # httpx's ConnectError and friends: the server could not be reached.
        return ErrorCode.UNAVAILABLE
    return code


def _safe_code(exc: BaseException, tool_exception_code: ErrorCode) -> ErrorCode:
    """The safe code for whatever a LangChain tool raised, from its type and status only."""
    from langchain_core.tools import ToolException

    if isinstance(exc, ToolException):
        # Its message is the tool's own text (for MCP: the server's error content).
        return tool_exception_code
    if isinstance(exc, ExceptionGroup):
        # anyio task groups (the MCP client's transports) wrap the real failure.
        return _group_code(exc)
    if isinstance(exc, Exception):
        return error_code_for(exc)
    # SystemExit, KeyboardInterrupt, GeneratorExit...: control flow escaping the tool.
    return ErrorCode.INTERNAL_ERROR


def _sanitize_failures(tool: BaseTool, tool_exception_code: ErrorCode) -> None:
    """Make ``tool`` (a private copy) fail with a bare :class:`ToolError` carrying a safe code.

    LangChain hands the exception a tool body raised to every callback (``on_tool_error``: every
    tracer and ``astream_events``) before it reaches the caller. Wrapping only the methods that
    run the body (``_run``/``_arun``) and parse its input (``_to_args_and_kwargs``) keeps the
    tool's start and end events and its nested runs, while the error those callbacks see is
    ``ToolError(code)``: raised outside the handler, so it carries no ``__context__`` either.
    ``functools.wraps`` keeps the signatures LangChain inspects (``run_manager``, a
    ``RunnableConfig`` parameter). The wrappers live on this copy only, never on the caller's
    tool.
    """

    def sync_guard(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except BaseException as exc:
                code = _safe_code(exc, tool_exception_code)
                _log_raised(tool, exc, code)
            raise ToolError(code)

        return guarded

    def async_guard(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return await method(*args, **kwargs)
            except asyncio.CancelledError:
                raise  # the run's own cancellation, not a tool failure
            except BaseException as exc:
                code = _safe_code(exc, tool_exception_code)
                _log_raised(tool, exc, code)
            raise ToolError(code)

        return guarded

    # Instance attributes shadow the class's methods on this copy (a pydantic model keeps a
    # ``__dict__``); ``object.__setattr__`` because they are not fields.
    object.__setattr__(tool, "_run", sync_guard(tool._run))
    object.__setattr__(tool, "_arun", async_guard(tool._arun))
    object.__setattr__(tool, "_to_args_and_kwargs", sync_guard(tool._to_args_and_kwargs))


def _log_raised(tool: BaseTool, exc: BaseException, code: ErrorCode) -> None:
    """What a LangChain tool raised, logged once with its traceback (the ``ToolError`` that
    replaces it is the runtime's to handle, and is not logged again)."""
    if isinstance(exc, ToolError):
        return  # the tool's own typed report
    scope = current_call.get()
    raised(
        TOOLS,
        f"tool {scope.tool if scope else tool.name!r}",
        exc,
        run_id=scope.run_id if scope else None,
        call_id=scope.call_id if scope else None,
        code=code.value,
    )


def has_async_body(tool: BaseTool) -> bool:
    """Whether the LangChain tool has an async body of its own; else LangChain's ``ainvoke``
    runs its sync body on the event loop's default executor, which fencepost never uses."""
    from langchain_core.tools import BaseTool, StructuredTool, Tool

    if getattr(tool, "coroutine", None) is not None:
        return True
    return type(tool)._arun not in (BaseTool._arun, StructuredTool._arun, Tool._arun)


class _LangChainExecute:
    """``ToolSpec.execute`` for a LangChain tool: trusted injection in, safe codes out."""

    def __init__(
        self,
        tool: BaseTool,
        *,
        spec_name: str,
        injectors: dict[str, Injector],
        runtime_args: frozenset[str],
        needs_call_id: bool,
        tool_exception_code: ErrorCode,
    ) -> None:
        # Errors are mapped here, not turned into chatty ToolMessages by the tool itself.
        self.tool = tool.model_copy(
            update={"handle_tool_error": False, "handle_validation_error": False}
        )
        _sanitize_failures(self.tool, tool_exception_code)
        self.spec_name = spec_name
        self.injectors = injectors
        self.runtime_args = runtime_args
        self.tool_exception_code = tool_exception_code
        # Invoked with plain arguments, LangChain hands back what the tool returned (a dict
        # stays a dict). Invoked as a tool call it wraps the value in a ToolMessage, stringified:
        # done only when the tool needs the call id or returns content and artifact.
        self.as_tool_call = needs_call_id or tool.response_format == "content_and_artifact"

    def _input(self, args: BaseModel, ctx: ToolContext) -> tuple[Any, dict[str, Any]]:
        # Only keys the model actually gave: the tool applies its own defaults to the rest.
        arguments = args.model_dump(mode="json", by_alias=True, exclude_unset=True)
        config = _trusted_config(ctx, self.spec_name)
        for name, make in self.injectors.items():
            arguments[name] = make(ctx)
        for name in self.runtime_args:
            arguments[name] = _tool_runtime(ctx, config)
        tool_input: Any = arguments
        if self.as_tool_call:
            tool_input = {
                "type": "tool_call",
                "id": ctx.idempotency_key or f"{ctx.run_id}:{self.spec_name}",
                "name": self.tool.name,
                "args": arguments,
            }
        return tool_input, config

    def _failure(self, exc: BaseException) -> ToolError:
        # Bodies already fail with a ToolError (see _sanitize_failures); anything else comes
        # from LangChain itself or a callback, and is mapped the same way.
        if isinstance(exc, ToolError):
            return ToolError(exc.code, retryable=exc.retryable)
        code = _safe_code(exc, self.tool_exception_code)
        _log_raised(self.tool, exc, code)
        return ToolError(code)

    def _output(self, output: Any) -> Any:
        from langchain_core.messages import ToolMessage
        from langchain_core.messages.tool import ToolOutputMixin

        if isinstance(output, ToolMessage):
            if output.status == "error":
                raise ToolError(self.tool_exception_code)
            return _content_value(output.content)
        if isinstance(output, ToolOutputMixin) or (
            isinstance(output, list)
            and output
            and all(isinstance(o, ToolOutputMixin) for o in output)
        ):
            # A LangGraph ``Command`` would update a graph that fencepost owns.
            raise ToolError(ErrorCode.INTERNAL_ERROR)
        # The loop serializes it; a value that is not JSON data becomes unserializable_result.
        return output

    async def run(self, args: BaseModel, ctx: ToolContext) -> Any:
        """Run a tool with an async body; raises ToolError with a safe code on failure."""
        tool_input, config = self._input(args, ctx)
        try:
            output = await self.tool.ainvoke(tool_input, config=config)  # type: ignore[arg-type]
        except Exception as exc:
            failure = self._failure(exc)
        else:
            return self._output(output)
        # Raised outside the handler so the tool's text is not even kept as its context.
        raise failure

    def run_sync(self, args: BaseModel, ctx: ToolContext) -> Any:
        """Run a sync-only tool in the caller's thread (the runtime's bounded tool pool), not in
        the loop's default executor, where a body past its deadline would keep a thread."""
        tool_input, config = self._input(args, ctx)
        try:
            output = self.tool.invoke(tool_input, config=config)  # type: ignore[arg-type]
        except Exception as exc:
            failure = self._failure(exc)
        else:
            return self._output(output)
        raise failure


def tool_spec(
    tool: BaseTool,
    *,
    effect: Effect | str,
    capability: str,
    timeout_seconds: float = DEFAULT_TOOL_TIMEOUT_SECONDS,
    name: str | None = None,
    description: str | None = None,
    inject: Mapping[str, Injector] | None = None,
    tool_exception_code: ErrorCode = ErrorCode.INTERNAL_ERROR,
    semantic_validator: SemanticValidator | None = None,
    progress_predicate: ProgressPredicate | None = None,
    idempotent: bool | None = None,
    allow_empty_query: bool = False,
    repeat_limit: int | None = None,
    needs_approval: NeedsApproval | None = None,
    approval_right: str | None = None,
    four_eyes: bool | None = None,
    output_trust: Trust | str = Trust.UNTRUSTED,
    sensitive: tuple[str, ...] | list[str] = (),
) -> ToolSpec:
    """Wrap a LangChain ``BaseTool`` (``@tool``, ``StructuredTool``, an MCP tool) as a ToolSpec.

    ``effect`` and ``capability`` are required: nothing about a tool says it is safe to run, so
    the caller must say what it does and who may call it. The keywords are the ones
    ``@fp.tool`` and ``ToolSpec`` take; ``fp.tool(langchain_tool, effect=..., capability=...)``
    is the same call.

    - The args model is the tool's model-facing schema made strict: extra keys are refused at
      every level, ``"5"`` is not an int. Schema keywords it cannot enforce raise
      :class:`ToolAdapterError` here, at registration, instead of being dropped.
    - Injected arguments never come from the model and never appear in the catalog:
      ``InjectedToolCallId`` gets the call id (the idempotency key), ``ToolRuntime`` gets a
      runtime whose ``context`` is the trusted :class:`ToolContext` (annotate it
      ``ToolRuntime[ToolContext]``) and whose ``state`` is empty, a ``RunnableConfig``
      parameter gets ``configurable`` = run id, tenant, principal, call id and attempt. Any other
      ``InjectedToolArg`` needs an entry in ``inject`` (name -> ``fn(ToolContext)``) unless it
      has a default. ``inject`` may also name an ordinary schema property (an MCP tool's
      ``tenant_id``, say): it is then hidden from the model and filled from the context.
    - A ``ToolException`` (an MCP ``isError`` result among them) becomes
      ``tool_exception_code``; a :class:`ToolError` keeps its code; anything else is mapped by
      type and status by the loop. The tool's own error text never reaches the model.
    - The observation holds what the tool returned (a dict stays a dict; a value that is not
      JSON data ends as ``unserializable_result``). A tool that takes ``InjectedToolCallId`` or
      returns ``content_and_artifact`` (MCP tools do) is run as a tool call, and the observation
      is its ``ToolMessage`` content as LangChain's ``ToolNode`` would show it to a model (text
      blocks joined); an ``artifact`` is not shown.
    - ``output_trust`` and ``sensitive`` declare, as for ``@fp.tool``, whether the tool's
      output is trusted and which arguments the graph's ``provenance`` rule judges (each a
      property of the tool's schema, else :class:`ToolAdapterError`).

    Example::

        @tool
        def search_logs(query: str) -> str:
            '''Search the logs.'''
            ...

        spec = tool_spec(search_logs, effect=Effect.READ, capability="logs:read",
                         timeout_seconds=5)
    """
    from langchain_core.tools import BaseTool

    if not isinstance(tool, BaseTool):
        raise TypeError(f"tool_spec wraps a LangChain BaseTool, got {type(tool).__name__}")
    label = str(getattr(tool, "name", "?"))
    try:
        effect = Effect(effect)
    except ValueError:
        raise ToolAdapterError(
            label, f"effect must be one of {[e.value for e in Effect]}"
        ) from None
    if not isinstance(capability, str) or not capability:
        raise ToolAdapterError(label, "capability must be a non-empty string")
    spec_name = name or tool.name
    if not re.match(TOOL_NAME_PATTERN, spec_name):
        raise ToolAdapterError(
            label,
            f"name {spec_name!r} does not match {TOOL_NAME_PATTERN}; pass name='...' to register "
            "it under another",
        )
    text = (description if description is not None else tool.description or "").strip()
    if not text:
        raise ToolAdapterError(label, "has no description; pass description='...'")
    if len(text) > 4_000:
        raise ToolAdapterError(label, "description is over 4000 characters; pass a shorter one")

    injectors = dict(inject or {})
    runtime_args: set[str] = set()
    needs_call_id = False
    for arg, (annotation, has_default) in _injected_fields(tool).items():
        if arg in injectors:
            continue
        if _is_call_id(annotation):
            needs_call_id = True  # LangChain fills it from the call id we hand over
            continue
        if _is_tool_runtime(annotation):
            runtime_args.add(arg)
            continue
        if not has_default:
            raise ToolAdapterError(
                label,
                f"injected argument {arg!r} has no default; pass inject={{{arg!r}: fn}} "
                "to fill it from the trusted ToolContext",
            )

    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        json_schema: dict[str, Any] = dict(schema)
    elif issubclass(schema, BaseModel):
        json_schema = schema.model_json_schema()
    else:  # a pydantic v1 model
        json_schema = dict(schema.schema())
    json_schema.pop("description", None)
    hidden = frozenset(k for k in injectors if k in (json_schema.get("properties") or {}))
    args_model = strict_args_model(spec_name, json_schema, hidden=hidden)
    try:
        trust = Trust(output_trust)
    except ValueError:
        raise ToolAdapterError(
            label, f"output_trust must be one of {[t.value for t in Trust]}"
        ) from None
    if isinstance(sensitive, str):
        raise ToolAdapterError(
            label, f"sensitive must be a tuple of argument names, as sensitive=({sensitive!r},)"
        )
    unknown = [n for n in sensitive if n not in args_model.model_fields]
    if unknown:
        raise ToolAdapterError(label, f"sensitive names {unknown} that are not its arguments")

    execute = _LangChainExecute(
        tool,
        spec_name=spec_name,
        injectors=injectors,
        runtime_args=frozenset(runtime_args),
        needs_call_id=needs_call_id,
        tool_exception_code=tool_exception_code,
    )
    return ToolSpec(
        name=spec_name,
        description=text,
        args_model=args_model,
        effect=effect,
        capability=capability,
        timeout_seconds=timeout_seconds,
        # A bound ``async def`` for a tool with an async body (the loop awaits it), a plain method
        # for a sync-only tool (the runtime runs it on its own bounded thread pool).
        execute=execute.run if has_async_body(tool) else execute.run_sync,
        semantic_validator=semantic_validator,
        progress_predicate=progress_predicate,
        idempotent=idempotent,
        allow_empty_query=allow_empty_query,
        repeat_limit=repeat_limit,
        needs_approval=needs_approval,
        approval_right=approval_right,
        four_eyes=four_eyes,
        output_trust=trust,
        sensitive=tuple(sensitive),
    )
