"""``FencepostMiddleware``: the policy layer as a LangChain agent middleware.

The second binding of the contract, for teams who keep LangChain's ``create_agent`` and its
middleware list: ``create_agent(model, tools, middleware=[..., fp.FencepostMiddleware(...)])``,
invoked with ``context=fp.RunContext(...)``. The same policy functions as the graph binding judge
every call; each hook only loads the run, asks policy, does the I/O the answer names and writes:

- ``before_agent``: a run starts (or goes on): its ledger account is opened under the thread
  and the run id, owned by the trusted context; a missing context ends it ``policy_denied``.
- ``before_model``: a model step is reserved in the ledger before the model is called; a step
  crowded out only by other runs' steps in flight waits for them in the ledger's line (bounded
  by the deadline: busy is not exhausted); a budget whose spending cannot cover it ends the run
  (``jump_to="end"``) with its typed reason, long before LangGraph's recursion limit.
- ``after_model``: the model's tool calls are a batch, gated (allowlist, strict schema, semantic
  rules, no-progress, capability, effect and approval) and reserved before any runs; with
  ``approval="interrupt"`` a call that needs approval waits for a person (``interrupt()``).
- ``wrap_model_call``: with ``tool_catalog="permitted"``, the model is shown only the tools the
  run's principal may call (``policy.registry``).
- ``wrap_tool_call``: the executor's own check of the recorded verdict for this very call id and
  these very arguments, a durable start marker, the tool, its error as a safe code. Denial is
  enforced here, so neither another middleware's ``jump_to`` nor a retry wrapper runs a call the
  gate refused, and no call id runs twice.

Every run ends with one :class:`~fencepost.policy.TerminationReason` in the agent's state
(``termination``). What the binding cannot see is in ``docs/middleware.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple, NotRequired, Unpack

from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    ModelRequest,
    ModelResponse,
    hook_config,
)
from langchain.agents.middleware.types import OmitFromInput
from langchain_core.caches import BaseCache
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    RemoveMessage,
    ToolMessage,
)
from langchain_core.rate_limiters import BaseRateLimiter
from langgraph.config import get_stream_writer
from langgraph.errors import GraphBubbleUp
from langgraph.types import Command, interrupt
from pydantic import ValidationError

from fencepost.adapters import telemetry
from fencepost.adapters.agent import registry_of
from fencepost.adapters.chat_model import parse_ai_message
from fencepost.adapters.tools import has_async_body
from fencepost.graph.account import (
    RunAccount,
    account_of,
    charge,
    mark_result,
    open_run,
    reserve,
    reserve_batch,
    tokens_left,
    with_budget_view,
)
from fencepost.graph.containment.model import run_model
from fencepost.graph.containment.tools import run_callable, run_callable_blocking
from fencepost.graph.events import subscribe
from fencepost.graph.gate import gate
from fencepost.graph.node_io import AsyncIO, NodeIO, SyncIO, drive
from fencepost.graph.rules import ContainedRules, judged_with_rules
from fencepost.graph.settings import (
    GraphConfigError,
    LoopConfig,
    LoopOptions,
    LoopSettings,
    settings_from,
)
from fencepost.graph.state import new_run_id
from fencepost.graph.step_line import hold_step, run_ended
from fencepost.graph.token_count import count_tokens
from fencepost.graph.trace import manifest
from fencepost.policy import (
    AgentState as RunState,
)
from fencepost.policy import (
    Deadline,
    Effect,
    ErrorCode,
    RuntimeBudget,
    StepManifest,
    StopRequest,
    TerminationReason,
    ToolProposal,
    ToolRegistry,
    stage_deadline,
)
from fencepost.policy.approval import (
    ApprovalProblem,
    apply_approvals,
    approval_request,
    read_answer,
    waiting,
)
from fencepost.policy.budget import default_budget
from fencepost.policy.cancellation import cancelled_by_caller
from fencepost.policy.context import RunContext, coerce_context
from fencepost.policy.decide import (
    accept_decision,
    after_model_failure,
    invalid_code,
    model_failure,
)
from fencepost.policy.decision import InvalidProposal, ToolBatch
from fencepost.policy.denial import shown_code
from fencepost.policy.developer_log import MODEL, TOOLS, raised
from fencepost.policy.error_codes import failure_code_for
from fencepost.policy.execution import admits
from fencepost.policy.fingerprint import proposal_fingerprint, with_encodable_text
from fencepost.policy.keys import call_key, overage_key, started_key, step_key
from fencepost.policy.ledger import UnknownAccount, UnknownReservation
from fencepost.policy.may_go_on import check_before_acting, context_refusal
from fencepost.policy.phase import Phase
from fencepost.policy.provenance import ObservedOutput, output_of
from fencepost.policy.registry import permitted_names
from fencepost.policy.reservations import (
    Claim,
    call_amounts,
    claim,
    step_hold,
    stop_for_exceeded,
    stop_for_unknown_account,
)
from fencepost.policy.state import as_turn, stop
from fencepost.policy.trust import Trust
from fencepost.policy.usage import step_settlement, usage_report
from fencepost.policy.verdict import VerdictCode

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.runtime import Runtime

__all__ = ["FencepostMiddleware", "FencepostState", "MiddlewareOrderError", "check_middleware"]

# The second composition root: the loop's events it emits (a budget refusal) reach telemetry.
subscribe(telemetry.LISTENER)

TAKEN = frozenset(
    {
        "approval",
        "ledger",
        "repeat_limit",
        "verdict_key",
        "clock",
        "denial",
        "tokens_per_step",
        "model_retries",
        "tool_catalog",
        "provenance",
    }
)
"""The :class:`~fencepost.LoopSettings` this binding takes; any other given a value of its own
is refused (``GraphConfigError`` naming it), never silently ignored."""

_NO_PROMPT = (
    "is not supported by FencepostMiddleware: create_agent builds the model's input, so a "
    "refused batch ends the run; use fp.create_agent(..., {field}=...)"
)
UNSUPPORTED = {
    field: _NO_PROMPT.format(field=field) for field in ("repair_attempts", "answer_margin")
}
"""Settings this binding cannot honour, refused with why: the graph gives a refused batch back
to the model with repair notes in its input (``repair_attempts``), and tells the model its last
steps are for answering (``answer_margin``); here no hook writes the model's input."""

RUN_KEY = "fencepost_run"
"""The state field holding the run's record (fencepost's ``AgentState`` as JSON data)."""
MANIFESTS_KEY = "fencepost_manifests"
"""The state field the manifests are appended to."""
STEP_KEY = "fencepost_step"
"""The state field holding what the model step in flight holds: ``{"tokens": ..., "sent": ...}``."""


def _appended_manifests(kept: Any, added: Any) -> list[dict[str, Any]]:
    """The manifests channel's reducer: ``added``'s manifests after ``kept``'s. A caller can
    write this channel (``update_state``, a ``Command``'s update) before any hook runs: a write
    that is no list of maps keeps none of it, never raising out of ``invoke``."""
    before = kept if isinstance(kept, list) else []
    more = [m for m in added if isinstance(m, dict)] if isinstance(added, list) else []
    return [*before, *more] if more else before


