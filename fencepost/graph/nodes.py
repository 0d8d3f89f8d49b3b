"""The loop's nodes. Thin: each calls the policy layer and writes state.

Every node is one sync body plus, where it calls out (the model, the tools), an async part; the
sync graph runs that part on a portal loop, the async graph awaits it. Policy logic is shared.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import interrupt
from pydantic import ValidationError

from fencepost.graph.context import RunContext, coerce_context
from fencepost.graph.portal import run_sync
from fencepost.graph.state import StartRequest, changed, load_state
from fencepost.policy import (
    AbstainProposal,
    Accepted,
    AgentState,
    BudgetAxis,
    BudgetExhausted,
    Clock,
    Deadline,
    Decided,
    DecisionInput,
    DecisionModel,
    Effect,
    ErrorCode,
    FinalProposal,
    InvalidProposal,
    Ledger,
    MissingCitation,
    Phase,
    Receipt,
    ReceiptStatus,
    RuntimeEvent,
    StepManifest,
    StopRequest,
    TerminationReason,
    ToolBatch,
    ToolContext,
    ToolFailed,
    ToolProposal,
    ToolRegistry,
    ToolSpec,
    ToolSucceeded,
    UnsupportedCitation,
    Verdict,
    VerdictCode,
    authorize,
    check_schema,
    error_code_for,
    fits_checkpoint,
    gate_proposal,
    is_retryable,
    proposal_fingerprint,
    reduce_tool_events,
    reserve_step,
    reserve_tool_call,
    seal_verdict,
    serialize_tool_result,
    stage_deadline,
    terminate,
    validate_final_answer,
    verdict_is_sealed,
)
from fencepost.policy.gates import HumanApprovalRequired, ToolPolicyDenied

Update = dict[str, Any]
ApprovalMode = Literal["terminate", "interrupt"]

# Supersteps a node needs, itself included, before LangGraph's recursion limit: decide needs
# room for execute and the terminal node after it; execute needs room for the terminal node
# (and, to hand back to decide, for decide to stop). Checked in the nodes, where RemainingSteps
# is real (update_state runs the routers with a scratch value).
NEEDS_DECIDE = 3
NEEDS_EXECUTE = 2
NEEDS_ANOTHER_DECIDE = 3


def out_of_supersteps(values: dict[str, Any], needs: int) -> bool:
    """True when fewer than ``needs`` supersteps remain before the recursion limit."""
    remaining = values.get("remaining_steps")
    return isinstance(remaining, int) and remaining < needs


@dataclass(frozen=True, slots=True)
class LoopConfig:
    """What the nodes need from the builder."""

    registry: ToolRegistry
    model: DecisionModel
    approval: ApprovalMode
    repeat_limit: int
    ledger: Ledger | None
    clock: Clock
    model_timeout_seconds: float
    require_citations: bool
    model_retries: int
    max_concurrent_tools: int
    verdict_key: bytes | None


def _stop(reason: TerminationReason, code: str | None = None, **kw: Any) -> StopRequest:
    return StopRequest(reason=reason, error_code=code, **kw)


def _manifest(
    state: AgentState,
    cfg: LoopConfig,
    ctx: RunContext | None,
    *,
    phase: Phase,
    outcome: Any,
    **fields: Any,
) -> StepManifest:
    deadline = ctx.deadline if ctx is not None else None
    return StepManifest(
        run_id=state.run_id,
        step=state.step,
        phase=phase,
        steps_remaining=state.budget.steps_remaining,
        tool_calls_remaining=state.budget.tool_calls_remaining,
        tokens_used=state.budget.tokens_used,
        deadline_remaining_ms=deadline.remaining_ms(clock=cfg.clock) if deadline else None,
        outcome=outcome,
        **fields,
    )


def _emit(runtime: Runtime[Any], manifests: Sequence[StepManifest]) -> None:
    writer = runtime.stream_writer
    for manifest in manifests:
        writer({"fencepost": "manifest", **manifest.model_dump(mode="json")})


def _with_manifests(state: AgentState, manifests: Sequence[StepManifest]) -> AgentState:
    return state.model_copy(update={"manifests": state.manifests + tuple(manifests)})


def guard(state: AgentState, ctx: RunContext | None, cfg: LoopConfig) -> StopRequest | None:
    """Checks every acting node makes first: trusted context present and matching, time left."""
    if ctx is None:
        return _stop(TerminationReason.POLICY_DENIED, "missing_context")
    if state.tenant_id != ctx.tenant_id or state.principal_id != ctx.principal.id:
        return _stop(TerminationReason.POLICY_DENIED, "context_mismatch")
    if ctx.deadline is not None and ctx.deadline.expired(clock=cfg.clock):
        return _stop(TerminationReason.DEADLINE_EXCEEDED, "deadline_exceeded")
    return None


def _begin(request: StartRequest, ctx: RunContext | None, cfg: LoopConfig) -> AgentState:
    """A new run's state, bound to the identity in the caller's context."""
    state = AgentState(
        run_id=request.run_id,
        question=request.question,
        budget=request.budget,
        tenant_id=ctx.tenant_id if ctx else None,
        principal_id=ctx.principal.id if ctx else None,
    )
    if cfg.ledger is not None and ctx is not None:
        cfg.ledger.open_account(_account(state), request.budget.limits(), parent=ctx.budget_account)
    return state


def _account(state: AgentState) -> str:
    return f"run:{state.run_id}"


def _step_key(state: AgentState, step: int) -> str:
    return f"{state.run_id}:step:{step}"


def _call_key(state: AgentState, call_id: str, attempt: int) -> str:
    return f"{state.run_id}:call:{call_id}:{attempt}"


def _reserve_step(state: AgentState, cfg: LoopConfig) -> AgentState:
    """Reserve the next model step in state and, with a ledger, durably before the model call.

    A key the ledger already holds means an earlier attempt at that step started and crashed:
    it is charged (never refunded) and the next step is reserved for this attempt.
    """
    while True:
        state = reserve_step(state).model_copy(update={"step": state.step + 1})
        if cfg.ledger is None:
            return state
        held = cfg.ledger.reserve(
            _account(state), _step_key(state, state.step), {BudgetAxis.STEPS.value: 1}
        )
        if not held.existing:
            return state


def _decision_input(state: AgentState, cfg: LoopConfig) -> DecisionInput:
    return DecisionInput.model_construct(
        run_id=state.run_id,
        question=state.question,
        observations=state.observations,
        proposals=state.proposals,
        catalog=tuple(cfg.registry.model_catalog()),
        budget=state.budget,
        step=state.step,
    )


class Nodes:
    """The node bodies for one built graph."""

    def __init__(self, cfg: LoopConfig) -> None:
        self.cfg = cfg

    # decide ---------------------------------------------------------------------------------

    def _decide_prepare(
        self, values: dict[str, Any], ctx: RunContext | None
    ) -> tuple[AgentState | None, AgentState, Update | None]:
        before = load_state(values)
        cfg = self.cfg
        if before is None:
            request = values.get("request")
            if not isinstance(request, StartRequest):
                request = StartRequest.model_validate(request, strict=False)
            state = _begin(request, ctx, cfg)
        else:
            state = before
        if state.is_terminal or state.stop is not None:
            return before, state, changed(before, state)
        stop = guard(state, ctx, cfg)
        if stop is None and out_of_supersteps(values, NEEDS_DECIDE):
            stop = _stop(TerminationReason.STEP_BUDGET_EXHAUSTED, "recursion_limit")
        if stop is None:
            try:
                state = _reserve_step(state, cfg)
            except BudgetExhausted as exc:
                stop = _stop(exc.reason, "budget_exhausted")
        if stop is not None:
            return before, state, changed(before, state.model_copy(update={"stop": stop}))
        state = state.model_copy(update={"phase": Phase.DECIDE})
        return before, state, None

    async def _ask_model(
        self, state: AgentState, ctx: RunContext
    ) -> Decided | InvalidProposal | StopRequest:
        cfg = self.cfg
        run_deadline = ctx.deadline or Deadline.after(cfg.model_timeout_seconds, clock=cfg.clock)
        deadline = stage_deadline(
            run_deadline, max_stage_seconds=cfg.model_timeout_seconds, clock=cfg.clock
        )
        try:
            raw = await asyncio.wait_for(
                cfg.model.decide(_decision_input(state, cfg), deadline=deadline),
                timeout=max(0.0, deadline.remaining_seconds(clock=cfg.clock)),
            )
        except InvalidProposal as exc:
            return exc
        except TimeoutError:
            if ctx.deadline is not None and ctx.deadline.expired(clock=cfg.clock):
                return _stop(TerminationReason.DEADLINE_EXCEEDED, "deadline_exceeded")
            return _stop(TerminationReason.FAILED, ErrorCode.TIMEOUT.value)
        except Exception as exc:
            # The model's own error text never reaches state: only its safe code.
            return _stop(TerminationReason.FAILED, error_code_for(exc).value)
        if isinstance(raw, ToolProposal | FinalProposal | AbstainProposal | ToolBatch):
            raw = Decided(decision=raw)
        if not isinstance(raw, Decided):
            return InvalidProposal("malformed_decision")
        decision = raw.decision
        calls = decision.calls if isinstance(decision, ToolBatch) else (decision,)
        if any(isinstance(c, ToolProposal) and not fits_checkpoint(c.arguments) for c in calls):
            # Valid JSON that no checkpoint could store: refused before it reaches state.
            return InvalidProposal("unrepresentable_arguments")
        return raw

    def _decide_finish(
        self,
        before: AgentState | None,
        state: AgentState,
        ctx: RunContext,
        outcome: Decided | InvalidProposal | StopRequest,
        runtime: Runtime[Any],
    ) -> Update:
        cfg = self.cfg
        if isinstance(outcome, StopRequest):
            m = _manifest(
                state, cfg, ctx, phase=Phase.DECIDE, outcome="error", code=outcome.error_code
            )
            _emit(runtime, [m])
            state = _with_manifests(state, [m])
            if _retryable_model_error(outcome) and state.model_failures < cfg.model_retries:
                # Ask again at the next step: the retry spends its own reserved step.
                state = state.model_copy(
                    update={
                        "model_failures": state.model_failures + 1,
                        "last_error_code": outcome.error_code,
                    }
                )
                return changed(before, state)
            return changed(before, state.model_copy(update={"stop": outcome}))
        if state.model_failures:
            state = state.model_copy(update={"model_failures": 0, "last_error_code": None})

        def end_with(stop: StopRequest, **manifest: Any) -> Update:
            manifest.setdefault("code", stop.error_code)
            m = _manifest(state, cfg, ctx, phase=Phase.DECIDE, **manifest)
            _emit(runtime, [m])
            return changed(before, _with_manifests(state, [m]).model_copy(update={"stop": stop}))

        if isinstance(outcome, InvalidProposal):
            stop = _stop(TerminationReason.INVALID_PROPOSAL, outcome.code)
            return end_with(stop, outcome="denied", decision_kind="invalid")
        decision = outcome.decision
        usage: dict[str, Any] = {
            "input_tokens": outcome.input_tokens,
            "output_tokens": outcome.output_tokens,
        }
        spent = (outcome.input_tokens or 0) + (outcome.output_tokens or 0)
        state = state.model_copy(update={"budget": state.budget.record(BudgetAxis.TOKENS, spent)})
        if isinstance(decision, FinalProposal):
            try:
                answer = validate_final_answer(
                    decision.answer, state, require_citations=cfg.require_citations
                )
            except (UnsupportedCitation, MissingCitation) as exc:
                stop = _stop(TerminationReason.INVALID_PROPOSAL, exc.code)
                return end_with(stop, outcome="denied", decision_kind="final", **usage)
            stop = _stop(TerminationReason.COMPLETED, answer=answer)
            return end_with(stop, outcome="decided", decision_kind="final", **usage)
        if isinstance(decision, AbstainProposal):
            stop = _stop(TerminationReason(decision.reason))
            return end_with(
                stop, outcome="decided", decision_kind="abstain", code=decision.reason, **usage
            )
        calls = decision.calls if isinstance(decision, ToolBatch) else (decision,)
        state, manifests = self._gate(state, calls, ctx, usage)
        _emit(runtime, manifests)
        return changed(before, _with_manifests(state, manifests))

    # gate -------------------------------------------------------------------------------------

    def _gate(
        self,
        state: AgentState,
        calls: Sequence[ToolProposal],
        ctx: RunContext,
        usage: dict[str, Any],
        *,
        approved: bool = False,
    ) -> tuple[AgentState, list[StepManifest]]:
        """Gate the whole batch, then reserve it, before any of it runs."""
        cfg = self.cfg
        state = state.model_copy(update={"phase": Phase.VALIDATE, "pending": tuple(calls)})
        answered = {o.call_id for o in state.observations}
        if len({c.call_id for c in calls}) != len(calls) or any(
            c.call_id in answered for c in calls
        ):
            m = _manifest(
                state,
                cfg,
                ctx,
                phase=Phase.VALIDATE,
                outcome="denied",
                decision_kind="tool",
                code="duplicate_call_id",
                **usage,
            )
            return state.model_copy(
                update={"stop": _stop(TerminationReason.INVALID_PROPOSAL, "duplicate_call_id")}
            ), [m]
        verdicts: list[Verdict] = []
        manifests: list[StepManifest] = []
        fingerprints = dict(state.fingerprints)
        stop: StopRequest | None = None
        for call in calls:
            verdict = gate_proposal(
                cfg.registry,
                call,
                state.model_copy(update={"fingerprints": fingerprints}),
                ctx.principal,
                repeat_limit=cfg.repeat_limit,
                approved=approved,
            )
            spec = cfg.registry.get(call.tool_name) if call.tool_name in cfg.registry else None
            if verdict.code is VerdictCode.APPROVAL_REQUIRED and cfg.approval == "interrupt":
                verdict = verdict.model_copy(update={"code": VerdictCode.APPROVAL_PENDING})
            elif verdict.allowed:
                fingerprints[verdict.fingerprint] = fingerprints.get(verdict.fingerprint, 0) + 1
            elif stop is None and verdict.termination is not None:
                stop = _stop(verdict.termination, verdict.code.value)
            verdicts.append(verdict)
            manifests.append(
                _manifest(
                    state,
                    cfg,
                    ctx,
                    phase=Phase.VALIDATE,
                    outcome="allowed"
                    if verdict.allowed
                    else (
                        "approval_pending"
                        if verdict.code is VerdictCode.APPROVAL_PENDING
                        else "denied"
                    ),
                    decision_kind="tool",
                    tool_name=call.tool_name if spec else None,
                    effect=spec.effect if spec else None,
                    verdict=verdict.code,
                    **usage,
                )
            )
            usage = {}
        state = state.model_copy(update={"fingerprints": fingerprints})
        if stop is not None:
            # One denial stops the whole batch: nothing in it runs, nothing is reserved.
            return state.model_copy(update={"verdicts": tuple(verdicts), "stop": stop}), manifests
        state, verdicts = self._reserve_calls(state, verdicts)
        return state.model_copy(
            update={"verdicts": tuple(verdicts), "stop": _stop_if_nothing_runs(verdicts)}
        ), manifests

    def _reserve_calls(
        self, state: AgentState, verdicts: list[Verdict]
    ) -> tuple[AgentState, list[Verdict]]:
        """Reserve allowed calls in order; those past the budget are marked, not run."""
        out: list[Verdict] = []
        for verdict in verdicts:
            if verdict.allowed:
                spec = self.cfg.registry.get(verdict.tool_name)
                try:
                    state = reserve_tool_call(state, mutation=spec.effect is not Effect.READ)
                except BudgetExhausted:
                    verdict = verdict.model_copy(update={"code": VerdictCode.BUDGET_EXHAUSTED})
                else:
                    if self.cfg.verdict_key is not None:
                        verdict = seal_verdict(
                            verdict, run_id=state.run_id, key=self.cfg.verdict_key
                        )
            out.append(verdict)
        return state, out

    # approve ----------------------------------------------------------------------------------

    def approve(self, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
        """Pause for a human on write/external calls; approve, reject or edit on resume."""
        cfg = self.cfg
        before = _require_state(values)
        waiting = [
            (call, verdict)
            for call, verdict in zip(before.pending, before.verdicts, strict=True)
            if verdict.code is VerdictCode.APPROVAL_PENDING
        ]
        payload = [
            {
                "call_id": call.call_id,
                "tool_name": call.tool_name,
                "arguments": call.arguments,
                "effect": cfg.registry.get(call.tool_name).effect.value,
                "capability": cfg.registry.get(call.tool_name).required_capability,
            }
            for call, _ in waiting
        ]
        response = interrupt({"fencepost": "approval", "calls": payload})
        # Everything below runs only on resume, with the context passed on resume.
        ctx = coerce_context(runtime.context)
        stop = guard(before, ctx, cfg)
        if stop is not None or ctx is None:
            return changed(before, before.model_copy(update={"stop": stop}))
        decisions = _approval_decisions(response, [call.call_id for call, _ in waiting])
        state = before
        verdicts = list(before.verdicts)
        pending = list(before.pending)
        manifests: list[StepManifest] = []
        rejected: list[RuntimeEvent] = []
        receipts: list[Receipt] = []
        for call, _ in waiting:
            index = pending.index(call)
            choice, arguments = decisions[call.call_id]
            spec = cfg.registry.get(call.tool_name)
            if choice == "reject":
                verdicts[index] = verdicts[index].model_copy(update={"code": VerdictCode.REJECTED})
                rejected.append(
                    ToolFailed(
                        call_id=call.call_id,
                        tool_name=call.tool_name,
                        error_code=ErrorCode.PERMISSION_DENIED,
                    )
                )
                receipts.append(
                    Receipt(
                        call_id=call.call_id,
                        tool_name=call.tool_name,
                        status=ReceiptStatus.DENIED,
                        error_code=ErrorCode.PERMISSION_DENIED,
                        attempts=0,
                    )
                )
                manifests.append(
                    _manifest(
                        state,
                        cfg,
                        ctx,
                        phase=Phase.VALIDATE,
                        outcome="denied",
                        decision_kind="tool",
                        tool_name=call.tool_name,
                        effect=spec.effect,
                        verdict=VerdictCode.REJECTED,
                    )
                )
                continue
            proposal = call
            if choice == "edit":
                try:
                    proposal = ToolProposal(
                        call_id=call.call_id, tool_name=call.tool_name, arguments=arguments or {}
                    )
                except ValidationError:
                    proposal = call.model_copy(update={"arguments": {"__invalid__": True}})
                pending[index] = proposal
            # Edited arguments pass every gate again; authorization is checked again at commit.
            verdict = gate_proposal(
                cfg.registry,
                proposal,
                state,
                ctx.principal,
                repeat_limit=cfg.repeat_limit,
                approved=True,
            )
            if verdict.allowed:
                fingerprints = dict(state.fingerprints)
                fingerprints[verdict.fingerprint] = fingerprints.get(verdict.fingerprint, 0) + 1
                state = state.model_copy(update={"fingerprints": fingerprints})
            verdicts[index] = verdict
            manifests.append(
                _manifest(
                    state,
                    cfg,
                    ctx,
                    phase=Phase.VALIDATE,
                    outcome="allowed" if verdict.allowed else "denied",
                    decision_kind="tool",
                    tool_name=call.tool_name,
                    effect=spec.effect,
                    verdict=verdict.code,
                )
            )
            if not verdict.allowed and verdict.termination is not None and stop is None:
                stop = _stop(verdict.termination, verdict.code.value)
        state = state.model_copy(update={"pending": tuple(pending)})
        if stop is None:
            state, new_verdicts = self._reserve_calls(
                state,
                [
                    v
                    for v, old in zip(verdicts, before.verdicts, strict=True)
                    if old.code is VerdictCode.APPROVAL_PENDING
                ],
            )
            it = iter(new_verdicts)
            verdicts = [
                next(it) if old.code is VerdictCode.APPROVAL_PENDING else v
                for v, old in zip(verdicts, before.verdicts, strict=True)
            ]
        state = state.model_copy(
            update={"verdicts": tuple(verdicts), "stop": stop or _stop_if_nothing_runs(verdicts)}
        )
        if rejected:
            state = reduce_tool_events(state, tuple(rejected))
            state = state.model_copy(update={"receipts": state.receipts + tuple(receipts)})
        _emit(runtime, manifests)
        return changed(before, _with_manifests(state, manifests))

    # execute ----------------------------------------------------------------------------------

    def _execute_prepare(
        self, values: dict[str, Any], before: AgentState, ctx: RunContext | None
    ) -> tuple[AgentState, list[tuple[ToolProposal, ToolSpec, int]], list[Any], Update | None]:
        cfg = self.cfg
        stop = guard(before, ctx, cfg)
        if stop is None and out_of_supersteps(values, NEEDS_EXECUTE):
            stop = _stop(TerminationReason.STEP_BUDGET_EXHAUSTED, "recursion_limit")
        if stop is not None or ctx is None:
            return before, [], [], changed(before, before.model_copy(update={"stop": stop}))
        state = before.model_copy(update={"phase": Phase.EXECUTE})
        done = {r.call_id for r in state.receipts}
        verdict_by_id = {v.call_id: v for v in state.verdicts}
        runnable: list[tuple[ToolProposal, ToolSpec, int]] = []
        # (call, spec, code, receipt status, attempts started) for calls settled without running
        early: list[Any] = []
        checked: list[tuple[ToolProposal, ToolSpec]] = []
        refused: list[ToolProposal] = []
        for call in state.pending:
            verdict = verdict_by_id.get(call.call_id)
            if call.call_id in done or verdict is None or not verdict.allowed:
                continue
            # The executor's own checks, whatever state says: the verdict must be for these very
            # arguments, the tool registered, the capability held now, and a write approvable
            # at all (never in terminate mode). A call refused here is receipted and ends the run.
            spec = cfg.registry.get(call.tool_name) if call.tool_name in cfg.registry else None
            try:
                if (
                    spec is None
                    or verdict.fingerprint != proposal_fingerprint(call.tool_name, call.arguments)
                    or (
                        cfg.verdict_key is not None
                        and not verdict_is_sealed(verdict, run_id=state.run_id, key=cfg.verdict_key)
                    )
                ):
                    raise ToolPolicyDenied(call.tool_name)
                authorize(spec, ctx.principal, approved=cfg.approval == "interrupt")
            except (ToolPolicyDenied, HumanApprovalRequired):
                refused.append(call)
                continue
            checked.append((call, spec))
        if refused:
            # As at the gate, one refusal stops the whole batch: none of it runs.
            denied = ErrorCode.PERMISSION_DENIED, ReceiptStatus.DENIED, 0
            early = [
                (
                    call,
                    cfg.registry.get(call.tool_name) if call.tool_name in cfg.registry else None,
                    *denied,
                )
                for call in state.pending
                if call in refused or any(call is c for c, _ in checked)
            ]
            return state, [], early, None
        for call, spec in checked:
            attempt = 1
            if cfg.ledger is not None:
                state, attempt, settled = self._claim_attempt(state, call, spec)
                if settled is not None:
                    early.append((call, spec, *settled))
                    continue
            runnable.append((call, spec, attempt))
        return state, runnable, early, None

    def _claim_attempt(
        self, state: AgentState, call: ToolProposal, spec: ToolSpec
    ) -> tuple[AgentState, int, tuple[ErrorCode, ReceiptStatus, int] | None]:
        """Durably mark this call's attempt as started; detect an earlier attempt that crashed.

        Returns the state (charged for any crashed attempt's retry), the attempt number, and,
        when the call must not run, the code and receipt status it ends with instead plus how
        many attempts had been started (each one charged).
        """
        ledger = self.cfg.ledger
        assert ledger is not None
        attempt = 1
        amounts = {BudgetAxis.TOOL_CALLS.value: 1.0}
        if spec.effect is not Effect.READ:
            amounts[BudgetAxis.MUTATIONS.value] = 1.0
        while True:
            key = _call_key(state, call.call_id, attempt)
            try:
                held = ledger.reserve(_account(state), key, amounts)
            except BudgetExhausted:
                if attempt == 1:
                    return state, attempt, (ErrorCode.BUDGET_EXHAUSTED, ReceiptStatus.DENIED, 0)
                uncertain = (ErrorCode.EXECUTION_UNCERTAIN, ReceiptStatus.UNCERTAIN, attempt - 1)
                return state, attempt, uncertain
            if not held.existing:
                return state, attempt, None
            # An earlier attempt started and never reported: its effect may have happened.
            if not spec.retry_safe:
                return (
                    state,
                    attempt,
                    (ErrorCode.EXECUTION_UNCERTAIN, ReceiptStatus.UNCERTAIN, attempt),
                )
            attempt += 1
            try:
                state = reserve_tool_call(state, mutation=spec.effect is not Effect.READ)
            except BudgetExhausted:
                uncertain = (ErrorCode.EXECUTION_UNCERTAIN, ReceiptStatus.UNCERTAIN, attempt - 1)
                return state, attempt, uncertain

    async def _run_calls(
        self, state: AgentState, ctx: RunContext, runnable: list[tuple[ToolProposal, ToolSpec, int]]
    ) -> list[tuple[RuntimeEvent, ReceiptStatus]]:
        if len(runnable) == 1:
            call, spec, attempt = runnable[0]
            return [await self._run_one(state, ctx, call, spec, attempt)]
        # The concurrency axis: at most this many calls of a batch are in flight at once.
        gate = asyncio.Semaphore(self.cfg.max_concurrent_tools)

        async def bounded(
            call: ToolProposal, spec: ToolSpec, attempt: int
        ) -> tuple[RuntimeEvent, ReceiptStatus]:
            async with gate:
                return await self._run_one(state, ctx, call, spec, attempt)

        return list(await asyncio.gather(*(bounded(c, s, a) for c, s, a in runnable)))

    async def _run_one(
        self, state: AgentState, ctx: RunContext, call: ToolProposal, spec: ToolSpec, attempt: int
    ) -> tuple[RuntimeEvent, ReceiptStatus]:
        cfg = self.cfg
        run_deadline = ctx.deadline or Deadline.after(spec.timeout_seconds, clock=cfg.clock)
        deadline = stage_deadline(
            run_deadline, max_stage_seconds=spec.timeout_seconds, clock=cfg.clock
        )
        tool_ctx = ToolContext.model_construct(
            run_id=state.run_id,
            tenant_id=ctx.tenant_id,
            principal_id=ctx.principal.id,
            deadline=deadline,
            idempotency_key=call.call_id,
            attempt=attempt,
        )
        try:
            args = check_schema(spec, call)
            timeout = max(0.0, deadline.remaining_seconds(clock=cfg.clock))
            if inspect.iscoroutinefunction(spec.execute):
                result = await asyncio.wait_for(spec.execute(args, tool_ctx), timeout=timeout)
            else:
                result = await asyncio.wait_for(
                    asyncio.to_thread(_call_sync, spec.execute, args, tool_ctx), timeout=timeout
                )
            status = (
                ReceiptStatus.ACCEPTED_PENDING
                if isinstance(result, Accepted)
                else ReceiptStatus.COMPLETED
            )
            event: RuntimeEvent = ToolSucceeded(
                call_id=call.call_id, tool_name=spec.name, result=serialize_tool_result(result)
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            code = error_code_for(exc)
            event = ToolFailed(
                call_id=call.call_id,
                tool_name=spec.name,
                error_code=code,
                retryable=is_retryable(code),
            )
            status = ReceiptStatus.FAILED
        if cfg.ledger is not None:
            cfg.ledger.settle(_call_key(state, call.call_id, attempt))
        return event, status

    def _execute_finish(
        self,
        state: AgentState,
        ctx: RunContext,
        runnable: list[tuple[ToolProposal, ToolSpec, int]],
        early: list[Any],
        results: list[tuple[RuntimeEvent, ReceiptStatus]],
        runtime: Runtime[Any],
        before: AgentState,
        last_superstep: bool = False,
    ) -> Update:
        cfg = self.cfg
        by_id: dict[str, tuple[ToolSpec | None, RuntimeEvent, ReceiptStatus, int]] = {}
        for (call, spec, attempt), (event, status) in zip(runnable, results, strict=True):
            by_id[call.call_id] = (spec, event, status, attempt)
        for call, maybe_spec, code, status, started in early:
            event = ToolFailed(call_id=call.call_id, tool_name=call.tool_name, error_code=code)
            by_id[call.call_id] = (maybe_spec, event, status, started)
        # Joined by call id, in the order the model proposed them: never by arrival order.
        ordered = [by_id[c.call_id] for c in state.pending if c.call_id in by_id]
        state = reduce_tool_events(state, tuple(e for _, e, _, _ in ordered))
        receipts = tuple(
            Receipt(
                call_id=e.call_id,
                tool_name=e.tool_name,
                status=status,
                error_code=e.error_code if isinstance(e, ToolFailed) else None,
                attempts=attempt,
            )
            for _, e, status, attempt in ordered
        )
        # Calls of the batch the budget could not cover: reported as not done, never run.
        receipts += tuple(
            Receipt(
                call_id=v.call_id,
                tool_name=v.tool_name,
                status=ReceiptStatus.DENIED,
                error_code=ErrorCode.BUDGET_EXHAUSTED,
                attempts=0,
            )
            for v in state.verdicts
            if v.code is VerdictCode.BUDGET_EXHAUSTED
        )
        manifests = [
            _manifest(
                state,
                cfg,
                ctx,
                phase=Phase.EXECUTE,
                outcome=(
                    "success"
                    if isinstance(e, ToolSucceeded)
                    else "uncertain"
                    if status is ReceiptStatus.UNCERTAIN
                    else "error"
                ),
                decision_kind="tool",
                tool_name=spec.name if spec else None,
                effect=spec.effect if spec else None,
                verdict=VerdictCode.ALLOWED,
                code=e.error_code.value if isinstance(e, ToolFailed) else status.value,
            )
            for spec, e, status, _ in ordered
        ]
        stop: StopRequest | None = None
        if any(
            status is ReceiptStatus.DENIED
            and isinstance(e, ToolFailed)
            and e.error_code is ErrorCode.PERMISSION_DENIED
            for _, e, status, _ in ordered
        ):
            stop = _stop(TerminationReason.POLICY_DENIED, "executor_refused")
        elif ctx.deadline is not None and ctx.deadline.expired(clock=cfg.clock):
            stop = _stop(TerminationReason.DEADLINE_EXCEEDED, "deadline_exceeded")
        elif any(v.code is VerdictCode.BUDGET_EXHAUSTED for v in state.verdicts) or any(
            isinstance(e, ToolFailed) and e.error_code is ErrorCode.BUDGET_EXHAUSTED
            for _, e, _, _ in ordered
        ):
            stop = _stop(TerminationReason.TOOL_BUDGET_EXHAUSTED, "budget_exhausted")
        elif last_superstep:
            # The results are recorded; there is no room left for another decision.
            stop = _stop(TerminationReason.STEP_BUDGET_EXHAUSTED, "recursion_limit")
        state = state.model_copy(
            update={
                "receipts": state.receipts + receipts,
                "pending": (),
                "verdicts": (),
                "stop": stop,
            }
        )
        _emit(runtime, manifests)
        return changed(before, _with_manifests(state, manifests))

    # terminal ---------------------------------------------------------------------------------

    def terminal(self, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
        """The single exit: the only place a terminal state is made."""
        before = load_state(values)
        ctx = coerce_context(runtime.context)
        start: AgentState | None = None
        if before is None:
            # The recursion limit left no room even for a first decision: the run still ends
            # with a reason, bound to whoever started it.
            request = values.get("request")
            if request is None:
                return {}
            if not isinstance(request, StartRequest):
                request = StartRequest.model_validate(request, strict=False)
            start = _begin(request, ctx, self.cfg)
        elif before.is_terminal:
            return {}
        current = before or start
        assert current is not None
        stop = current.stop or _stop(TerminationReason.STEP_BUDGET_EXHAUSTED, "recursion_limit")
        state = terminate(current, stop.reason, answer=stop.answer, error_code=stop.error_code)
        m = _manifest(
            state, self.cfg, ctx, phase=Phase.TERMINAL, outcome="terminal", code=stop.reason.value
        )
        _emit(runtime, [m])
        state = _with_manifests(state, [m])
        return changed(before, state)

    # sync / async entry points ----------------------------------------------------------------

    def decide(self, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
        ctx = coerce_context(runtime.context)
        before, state, done = self._decide_prepare(values, ctx)
        if done is not None or ctx is None:
            return done or {}
        outcome = run_sync(self._ask_model(state, ctx))
        return self._decide_finish(before, state, ctx, outcome, runtime)

    async def adecide(self, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
        ctx = coerce_context(runtime.context)
        before, state, done = self._decide_prepare(values, ctx)
        if done is not None or ctx is None:
            return done or {}
        outcome = await self._ask_model(state, ctx)
        return self._decide_finish(before, state, ctx, outcome, runtime)

    def execute(self, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
        ctx = coerce_context(runtime.context)
        before = _require_state(values)
        state, runnable, early, done = self._execute_prepare(values, before, ctx)
        if done is not None or ctx is None:
            return done or {}
        results = run_sync(self._run_calls(state, ctx, runnable)) if runnable else []
        last = out_of_supersteps(values, NEEDS_ANOTHER_DECIDE)
        return self._execute_finish(state, ctx, runnable, early, results, runtime, before, last)

    async def aexecute(self, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
        ctx = coerce_context(runtime.context)
        before = _require_state(values)
        state, runnable, early, done = self._execute_prepare(values, before, ctx)
        if done is not None or ctx is None:
            return done or {}
        results = await self._run_calls(state, ctx, runnable) if runnable else []
        last = out_of_supersteps(values, NEEDS_ANOTHER_DECIDE)
        return self._execute_finish(state, ctx, runnable, early, results, runtime, before, last)


_RETRYABLE_MODEL_CODES = frozenset(
    {ErrorCode.RATE_LIMITED.value, ErrorCode.UNAVAILABLE.value, ErrorCode.TIMEOUT.value}
)


def _retryable_model_error(stop: StopRequest) -> bool:
    return stop.reason is TerminationReason.FAILED and stop.error_code in _RETRYABLE_MODEL_CODES


def _stop_if_nothing_runs(verdicts: Sequence[Verdict]) -> StopRequest | None:
    """A batch whose every call was refused for budget ends the run now, not at the next step."""
    if any(v.code is VerdictCode.BUDGET_EXHAUSTED for v in verdicts) and not any(
        v.allowed or v.code is VerdictCode.APPROVAL_PENDING for v in verdicts
    ):
        return _stop(TerminationReason.TOOL_BUDGET_EXHAUSTED, "budget_exhausted")
    return None


def _require_state(values: dict[str, Any]) -> AgentState:
    state = load_state(values)
    if state is None:
        raise RuntimeError("no run on this thread")
    return state


def _call_sync(fn: Callable[..., Any], args: Any, ctx: ToolContext) -> Any:
    result = fn(args, ctx)
    if inspect.isawaitable(result):
        raise TypeError("sync tool returned an awaitable")
    return result


def _approval_decisions(
    response: Any, call_ids: list[str]
) -> dict[str, tuple[str, dict[str, Any] | None]]:
    """Normalise a resume value; anything unrecognised is a rejection (a call never runs by default).

    Accepted shapes: ``"approve"``/``"reject"``; ``{"decision": "approve"|"reject"|"edit",
    "arguments": {...}}`` for every waiting call; or ``{call_id: <one of those>}`` per call.
    """

    def one(value: Any) -> tuple[str, dict[str, Any] | None]:
        if value in ("approve", "reject"):
            return str(value), None
        if isinstance(value, dict):
            decision = value.get("decision", value.get("type"))
            if decision in ("approve", "reject"):
                return str(decision), None
            if decision == "edit" and isinstance(value.get("arguments"), dict):
                return "edit", value["arguments"]
        return "reject", None

    if (
        isinstance(response, dict)
        and call_ids
        and all(k in call_ids for k in response)
        and response
    ):
        return {cid: one(response.get(cid)) for cid in call_ids}
    decision = one(response)
    return {cid: decision for cid in call_ids}
