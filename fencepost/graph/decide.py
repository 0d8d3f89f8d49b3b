"""The decide node: reserve a step, ask the model, judge its answer, gate and reserve the batch.

The node does the I/O; what each step holds, what the model's answer means and what the run
writes are plans of :mod:`fencepost.policy.decide` (facts in, one frozen plan out).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from dataclasses import dataclass, field
from types import FunctionType, MethodType
from typing import Any, cast

from langgraph.runtime import Runtime
from langgraph.types import interrupt

from fencepost.graph.account import (
    RunAccount,
    StepSettlement,
    StepWritten,
    answer_facts,
    balance_of,
    chain_left,
    node_thread,
    open_run,
    run_account_of,
    settle_pending,
    started_run_id,
    step_facts,
    with_budget_view,
    write_step,
)
from fencepost.graph.gate import gate
from fencepost.graph.node_io import NodeIO
from fencepost.graph.settings import LoopConfig, Update
from fencepost.graph.state import follows_input, load_state, new_run_state, request_from
from fencepost.graph.step_line import hold_step
from fencepost.graph.token_count import count_tokens
from fencepost.graph.trace import manifest, recorded
from fencepost.graph.writes import step_writes
from fencepost.policy import (
    AgentState,
    BudgetAxis,
    Deadline,
    Decided,
    DecisionInput,
    ErrorCode,
    InvalidProposal,
    Phase,
    StopRequest,
    ToolProposal,
    stage_deadline,
)
from fencepost.policy.context import RunContext, coerce_context
from fencepost.policy.decide import (
    ModelRaised,
    Settlement,
    StepPlan,
    StepSettings,
    accept_decision,
    end_step,
    log_raised,
    model_failure,
    plan_step,
    read_raised,
    reads_money_limit,
    settle_step,
    unreadable,
    waiting_for_requester,
)
from fencepost.policy.keys import step_key
from fencepost.policy.terminate import reopened
from fencepost.policy.usage import input_text


def step_settings(cfg: LoopConfig) -> StepSettings:
    """The settings a model step reads, from the graph's."""
    return StepSettings(
        registry=cfg.registry,
        tool_catalog=cfg.tool_catalog,
        tokens_per_step=cfg.tokens_per_step,
        price=cfg.price,
        answer_margin=cfg.answer_margin,
        model_retries=cfg.model_retries,
        require_citations=cfg.require_citations,
    )


@dataclass(frozen=True, slots=True)
class _Awaiting:
    """What a plain ``def decide`` handed back when it is an awaitable, carried off its thread
    to be awaited (and read) in containment too."""

    made: Awaitable[object]


def _read_on_thread(cfg: LoopConfig, inp: DecisionInput, deadline: Deadline) -> object:
    try:
        made = cfg.model.decide(inp, deadline=deadline)
        # Read where it was made: a reply that raises as it is read raises on its thread.
        return _Awaiting(made) if inspect.isawaitable(made) else accept_decision(made)
    except asyncio.CancelledError:
        raise  # its own: the step ends cancelled, as a task's would
    except BaseException as exc:
        return _read(exc)


def _read(exc: BaseException) -> ModelRaised:
    """What the model raised, read in its containment, where reading it (its ``code``, its
    type, its status) runs the model's code too; logged by the caller, only if it counts."""
    try:
        return read_raised(exc)
    except BaseException as unread:  # what the model raised, raising as it was read
        return unreadable(unread)


def _async_decide(model: object) -> bool:
    """Whether ``model``'s ``decide`` is an ``async def``, told without running any of the
    model's code: looking ``decide`` up is its code too (a property), and runs in containment.
    Only a plain function or method is judged here; any other ``decide`` is looked up and
    called on a thread, and an awaitable it hands back is awaited as an async one's."""
    found = inspect.getattr_static(model, "decide", None)
    if type(found) is MethodType:
        found = found.__func__
    return type(found) is FunctionType and inspect.iscoroutinefunction(found)


async def _contained(
    cfg: LoopConfig, inp: DecisionInput, deadline: Deadline, made: Awaitable[object] | None = None
) -> object:
    try:
        asked = cfg.model.decide(inp, deadline=deadline) if made is None else made
        # The reply is read here, in the model's containment: what the model hands back is
        # its code too (a property that raises ``SystemExit`` as the runtime asks its type).
        return accept_decision(await asked if inspect.isawaitable(asked) else asked)
    except (asyncio.CancelledError, GeneratorExit):
        raise  # the task cancelled or closed (or the model's own cancellation): its end
    except BaseException as exc:
        # Read here, what it raised is this step's outcome; asyncio would re-raise a
        # ``SystemExit`` or ``KeyboardInterrupt`` out of the event loop after failing the task.
        return _read(exc)


