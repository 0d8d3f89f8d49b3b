"""The gate step of a decision: judge the whole batch, then reserve it, before any of it runs."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from fencepost.graph.account import account_of, produced, reserve_batch
from fencepost.graph.containment.model import run_model
from fencepost.graph.containment.tools import is_async, run_callable
from fencepost.graph.events import EVENTS
from fencepost.graph.node_io import NodeIO
from fencepost.graph.rules import ContainedRules, judged_with_rules
from fencepost.graph.trace import checked_manifest
from fencepost.policy import (
    AgentState,
    Deadline,
    Phase,
    StepManifest,
    ToolProposal,
    VerdictCode,
    reduce_tool_events,
    stage_deadline,
)
from fencepost.policy.approver import (
    APPROVER_FAILED,
    APPROVER_TIMEOUT,
    APPROVER_TIMEOUT_SECONDS,
    ApproverDecision,
    ApproverInput,
    apply_approver,
    approver_input,
    read_decision,
    to_approve,
)
from fencepost.policy.batch import Batch
from fencepost.policy.cancellation import cancelled_by_caller
from fencepost.policy.conditional_approval import (
    NEEDS_APPROVAL_FAILED,
    NEEDS_APPROVAL_TIMEOUT_SECONDS,
    ApprovalQuestion,
    deciding,
    read_needs_approval,
)
from fencepost.policy.context import RunContext
from fencepost.policy.denial import gate_record, settled_calls
from fencepost.policy.developer_log import APPROVAL, raised
from fencepost.policy.effect import Effect
from fencepost.policy.execution import budget_refusals
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.gating import (
    GatedBatch,
    gate_batch,
    refused_batch,
)
from fencepost.policy.manifest import verdict_outcome
from fencepost.policy.outcome import receipt_for
from fencepost.policy.provenance import ObservedOutput
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.remembered import ApprovalScope, Remember, matching_scope, new_scope
from fencepost.policy.repair import given_back, may_repair
from fencepost.policy.tool import NeedsApproval


async def gate(
    io: NodeIO,
    state: AgentState,
    ctx: RunContext,
    calls: Sequence[ToolProposal],
    usage: dict[str, Any],
    *,
    outputs: Sequence[ObservedOutput] | None = None,
) -> tuple[AgentState, list[StepManifest]]:
    """Gate the whole batch, then reserve it call by call, before any of it runs. ``outputs``
    are the earlier tool outputs provenance traces values to (``None``: the run's own
    observations; a binding that keeps none passes its record of them)."""
    cfg = io.cfg
    # The phase is set with the step's first real change (one state copy less per decision);
    # nothing before it reads the phase.
    # Only a batch that names dependencies needs the ledger read for them: each one outside the
    # batch must be an earlier call whose tool returned a result (never a receipt in state).
    named = any(c.depends_on for c in calls)
    produced_outside = await _produced_outside(io, state, calls) if named else frozenset()
    refused = refused_batch(calls, state.answered, produced_outside)
    if refused is not None:
        m = checked_manifest(
            state,
            cfg,
            ctx,
            phase=Phase.VALIDATE,
            outcome="denied",
            decision_kind="tool",
            code=refused.error_code,
            **usage,
        )
        EVENTS.batch_refused(state.run_id, calls, cfg.registry, refused.error_code or "")
        return state.model_copy(update={"phase": Phase.VALIDATE, "stop": refused}), [m]
    now = cfg.clock.now()
    # Consulted before the approver or a human is asked: a live scope approves the call.
    remembered = await remembered_approvals(io, calls, ctx, now)

    rules = ContainedRules(ctx, cfg.clock)
    names = [c.tool_name for c in calls]

    def judge(needs_approval: dict[str, bool] | None = None) -> GatedBatch:
        return gate_batch(
            cfg.registry,
            calls,
            state,
            ctx.principal,
            repeat_limit=cfg.repeat_limit,
            approval=cfg.approval,
            now=now,
            context=ctx,
            denial=cfg.denial,
            approver=cfg.approver is not None,
            needs_approval=needs_approval,
            remembered=remembered,
            provenance=cfg.provenance,
            outputs=outputs,
            run_rule=rules,
        )

    async def judged(needs_approval: dict[str, bool] | None = None) -> GatedBatch:
        return await judged_with_rules(
            io, cfg.registry, names, lambda: judge(needs_approval), rules
        )

    gated = await judged()
    decided = _decided_per_call(cfg.registry, calls, cfg.needs_approval)
    if decided:
        # Asked only about calls that passed every check before approval (their arguments are
        # schema-valid), then the batch is judged again with the answers; a call of such a tool
        # that was not asked needs approval (fail closed).
        answers = dict.fromkeys(decided, True)
        for entry, spec in zip(gated.batch, gated.specs, strict=True):
            decider = decided.get(entry.call_id)
            if spec is not None and decider is not None and entry.verdict.code in _REACHED:
                question = ApprovalQuestion(proposal=entry.proposal, tool=spec, context=ctx)
                answers[entry.call_id] = await ask_needs_approval(io, decider, question, state)
        gated = await judged(answers)
    asked = to_approve(gated.batch) if gated.stop is None and cfg.approver is not None else []
    if asked:
        # Asked before anything of the batch is reserved, and written with the batch: an answer
        # is the checkpoint's, given once per gated call.
        decisions = {}
        for entry, spec in zip(gated.batch, gated.specs, strict=True):
            if spec is not None and entry.verdict.code is VerdictCode.APPROVAL_REQUIRED:
                request = approver_input(
                    entry, spec, state, ctx, gated.provenance.get(entry.call_id)
                )
                decisions[entry.call_id] = await ask_approver(io, request)
        batch = gated.batch
        fingerprints = gated.fingerprints
        answered = await judged_with_rules(
            io,
            cfg.registry,
            names,
            lambda: apply_approver(
                state,
                batch,
                decisions,
                fingerprints,
                cfg.registry,
                ctx.principal,
                context=ctx,
                approval=cfg.approval,
                denial=cfg.denial,
                repeat_limit=cfg.repeat_limit,
                now=now,
                run_rule=rules,
            ),
            rules,
        )
        gated = gated._replace(
            batch=await remember_approvals(
                io,
                answered.batch,
                {c: d.remember for c, d in decisions.items() if d.remember is not None},
                state,
                ctx,
                now,
                answered_by="approver",
            ),
            fingerprints=answered.fingerprints,
            stop=answered.stop,
        )
        EVENTS.approver_answered(state.run_id, asked, gated.batch, cfg.registry)
    EVENTS.gated(state.run_id, gated.batch, gated.specs)
    manifests = []
    for entry, spec in zip(gated.batch, gated.specs, strict=True):
        verdict = entry.verdict
        manifests.append(
            checked_manifest(
                state,
                cfg,
                ctx,
                phase=Phase.VALIDATE,
                outcome=verdict_outcome(verdict.code),
                decision_kind="tool",
                # The registered name (an exact str): the model's may be a str subclass.
                tool_name=spec.name if spec else None,
                effect=spec.effect if spec else None,
                verdict=verdict.code,
                **usage,
                **gate_record(verdict, cfg.denial),
            )
        )
        usage = {}
    gated_update: dict[str, Any] = {
        "phase": Phase.VALIDATE,
        "batch": gated.batch,
        "fingerprints": gated.fingerprints,
    }
    if gated.stop is not None:
        # One denial stops the whole batch: nothing in it runs, nothing is reserved. A repairable
        # one may be given back to the model instead (repair_attempts); then none of its calls
        # ran, so none counts as repeated (the counts it raised are not written).
        notes = may_repair(state, gated.batch, attempts=cfg.repair_attempts)
        if notes is not None:
            return given_back(state, notes), manifests
        return state.model_copy(update={**gated_update, "stop": gated.stop}), manifests
    if state.repair_notes:
        gated_update["repair_notes"] = ()  # a batch that passes clears them
    settled = settled_calls(gated.batch, cfg.registry, cfg.denial)
    if settled:
        # Denied as data (or rejected by the approver): observed and receipted now, never run;
        # the rest of the batch goes on.
        state = reduce_tool_events(
            state.model_copy(update={"batch": gated.batch}), tuple(o.event for o in settled)
        )
        state = state.model_copy(
            update={"receipts": state.receipts + tuple(receipt_for(o) for o in settled)}
        )
    # Written with the reservations' result: one copy of state for both.
    state, stopped = await reserve_batch(io, state, ctx, gated=gated_update)
    if stopped is None:
        return state, manifests
    # Nothing of the batch runs: each call the budget could not cover is still receipted.
    unfunded = tuple(receipt_for(o) for o in budget_refusals(state.batch))
    return state.model_copy(
        update={"receipts": state.receipts + unfunded, "stop": stopped}
    ), manifests


async def remembered_approvals(
    io: NodeIO, calls: Sequence[ToolProposal], ctx: RunContext, now: datetime
) -> dict[str, ApprovalScope]:
    """By call id, the live remembered approval scope of the run's tenant that matches each
    call needing approval (a write or external tool), read from the ledger's database.

    Keyed by the trusted context's tenant only, and matched by tool name and the canonical
    fingerprint of the arguments (:mod:`fencepost.policy.remembered`): nothing the model or a
    caller names picks the scope.
    """
    registry = io.cfg.registry
    tools = {
        c.tool_name
        for c in calls
        if type(c.tool_name) is str
        and c.tool_name in registry
        and registry.get(c.tool_name).effect is not Effect.READ
    }
    if not tools:
        return {}
    scopes = {name: await io.approval_scopes(ctx.tenant_id, name) for name in sorted(tools)}
    found: dict[str, ApprovalScope] = {}
    for call in calls:
        if call.tool_name not in tools or not scopes[call.tool_name]:
            continue
        try:
            fingerprint = proposal_fingerprint(call.tool_name, call.arguments)
        except (TypeError, ValueError):
            continue  # arguments no JSON holds: the gate refuses them, no scope approves them
        scope = matching_scope(
            scopes[call.tool_name], ctx.tenant_id, call.tool_name, fingerprint, now
        )
        if scope is not None:
            found[call.call_id] = scope
    return found


async def remember_approvals(
    io: NodeIO,
    batch: Batch,
    remember: Mapping[str, Remember],
    state: AgentState,
    ctx: RunContext,
    now: datetime,
    *,
    answered_by: Literal["approver", "human"],
) -> Batch:
    """Store the scope of each "approve always" answer (``remember``, by call id) whose call
    the approval let through, and name it in that call's verdict (so its receipt names it too),
    before the verdict is sealed. The scope is the trusted context's tenant's; its creator the
    context's principal.

    The scope's id is derived from run and call, so a replayed gate stores it once. A ledger
    that keeps no scopes stores nothing: the call is still approved, once.
    """
    named: dict[str, str] = {}
    for entry in batch:
        asked = remember.get(entry.call_id)
        if asked is None or not entry.verdict.allowed:
            continue
        scope = new_scope(
            asked,
            tenant_id=ctx.tenant_id,
            tool_name=entry.verdict.tool_name,
            fingerprint=entry.verdict.fingerprint,
            created_by=ctx.principal.id,
            answered_by=answered_by,
            run_id=state.run_id,
            call_id=entry.call_id,
            now=now,
        )
        stored = await io.remember_scope(scope)
        if stored is not None:
            named[entry.call_id] = stored.scope_id
    if not named:
        return batch
    return tuple(
        e.with_verdict(e.verdict.model_copy(update={"scope_id": named[e.call_id]}))
        if e.call_id in named
        else e
        for e in batch
    )


async def ask_approver(io: NodeIO, request: ApproverInput) -> ApproverDecision:
    """The graph's approver's answer for one call, contained: fail closed on anything but a
    decision in time.

    The approver gets at most its timeout, within the run's deadline: an answer after it is
    ``approver_timeout``, whatever it says. A sync one runs on a fencepost thread from its
    tenant's share (:func:`~fencepost.graph.containment.tools.run_callable`), left behind at its
    timeout as a sync tool body is. An ``async`` one runs as a task of its own on a
    leash, as a model call does (:func:`~fencepost.graph.containment.model.run_model`): past its
    timeout it is cancelled and left behind, never waited for, so one that ignores its
    cancellation neither holds the caller nor gets its late answer heard. Whatever it raises —
    an exception, its own ``CancelledError`` or ``GeneratorExit``, ``SystemExit`` — rejects the
    call ``approver_failed``, logged here with its traceback, never kept. Only the caller's own
    cancellation propagates (:func:`~fencepost.policy.cancellation.cancelled_by_caller`).
    """
    cfg = io.cfg
    approver = cfg.approver
    assert approver is not None
    run_deadline = request.context.deadline or Deadline.after(
        APPROVER_TIMEOUT_SECONDS, clock=cfg.clock
    )
    timeout = stage_deadline(
        run_deadline, max_stage_seconds=APPROVER_TIMEOUT_SECONDS, clock=cfg.clock
    ).remaining_seconds(clock=cfg.clock)
    if not timeout > 0:  # NaN included: no time left, the approver is not asked
        return ApproverDecision.reject(APPROVER_TIMEOUT)
    until = time.monotonic() + timeout
    if is_async(approver):
        try:
            answer = approver(request)
        except BaseException as exc:
            if cancelled_by_caller(exc):
                raise
            return _approver_failed(request, exc)
    else:
        # A sync approver runs on a fencepost thread, as a sync tool body does: one that blocks
        # is left behind at its timeout and never holds the node (nor invoke) while it blocks.
        ran = await io.call(
            lambda: run_callable(
                lambda: approver(request),
                timeout_seconds=timeout,
                tenant=request.context.tenant_id,
            )
        )
        if not ran.finished:
            return ApproverDecision.reject(APPROVER_TIMEOUT)
        if ran.raised is not None:
            return _approver_failed(request, ran.raised)
        answer = ran.value
    if inspect.isawaitable(answer):
        pending = answer
        run = await io.call(
            lambda: run_model(lambda: _awaited(pending), max(0.0, until - time.monotonic()))
        )
        if not run.finished:
            return ApproverDecision.reject(APPROVER_TIMEOUT)
        if run.error is not None:
            error = run.error
            raised_by = error.raised if isinstance(error, _ApproverRaised) else error
            return _approver_failed(request, raised_by)
        if run.cancelled:  # never: its own cancellation is carried as data by _awaited
            return ApproverDecision.reject(APPROVER_FAILED)
        answer = run.value
    if time.monotonic() > until:
        return ApproverDecision.reject(APPROVER_TIMEOUT)
    return read_decision(answer)


_REACHED = frozenset(
    {VerdictCode.ALLOWED, VerdictCode.APPROVAL_REQUIRED, VerdictCode.APPROVAL_PENDING}
)
"""Verdicts of a call that passed every check before approval."""


def _decided_per_call(
    registry: ToolRegistry, calls: Sequence[ToolProposal], graph: NeedsApproval | None
) -> dict[str, NeedsApproval]:
    """Per call id, the ``needs_approval`` callable that decides the call (its tool's, else
    the graph's), for the calls of registered tools that have one."""
    out: dict[str, NeedsApproval] = {}
    for call in calls:
        if call.tool_name in registry:
            decider = deciding(registry.get(call.tool_name), graph)
            if decider is not None:
                out[call.call_id] = decider
    return out


async def ask_needs_approval(
    io: NodeIO, decider: NeedsApproval, question: ApprovalQuestion, state: AgentState
) -> bool:
    """Whether one call needs approval, as ``decider`` answers, contained as an approver is
    (:func:`ask_approver`): at most its timeout within the run's deadline, a sync one on a
    fencepost thread and an ``async`` one on a leash, either left behind at its timeout. Fail
    closed: anything but ``True`` or ``False`` in time — what it raised (its own
    ``CancelledError``, ``GeneratorExit``, ``SystemExit`` included), a hang, another value —
    means it does, logged on ``fencepost.approval``. Only the caller's own cancellation
    propagates."""
    cfg = io.cfg
    call_id = question.proposal.call_id
    run_deadline = question.context.deadline or Deadline.after(
        NEEDS_APPROVAL_TIMEOUT_SECONDS, clock=cfg.clock
    )
    timeout = stage_deadline(
        run_deadline, max_stage_seconds=NEEDS_APPROVAL_TIMEOUT_SECONDS, clock=cfg.clock
    ).remaining_seconds(clock=cfg.clock)
    what = f"needs_approval, for {question.tool.name!r},"
    answer: object = None
    if not timeout > 0:  # NaN included: no time left, it is not asked
        return _fails_closed(what, "had no time left", state.run_id, call_id)
    until = time.monotonic() + timeout
    if is_async(decider):
        try:
            pending = decider(question)
        except BaseException as exc:
            if cancelled_by_caller(exc):
                raise
            return _raised_closed(what, exc, state.run_id, call_id)
        run = await io.call(
            lambda: run_model(lambda: _awaited(pending), max(0.0, until - time.monotonic()))
        )
        if not run.finished:
            return _fails_closed(what, "did not answer in time", state.run_id, call_id)
        if run.error is not None:
            error = run.error
            cause = error.raised if isinstance(error, _ApproverRaised) else error
            return _raised_closed(what, cause, state.run_id, call_id)
        answer = run.value
    else:
        ran = await io.call(
            lambda: run_callable(
                lambda: decider(question),
                timeout_seconds=timeout,
                tenant=question.context.tenant_id,
            )
        )
        if not ran.finished:
            return _fails_closed(what, "did not answer in time", state.run_id, call_id)
        if ran.raised is not None:
            return _raised_closed(what, ran.raised, state.run_id, call_id)
        answer = ran.value
        if inspect.isawaitable(answer):  # a sync callable handing back work nobody awaits
            if inspect.iscoroutine(answer):
                answer.close()
            answer = None
    if time.monotonic() > until:
        return _fails_closed(what, "did not answer in time", state.run_id, call_id)
    read = read_needs_approval(answer)
    if read is None:
        return _fails_closed(what, "answered no bool", state.run_id, call_id)
    return read


def _raised_closed(what: str, exc: BaseException, run_id: str, call_id: str) -> bool:
    raised(APPROVAL, what, exc, run_id=run_id, call_id=call_id, code=NEEDS_APPROVAL_FAILED)
    return True


def _fails_closed(what: str, why: str, run_id: str, call_id: str) -> bool:
    APPROVAL.warning(
        "%s %s (run %s, call %s): the call needs approval",
        what,
        why,
        run_id,
        call_id,
        extra={"run_id": run_id, "call_id": call_id, "code": NEEDS_APPROVAL_FAILED},
    )
    return True


class _ApproverRaised(Exception):
    """What an ``async`` approver raised, carried off its task as data: a task's own
    ``CancelledError`` would read as its cancellation, and asyncio re-raises ``SystemExit``
    and ``KeyboardInterrupt`` out of the event loop after failing the task."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(type(raised).__name__)
        self.raised = raised


async def _awaited(pending: Awaitable[object]) -> object:
    try:
        return await pending
    except BaseException as exc:
        if cancelled_by_caller(exc):
            raise  # its task was cancelled or closed at its timeout: nobody listens any more
        raise _ApproverRaised(exc) from None


def _approver_failed(request: ApproverInput, exc: BaseException) -> ApproverDecision:
    # Fail closed: the call is rejected; the traceback is the developer's, in the log only.
    raised(
        APPROVAL,
        f"the approver, for {request.tool.name!r},",
        exc,
        run_id=request.run_id,
        call_id=request.proposal.call_id,
        code=APPROVER_FAILED,
    )
    return ApproverDecision.reject(APPROVER_FAILED)


async def _produced_outside(
    io: NodeIO, state: AgentState, calls: Sequence[ToolProposal]
) -> frozenset[str]:
    inside = {c.call_id for c in calls}
    outside = {d for c in calls for d in c.depends_on if d not in inside}
    return await produced(io, account_of(state), outside) if outside else frozenset()
