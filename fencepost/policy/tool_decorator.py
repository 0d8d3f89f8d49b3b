"""``@tool``: a :class:`~fencepost.policy.tool.ToolSpec` from a plain function.

The function's signature becomes the strict args model (no coercion, no extra keys; a parameter
without a default is required), its docstring the description the model reads, and its name the
tool name. What the tool does to the world and who may call it are not in the function: ``effect``
and ``capability`` are required keyword arguments, with no default that allows (a bare
``@tool`` says so in one sentence).

Example::

    @tool(effect=Effect.READ, capability="logs:read", timeout_seconds=5)
    def search_logs(service: str, window_minutes: int = 60) -> dict[str, Any]:
        \"\"\"Search a service's error logs for the last N minutes.\"\"\"
        return {"hits": []}

    registry = ToolRegistry([search_logs])   # search_logs is a ToolSpec now

A parameter annotated :class:`~fencepost.policy.tool.ToolContext` is filled from the trusted run
context and is not part of the schema; ``async def`` functions stay async.

A parameter annotated ``Annotated[T, Injected("name")]`` is an injected dependency (a database
handle, the environment a tool acts on): the caller supplies it in ``RunContext.injected``, and
it is no field of the schema, so the model never sees it::

    @tool(effect="write", capability="bank:pay")
    def send_money(recipient: str, amount: float, bank: Annotated[Bank, Injected("bank")]) -> dict:
        \"\"\"Send money to an IBAN.\"\"\"
        return bank.transfer(recipient, amount)

    ctx = RunContext(tenant_id="acme", principal=..., injected={"bank": bank_client})
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from typing import Any, overload

from pydantic import BaseModel, ConfigDict, PydanticUserError, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fencepost.policy.decision import TOOL_NAME_PATTERN
from fencepost.policy.error_codes import ErrorCode
from fencepost.policy.tool import (
    DEFAULT_TOOL_TIMEOUT_SECONDS,
    Effect,
    Injected,
    NeedsApproval,
    ProgressPredicate,
    SemanticValidator,
    ToolContext,
    ToolSpec,
    lax_model_in,
)
from fencepost.policy.trust import Trust

__all__ = ["InjectionMissing", "ToolDefinitionError", "tool"]


class ToolDefinitionError(TypeError):
    """A function cannot become a tool as written. Raised at decoration time, naming the tool and,
    where one is to blame, the parameter."""


_ARGS_MODEL_CONFIG = ConfigDict(extra="forbid", strict=True, frozen=True)
_ARGS_HEADER = re.compile(r"^(Args|Arguments|Parameters):\s*$")
_ARG_LINE = re.compile(r"^(?P<name>\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(?P<text>.*)$")
_NAME = re.compile(TOOL_NAME_PATTERN)


@overload
def tool(
    fn: Callable[..., Any],
    /,
    *,
    effect: Effect | str | None = None,
    capability: str | None = None,
    timeout_seconds: float = DEFAULT_TOOL_TIMEOUT_SECONDS,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool | None = None,
    semantic_validator: SemanticValidator | None = None,
    progress_predicate: ProgressPredicate | None = None,
    allow_empty_query: bool = False,
    repeat_limit: int | None = None,
    approval_right: str | None = None,
    four_eyes: bool | None = None,
    needs_approval: NeedsApproval | None = None,
    output_trust: Trust | str = Trust.UNTRUSTED,
    sensitive: tuple[str, ...] | list[str] = (),
) -> ToolSpec: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    effect: Effect | str | None = None,
    capability: str | None = None,
    timeout_seconds: float = DEFAULT_TOOL_TIMEOUT_SECONDS,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool | None = None,
    semantic_validator: SemanticValidator | None = None,
    progress_predicate: ProgressPredicate | None = None,
    allow_empty_query: bool = False,
    repeat_limit: int | None = None,
    approval_right: str | None = None,
    four_eyes: bool | None = None,
    needs_approval: NeedsApproval | None = None,
    output_trust: Trust | str = Trust.UNTRUSTED,
    sensitive: tuple[str, ...] | list[str] = (),
) -> Callable[[Callable[..., Any]], ToolSpec]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    effect: Effect | str | None = None,
    capability: str | None = None,
    timeout_seconds: float = DEFAULT_TOOL_TIMEOUT_SECONDS,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool | None = None,
    semantic_validator: SemanticValidator | None = None,
    progress_predicate: ProgressPredicate | None = None,
    allow_empty_query: bool = False,
    repeat_limit: int | None = None,
    approval_right: str | None = None,
    four_eyes: bool | None = None,
    needs_approval: NeedsApproval | None = None,
    output_trust: Trust | str = Trust.UNTRUSTED,
    sensitive: tuple[str, ...] | list[str] = (),
) -> Any:
    """Turn the decorated function into a :class:`ToolSpec`.

    ``effect`` (read / write / external) and ``capability`` (what the principal must hold) are
    trusted configuration and required: nothing about a function says it is safe to run, so a
    bare ``@tool`` says in one sentence what it lacks. ``timeout_seconds`` is the tool's own time
    limit (default :data:`DEFAULT_TOOL_TIMEOUT_SECONDS`). ``name`` defaults to the function's name
    and ``description`` to its docstring (without its ``Args:`` section, whose lines become the
    fields' descriptions). ``idempotent``, ``semantic_validator``, ``progress_predicate``,
    ``allow_empty_query``, ``repeat_limit``, ``needs_approval``, ``approval_right``,
    ``four_eyes``, ``output_trust`` (:class:`~fencepost.policy.trust.Trust`: untrusted unless
    said) and ``sensitive`` (argument names, each checked to be a parameter) are passed to the
    ToolSpec as they are. These are the keyword names ``ToolSpec`` and
    ``tool_spec`` take.

    ``tool(fn, effect=..., capability=...)`` (the function given directly) is the same as the
    decorator.

    A parameter annotated ``Annotated[T, Injected("name")]`` is an injected dependency, given
    from ``RunContext.injected`` and never part of the schema (see the module docstring).

    Raises :class:`ToolDefinitionError` for a missing ``effect`` or ``capability``, a parameter
    without a type annotation (or annotated ``Any``), ``*args`` / ``**kwargs``, a parameter
    starting with ``_``, a parameter whose type would let the model send any keys (a pydantic
    model that allows extra ones: an application object meant to be injected, say), a missing
    description or an invalid name — never a raw pydantic ``ValidationError``.
    """

    def decorate(fn: Callable[..., Any]) -> ToolSpec:
        tool_name = name if name is not None else getattr(fn, "__name__", "")
        if not _NAME.match(tool_name):
            raise ToolDefinitionError(
                f"tool name {tool_name!r} must match {TOOL_NAME_PATTERN}: pass name=..."
            )
        if effect is None or capability is None:
            missing = [k for k, v in (("effect", effect), ("capability", capability)) if v is None]
            raise ToolDefinitionError(_missing(tool_name, missing))
        summary, arg_docs = _split_docstring(inspect.getdoc(fn) or "")
        text = description if description is not None else summary
        if not text.strip():
            raise ToolDefinitionError(
                f"tool {tool_name!r} needs a description for the model: "
                "give the function a docstring or pass description=..."
            )
        try:
            tool_effect = Effect(effect)
        except ValueError:
            allowed = ", ".join(e.value for e in Effect)
            raise ToolDefinitionError(
                f"tool {tool_name!r}: effect {effect!r} is not one of {allowed}"
            ) from None
        args_model, call = _derive(fn, tool_name, arg_docs)
        try:
            trust = Trust(output_trust)
        except ValueError:
            allowed = ", ".join(t.value for t in Trust)
            raise ToolDefinitionError(
                f"tool {tool_name!r}: output_trust {output_trust!r} is not one of {allowed}"
            ) from None
        if isinstance(sensitive, str):
            raise ToolDefinitionError(
                f"tool {tool_name!r}: sensitive must be a tuple of argument names, "
                f"as sensitive=({sensitive!r},)"
            )
        unknown = [n for n in sensitive if n not in args_model.model_fields]
        if unknown:
            raise ToolDefinitionError(
                f"tool {tool_name!r}: sensitive names {unknown} that are not its arguments"
            )
        try:
            return ToolSpec(
                name=tool_name,
                description=text.strip(),
                args_model=args_model,
                effect=tool_effect,
                capability=capability,
                timeout_seconds=timeout_seconds,
                execute=_executor(fn, call),
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
        except ValidationError as exc:
            # A keyword of the decorator out of range (timeout_seconds=0, repeat_limit=0):
            # named by field, never pydantic's report (which quotes the values).
            fields = sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]}) or ["?"]
            raise ToolDefinitionError(
                f"tool {tool_name!r}: {', '.join(fields)} is not a valid value"
            ) from None

    if fn is not None:
        return decorate(fn)
    return decorate


def _missing(tool_name: str, missing: list[str]) -> str:
    """The one sentence a tool definition without an effect or a capability gets."""
    what = {
        "effect": "effect= (what it does: read, write or external)",
        "capability": "capability= (what a caller must hold to run it)",
    }
    needs = " and ".join(what[m] for m in missing)
    return (
        f"tool {tool_name!r} needs {needs}, which have no safe default: write "
        "@fp.tool(effect='read', capability='logs:read') with your own values"
    )


class InjectionMissing(LookupError):
    """A tool takes an injected dependency the run's context does not hold (and the parameter
    has no default): the call fails before its body runs. The message names the dependency
    (trusted configuration); the call's observation says ``internal_error`` (a configuration
    fault, not a lookup the model could retry differently)."""

    safe_code = ErrorCode.INTERNAL_ERROR

    def __init__(self, name: str) -> None:
        super().__init__(f"no injected dependency {name!r} in RunContext.injected")
        self.name = name


class _Injection(typing.NamedTuple):
    """An injected parameter: the name it is injected under, and its default, if any."""

    name: str
    default: Any
    """``inspect.Parameter.empty`` when the parameter has none."""


_CONTEXT = object()
"""The positional slot the ToolContext is passed in."""


class _Call(typing.NamedTuple):
    """How to call the function from an args model instance and a ToolContext."""

    positional: tuple[str | _Injection | object, ...]
    """Positional-only parameters in order: a field name, an injection, or the context."""
    keywords: tuple[str, ...]
    """Fields passed by keyword."""
    context_keyword: str | None
    """The keyword the context is passed as, if the function takes it by keyword."""
    injected_keywords: tuple[tuple[str, _Injection], ...] = ()
    """Injected parameters passed by keyword: (parameter name, injection)."""


def _injection(hint: Any) -> Injected | None:
    """The :class:`Injected` marker of an ``Annotated[T, Injected(...)]`` annotation, if any."""
    if typing.get_origin(hint) is not typing.Annotated:
        return None
    marks = [m for m in hint.__metadata__ if isinstance(m, Injected)]
    return marks[0] if marks else None


def _derive(
    fn: Callable[..., Any], tool_name: str, arg_docs: dict[str, str]
) -> tuple[type[BaseModel], _Call]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        raise ToolDefinitionError(f"tool {tool_name!r}: its signature cannot be read") from None
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except NameError as exc:
        missing = getattr(exc, "name", None) or "?"
        blamed = [
            p.name
            for p in signature.parameters.values()
            if isinstance(p.annotation, str)
            and re.search(rf"\b{re.escape(missing)}\b", p.annotation)
        ]
        where = f"parameter {blamed[0]!r}" if blamed else "an annotation"
        raise ToolDefinitionError(
            f"tool {tool_name!r}, {where}: the type {missing!r} cannot be resolved; "
            "define it where the function's module can see it (module level)"
        ) from None

    fields: dict[str, Any] = {}
    positional: list[str | _Injection | object] = []
    keywords: list[str] = []
    injected_keywords: list[tuple[str, _Injection]] = []
    context_keyword: str | None = None
    context_seen = False
    for param in signature.parameters.values():
        where = f"tool {tool_name!r}, parameter {param.name!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(
                f"{where}: *args and **kwargs cannot become a strict schema; name each argument"
            )
        if param.name not in hints:
            raise ToolDefinitionError(
                f"{where} has no type annotation: every argument needs one (it becomes the "
                "strict schema the model's arguments are checked against)"
            )
        hint = hints[param.name]
        if hint is ToolContext:
            if context_seen:
                raise ToolDefinitionError(f"{where}: only one parameter may take the ToolContext")
            context_seen = True
            if param.kind is param.POSITIONAL_ONLY:
                positional.append(_CONTEXT)
            else:
                context_keyword = param.name
            continue
        mark = _injection(hint)
        if mark is not None:
            # The caller's, never the model's: no field of the schema, no part of the catalog.
            injection = _Injection(mark.name or param.name, param.default)
            if param.kind is param.POSITIONAL_ONLY:
                positional.append(injection)
            else:
                injected_keywords.append((param.name, injection))
            continue
        if hint is Any or hint is object:
            raise ToolDefinitionError(
                f"{where} is annotated {getattr(hint, '__name__', 'Any')}, which accepts "
                "anything: give it a concrete type"
            )
        if param.name.startswith("_"):
            raise ToolDefinitionError(
                f"{where}: a name starting with '_' cannot be a schema field; rename it"
            )
        lax = lax_model_in(hint)
        if lax is not None:
            raise ToolDefinitionError(
                f"{where}: its type ({lax}) allows extra keys, so it cannot be a strict schema "
                "field; if the caller supplies it (a database, an environment), annotate it "
                "Annotated[..., fp.Injected()] and pass it in RunContext.injected, else give "
                "the model extra='forbid'"
            )
        default = PydanticUndefined if param.default is param.empty else param.default
        if isinstance(default, FieldInfo):
            info = FieldInfo.merge_field_infos(
                FieldInfo.from_annotation(hint), default, annotation=hint
            )
        else:
            info = FieldInfo.from_annotated_attribute(hint, default)
        if info.description is None and param.name in arg_docs:
            info.description = arg_docs[param.name]
        fields[param.name] = (info.annotation, info)
        if param.kind is param.POSITIONAL_ONLY:
            positional.append(param.name)
        else:
            keywords.append(param.name)

    model_name = "".join(part.capitalize() for part in tool_name.split("_")) + "Args"
    try:
        model = create_model(
            model_name,
            __config__=_ARGS_MODEL_CONFIG,
            __doc__=f"Arguments of ``{tool_name}``, derived from its signature.",
            __module__=getattr(fn, "__module__", __name__),
            **fields,
        )
        # The catalog sends this schema to the model: fail here, not at the first run.
        model.model_json_schema()
    except (PydanticUserError, TypeError, ValueError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ToolDefinitionError(
            f"tool {tool_name!r}: its arguments cannot become a strict schema ({first_line})"
        ) from None
    return model, _Call(
        tuple(positional), tuple(keywords), context_keyword, tuple(injected_keywords)
    )


def _injected_value(injection: _Injection, ctx: ToolContext) -> Any:
    found = ctx.injected.get(injection.name, _ABSENT)
    if found is not _ABSENT:
        return found
    if injection.default is not inspect.Parameter.empty:
        return injection.default
    raise InjectionMissing(injection.name)


_ABSENT = object()


def _executor(fn: Callable[..., Any], call: _Call) -> Callable[[Any, ToolContext], Any]:
    def arguments(args: Any, ctx: ToolContext) -> tuple[list[Any], dict[str, Any]]:
        # Field names come from the signature (trusted), never from the model's proposal.
        pos: list[Any] = []
        for slot in call.positional:
            if isinstance(slot, str):
                pos.append(getattr(args, slot))
            elif isinstance(slot, _Injection):
                pos.append(_injected_value(slot, ctx))
            else:
                pos.append(ctx)
        kw = {field: getattr(args, field) for field in call.keywords}
        if call.context_keyword is not None:
            kw[call.context_keyword] = ctx
        for param, injection in call.injected_keywords:
            kw[param] = _injected_value(injection, ctx)
        return pos, kw

    if inspect.iscoroutinefunction(fn):

        async def execute_async(args: Any, ctx: ToolContext) -> Any:
            pos, kw = arguments(args, ctx)
            return await fn(*pos, **kw)

        return execute_async

    def execute(args: Any, ctx: ToolContext) -> Any:
        pos, kw = arguments(args, ctx)
        return fn(*pos, **kw)

    return execute


def _split_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The docstring without its ``Args:`` section, and that section as name -> description.

    Google style: ``name: text`` or ``name (type): text`` one indent under the header, longer
    text continued on deeper-indented lines; the section ends at the first line indented less.
    """
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if _ARGS_HEADER.match(line.strip())), None)
    if start is None:
        return doc, {}
    body = [line for line in lines[start + 1 :] if line.strip()]
    arg_indent = _indent(body[0]) if body else 0
    docs: dict[str, str] = {}
    current: str | None = None
    end = len(lines)
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if not line.strip():
            continue
        indent = _indent(line)
        if indent < arg_indent or indent == 0:
            end = i  # the next section (Returns:, Raises:, ...) or prose
            break
        match = _ARG_LINE.match(line.strip())
        if indent == arg_indent and match:
            current = match["name"].lstrip("*")
            docs[current] = match["text"].strip()
        elif current is not None:
            docs[current] = f"{docs[current]} {line.strip()}".strip()
    rest = [*lines[:start], *lines[end:]]
    return "\n".join(rest).strip(), docs


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())