async def ask_model(
    io: NodeIO, plan: StepPlan, state: AgentState, ctx: RunContext
) -> Decided | InvalidProposal | StopRequest:
    """Ask the decision model, within the run's deadline and the model's own timeout.

    An ``async def`` model runs as a task of its own, a plain ``def`` one on a thread of the
    tenant's share (:mod:`fencepost.graph.containment.model`), so whatever it raises — an
    exception, a ``BaseException``, its own ``CancelledError`` — is this step's failure with a
    safe code, and a model that ignores its deadline is left behind: its text never reaches
    state and nothing it raises escapes ``invoke``. Only the caller's own cancellation
    propagates; no thread of its tenant's share for a ``def`` one: ``unavailable``.
    """
    cfg = io.cfg
    run_deadline = ctx.deadline or Deadline.after(cfg.model_timeout_seconds, clock=cfg.clock)
    deadline = stage_deadline(
        run_deadline, max_stage_seconds=cfg.model_timeout_seconds, clock=cfg.clock
    )
    inp = plan.decision_input(state)
    timeout = deadline.remaining_seconds(clock=cfg.clock)
    if _async_decide(cfg.model):
        run = await io.run_model(lambda: _contained(cfg, inp, deadline), timeout)
    else:
        # A plain ``def decide`` runs on a thread of the tenant's share, as a sync tool body.
        run = await io.run_model_on_thread(
            lambda: _read_on_thread(cfg, inp, deadline), timeout, tenant=ctx.tenant_id
        )
        if run.finished and isinstance(run.value, _Awaiting):
            # A ``def`` handing back an awaitable (a decorated ``async def``) is awaited where
            # an ``async def`` would be.
            made = run.value.made
            run = await io.run_model(
                lambda: _contained(cfg, inp, deadline, made),
                deadline.remaining_seconds(clock=cfg.clock),
            )
    passed = ctx.deadline is not None and ctx.deadline.expired(clock=cfg.clock)
    if not run.finished:
        code = ErrorCode.UNAVAILABLE if run.unavailable else ErrorCode.TIMEOUT
        return model_failure(code, run_deadline_passed=passed)
    if run.cancelled:
        return model_failure(ErrorCode.CANCELLED, run_deadline_passed=passed)
    # Read in containment already (``accept_decision``, ``read_raised``): a decision, why it
    # is none, or what the model raised; only a ``GeneratorExit`` of its own is left unread.
    value = run.value if run.error is None else unreadable(run.error)
    if isinstance(value, ModelRaised):
        log_raised(value, state.run_id)  # here, where the step's outcome counts
        if value.invalid is not None:
            return value.invalid
        return model_failure(value.code, run_deadline_passed=passed)
    return cast("Decided | InvalidProposal", value)