class FencepostState(AgentState[Any]):
    """The agent's state with what fencepost adds: the run's record and how it ended."""

    fencepost_run: NotRequired[Annotated[dict[str, Any] | None, OmitFromInput]]
    """The run as fencepost's policy sees it (run id, budget view, batch and verdicts, repeat
    counts), as plain JSON data; validated back at every hook."""
    termination: NotRequired[Annotated[str | None, OmitFromInput]]
    """How the run ended: one :class:`~fencepost.policy.TerminationReason` value; ``None``
    while it runs."""
    last_error_code: NotRequired[Annotated[str | None, OmitFromInput]]
    """The safe code of what ended the run, if it was not a plain completion."""
    fencepost_manifests: NotRequired[
        Annotated[list[dict[str, Any]], OmitFromInput, _appended_manifests]
    ]
    """The run's :class:`~fencepost.policy.StepManifest` s as JSON data, appended as each hook
    records them (kept out of the run's record, which every hook reads whole)."""
    fencepost_step: NotRequired[Annotated[dict[str, int] | None, OmitFromInput]]
    """What the model step in flight holds: its token estimate and the tokens it sends, as
    counted before the model was called (settled against the model's usage report)."""


class _Admitted(NamedTuple):
    """A call the executor's check let run: its run, the caller's context, the reservation it
    runs on (``keys.call_key``) and which attempt of the call id it is."""

    run: RunState
    ctx: RunContext
    key: str
    attempt: int


class MiddlewareOrderError(GraphConfigError):
    """A middleware list ``FencepostMiddleware`` cannot keep its contract in: a middleware that
    wraps tool calls listed after it (inside it), a model retry or fallback listed before it,
    one it replaces, or not exactly one of it.
    Raised by :func:`check_middleware`; ``field`` is ``"middleware"``."""


REPLACED = {
    "ToolCallLimitMiddleware": "the budget's tool_calls_remaining",
    "ModelCallLimitMiddleware": "the budget's steps_remaining",
    "HumanInTheLoopMiddleware": "approval='interrupt'",
}
"""LangChain middleware fencepost's replaces, by class name, and what replaces it: their run
counters restart at each resume, and a HITL edit changes a call after fencepost gated it."""


MODEL_FAILURE_HANDLERS = frozenset({"ModelRetryMiddleware", "ModelFallbackMiddleware"})
"""LangChain middleware that act on a model call that raised, by class name: they go after
``FencepostMiddleware`` (inside its ``wrap_model_call``, which turns a failed model call into the
step's safe code, so listed before it they never see one)."""


def check_middleware(middleware: Sequence[Any]) -> list[Any]:
    """``middleware``, checked for ``FencepostMiddleware``'s place in it: exactly one, after
    every middleware that wraps tool calls (LangChain composes ``wrap_tool_call`` first-listed
    outermost, so a wrapper listed after it runs inside it, around the tool: a retry there
    re-runs a call fencepost admitted once), before LangChain's model retry and fallback
    middleware (:data:`MODEL_FAILURE_HANDLERS`: fencepost contains a failed model call, so they
    act on it only inside it), and none of the middleware it replaces (:data:`REPLACED`). ``create_agent`` hands a middleware nothing of the list, so this is the
    check; pass its result to ``create_agent(..., middleware=fp.check_middleware([...]))``.

    Raises :class:`MiddlewareOrderError` naming the offending middleware.
    """
    listed = list(middleware)
    ours = [n for n, m in enumerate(listed) if isinstance(m, FencepostMiddleware)]
    if len(ours) != 1:
        raise MiddlewareOrderError(
            "middleware", f"needs exactly one fp.FencepostMiddleware, found {len(ours)}"
        )
    for m in listed:
        replacement = REPLACED.get(type(m).__name__)
        if replacement is not None and type(m).__module__.startswith("langchain."):
            raise MiddlewareOrderError(
                "middleware",
                f"{type(m).__name__} is replaced by fp.FencepostMiddleware ({replacement}): "
                "remove it",
            )
    for m in listed[: ours[0]]:
        if type(m).__name__ in MODEL_FAILURE_HANDLERS and type(m).__module__.startswith(
            "langchain."
        ):
            raise MiddlewareOrderError(
                "middleware",
                f"{type(m).__name__} acts on a model call that raised and is listed before "
                "fp.FencepostMiddleware, which contains that failure first: list it after "
                "fp.FencepostMiddleware",
            )
    for m in listed[ours[0] + 1 :]:
        if _wraps_tool_calls(m):
            raise MiddlewareOrderError(
                "middleware",
                f"{type(m).__name__} wraps tool calls and is listed after "
                "fp.FencepostMiddleware, so it runs inside it, around the tool: list "
                "fp.FencepostMiddleware last",
            )
    return listed


def _wraps_tool_calls(m: Any) -> bool:
    """Whether ``m`` overrides a tool-call wrapper: the test ``create_agent`` itself makes to
    put it around the tool node's calls."""
    kind = type(m)
    return (
        getattr(kind, "wrap_tool_call", None) is not AgentMiddleware.wrap_tool_call
        or getattr(kind, "awrap_tool_call", None) is not AgentMiddleware.awrap_tool_call
    )


class _ChatModelDecides:
    """The decision model of the middleware binding: LangChain's agent calls the chat model
    itself; ``LoopConfig`` needs one, and nothing of this binding ever asks it."""

    async def decide(self, input: Any, *, deadline: Any) -> Any:
        raise RuntimeError("create_agent calls the model; FencepostMiddleware never does")


