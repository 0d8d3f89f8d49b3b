"""``FencepostMiddleware``: the policy layer as a LangChain agent middleware.

The second binding of the contract, for teams who keep LangChain's ``create_agent`` and its
middleware list: ``create_agent(model, tools, middleware=[..., fp.FencepostMiddleware(...)])``,
invoked with ``context=fp.RunContext(...)``. The same policy functions as the graph binding judge
every call; each hook only loads the run, asks policy, does the I/O the answer names and writes:

- ``before_agent``: a run starts (or goes on): its ledger account is opened under the thread
  and the run id, owned by the trusted context; a missing context ends it ``policy_denied``.
- ``before_model``: a model step is reserved in the ledger before the model is called; a budget
  that cannot cover it ends the run (``jump_to="end"``) with its typed reason, long before
  LangGraph's recursion limit.
- ``after_model``: the model's tool calls are a batch, gated (allowlist, strict schema, semantic
  rules, no-progress, capability, effect and approval) and reserved before any runs; with
  ``approval="interrupt"`` a call that needs approval waits for a person (``interrupt()``).
- ``wrap_tool_call``: the executor's own check of the recorded verdict for this very call id and
  these very arguments, a durable start marker, the tool, its error as a safe code. Denial is
  enforced here, so neither another middleware's ``jump_to`` nor a retry wrapper runs a call the
  gate refused, and no call id runs twice.

Every run ends with one :class:`~fencepost.policy.TerminationReason` in the agent's state
(``termination``). What the binding cannot see is in ``docs/middleware.md``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Annotated, Any, NotRequired, Unpack

from langchain.agents.middleware import AgentMiddleware, AgentState, hook_config
from langchain.agents.middleware.types import OmitFromInput
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.types import Command, interrupt
from pydantic import ValidationError

from fencepost.adapters import telemetry
from fencepost.adapters.agent import registry_of
from fencepost.graph.account import (
    account_of,
    mark_result,
    reserve,
    reserve_batch,
    with_budget_view,
)
from fencepost.graph.events import subscribe
from fencepost.graph.node_io import AsyncIO, NodeIO, SyncIO, drive
from fencepost.graph.settings import (
    GraphConfigError,
    LoopConfig,
    LoopOptions,
    LoopSettings,
    settings_from,
)
from fencepost.graph.state import new_run_id
from fencepost.policy import (
    AgentState as RunState,
)
from fencepost.policy import (
    ErrorCode,
    RuntimeBudget,
    StopRequest,
    TerminationReason,
    ToolProposal,
    ToolRegistry,
)
from fencepost.policy.approval import (
    ApprovalProblem,
    apply_approvals,
    approval_request,
    read_answer,
    waiting,
)
from fencepost.policy.budget import default_budget
from fencepost.policy.context import RunContext, coerce_context
from fencepost.policy.developer_log import TOOLS, raised
from fencepost.policy.error_codes import error_code_for
from fencepost.policy.execution import admits
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.gating import gate_batch, refused_batch
from fencepost.policy.keys import call_key, started_key, step_key
from fencepost.policy.ownership import run_owner
from fencepost.policy.phase import Phase
from fencepost.policy.reservations import (
    Claim,
    claim,
    step_amounts,
    stop_for_conflict,
    stop_for_unknown_account,
)
from fencepost.policy.state import as_turn, stop

if TYPE_CHECKING:
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.runtime import Runtime

__all__ = ["FencepostMiddleware", "FencepostState", "MiddlewareOrderError"]

# The second composition root: the loop's events it emits (a budget refusal) reach telemetry.
subscribe(telemetry.LISTENER)

TAKEN = frozenset({"approval", "ledger", "repeat_limit", "verdict_key", "clock", "denial"})
"""The :class:`~fencepost.LoopSettings` this binding takes; any other given a value of its own
is refused (``GraphConfigError`` naming it), never silently ignored."""

RUN_KEY = "fencepost_run"
"""The state field holding the run's record (fencepost's ``AgentState`` as JSON data)."""


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


class MiddlewareOrderError(GraphConfigError):
    """A middleware list puts a tool-wrapping middleware inside ``FencepostMiddleware``."""


class _ChatModelDecides:
    """The decision model of the middleware binding: LangChain's agent calls the chat model
    itself; ``LoopConfig`` needs one, and nothing of this binding ever asks it."""

    async def decide(self, input: Any, *, deadline: Any) -> Any:
        raise RuntimeError("create_agent calls the model; FencepostMiddleware never does")


class FencepostMiddleware(AgentMiddleware[FencepostState, Any, Any]):
    """fencepost's policy layer for LangChain's ``create_agent``: put it LAST in the middleware
    list (innermost around the tools).

    ``tools_or_registry`` are the :class:`~fencepost.policy.ToolSpec` s of the agent's tools
    (``fp.tool(lc_tool, effect=..., capability=...)``) or a ready ``ToolRegistry``: the names
    must be the LangChain tools' given to ``create_agent``. ``budget`` is each run's budget
    (default: 8 model steps, 8 tool calls). The other settings are ``fp.create_agent``'s, an
    :class:`~fencepost.LoopSettings` given as ``settings`` or its fields as keyword arguments
    (a keyword wins), with the same defaults and checks. It takes ``approval``
    (``"terminate"`` | ``"interrupt"``), ``ledger``, ``repeat_limit``, ``verdict_key``,
    ``clock`` and ``denial`` (``"end_run"`` | ``"observe"``); any other setting given a value
    of its own is refused (a ``GraphConfigError`` names it), never ignored: with
    ``approval="interrupt"`` the requester answers.

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
            if value != setting.default:
                raise GraphConfigError(
                    setting.name,
                    "is not taken by FencepostMiddleware yet: use approval='interrupt' (a "
                    f"person answers) or fp.create_agent(..., {setting.name}=...)",
                )
        if budget is not None and not isinstance(budget, RuntimeBudget):
            raise GraphConfigError("budget", "must be an fp.RuntimeBudget")
        self.budget = budget or default_budget()
        # LangChain's agent calls the model: no step is kept for answering, no refused
        # proposal is given back to repair, and a step reserves no token estimate.
        self.cfg: LoopConfig = LoopConfig.of(
            registry_of(tools_or_registry),
            _ChatModelDecides(),
            replace(given, tokens_per_step=0, answer_margin=0, repair_attempts=0),
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

    @hook_config(can_jump_to=["end"])
    def after_model(self, state: FencepostState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return drive(self._gate(SyncIO(self.cfg), state, runtime.context))

    @hook_config(can_jump_to=["end"])
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

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        io = SyncIO(self.cfg)
        admitted = drive(self._admit(io, request))
        if isinstance(admitted, ToolMessage):
            return admitted
        try:
            result = handler(request)
        except Exception as exc:
            return drive(self._failed(io, request, admitted, exc))
        return drive(self._ran(io, request, admitted, result))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        io = AsyncIO(self.cfg)
        admitted = await self._admit(io, request)
        if isinstance(admitted, ToolMessage):
            return admitted
        try:
            result = await handler(request)
        except Exception as exc:
            return await self._failed(io, request, admitted, exc)
        return await self._ran(io, request, admitted, result)

    # -- the bodies ---------------------------------------------------------------------------

    async def _start(
        self, io: NodeIO, values: FencepostState, context: Any
    ) -> dict[str, Any] | None:
        """A run starts with new input on a thread whose last run ended (or on a new thread);
        input on a run that has not ended goes on with that run and its budget."""
        ctx = coerce_context(context)
        record = _record(values)
        if record is not None and not record.is_terminal:
            return None if ctx is not None else _end(record, stop(_DENIED, "invalid_context"))
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
            return _end(run, stop(_DENIED, "invalid_context"))
        try:
            balance = await io.open_account(
                account_of(run),
                self.budget.limits(),
                parent=ctx.budget_account,
                owner=run_owner(ctx, run.run_id),
            )
        except LookupError:
            return _end(run, stop_for_unknown_account())
        except ValueError:
            return _end(run, stop_for_conflict())
        run = with_budget_view(run, balance)
        return {RUN_KEY: _dump(run), "termination": None, "last_error_code": None}

    async def _step(
        self, io: NodeIO, values: FencepostState, context: Any
    ) -> dict[str, Any] | None:
        """Reserve the next model step before the model is called."""
        run = _record(values)
        ctx = coerce_context(context)
        if run is None or ctx is None:
            return _end(run, stop(_DENIED, "invalid_context"))
        if run.is_terminal:
            return {"jump_to": "end"}
        if ctx.deadline is not None and ctx.deadline.expired(clock=self.cfg.clock):
            return await self._close(io, run, stop(TerminationReason.DEADLINE_EXCEEDED))
        run = _answered(run)
        held = await reserve(io, run, ctx, step_key(account_of(run), run.step + 1), step_amounts(0))
        if isinstance(held, StopRequest):
            return await self._close(io, run, held)
        run = with_budget_view(run.model_copy(update={"step": run.step + 1}), held.balance)
        return {RUN_KEY: _dump(run)}

    async def _gate(
        self, io: NodeIO, values: FencepostState, context: Any
    ) -> dict[str, Any] | None:
        """Gate and reserve the model's tool calls, all of them before any runs."""
        run = _record(values)
        ctx = coerce_context(context)
        if run is None or ctx is None:
            return _end(run, stop(_DENIED, "invalid_context"))
        if run.is_terminal:
            return {"jump_to": "end"}
        message = _last_ai(values.get("messages", []))
        if message is None:
            return None
        if message.invalid_tool_calls:
            return await self._close(io, run, stop(_INVALID, "malformed_tool_call"), message)
        if not message.tool_calls:
            return await self._close(io, run, stop(TerminationReason.COMPLETED))
        try:
            calls = [
                ToolProposal(call_id=c["id"] or "", tool_name=c["name"], arguments=c["args"])
                for c in message.tool_calls
            ]
        except ValidationError:
            return await self._close(io, run, stop(_INVALID, "invalid_tool_call"), message)
        refused = refused_batch(calls, run.answered, frozenset())
        if refused is not None:
            telemetry.batch_refused(run.run_id, calls, self.cfg.registry, refused.error_code or "")
            return await self._close(io, run, refused, message)
        cfg = self.cfg
        gated = gate_batch(
            cfg.registry,
            calls,
            run,
            ctx.principal,
            repeat_limit=cfg.repeat_limit,
            approval=cfg.approval,
            now=cfg.clock.now(),
            context=ctx,
            denial=cfg.denial,
        )
        telemetry.gated(run.run_id, gated.batch, gated.specs)
        if gated.stop is not None:
            return await self._close(io, run, gated.stop, message)
        update = {"phase": Phase.VALIDATE, "batch": gated.batch, "fingerprints": gated.fingerprints}
        run, stopped = await reserve_batch(io, run, ctx, gated=update)
        if stopped is not None:
            return await self._close(io, run, stopped, message)
        asked = waiting(run.batch, run_id=run.run_id, verdict_key=cfg.verdict_key)
        if asked:
            run, stopped = await self._approve(io, run, ctx, asked)
            if stopped is not None:
                return await self._close(io, run, stopped, message)
        return {RUN_KEY: _dump(run)}

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
        result = apply_approvals(
            run,
            answers,
            cfg.registry,
            ctx.principal,
            repeat_limit=cfg.repeat_limit,
            now=cfg.clock.now(),
            asked=asked,
            context=ctx,
            approved_by=ctx.principal.id,
        )
        run = run.model_copy(update={"batch": result.batch, "fingerprints": result.fingerprints})
        if result.stop is not None:
            return run, result.stop
        return await reserve_batch(io, run, ctx, frozenset(e.call_id for e in asked))

    async def _admit(self, io: NodeIO, request: ToolCallRequest) -> Any:
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
        entry = next((e for e in run.batch if e.call_id == call_id), None)
        if entry is None:
            return _refusal(call_id, name, ErrorCode.PERMISSION_DENIED.value)
        verdict = entry.verdict
        if not verdict.allowed:
            return _refusal(call_id, name, verdict.code.value)
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
        account = account_of(run)
        attempt = 1
        while True:
            marker = await reserve(io, run, ctx, started_key(account, call_id, attempt), {})
            if isinstance(marker, StopRequest):
                return _refusal(call_id, name, marker.error_code or marker.reason.value)
            if not marker.existing:
                return run, ctx, account, call_key(account, call_id, attempt)
            if claim(spec, started_before=True) is Claim.UNCERTAIN:
                return _refusal(call_id, name, ErrorCode.EXECUTION_UNCERTAIN.value)
            attempt += 1
            held = await reserve(
                io, run, ctx, call_key(account, call_id, attempt), {"tool_calls": 1.0}
            )
            if isinstance(held, StopRequest):
                return _refusal(call_id, name, held.error_code or held.reason.value)

    async def _ran(
        self, io: NodeIO, request: ToolCallRequest, admitted: Any, result: Any
    ) -> ToolMessage | Command[Any]:
        run, ctx, account, key = admitted
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
        await mark_result(io, run, ctx, account, call_id)
        return result  # type: ignore[no-any-return]

    async def _failed(
        self, io: NodeIO, request: ToolCallRequest, admitted: Any, exc: Exception
    ) -> ToolMessage:
        run, _ctx, _account, key = admitted
        call_id = str(request.tool_call.get("id") or "")
        name = str(request.tool_call.get("name") or "")
        code = error_code_for(exc)
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
        out = _end(run, request)
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


def _end(run: RunState | None, request: StopRequest) -> dict[str, Any]:
    out: dict[str, Any] = {
        "jump_to": "end",
        "termination": request.reason.value,
        "last_error_code": request.error_code,
    }
    if run is not None:
        out[RUN_KEY] = _dump(
            run.model_copy(
                update={
                    "phase": Phase.TERMINAL,
                    "termination": request.reason,
                    "last_error_code": request.error_code,
                    "stop": None,
                }
            )
        )
    return out


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
    return run.model_dump(mode="json")


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