async def decide(io: NodeIO, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
    """Load or open the run, take its model step, gate the calls it proposes, write what the
    two phases made of it."""
    ctx = coerce_context(runtime.context)
    before, state = await _loaded(io, values, ctx)
    run = run_account_of(state)
    stepped = await model_step(io, run, state, ctx, values, runtime)
    if stepped.calls is None or stepped.ctx is None:
        if stepped.record is None or stepped.ctx is None:
            return step_writes(before, stepped.state)
        m = manifest(stepped.state, io.cfg, stepped.ctx, phase=Phase.DECIDE, **stepped.record)
        return step_writes(before, recorded(stepped.state, runtime, [m]))
    try:
        state, manifests = await gate(
            io,
            stepped.state,
            stepped.ctx,
            stepped.calls,
            stepped.usage,
            settle=stepped.settle,
            account=run,
        )
    except BaseException:
        await settle_pending(io, stepped.settle)  # never left in flight by what the gate raised
        raise
    return step_writes(before, recorded(state, runtime, manifests))


@dataclass(frozen=True, slots=True)
class Stepped:
    """What a model step made of the run: the run to write (its stop, if any, set) with the
    manifest fields the node records of the decision (``record``: none where no decision was
    made), or, when the model proposed calls, the run and the calls for the gate phase, with
    the step's usage for their manifests and its settlement when it is to be written with the
    calls' holds (``settle``)."""

    state: AgentState
    ctx: RunContext | None
    calls: tuple[ToolProposal, ...] | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    settle: StepSettlement | None = None
    record: dict[str, Any] | None = None


async def _loaded(
    io: NodeIO, values: dict[str, Any], ctx: RunContext | None
) -> tuple[AgentState | None, AgentState]:
    """The run as the checkpoint holds it (``None`` for a run this step starts) and the run the
    step goes on with: a thread's first run, or its next one after new input (the ended run
    kept as a turn), opened on the ledger, or its stop when the ledger refused it."""
    before = load_state(values)
    ended = before if before is not None and follows_input(before, values) else None
    if before is not None and ended is None:
        return before, before
    fork = values.get("fork")
    state = new_run_state(
        request_from(values, run_id=started_run_id()),
        ctx,
        ended,
        fork if isinstance(fork, str) else None,
        node_thread()[0] or None,
    )
    if ctx is None:
        return None, state
    opened = await open_run(io, state, ctx)
    if isinstance(opened, StopRequest):
        return None, state.model_copy(update={"stop": opened})
    return None, opened


async def model_step(
    io: NodeIO,
    run: RunAccount,
    state: AgentState,
    ctx: RunContext | None,
    values: dict[str, Any],
    runtime: Runtime[Any],
) -> Stepped:
    """Read what the ledger says on the run's account (``run``: the context the step acts in,
    the money limit where the plan needs it); plan the step (a stop, or what it holds); hold it
    in the ledger's line; ask the model; settle and charge what the settlement plan says; judge
    the outcome: the run with its stop and the manifest fields it records, or the calls it
    proposes for the gate phase."""
    if state.is_terminal:
        # An ending the terminal node did not make goes back to it to be judged.
        balance = await balance_of(io, run.name)
        return Stepped(reopened(state, balance) or state, ctx)
    if state.stop is not None:
        return Stepped(state, ctx)
    cfg = io.cfg
    settings = step_settings(cfg)
    facts = await step_facts(io, run, state, ctx, money=reads_money_limit(state, settings))
    # After an approver's answer the run goes on for the requester, with the capabilities its
    # account recorded; an older account records none, and the run waits for the requester.
    while facts.acting.waits_for_requester:
        interrupt(waiting_for_requester(state))
    ctx = facts.acting.context
    plan = plan_step(
        state,
        ctx,
        settings,
        given=runtime.context,
        remaining_steps=values.get("remaining_steps"),
        clock=cfg.clock,
        money_left=facts.money_left,
    )
    if plan.stop is not None or ctx is None:
        return Stepped(state.model_copy(update={"stop": plan.stop}), ctx)
    # What the model will be given, counted once and only where a token limit or a price needs
    # it (the count walks the whole run): the step number and budget it is also shown change
    # with the reservation, the text does not.
    shown, counted = state, list[int]()

    def sent() -> int:
        if not counted:
            counted.append(count_tokens(input_text(plan.decision_input(shown))))
        return counted[0]

    axes = (BudgetAxis.TOKENS, BudgetAxis.MONEY) if plan.holds_money else (BudgetAxis.TOKENS,)

    async def hold() -> tuple[int, int]:
        # Read again after each refusal (``step_line.hold_step``): others' steps settle.
        left = await chain_left(io, state, ctx, axes)
        return plan.hold(sent, left.tokens, left.money)

    while True:
        step = state.step + 1
        held, holds = await hold_step(
            io, run, ctx, step_key(run.name, step), hold, under_way=state.step > 0
        )
        if isinstance(held, StopRequest):
            return Stepped(state.model_copy(update={"stop": held}), ctx)
        state = with_budget_view(state.model_copy(update={"step": step}), held.balance)
        if not held.existing:
            # A number the ledger held already was an earlier attempt that started and crashed:
            # it stays charged, and this attempt holds the number after it.
            break
    # One name for the state the model is asked in: the budget view's copy before it is not
    # kept alive through the call (a run in flight waits there), nor is the step's reservation
    # (its balance's books: about 1.7 KB a run, read only for the view above).
    state = asked = state.model_copy(update={"phase": Phase.DECIDE})
    del held
    outcome = await ask_model(io, plan, asked, ctx)
    settled = settle_step(plan, asked, outcome, holds, sent, count_tokens)
    # A settlement that gives nothing back leaves the view the hold wrote: it waits to be
    # written with the calls the gate holds, in one ledger write.
    written = await write_step(
        io, run.name, asked, settled.actual, settled.overage, now=settled.settles_now
    )
    try:
        return await _ended_step(io, run, plan, ctx, outcome, settled, written)
    except BaseException:
        await settle_pending(io, written.later)  # never left in flight by what the step raised
        raise


async def _ended_step(
    io: NodeIO,
    run: RunAccount,
    plan: StepPlan,
    ctx: RunContext,
    outcome: Decided | InvalidProposal | StopRequest,
    settled: Settlement,
    written: StepWritten,
) -> Stepped:
    """The rest of :func:`model_step`, its settlement written (or waiting, ``written.later``):
    judge its outcome, with the ledger's facts about a final answer (``settled.citations``):
    the run's end, or the calls to gate."""
    state = written.state
    cited = settled.citations
    facts = await answer_facts(io, run.name, state, cited) if cited is not None else None
    end = end_step(plan, state, outcome, settled, written.charged, facts)
    if end.record is None:
        return Stepped(end.state, ctx, tuple(end.calls), settled.usage, written.later)
    await settle_pending(io, written.later)
    return Stepped(end.state, ctx, record=end.record)
