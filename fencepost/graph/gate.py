"""The gate step of a decision: judge the whole batch, then reserve it, before any of it runs.

The node does the I/O (the ledger's facts, the tools' rules, ``needs_approval`` and the
approver, each contained, and the batch's reservation); what is asked, how the batch is judged
and what the run writes are plans of :mod:`fencepost.policy.gating` (facts in, one frozen plan
out).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from fencepost.graph.account import (
    RunAccount,
    StepSettlement,
    produced,
    reserve_batch,
    run_account_of,
    settle_pending,
)
from fencepost.graph.containment.model import run_model
from fencepost.graph.containment.tools import is_async, run_callable
from fencepost.graph.events import EVENTS
from fencepost.graph.node_io import NodeIO
from fencepost.graph.rules import ContainedRules, judged_with_rules
from fencepost.graph.settings import LoopConfig
from fencepost.policy import (
    AgentState,
    Deadline,
    Phase,
    StepManifest,
    ToolProposal,
    stage_deadline,
)
from fencepost.policy.approver import (
    APPROVER_FAILED,
    APPROVER_TIMEOUT,
    APPROVER_TIMEOUT_SECONDS,
    ApproverDecision,
    ApproverInput,
    read_decision,
)
from fencepost.policy.batch import Batch
from fencepost.policy.cancellation import cancelled_by_caller
from fencepost.policy.conditional_approval import (
    NEEDS_APPROVAL_FAILED,
    NEEDS_APPROVAL_TIMEOUT_SECONDS,
    ApprovalQuestion,
    read_needs_approval,
)
from fencepost.policy.context import RunContext
from fencepost.policy.developer_log import APPROVAL, raised
from fencepost.policy.gating import GatedBatch, GatePlan, GateSettings, end_gate, plan_gate
from fencepost.policy.manifest import manifest_base
from fencepost.policy.provenance import ObservedOutput
from fencepost.policy.remembered import Remember, scopes_named, scopes_to_remember
from fencepost.policy.rule_runner import run_directly
from fencepost.policy.state import StopRequest
from fencepost.policy.tool import NeedsApproval

_LAST_GATE: tuple[LoopConfig, GateSettings] | None = None
"""The last graph's gate settings: a graph's settings never change, so each step of its runs
reads the same ones (held by identity of the graph's settings, never by their values)."""


def gate_settings(cfg: LoopConfig) -> GateSettings:
    """The settings the gate phase reads, from the graph's."""
    global _LAST_GATE
    last = _LAST_GATE
    if last is not None and last[0] is cfg:
        return last[1]
    made = GateSettings(
        registry=cfg.registry,
        repeat_limit=cfg.repeat_limit,
        approval=cfg.approval,
        denial=cfg.denial,
        provenance=cfg.provenance,
        approver=cfg.approver is not None,
        needs_approval=cfg.needs_approval,
        repair_attempts=cfg.repair_attempts,
    )
    _LAST_GATE = (cfg, made)
    return made


async def gate(
    io: NodeIO,
    state: AgentState,
    ctx: RunContext,
    calls: Sequence[ToolProposal],
    usage: dict[str, Any],
    *,
    outputs: Sequence[ObservedOutput] | None = None,
    settle: StepSettlement | None = None,
    account: RunAccount | None = None,
) -> tuple[AgentState, list[StepManifest]]:
    """Plan the gate (what the ledger is asked, who decides what); judge the whole batch with
    the tools' rules contained; ask each ``needs_approval`` and the approver, contained, and
    judge again with their answers; write what the plan's end says and reserve the batch call
    by call, before any of it runs. ``outputs`` are the earlier tool outputs provenance traces
    values to (``None``: the run's own observations; a binding that keeps none passes its
    record of them). ``settle``: the model step's settlement that waited, written with the
    batch's reservations (or alone, when there are none). ``account``: the run's ledger
    account, where the node named it already (``account.run_account_of`` of ``state``)."""
    cfg = io.cfg
    plan = plan_gate(calls, gate_settings(cfg))
    # The phase is set with the step's first real change (one state copy less per decision);
    # nothing before it reads the phase.
    if plan.outside:
        account = account or run_account_of(state)
        outside: Collection[str] = await produced(io, account.name, plan.outside)
    else:
        outside = ()
    refused = plan.refused(state, outside)
    if refused is not None:
        EVENTS.batch_refused(state.run_id, calls, cfg.registry, refused.error_code or "")
    if refused is not None:
        judged: GatedBatch | StopRequest = refused
    elif plan.in_place:
        judged = judged_in_place(io, plan, state, ctx, outputs)
    else:
        judged = await judge_batch(io, plan, state, ctx, outputs)
    deadline = ctx.deadline
    left = deadline.remaining_ms(clock=cfg.clock) if deadline is not None else None
    base = manifest_base(state.run_id, state.step, state.budget, Phase.VALIDATE, left)
    end = end_gate(plan, state, judged, usage, base)
    manifests = list(end.manifests)
    if not end.reserves:
        await settle_pending(io, settle)
        return end.state, manifests
    # Written with the reservations' result: one copy of state for both.
    state, stopped = await reserve_batch(
        io, end.state, ctx, gated=end.gated, settle=settle, run=account
    )
    return end.reserved(state, stopped), manifests


def judged_in_place(
    io: NodeIO,
    plan: GatePlan,
    state: AgentState,
    ctx: RunContext,
    outputs: Sequence[ObservedOutput] | None,
) -> GatedBatch:
    """The batch as ``plan`` judges it when that needs no I/O (``GatePlan.in_place``: no
    scope to read, nobody to ask, no rule of a tool to contain): judged here, on the node."""
    gated = plan.judge(
        state,
        ctx,
        # Only a polling tool's call is judged by the time (``GatePlan.polls``).
        now=io.cfg.clock.now() if plan.polls else None,
        remembered={},
        outputs=outputs,
        run_rule=run_directly,
    )
    EVENTS.gated(state.run_id, gated.batch, gated.specs)
    return gated


async def judge_batch(
    io: NodeIO,
    plan: GatePlan,
    state: AgentState,
    ctx: RunContext,
    outputs: Sequence[ObservedOutput] | None,
) -> GatedBatch:
    """The batch as ``plan`` judges it, with the I/O it names: the tenant's remembered scopes
    read; the tools' rules run contained (:func:`~fencepost.graph.rules.judged_with_rules`);
    each ``needs_approval`` asked (:func:`ask_needs_approval`) and the batch judged again with
    the answers; the graph's approver asked (:func:`ask_approver`) and its answers applied,
    with the rules contained, and remembered."""
    cfg = io.cfg
    now = cfg.clock.now()
    # Read before the approver or a human is asked: a live scope approves the call.
    scopes = {name: await io.approval_scopes(ctx.tenant_id, name) for name in plan.scoped}
    remembered = plan.remembered(scopes, ctx.tenant_id, now) if scopes else {}
    rules = ContainedRules(ctx, cfg.clock)

    async def judged(needs_approval: dict[str, bool] | None = None) -> GatedBatch:
        return await judged_with_rules(
            io,
            cfg.registry,
            plan.names,
            lambda: plan.judge(
                state,
                ctx,
                now=now,
                remembered=remembered,
                outputs=outputs,
                run_rule=rules,
                needs_approval=needs_approval,
            ),
            rules,
        )

    gated = await judged()
    if plan.deciders:
        answers = {
            question.proposal.call_id: await ask_needs_approval(io, decider, question, state.run_id)
            for decider, question in plan.questions(gated, ctx)
        }
        gated = await judged(plan.needs_approval(answers))
    asked, requests = plan.approver_asks(gated, state, ctx)
    if asked:
        # Asked before anything of the batch is reserved, and written with the batch: an answer
        # is the checkpoint's, given once per gated call.
        decisions = {r.proposal.call_id: await ask_approver(io, r) for r in requests}
        before = gated
        answered = await judged_with_rules(
            io,
            cfg.registry,
            plan.names,
            lambda: plan.apply_approver(state, ctx, before, decisions, now=now, run_rule=rules),
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
    return gated


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
    for call_id, scope in scopes_to_remember(
        batch,
        remember,
        tenant_id=ctx.tenant_id,
        created_by=ctx.principal.id,
        answered_by=answered_by,
        run_id=state.run_id,
        now=now,
    ):
        stored = await io.remember_scope(scope)
        if stored is not None:
            named[call_id] = stored.scope_id
    return scopes_named(batch, named)


@dataclass(frozen=True, slots=True)
class _Answer:
    """How a contained callable (an approver, a ``needs_approval``) answered: ``answered`` with
    ``value`` in time; ``no_time`` (not asked: no time left); ``late`` (no answer in time);
    ``raised`` what it raised; ``lost`` (its task ended cancelled with no answer: never, its
    own cancellation is carried as data by :func:`_awaited`)."""

    status: Literal["answered", "no_time", "late", "raised", "lost"]
    value: object = None
    raised: BaseException | None = None


async def _ask_contained(
    io: NodeIO,
    fn: Callable[[Any], object],
    arg: object,
    *,
    max_seconds: float,
    ctx: RunContext,
    awaits_sync: bool,
) -> _Answer:
    """``fn(arg)``, contained: given at most ``max_seconds`` within the run's deadline. A sync
    ``fn`` runs on a fencepost thread from its tenant's share
    (:func:`~fencepost.graph.containment.tools.run_callable`), left behind at its timeout as a
    sync tool body is, and never holds the node (nor invoke) while it blocks; what it hands
    back to await is awaited on the same leash (``awaits_sync``), or closed and no answer. An
    ``async`` one runs as a task of its own on a leash, as a model call does
    (:func:`~fencepost.graph.containment.model.run_model`): past its timeout it is cancelled
    and left behind, never waited for, so one that ignores its cancellation neither holds the
    caller nor gets its late answer heard. Only the caller's own cancellation propagates
    (:func:`~fencepost.policy.cancellation.cancelled_by_caller`)."""
    clock = io.cfg.clock
    run_deadline = ctx.deadline or Deadline.after(max_seconds, clock=clock)
    timeout = stage_deadline(
        run_deadline, max_stage_seconds=max_seconds, clock=clock
    ).remaining_seconds(clock=clock)
    if not timeout > 0:  # NaN included: no time left, it is not asked
        return _Answer("no_time")
    until = time.monotonic() + timeout
    if is_async(fn):
        try:
            answer = fn(arg)
        except BaseException as exc:
            if cancelled_by_caller(exc):
                raise
            return _Answer("raised", raised=exc)
    else:
        ran = await io.call(
            lambda: run_callable(lambda: fn(arg), timeout_seconds=timeout, tenant=ctx.tenant_id)
        )
        if not ran.finished:
            return _Answer("late")
        if ran.raised is not None:
            return _Answer("raised", raised=ran.raised)
        answer = ran.value
        if not awaits_sync and inspect.isawaitable(answer):  # work nobody awaits
            if inspect.iscoroutine(answer):
                answer.close()
            answer = None
    if inspect.isawaitable(answer):
        pending = answer
        run = await io.call(
            lambda: run_model(lambda: _awaited(pending), max(0.0, until - time.monotonic()))
        )
        if not run.finished:
            return _Answer("late")
        if run.error is not None:
            error = run.error
            cause = error.raised if isinstance(error, _RaisedOnItsTask) else error
            return _Answer("raised", raised=cause)
        if run.cancelled:
            return _Answer("lost")
        answer = run.value
    if time.monotonic() > until:
        return _Answer("late")
    return _Answer("answered", value=answer)


async def ask_approver(io: NodeIO, request: ApproverInput) -> ApproverDecision:
    """The graph's approver's answer for one call, contained (:func:`_ask_contained`): fail
    closed on anything but a decision in time.

    The approver gets at most its timeout, within the run's deadline: an answer after it is
    ``approver_timeout``, whatever it says. Whatever it raises — an exception, its own
    ``CancelledError`` or ``GeneratorExit``, ``SystemExit`` — rejects the call
    ``approver_failed``, logged here with its traceback, never kept. A sync approver that hands
    back an awaitable has it awaited within the same timeout.
    """
    approver = io.cfg.approver
    assert approver is not None
    asked = await _ask_contained(
        io,
        approver,
        request,
        max_seconds=APPROVER_TIMEOUT_SECONDS,
        ctx=request.context,
        awaits_sync=True,
    )
    if asked.status == "answered":
        return read_decision(asked.value)
    if asked.raised is not None:
        return _approver_failed(request, asked.raised)
    if asked.status == "lost":
        return ApproverDecision.reject(APPROVER_FAILED)
    return ApproverDecision.reject(APPROVER_TIMEOUT)


async def ask_needs_approval(
    io: NodeIO, decider: NeedsApproval, question: ApprovalQuestion, run_id: str
) -> bool:
    """Whether one call needs approval, as ``decider`` answers, contained as an approver is
    (:func:`_ask_contained`): at most its timeout within the run's deadline, a sync one on a
    fencepost thread and an ``async`` one on a leash, either left behind at its timeout. Fail
    closed: anything but ``True`` or ``False`` in time — what it raised (its own
    ``CancelledError``, ``GeneratorExit``, ``SystemExit`` included), a hang, another value, an
    awaitable a sync one hands back — means it does, logged on ``fencepost.approval`` (with
    ``run_id``). Only the caller's own cancellation propagates."""
    call_id = question.proposal.call_id
    what = f"needs_approval, for {question.tool.name!r},"
    asked = await _ask_contained(
        io,
        decider,
        question,
        max_seconds=NEEDS_APPROVAL_TIMEOUT_SECONDS,
        ctx=question.context,
        awaits_sync=False,
    )
    if asked.raised is not None:
        return _raised_closed(what, asked.raised, run_id, call_id)
    if asked.status == "no_time":
        return _fails_closed(what, "had no time left", run_id, call_id)
    if asked.status == "late":
        return _fails_closed(what, "did not answer in time", run_id, call_id)
    read = read_needs_approval(asked.value)
    if read is None:
        return _fails_closed(what, "answered no bool", run_id, call_id)
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


class _RaisedOnItsTask(Exception):
    """What an awaited approver or ``needs_approval`` raised, carried off its task as data: a
    task's own ``CancelledError`` would read as its cancellation, and asyncio re-raises
    ``SystemExit`` and ``KeyboardInterrupt`` out of the event loop after failing the task."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(type(raised).__name__)
        self.raised = raised


async def _awaited(pending: Awaitable[object]) -> object:
    try:
        return await pending
    except BaseException as exc:
        if cancelled_by_caller(exc):
            raise  # its task was cancelled or closed at its timeout: nobody listens any more
        raise _RaisedOnItsTask(exc) from None


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