class FencepostMiddleware(AgentMiddleware[FencepostState, Any, Any]):
    """fencepost's policy layer for LangChain's ``create_agent``: put it LAST in the middleware
    list (innermost around the tools); :func:`check_middleware` checks a list.

    ``tools_or_registry`` are the :class:`~fencepost.policy.ToolSpec` s of the agent's tools
    (``fp.tool(lc_tool, effect=..., capability=...)``) or a ready ``ToolRegistry``: the names
    must be the LangChain tools' given to ``create_agent``. ``budget`` is each run's budget
    (default: 8 model steps, 8 tool calls). The other settings are ``fp.create_agent``'s, an
    :class:`~fencepost.LoopSettings` given as ``settings`` or its fields as keyword arguments
    (a keyword wins), with the same defaults and checks. It takes ``approval``
    (``"terminate"`` | ``"interrupt"``), ``ledger``, ``repeat_limit``, ``verdict_key``,
    ``clock``, ``denial`` (``"end_run"`` | ``"observe"``), ``model_retries`` (a model call that
    raises a retryable error is asked again at a step of its own), ``tokens_per_step`` (a step's
    output cap, held with what it sends where tokens are limited, settled against
    ``AIMessage.usage_metadata``), ``tool_catalog`` (``"all"`` | ``"permitted"``: the model is
    shown only the registered tools the run's principal may call, each model call, from its
    context) and ``provenance`` (``"observe"`` | ``"ask"`` | ``"refuse"``: the built-in
    provenance rule, judging values against the thread's tool messages, and its human messages
    that are none of the user's questions, a summary say, as untrusted); ``repair_attempts`` and
    ``answer_margin`` are not supported (``create_agent`` builds the model's input), and any
    other setting given a value of its own is refused (a ``GraphConfigError`` names it), never
    ignored: with ``approval="interrupt"`` the requester answers.

    Example::

        agent = langchain.agents.create_agent(
            model, [search_logs, write_note],
            middleware=[SummarizationMiddleware(...), fp.FencepostMiddleware(specs)],
            checkpointer=InMemorySaver(),
        )
        out = agent.invoke({"messages": [...]}, config, context=fp.RunContext(...))
        out["termination"]  # "completed", "tool_budget_exhausted", ...
    """

    state_schema = FencepostState

    def __init__(
        self,
        tools_or_registry: ToolRegistry | Iterable[Any],
        *,
        budget: RuntimeBudget | None = None,
        settings: LoopSettings | None = None,
        **options: Unpack[LoopOptions],
    ) -> None:
        super().__init__()
        given = settings_from(settings, options)
        for setting in fields(LoopSettings):
            if setting.name in TAKEN:
                continue
            value = getattr(given, setting.name)
            if setting.name in UNSUPPORTED:
                # Its default, or 0, is what this binding does: none is kept or given back.
                if value not in (setting.default, 0):
                    raise GraphConfigError(setting.name, UNSUPPORTED[setting.name])
                continue
            if value != setting.default:
                raise GraphConfigError(
                    setting.name,
                    "is not taken by FencepostMiddleware yet: use approval='interrupt' (a "
                    f"person answers) or fp.create_agent(..., {setting.name}=...)",
                )
        if budget is not None and not isinstance(budget, RuntimeBudget):
            raise GraphConfigError("budget", "must be an fp.RuntimeBudget")
        self.budget = budget or default_budget()
        # LangChain's agent calls the model: no step is kept for answering, and no refused
        # proposal is given back to repair (UNSUPPORTED).
        self.cfg: LoopConfig = LoopConfig.of(
            registry_of(tools_or_registry),
            _ChatModelDecides(),
            replace(given, answer_margin=0, repair_attempts=0),
        )

    # -- the hooks: each drives one body, over the sync or the async ledger -------------------

    @hook_config(can_jump_to=["end"])
    def before_agent(self, state: FencepostState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return drive(self._start(SyncIO(self.cfg), state, runtime.context))

    @hook_config(can_jump_to=["end"])
    async def abefore_agent(
        self, state: FencepostState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return await self._start(AsyncIO(self.cfg), state, runtime.context)

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: FencepostState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return drive(self._step(SyncIO(self.cfg), state, runtime.context))

    @hook_config(can_jump_to=["end"])
    async def abefore_model(
        self, state: FencepostState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return await self._step(AsyncIO(self.cfg), state, runtime.context)

    @hook_config(can_jump_to=["end", "model"])
    def after_model(self, state: FencepostState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return drive(self._gate(SyncIO(self.cfg), state, runtime.context))

    @hook_config(can_jump_to=["end", "model"])
    async def aafter_model(
        self, state: FencepostState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return await self._gate(AsyncIO(self.cfg), state, runtime.context)

    def after_agent(self, state: FencepostState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return drive(self._finish(SyncIO(self.cfg), state))

    async def aafter_agent(
        self, state: FencepostState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return await self._finish(AsyncIO(self.cfg), state)

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> Any:
        try:
            return handler(self._shown(request))
        except GraphBubbleUp:  # LangGraph's own control flow
            raise
        except BaseException as exc:  # a model cannot end its run untyped, nor the process
            if cancelled_by_caller(exc) or _interrupted_by_caller(exc):
                raise
            return _model_failed(request, exc)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> Any:
        try:
            return await handler(_model_contained(self._shown(request)))
        except GraphBubbleUp:
            raise
        except BaseException as exc:
            # type(), not isinstance(): isinstance reads a foreign exception's ``__class__``,
            # which is the model's code.
            if type(exc) is _ModelRaised:
                return _model_failed(request, exc.raised)
            if cancelled_by_caller(exc):
                raise
            return _model_failed(request, exc)

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        io = SyncIO(self.cfg)
        admitted = drive(self._admit(io, request))
        if isinstance(admitted, ToolMessage):
            return admitted
        with self._span(request, admitted) as span:
            # The tool runs as a sync tool body does in the graph binding: on a fencepost thread
            # of its tenant's share, left behind at its deadline (its late result never heard).
            ran = run_callable_blocking(
                lambda: handler(request),
                timeout_seconds=self._tool_seconds(request, admitted),
                tenant=admitted.ctx.tenant_id,
            )
            if ran.never_started:  # no thread took it, or no time was left: nothing happened
                return _spanned(span, drive(self._not_started(io, request, admitted)))
            if not ran.finished:
                return _spanned(span, drive(self._cut_off(io, request, admitted)))
            if isinstance(ran.raised, GraphBubbleUp):  # LangGraph's control flow: interrupt()
                raise ran.raised
            if ran.raised is not None:  # a tool cannot end its run, nor the process
                return _spanned(span, drive(self._failed(io, request, admitted, ran.raised)))
            return _spanned(span, drive(self._ran(io, request, admitted, ran.value)))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        io = AsyncIO(self.cfg)
        admitted = await self._admit(io, request)
        if isinstance(admitted, ToolMessage):
            return admitted
        with self._span(request, admitted) as span:
            seconds = self._tool_seconds(request, admitted)
            until = time.monotonic() + seconds

            async def called() -> ToolMessage | Command[Any]:
                try:
                    sent = request
                    # Read and copied here, in the call's containment: what the tool's class
                    # does as it is asked (``coroutine``, ``model_copy``) is its code too.
                    if request.tool is not None and not has_async_body(request.tool):
                        # create_agent's async handler would run a sync tool's body on the
                        # loop's default executor, shared by every tenant and never given back
                        # by a hung body: it runs on its tenant's share, as in the sync binding.
                        on_threads = _on_tenant_threads(request.tool, admitted.ctx.tenant_id, until)
                        sent = request.override(tool=on_threads)
                    return await handler(sent)
                except (KeyboardInterrupt, SystemExit) as exc:
                    # asyncio re-raises these two out of the event loop after failing the
                    # task: carried as data, they are this call's failure.
                    raise _BodyRaised(exc) from None

            # As an async tool body runs in the graph binding: a task on a leash, cancelled and
            # left behind at its deadline. Only the caller's own cancellation propagates.
            run = await run_model(called, seconds)
            if isinstance(run.error, _NotOnThread) and not run.error.started:
                return _spanned(span, await self._not_started(io, request, admitted))
            if not run.finished or isinstance(run.error, _NotOnThread):
                return _spanned(span, await self._cut_off(io, request, admitted))
            if isinstance(run.error, GraphBubbleUp):  # LangGraph's control flow: interrupt()
                raise run.error
            failure = run.error.raised if isinstance(run.error, _BodyRaised) else run.error
            if run.cancelled:
                failure = asyncio.CancelledError()
            if failure is not None:  # a tool cannot end its run, nor the process
                return _spanned(span, await self._failed(io, request, admitted, failure))
            return _spanned(span, await self._ran(io, request, admitted, run.value))

    def _span(self, request: ToolCallRequest, admitted: _Admitted) -> telemetry.ToolCall:
        """The ``execute_tool`` span of an admitted call."""
        call_id = str(request.tool_call.get("id") or "")
        spec = self.cfg.registry.get(str(request.tool_call.get("name") or ""))
        return telemetry.tool_span(call_id, spec, admitted.attempt)

    def _shown(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """The request with only the tools the model may be shown (``tool_catalog``): with
        ``"permitted"``, the tools the run's principal may call, read from this call's context
        (never kept: each call is its own caller's); a tool the registry does not know is never
        one of them. A provider's built-in tool (a dict with no name) runs at the provider,
        outside the gate, and is left as it is."""
        if self.cfg.tool_catalog == "all":
            return request
        ctx = coerce_context(getattr(request.runtime, "context", None))
        allowed = (
            permitted_names(self.cfg.registry, ctx.principal) if ctx is not None else frozenset()
        )
        tools = [t for t in request.tools if _tool_name(t) in allowed or _tool_name(t) is None]
        return request.override(tools=tools) if len(tools) != len(request.tools) else request

    # -- the bodies ---------------------------------------------------------------------------

    async def _start(
        self, io: NodeIO, values: FencepostState, context: Any
    ) -> dict[str, Any] | None:
        """A run starts with new input on a thread whose last run ended (or on a new thread);
        input on a run that has not ended goes on with that run and its budget."""
        ctx = coerce_context(context)
        record = _record(values)
        if record is not None and not record.is_terminal:
            return (
                None if ctx is not None else _end(record, stop(_DENIED, context_refusal(context)))
            )
        run = RunState(
            run_id=new_run_id(),
            tenant_id=ctx.tenant_id if ctx else None,
            principal_id=ctx.principal.id if ctx else None,
            question=_question(values.get("messages", [])),
            budget=self.budget,
            # The thread's earlier runs: the run's place in the thread names its account.
            turns=() if record is None else (*record.turns, as_turn(record)),
        )
        if ctx is None:
            return _end(run, stop(_DENIED, context_refusal(context)))
        # The graph's own opening: a parent account funds only what its owner may spend.
        opened = await open_run(io, run, ctx)
        if isinstance(opened, StopRequest):
            return _end(run, opened)
        return {RUN_KEY: _dump(opened), "termination": None, "last_error_code": None}

    async def _step(
        self, io: NodeIO, values: FencepostState, context: Any
    ) -> dict[str, Any] | None:
        """Reserve the next model step before the model is called."""
        run = _record(values)
        ctx = coerce_context(context)
        if run is None or ctx is None:
            return _end(run, stop(_DENIED, context_refusal(context)))
        if run.is_terminal:
            return {"jump_to": "end"}
        run = self._executed(run, values, ctx)
        # The graph's decide asks the same: the run's own identity, and time left.
        refused = check_before_acting(run, ctx, clock=self.cfg.clock, given=context)
        if refused is not None:
            return await self._close(io, run, refused)
        run = _answered(run)
        sent: int | None = None
        asking = run

        async def hold() -> tuple[int, int]:
            """What the step holds (``reservations.step_hold``, as the graph binding's decide
            node): the tokens of what the model is about to be sent (its messages and the tool
            catalog, counted once) and its output cap, within the headroom read now; nothing
            where no account of the chain limits tokens."""
            nonlocal sent
            headroom = await tokens_left(io, asking, ctx)
            if headroom is None:
                return 0, 0
            if sent is None:
                sent = count_tokens(_sent_text(values.get("messages", []), self.cfg.registry))
            return step_hold(sent, self.cfg.tokens_per_step, headroom), 0

        # The graph's own wait: a step crowded out by other runs' steps in flight waits for
        # them (busy is not exhausted), in the ledger's line.
        account = RunAccount(account_of(run), run.run_id)
        held, (estimate, _money) = await hold_step(
            io, account, ctx, step_key(account.name, run.step + 1), hold, under_way=run.step > 0
        )
        if isinstance(held, StopRequest):
            return await self._close(io, run, held)
        run = with_budget_view(run.model_copy(update={"step": run.step + 1}), held.balance)
        return _written(run, {STEP_KEY: {"tokens": estimate, "sent": sent or 0}})

    async def _gate(
        self, io: NodeIO, values: FencepostState, context: Any
    ) -> dict[str, Any] | None:
        """Gate and reserve the model's tool calls, all of them before any runs."""
        run = _record(values)
        ctx = coerce_context(context)
        if run is None or ctx is None:
            return _end(run, stop(_DENIED, context_refusal(context)))
        if run.is_terminal:
            return {"jump_to": "end"}
        message = _last_ai(values.get("messages", []))
        if message is None:
            return None
        failed = _failure_of(message)
        try:
            run, usage, over = await self._settle_step(io, run, ctx, values, message)
        except _Unreadable:
            # What the step held is not known: settling it would be half-read.
            return await self._close(io, run, stop(_DENIED, "invalid_state"), message)
        except (UnknownAccount, UnknownReservation):
            # A ledger that never held this run's step (a new middleware's in-memory ledger,
            # one lost with its process) resumes nothing of it, as the graph binding's does.
            return await self._close(io, run, stop_for_unknown_account(), message)
        if over is not None:
            run = self._noted(run, ctx, Phase.DECIDE, "denied", code=over.error_code, **usage)
            return await self._close(io, run, over, message)
        if failed is not None:
            return await self._model_failed(io, run, ctx, message, failed, usage)
        if run.model_failures:
            run = run.model_copy(update={"model_failures": 0, "last_error_code": None})
        # Calls create_agent's model node answered itself are no proposals: its structured
        # output (``response_format=ToolStrategy(...)``) is a tool call it answers, and ends the
        # run with ``structured_response`` set, or asks the model again when it did not parse.
        answered = _answers_since_last_model_step(values.get("messages", []))
        pending = [c for c in message.tool_calls if str(c.get("id") or "") not in answered]
        if message.tool_calls and not pending:
            if values.get("structured_response") is None:
                return _written(run, {})
            run = self._noted(run, ctx, Phase.DECIDE, "decided", "final", **usage)
            return await self._close(io, run, stop(TerminationReason.COMPLETED))
        if len(pending) != len(message.tool_calls):
            message = message.model_copy(update={"tool_calls": pending})
        try:
            # What the reply means is the graph binding's reading of it: a refusal, a cut-off
            # or malformed reply, an empty one is an invalid proposal, never a completion.
            parse_ai_message(message, run_id=run.run_id, step=run.step)
        except InvalidProposal as invalid:
            code = invalid_code(invalid, run.run_id)
            run = self._noted(run, ctx, Phase.DECIDE, "denied", "invalid", code=code, **usage)
            return await self._close(io, run, stop(_INVALID, code), message)
        if not message.tool_calls:
            run = self._noted(run, ctx, Phase.DECIDE, "decided", "final", **usage)
            return await self._close(io, run, stop(TerminationReason.COMPLETED))
        try:
            calls = [
                ToolProposal(call_id=c["id"] or "", tool_name=c["name"], arguments=c["args"])
                for c in message.tool_calls
            ]
        except ValidationError:
            code = "invalid_tool_call"
            run = self._noted(run, ctx, Phase.DECIDE, "denied", "invalid", code=code, **usage)
            return await self._close(io, run, stop(_INVALID, code), message)
        # What the model's calls mean is the graph binding's question too (``accept_decision``).
        accepted = accept_decision(ToolBatch(calls=tuple(calls)))
        if isinstance(accepted, InvalidProposal):
            code = invalid_code(accepted, run.run_id)
            run = self._noted(run, ctx, Phase.DECIDE, "denied", "invalid", code=code, **usage)
            return await self._close(io, run, stop(_INVALID, code), message)
        # The graph's own gate phase: refused batches, every call's verdict, denials as data,
        # reservations of the whole batch before any of it runs; its manifests recorded here.
        run, manifests = await gate(
            io,
            run,
            ctx,
            calls,
            usage,
            outputs=_outputs(values.get("messages", []), self.cfg.registry, _asked(run)),
        )
        run = _recorded(run, manifests)
        if run.stop is not None:
            return await self._close(io, run, run.stop, message)
        cfg = self.cfg
        asked = waiting(run.batch, run_id=run.run_id, verdict_key=cfg.verdict_key)
        if asked:
            run, stopped = await self._approve(io, run, ctx, asked)
            if stopped is not None:
                return await self._close(io, run, stopped, message)
        return _written(run, {})

    async def _model_failed(
        self,
        io: NodeIO,
        run: RunState,
        ctx: RunContext,
        message: AIMessage,
        failed: ErrorCode,
        usage: dict[str, Any],
    ) -> dict[str, Any]:
        """A failed model step, as the graph binding reads one (``decide.model_failure`` and
        ``decide.end_step``): its safe code ends the run ``failed`` (the deadline's, once the
        run's own deadline has passed), unless it is retryable and the run has retries left:
        then the model is asked again at a step of its own (``jump_to="model"``: the step is
        reserved first), and the stand-in reply is removed so the model never sees it."""
        passed = ctx.deadline is not None and ctx.deadline.expired(clock=self.cfg.clock)
        ended = model_failure(failed, run_deadline_passed=passed)
        run = self._noted(run, ctx, Phase.DECIDE, "error", code=ended.error_code, **usage)
        after = after_model_failure(run, ended, self.cfg.model_retries)
        if after.stop is not None:
            return await self._close(io, run, after.stop)
        out = _written(after, {"jump_to": "model"})
        if message.id:
            out["messages"] = [RemoveMessage(id=message.id)]
        return out

    async def _approve(
        self, io: NodeIO, run: RunState, ctx: RunContext, asked: list[Any]
    ) -> tuple[RunState, StopRequest | None]:
        """Ask a person about the calls that wait for approval; the answered ones are gated
        again and reserved. The interrupt re-runs the hook on resume: gating is pure and each
        reservation idempotent by key, so the replay reserves nothing twice."""
        cfg = self.cfg
        problem: ApprovalProblem | None = None
        while True:
            response = interrupt(approval_request(asked, cfg.registry, problem))
            answers = read_answer(response, asked, cfg.registry)
            if not isinstance(answers, ApprovalProblem):
                break
            problem = answers
        now = cfg.clock.now()
        answered = answers
        result = await judged_with_rules(
            io,
            cfg.registry,
            [e.proposal.tool_name for e in asked],
            lambda: apply_approvals(
                run,
                answered,
                cfg.registry,
                ctx.principal,
                repeat_limit=cfg.repeat_limit,
                now=now,
                asked=asked,
                context=ctx,
                approved_by=ctx.principal.id,
                run_rule=ContainedRules(ctx, cfg.clock),
            ),
        )
        run = run.model_copy(update={"batch": result.batch, "fingerprints": result.fingerprints})
        if result.stop is not None:
            return run, result.stop
        return await reserve_batch(io, run, ctx, frozenset(e.call_id for e in asked))

    async def _admit(self, io: NodeIO, request: ToolCallRequest) -> _Admitted | ToolMessage:
        """The executor's own check: this call id's recorded verdict allows these very
        arguments, and no attempt of it started before (else its outcome is unknown, and it
        never runs again). The admitted call's reservation key, or the refusal message."""
        call = request.tool_call
        call_id = str(call.get("id") or "")
        name = str(call.get("name") or "")
        run = _record(request.state if isinstance(request.state, dict) else {})
        ctx = coerce_context(getattr(request.runtime, "context", None))
        if run is None or ctx is None or run.is_terminal:
            return _refusal(call_id, name, ErrorCode.PERMISSION_DENIED.value)
        # The graph's executor asks the same before any tool runs: the run's own identity, and
        # time left (an approval answered after the deadline runs nothing).
        refused = check_before_acting(run, ctx, clock=self.cfg.clock)
        if refused is not None:
            return _refusal(call_id, name, refused.error_code or refused.reason.value)
        entry = next((e for e in run.batch if e.call_id == call_id), None)
        if entry is None:
            return _refusal(call_id, name, ErrorCode.PERMISSION_DENIED.value)
        verdict = entry.verdict
        if not verdict.allowed:
            return _refusal(call_id, name, shown_code(verdict).value)
        spec = self.cfg.registry.get(name) if name in self.cfg.registry else None
        try:
            same = name == entry.proposal.tool_name and verdict.fingerprint == (
                proposal_fingerprint(name, dict(call.get("args") or {}))
            )
        except (TypeError, ValueError):
            same = False
        if (
            spec is None
            or not same
            or not admits(
                entry,
                spec,
                ctx.principal,
                approval=self.cfg.approval,
                verdict_key=self.cfg.verdict_key,
                run_id=run.run_id,
            )
        ):
            return _refusal(call_id, name, ErrorCode.PERMISSION_DENIED.value)
        run_account = RunAccount(account_of(run), run.run_id)
        account = run_account.name
        attempt = 1
        # The gate reserved attempt 1: reserving it again returns that reservation. A call
        # whose budget the gate never reserved (a batch entry a caller wrote into the record)
        # is held against the limits here, before it can run, as the graph's executor does.
        held = await reserve(
            io, run_account, ctx, call_key(account, call_id, 1), call_amounts(spec)
        )
        if isinstance(held, StopRequest):
            return _refusal(call_id, name, held.error_code or held.reason.value)
        while True:
            marker = await reserve(io, run_account, ctx, started_key(account, call_id, attempt), {})
            if isinstance(marker, StopRequest):
                return _refusal(call_id, name, marker.error_code or marker.reason.value)
            if not marker.existing:
                return _Admitted(run, ctx, call_key(account, call_id, attempt), attempt)
            if claim(spec, started_before=True) is Claim.UNCERTAIN:
                return _refusal(call_id, name, ErrorCode.EXECUTION_UNCERTAIN.value)
            attempt += 1
            held = await reserve(
                io, run_account, ctx, call_key(account, call_id, attempt), call_amounts(spec)
            )
            if isinstance(held, StopRequest):
                return _refusal(call_id, name, held.error_code or held.reason.value)

    async def _ran(
        self, io: NodeIO, request: ToolCallRequest, admitted: _Admitted, result: Any
    ) -> ToolMessage | Command[Any]:
        run, ctx, key, _attempt = admitted
        call_id = str(request.tool_call.get("id") or "")
        await io.settle(key)
        if isinstance(result, ToolMessage) and result.status == "error":
            # LangChain's own error text (a ToolException's message, a validation error)
            # is the tool's: the model gets the safe code only.
            code = ErrorCode.INTERNAL_ERROR.value
            TOOLS.warning(
                "tool %s returned an error (run %s, call %s): the model gets %s",
                result.name,
                run.run_id,
                call_id,
                code,
                extra={"run_id": run.run_id, "call_id": call_id, "code": code},
            )
            return _refusal(call_id, str(request.tool_call.get("name") or ""), code)
        await mark_result(io, run, ctx, account_of(run), call_id)
        return result  # type: ignore[no-any-return]

    def _tool_seconds(self, request: ToolCallRequest, admitted: _Admitted) -> float:
        """The seconds a call may run: its tool's ``timeout_seconds``, within the run's
        deadline (the graph binding's stage deadline)."""
        spec = self.cfg.registry.get(str(request.tool_call.get("name") or ""))
        clock = self.cfg.clock
        run_deadline = admitted.ctx.deadline or Deadline.after(spec.timeout_seconds, clock=clock)
        return stage_deadline(
            run_deadline, max_stage_seconds=spec.timeout_seconds, clock=clock
        ).remaining_seconds(clock=clock)

    async def _cut_off(
        self, io: NodeIO, request: ToolCallRequest, admitted: _Admitted
    ) -> ToolMessage:
        """A call its deadline cut off (``execution.ran`` with ``cut_off``): a write or an
        external call may have had its effect, so it is ``execution_uncertain`` and never run
        again (its start marker stays); a read is a ``timeout``. Its attempt is settled."""
        run, _ctx, key, _attempt = admitted
        call_id = str(request.tool_call.get("id") or "")
        name = str(request.tool_call.get("name") or "")
        spec = self.cfg.registry.get(name)
        code = ErrorCode.TIMEOUT if spec.effect is Effect.READ else ErrorCode.EXECUTION_UNCERTAIN
        TOOLS.warning(
            "tool %s did not report by its deadline (run %s, call %s): recorded as %s",
            name,
            run.run_id,
            call_id,
            code.value,
            extra={"run_id": run.run_id, "call_id": call_id, "code": code.value},
        )
        await io.settle(key)
        return _refusal(call_id, name, code.value)

    async def _not_started(
        self, io: NodeIO, request: ToolCallRequest, admitted: _Admitted
    ) -> ToolMessage:
        """A call whose tool never started (no thread of its tenant's share took it in time):
        ``unavailable``, as the graph binding's ``execution.ran`` with ``started=False``; its
        attempt stays charged and its start marker stays, so it never runs later either."""
        call_id = str(request.tool_call.get("id") or "")
        name = str(request.tool_call.get("name") or "")
        await io.settle(admitted.key)
        return _refusal(call_id, name, ErrorCode.UNAVAILABLE.value)

    async def _failed(
        self, io: NodeIO, request: ToolCallRequest, admitted: _Admitted, exc: BaseException
    ) -> ToolMessage:
        run, _ctx, key, _attempt = admitted
        call_id = str(request.tool_call.get("id") or "")
        name = str(request.tool_call.get("name") or "")
        code = failure_code_for(exc)
        raised(TOOLS, f"tool {name!r}", exc, run_id=run.run_id, call_id=call_id, code=code.value)
        await io.settle(key)
        return _refusal(call_id, name, code.value)

    async def _finish(self, io: NodeIO, values: FencepostState) -> dict[str, Any] | None:
        """A run that left the loop without fencepost ending it (another middleware jumped
        to the end) ends here, once: ``policy_denied`` names that it was not this binding's."""
        run = _record(values)
        if run is None or run.is_terminal:
            return None
        return await self._close(io, run, stop(_DENIED, "ended_by_other_middleware"))

    # -- tokens and the trace: what the graph binding's decide, gate and execute record -------

    async def _settle_step(
        self,
        io: NodeIO,
        run: RunState,
        ctx: RunContext,
        values: FencepostState,
        message: AIMessage,
    ) -> tuple[RunState, dict[str, Any], StopRequest | None]:
        """Settle the model step against what the model reported (``AIMessage.usage_metadata``),
        checked by ``usage.usage_report`` and split by ``usage.step_settlement`` as the graph
        binding does: a missing or implausible report is charged the text sent and received,
        counted; usage beyond the hold is charged on its own, and a limit it crosses ends the
        run. The settled run, the usage for its manifest, and the stop, if any."""
        estimate, sent = _held(values)
        reported: Any = message.usage_metadata or {}
        reply = _reply_text(message)
        report = usage_report(
            reported.get("input_tokens"),
            reported.get("output_tokens"),
            counted=sent + count_tokens(reply) if estimate else 0,
            reply_chars=len(reply),
            cached_input_tokens=(reported.get("input_token_details") or {}).get("cache_read"),
        )
        actual, overage = step_settlement(report, estimate)
        account, key = account_of(run), step_key(account_of(run), run.step)
        run = with_budget_view(run, (await io.settle(key, actual)).balance)
        usage = {"input_tokens": report.input_tokens, "output_tokens": report.output_tokens}
        if not overage:
            return run, usage, None
        extra = await charge(io, overage_key(account, run.step), overage, account=account, of=key)
        if isinstance(extra, StopRequest):
            return run, usage, extra
        run = with_budget_view(run, extra.balance)
        over = stop_for_exceeded(extra.exceeded[1]) if extra.exceeded is not None else None
        return run, usage, over

    def _noted(
        self,
        run: RunState,
        ctx: RunContext | None,
        phase: Phase,
        outcome: Any,
        decision_kind: str | None = None,
        **fields: Any,
    ) -> RunState:
        """``run`` with one manifest recorded (see :func:`_recorded`)."""
        m = manifest(
            run, self.cfg, ctx, phase=phase, outcome=outcome, decision_kind=decision_kind, **fields
        )
        return _recorded(run, [m])

    def _executed(self, run: RunState, values: FencepostState, ctx: RunContext) -> RunState:
        """The executor's manifest of each allowed call of the last batch, from the message
        that answered it (its safe code on an error), as the graph binding's execute node
        records them: a tool wrapper cannot write the run's record (the calls of a batch run
        side by side), so the next hook that can records them."""
        answers = _answers_since_last_model_step(values.get("messages", []))
        manifests: list[StepManifest] = []
        for entry in run.batch:
            answer = answers.get(entry.call_id)
            if not entry.verdict.allowed or answer is None:
                continue
            name = entry.proposal.tool_name
            spec = self.cfg.registry.get(name) if name in self.cfg.registry else None
            code = _error_code(answer)
            manifests.append(
                manifest(
                    run,
                    self.cfg,
                    ctx,
                    phase=Phase.EXECUTE,
                    outcome="success" if code is None else "error",
                    decision_kind="tool",
                    tool_name=spec.name if spec else None,
                    effect=spec.effect if spec else None,
                    verdict=VerdictCode.ALLOWED,
                    code=code,
                )
            )
        return _recorded(run, manifests) if manifests else run

    async def _close(
        self,
        io: NodeIO,
        run: RunState,
        request: StopRequest,
        message: AIMessage | None = None,
    ) -> dict[str, Any]:
        """End the run: close its account with the reason (the first close's stands), and
        answer the model's pending tool calls with the code, so the thread stays valid."""
        # An account never opened (no context) has nothing to close.
        with contextlib.suppress(LookupError, ValueError):
            await io.close_account(account_of(run), request.reason.value)
        run_ended(io.ledger, account_of(run))
        ended = _ended(run, request)
        terminal = manifest(
            ended,
            self.cfg,
            None,
            phase=Phase.TERMINAL,
            outcome="terminal",
            code=request.reason.value,
        )
        out = _end(_recorded(ended, [terminal]), request)
        if message is not None and message.tool_calls:
            code = request.error_code or request.reason.value
            out["messages"] = [
                _refusal(str(c.get("id") or ""), str(c.get("name") or ""), code)
                for c in message.tool_calls
            ]
        if request.reason is TerminationReason.COMPLETED:
            out.pop("jump_to")
        return out


_DENIED = TerminationReason.POLICY_DENIED
_INVALID = TerminationReason.INVALID_PROPOSAL


class _BodyRaised(Exception):
    """A ``SystemExit`` or ``KeyboardInterrupt`` a tool raised, carried off its task as data."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(type(raised).__name__)
        self.raised = raised


class _NotOnThread(BaseException):
    """A sync tool that its tenant's share did not run to its end: no thread took it in time
    (``started`` false: it never ran), or its deadline came first (it was left behind). A
    ``BaseException``, so that create_agent's tool node, which turns a tool's ``Exception``
    into an error message, hands it on to the middleware unread."""

    def __init__(self, started: bool) -> None:
        super().__init__()
        self.started = started


def _on_tenant_threads(tool: BaseTool, tenant: str, until: float) -> BaseTool:
    """A copy of the sync-only ``tool`` whose ``ainvoke`` runs its own sync ``invoke`` (what
    create_agent's sync tool handler calls, with the same call and injected arguments) on a
    thread of ``tenant``'s share, until the ``time.monotonic()`` instant ``until``: left behind
    past it, its late answer never heard. What the body raises is raised on in the handler, as
    ``invoke`` raises it there; anything but an end in time is :class:`_NotOnThread`."""

    async def ainvoke(input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        ran = await run_callable(
            lambda: tool.invoke(input, config, **kwargs),
            timeout_seconds=until - time.monotonic(),
            tenant=tenant,
        )
        if not ran.finished:
            raise _NotOnThread(started=not ran.never_started)
        if ran.raised is not None:
            raise ran.raised
        return ran.value

    copy = tool.model_copy()
    # An instance attribute shadows the class's method on this copy only (a pydantic model
    # keeps a ``__dict__``); the caller's tool is never changed.
    object.__setattr__(copy, "ainvoke", ainvoke)
    return copy


class _ModelRaised(Exception):
    """A ``SystemExit`` or ``KeyboardInterrupt`` a chat model raised under ``ainvoke``, carried
    off the task LangChain runs the model in as data. An ``Exception``: LangChain's
    ``agenerate`` reads any other ``BaseException`` its task ended with as a result (so a
    middleware listed inside fencepost's that retries on an ``Exception`` may retry it, where
    under ``invoke`` the ``SystemExit`` itself passes it by)."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(type(raised).__name__)
        self.raised = raised


def _model_contained(request: ModelRequest[Any]) -> ModelRequest[Any]:
    """The request with a copy of its chat model whose calls raise :class:`_ModelRaised`
    instead of ``SystemExit`` or ``KeyboardInterrupt``: ``BaseChatModel.agenerate`` runs each
    call as a task of its own, and asyncio re-raises those two out of the caller's event loop,
    before any hook sees them.

    What is wrapped is what a chat model implements (``_agenerate``, and the streaming methods
    it defines: ``_astream``, ``_astream_chat_model_events``), each bound to the caller's model
    (what the model keeps on itself, a call count or a client, stays on the model the caller
    holds) and keeping its signature (LangChain passes ``run_manager`` only to a method that
    takes one). The copy serves only as the entry LangChain calls them through: its fields
    and callbacks are the same objects, its rate limiter and cache (asked on the same task)
    the model's own, wrapped the same way. A model that is not a LangChain
    chat model, or that refuses to be copied, is sent as it is."""
    model = request.model
    if not isinstance(model, BaseChatModel):
        return request
    try:
        copy = model.model_copy()
    except Exception:
        # A model that will not be copied (a live connection, a lock) is sent as it is:
        # healthy, it answers as under invoke; only those two would still escape its task.
        return request
    # An instance attribute shadows the class's method on this copy only (a pydantic model
    # keeps a ``__dict__``); the caller's model is never changed.
    object.__setattr__(copy, "_agenerate", _carried_call(model._agenerate))
    for name in ("_astream", "_astream_chat_model_events"):
        method = getattr(model, name, None)
        if method is not None:
            object.__setattr__(copy, name, _carried_stream(method))
    # LangChain asks the model's rate limiter and cache on the same task, outside those
    # methods: their code is the model's too.
    if isinstance(model.rate_limiter, BaseRateLimiter):
        object.__setattr__(copy, "rate_limiter", _CarriedLimiter(model.rate_limiter))
    if isinstance(model.cache, BaseCache):
        object.__setattr__(copy, "cache", _CarriedCache(model.cache))
    return request.override(model=copy)


class _CarriedLimiter(BaseRateLimiter):
    """A chat model's rate limiter, raising :class:`_ModelRaised` where its ``aacquire``
    raises ``SystemExit`` or ``KeyboardInterrupt``."""

    def __init__(self, limiter: BaseRateLimiter) -> None:
        self.limiter = limiter

    def acquire(self, *, blocking: bool = True) -> bool:
        return self.limiter.acquire(blocking=blocking)

    async def aacquire(self, *, blocking: bool = True) -> bool:
        return await _carried_call(self.limiter.aacquire)(blocking=blocking)  # type: ignore[no-any-return]


class _CarriedCache(BaseCache):
    """A chat model's cache, raising :class:`_ModelRaised` where its async methods raise
    ``SystemExit`` or ``KeyboardInterrupt``."""

    def __init__(self, cache: BaseCache) -> None:
        self.cache = cache

    def lookup(self, prompt: str, llm_string: str) -> Any:
        return self.cache.lookup(prompt, llm_string)

    def update(self, prompt: str, llm_string: str, return_val: Any) -> None:
        self.cache.update(prompt, llm_string, return_val)

    def clear(self, **kwargs: Any) -> None:
        self.cache.clear(**kwargs)

    async def alookup(self, prompt: str, llm_string: str) -> Any:
        return await _carried_call(self.cache.alookup)(prompt, llm_string)

    async def aupdate(self, prompt: str, llm_string: str, return_val: Any) -> None:
        await _carried_call(self.cache.aupdate)(prompt, llm_string, return_val)

    async def aclear(self, **kwargs: Any) -> None:
        await _carried_call(self.cache.aclear)(**kwargs)


def _carried_call(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``method``, raising :class:`_ModelRaised` where it raises ``SystemExit`` or
    ``KeyboardInterrupt``."""

    @functools.wraps(method)
    async def carried(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except (KeyboardInterrupt, SystemExit) as exc:
            raise _ModelRaised(exc) from None

    return carried


def _carried_stream(method: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """The async generator ``method``, raising :class:`_ModelRaised` where it raises
    ``SystemExit`` or ``KeyboardInterrupt``."""

    @functools.wraps(method)
    async def carried(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        try:
            async for chunk in method(*args, **kwargs):
                yield chunk
        except (KeyboardInterrupt, SystemExit) as exc:
            raise _ModelRaised(exc) from None

    return carried


MODEL_FAILED_KEY = "fencepost_model_failed"
"""The ``response_metadata`` key of the reply :func:`_model_failed` stands in for a model call
that raised: its value is the failure's safe code, read by the gate hook as a failed step."""


def _model_failed(request: ModelRequest[Any], exc: BaseException) -> ModelResponse[Any]:
    """A model call that raised, as a reply the gate hook reads as a failed step: the safe code
    only (the exception, its text and its traceback are the developer's, logged on
    ``fencepost.model``, never in the messages). ``create_agent``'s model node writes a reply,
    not a run's end, so the end is the next hook's (``after_model``)."""
    try:
        code = failure_code_for(exc)
    except BaseException as unread:  # its type or status is the model's code too: it failed
        code, exc = ErrorCode.INTERNAL_ERROR, unread
    record = _record(getattr(request, "state", None))
    run_id = record.run_id if record is not None else None
    raised(MODEL, "the chat model", exc, run_id=run_id, call_id=None, code=code.value)
    return ModelResponse(
        result=[AIMessage(content="", response_metadata={MODEL_FAILED_KEY: code.value})]
    )


def _interrupted_by_caller(exc: BaseException) -> bool:
    """Whether ``exc`` is the caller's Ctrl-C: a ``KeyboardInterrupt`` on the main thread, where
    Python raises SIGINT's, and where the sync graph calls its chat model (the graph binding's
    caller gets it while it waits, its model running on another thread). A model that raises
    one itself there cannot be told from it, and propagates too."""
    return issubclass(type(exc), KeyboardInterrupt) and (
        threading.current_thread() is threading.main_thread()
    )


def _failure_of(message: AIMessage) -> ErrorCode | None:
    """The safe code of a reply that stands in for a failed model call (:func:`_model_failed`);
    ``None`` for a model's own reply. An unknown code (a forged reply) is ``internal_error``:
    it can only end the run it is in."""
    metadata = message.response_metadata
    code = metadata.get(MODEL_FAILED_KEY) if isinstance(metadata, dict) else None
    if code is None:
        return None
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.INTERNAL_ERROR


def _end(run: RunState | None, request: StopRequest) -> dict[str, Any]:
    out: dict[str, Any] = {
        "jump_to": "end",
        "termination": request.reason.value,
        "last_error_code": request.error_code,
    }
    return out if run is None else _written(_ended(run, request), out)


def _written(run: RunState, out: dict[str, Any]) -> dict[str, Any]:
    """``out`` with the run's record and the manifests this hook recorded (the record is read
    back without its manifests, so those it holds are this hook's)."""
    out[RUN_KEY] = _dump(run)
    if run.manifests:
        out[MANIFESTS_KEY] = [m.model_dump(mode="json") for m in run.manifests]
    return out


def _tool_name(tool: Any) -> str | None:
    """The name a tool of a model request is called by: a LangChain tool's, or a dict's
    (``{"name": ...}`` or OpenAI's ``{"function": {"name": ...}}``); ``None`` for a provider's
    built-in tool, which has none."""
    if isinstance(tool, dict):
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else tool.get("name")
        return name if isinstance(name, str) else None
    name = getattr(tool, "name", None)
    return name if isinstance(name, str) else None


def _ended(run: RunState, request: StopRequest) -> RunState:
    return run.model_copy(
        update={
            "phase": Phase.TERMINAL,
            "termination": request.reason,
            "last_error_code": request.error_code,
            "stop": None,
        }
    )


def _refusal(call_id: str, name: str, code: str) -> ToolMessage:
    """What the model sees of a call that did not run, or failed: the safe code, as data."""
    return ToolMessage(
        content=json.dumps({"error_code": code}),
        tool_call_id=call_id,
        name=name,
        status="error",
    )


def _answered(run: RunState) -> RunState:
    """The last batch's call ids, marked answered (a model step follows their results): a
    reused call id is then refused by the gate."""
    if not run.batch:
        return run
    answered = dict(run.answered)
    for entry in run.batch:
        answered.setdefault(entry.call_id, run.step)
    return run.model_copy(update={"answered": answered, "batch": ()})


def _record(values: Any) -> RunState | None:
    raw = values.get(RUN_KEY) if isinstance(values, dict) else None
    if not isinstance(raw, dict):
        return None
    try:
        return RunState.model_validate_json(json.dumps(raw))
    except (ValidationError, TypeError, ValueError):
        return None


def _dump(run: RunState) -> dict[str, Any]:
    """The run's record as the next hook reads it back (through JSON, :func:`_record`): text
    with no UTF-8 form (a lone surrogate in the user's question, a refused call's arguments)
    has its characters replaced, or the record would not read back and the run would end as
    one with no context."""
    dumped: dict[str, Any] = with_encodable_text(run.model_dump(mode="json", exclude={"manifests"}))
    return dumped


def _asked(run: RunState) -> frozenset[str]:
    """What the user asked in the thread, as the run's record holds it: its runs' questions."""
    return frozenset([run.question, *(t.question for t in run.turns)])


def _outputs(
    messages: list[AnyMessage], registry: ToolRegistry, asked: frozenset[str]
) -> list[ObservedOutput]:
    """The thread's tool results as provenance sources (this binding keeps no observations:
    the messages are its record), each trusted as its registered tool declares; a refusal or
    an error (``status="error"``) carries no values. A human message that is none of the
    user's questions (``asked``) is another middleware's (``SummarizationMiddleware`` puts
    its summary of earlier tool results in one): an untrusted source, or a value an attacker
    planted in a tool's output would pass for the model's own once that output is summarised."""
    found = []
    for message in messages:
        if isinstance(message, HumanMessage) and (message.text[:2000] or "-") not in asked:
            call_id = f"message:{message.id or ''}"
            found.append(
                output_of(message, call_id=call_id, tool="", trusted=False, result=message.text)
            )
            continue
        if not isinstance(message, ToolMessage) or message.status == "error":
            continue
        name = message.name or ""
        trusted = name in registry and registry.get(name).output_trust is Trust.TRUSTED
        content: object = message.content
        if isinstance(content, str):
            with contextlib.suppress(ValueError):
                content = json.loads(content)
        found.append(
            output_of(
                message, call_id=message.tool_call_id, tool=name, trusted=trusted, result=content
            )
        )
    return found


def _held(values: Any) -> tuple[int, int]:
    """``(estimate, sent)`` of the model step in flight, as ``before_model`` wrote them (none:
    ``(0, 0)``). A caller can write the field: anything else is :class:`_Unreadable`."""
    hold = values.get(STEP_KEY) if isinstance(values, dict) else None
    if hold is None:
        return 0, 0
    if isinstance(hold, dict):
        estimate, sent = hold.get("tokens", 0), hold.get("sent", 0)
        if all(type(n) is int and n >= 0 for n in (estimate, sent)):
            return int(estimate), int(sent)
    raise _Unreadable


class _Unreadable(Exception):
    """A field of fencepost's own, written by someone else into a form no hook writes."""


def _last_ai(messages: list[AnyMessage]) -> AIMessage | None:
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            return message
    return None


def _question(messages: list[AnyMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message.text[:2000] or "-"
    return "-"


def _recorded(run: RunState, manifests: list[StepManifest]) -> RunState:
    """Stream ``manifests`` (``custom`` stream mode, as the graph binding does), let the
    telemetry see them (the run's log lines) and keep them in the run's record."""
    try:
        writer = get_stream_writer()
    except RuntimeError:  # outside a running graph: nothing streams
        writer = None
    for m in manifests:
        if writer is not None:
            writer({"fencepost": "manifest", **m.model_dump(mode="json")})
    telemetry.recorded(run, manifests)
    return run.model_copy(update={"manifests": run.manifests + tuple(manifests)})


def _sent_text(messages: list[AnyMessage], registry: ToolRegistry) -> str:
    """The text a model step sends: each message's text and tool calls, and the tool catalog."""
    parts = [json.dumps(list(registry.model_catalog()), default=str)]
    for message in messages:
        parts.append(message.text)
        if isinstance(message, AIMessage) and message.tool_calls:
            parts.append(json.dumps(message.tool_calls, default=str))
    return "\n".join(parts)


def _reply_text(message: AIMessage) -> str:
    """The text the model wrote: its answer and each call's name and arguments."""
    calls = [c.get("name", "") + json.dumps(c.get("args"), default=str) for c in message.tool_calls]
    return "\n".join([message.text, *calls])


def _answers_since_last_model_step(messages: list[AnyMessage]) -> dict[str, ToolMessage]:
    """The tool messages after the last AI message, by call id."""
    answers: dict[str, ToolMessage] = {}
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            break
        if isinstance(message, ToolMessage):
            answers.setdefault(message.tool_call_id, message)
    return answers


def _error_code(answer: ToolMessage) -> str | None:
    """The safe code of a call's answer that is an error (``{"error_code": ...}``), else None."""
    if answer.status != "error":
        return None
    try:
        code = json.loads(str(answer.content)).get("error_code")
    except (ValueError, AttributeError):
        return ErrorCode.INTERNAL_ERROR.value
    return code if isinstance(code, str) else ErrorCode.INTERNAL_ERROR.value


def _spanned(
    span: telemetry.ToolCall, out: ToolMessage | Command[Any]
) -> ToolMessage | Command[Any]:
    """``out`` (what the model gets of a call that ran), its receipt status on the span."""
    code = _error_code(out) if isinstance(out, ToolMessage) else None
    if code == ErrorCode.EXECUTION_UNCERTAIN.value:
        span.settled("uncertain", code)
    else:
        span.settled("failed" if code is not None else "completed", code)
    return out
