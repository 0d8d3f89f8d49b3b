"""``create_agent``: the bounded loop in one call, the way LangGraph users already build an agent.

``create_agent(model, tools, checkpointer=...)`` is LangChain's ``create_agent`` shape: a chat
model (or any fencepost :class:`~fencepost.policy.DecisionModel`), a list of tools, and the
settings of the loop; it returns the compiled graph. :func:`~fencepost.adapters.agent_graph.build_agent_graph`
stays for those who compile the graph themselves (their own ``compile`` arguments, or a node of
a graph of their own).

``tool`` here is the one way to say what a tool does and who may call it, whatever the tool is: a
plain function (as the ``@tool`` decorator), or a LangChain tool (``@langchain_core.tools.tool``,
``StructuredTool``, an MCP tool: wrapped by :func:`~fencepost.adapters.tools.tool_spec`), with
the same keywords either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Unpack, overload

from fencepost.adapters.agent_graph import build_agent_graph
from fencepost.graph.settings import GraphConfigError, LoopOptions, LoopSettings, settings_from
from fencepost.policy import DecisionModel, Effect, ErrorCode, ToolRegistry, ToolSpec
from fencepost.policy.registry import not_a_tool_spec
from fencepost.policy.tool import (
    DEFAULT_TOOL_TIMEOUT_SECONDS,
    NeedsApproval,
    ProgressPredicate,
    SemanticValidator,
)
from fencepost.policy.tool_decorator import ToolDefinitionError
from fencepost.policy.tool_decorator import tool as tool_from_function
from fencepost.policy.trust import Trust

if TYPE_CHECKING:
    from langgraph.graph.state import CompiledStateGraph

    from fencepost.adapters.tools import Injector

__all__ = ["create_agent", "tool"]


def _is_langchain_tool(value: object) -> bool:
    from langchain_core.tools import BaseTool

    return isinstance(value, BaseTool)


@overload
def tool(
    fn: Any,
    /,
    *,
    effect: Effect | str | None = None,
    capability: str | None = None,
    timeout_seconds: float = DEFAULT_TOOL_TIMEOUT_SECONDS,
    name: str | None = None,
    description: str | None = None,
    inject: Mapping[str, Injector] | None = None,
    tool_exception_code: ErrorCode | None = None,
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
    inject: Mapping[str, Injector] | None = None,
    tool_exception_code: ErrorCode | None = None,
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
    fn: Any = None,
    /,
    *,
    effect: Effect | str | None = None,
    capability: str | None = None,
    timeout_seconds: float = DEFAULT_TOOL_TIMEOUT_SECONDS,
    name: str | None = None,
    description: str | None = None,
    inject: Mapping[str, Injector] | None = None,
    tool_exception_code: ErrorCode | None = None,
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
    """A :class:`ToolSpec`: what a tool does (``effect``), who may call it (``capability``), how
    long a call may take (``timeout_seconds``); and, optionally, which of its calls need approval
    (``needs_approval``: :mod:`fencepost.policy.conditional_approval`).

    - ``@fp.tool(effect="read", capability="logs:read")`` over a function: its signature becomes
      the strict args model, its docstring the description (see
      :func:`fencepost.policy.tool_decorator.tool`).
    - ``fp.tool(langchain_tool, effect="read", capability="logs:read")``: a LangChain tool
      (``@tool``, ``StructuredTool``, an MCP tool), wrapped by
      :func:`~fencepost.adapters.tools.tool_spec`.

    ``effect`` and ``capability`` have no safe default: without them a one-sentence error says
    what is missing. ``approval_right`` and ``four_eyes`` say who may answer the tool's
    approval (see ``ToolSpec``). ``output_trust`` (``fp.Trust.TRUSTED`` for a system of record
    the application controls; untrusted by default) and ``sensitive`` (the argument names the
    graph's ``provenance`` rule judges) are the tool's provenance declarations, for a function and
    a LangChain tool alike.
    ``inject`` and ``tool_exception_code`` are a LangChain tool's (what ``tool_spec`` does with
    them); a function marks its injected parameters ``Annotated[T, fp.Injected("name")]`` and
    raises :class:`~fencepost.policy.ToolError` for a code of its own, so given for a function
    they are a :class:`~fencepost.policy.tool_decorator.ToolDefinitionError`.

    Example::

        @fp.tool(effect="read", capability="logs:read")
        def search_logs(query: str) -> dict:
            \"\"\"Search the service logs.\"\"\"
            return {"hits": []}
    """
    if fn is not None and _is_langchain_tool(fn):
        from fencepost.adapters.tools import tool_spec

        label = str(getattr(fn, "name", "tool"))
        missing = [k for k, v in (("effect", effect), ("capability", capability)) if v is None]
        if missing:
            needs = " and ".join(f"{m}=" for m in missing)
            raise ToolDefinitionError(
                f"LangChain tool {label!r} needs {needs}, which have no safe default: write "
                f"fp.tool({label}, effect='read', capability='...') with your own values"
            )
        assert effect is not None and capability is not None
        return tool_spec(
            fn,
            effect=effect,
            capability=capability,
            timeout_seconds=timeout_seconds,
            name=name,
            description=description,
            inject=inject,
            tool_exception_code=(
                ErrorCode.INTERNAL_ERROR if tool_exception_code is None else tool_exception_code
            ),
            semantic_validator=semantic_validator,
            progress_predicate=progress_predicate,
            idempotent=idempotent,
            allow_empty_query=allow_empty_query,
            repeat_limit=repeat_limit,
            needs_approval=needs_approval,
            approval_right=approval_right,
            four_eyes=four_eyes,
            output_trust=output_trust,
            sensitive=sensitive,
        )
    given = [
        k
        for k, v in (("inject", inject), ("tool_exception_code", tool_exception_code))
        if v is not None
    ]
    if given:
        raise ToolDefinitionError(
            f"{' and '.join(f'{k}=' for k in given)} wrap a LangChain tool "
            "(fp.tool(langchain_tool, ..., inject={...})); a function marks an injected "
            'parameter Annotated[T, fp.Injected("name")] and raises fp.ToolError for its own code'
        )
    return tool_from_function(
        fn,
        effect=effect,
        capability=capability,
        timeout_seconds=timeout_seconds,
        name=name,
        description=description,
        idempotent=idempotent,
        semantic_validator=semantic_validator,
        progress_predicate=progress_predicate,
        allow_empty_query=allow_empty_query,
        repeat_limit=repeat_limit,
        approval_right=approval_right,
        four_eyes=four_eyes,
        needs_approval=needs_approval,
        output_trust=output_trust,
        sensitive=sensitive,
    )


def registry_of(tools: ToolRegistry | Iterable[Any]) -> ToolRegistry:
    """A ready registry, or one built of ``ToolSpec`` s (``GraphConfigError`` naming what is not one)."""
    if isinstance(tools, ToolRegistry):
        return tools
    if isinstance(tools, str | bytes) or not isinstance(tools, Iterable):
        raise GraphConfigError("tools", "must be a list of tools (or a ToolRegistry)")
    specs: list[ToolSpec] = []
    for entry in tools:
        if not isinstance(entry, ToolSpec):
            raise GraphConfigError("tools", not_a_tool_spec(entry))
        specs.append(entry)
    return ToolRegistry(specs)


def _decision_model(model: Any, system_prompt: str | None, **decider: Any) -> DecisionModel:
    if callable(getattr(model, "decide", None)):
        if system_prompt is not None or decider:
            raise GraphConfigError(
                "system_prompt",
                "applies to a chat model only: a DecisionModel decides what it is shown itself",
            )
        return model  # type: ignore[no-any-return]
    from langchain_core.language_models import BaseChatModel

    if isinstance(model, BaseChatModel):
        from fencepost.adapters.chat_model import ChatModelDecider

        return ChatModelDecider(model, system_prompt=system_prompt, **decider)
    raise GraphConfigError(
        "model",
        f"must be a LangChain chat model (ChatOpenAI(...), init_chat_model(...)) or a fencepost "
        f"DecisionModel such as fp.ScriptedDecisionModel([...]), got {type(model).__name__}",
    )


def create_agent(
    model: Any,
    tools: ToolRegistry | Iterable[Any] = (),
    *,
    checkpointer: Any = None,
    store: Any = None,
    system_prompt: str | None = None,
    history_window: int | None = None,
    name: str | None = None,
    debug: bool = False,
    settings: LoopSettings | None = None,
    **options: Unpack[LoopOptions],
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The bounded agent, compiled: ``create_agent(model, tools, checkpointer=...)``.

    ``model`` is a LangChain chat model that supports ``bind_tools`` (wrapped in a
    :class:`~fencepost.adapters.chat_model.ChatModelDecider` with ``system_prompt`` and
    ``history_window``) or any fencepost ``DecisionModel`` (``ScriptedDecisionModel``, your own).
    ``tools`` are :class:`ToolSpec` s: ``@fp.tool`` functions, LangChain tools given their
    effect and capability with ``fp.tool(lc_tool, effect=..., capability=...)``, ``ToolSpec(...)``;
    or a ready :class:`ToolRegistry`.

    ``checkpointer``, ``store``, ``name`` and ``debug`` are passed to ``compile`` (leave
    ``checkpointer`` out to let LangGraph Server supply its own). The loop's settings are an
    :class:`~fencepost.LoopSettings` given as ``settings``, or its fields given as keyword
    arguments (``approval="interrupt"``, ``ledger=...``, ``repair_attempts=0``, ...), with its
    defaults; a keyword wins over the same field of ``settings``. A run's budget is given with
    its question: ``fp.start(question, fp.RuntimeBudget(...))``.

    Example::

        agent = fp.create_agent(ChatOpenAI(model="gpt-4.1-mini"), [search_logs],
                                checkpointer=InMemorySaver())
        out = agent.invoke(fp.start("Why is checkout failing?"), config, context=user)
    """
    given = settings_from(settings, options)
    decider_options: dict[str, Any] = {}
    if history_window is not None:
        decider_options["history_window"] = history_window
    decider = _decision_model(model, system_prompt, **decider_options)
    graph = build_agent_graph(registry_of(tools), decider, settings=given)
    return graph.compile(checkpointer=checkpointer, store=store, name=name, debug=debug)
