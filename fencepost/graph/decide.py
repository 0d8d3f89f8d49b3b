"""The decide node: reserve a step, ask the model, judge its answer, gate and reserve the batch."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime
from langgraph.types import interrupt

from fencepost.graph.account import (
    account_of,
    charge,
    open_run,
    pending_work,
    produced,
    started_run_id,
    tokens_left,
    with_budget_view,
)
from fencepost.graph.endings import unverified_ending
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
    Deadline,
    Decided,
    DecisionInput,
    ErrorCode,
    FinalProposal,
    InvalidProposal,
    Phase,
    StopRequest,
    error_code_for,
    stage_deadline,
)
from fencepost.policy.approval import approver_of, waiting_for_requester
from fencepost.policy.context import RunContext, coerce_context
from fencepost.policy.decide import (
    FinalRefused,
    accept_decision,
    after_decision,
    after_model_error,
    conclude,
    decision_record,
    final_turn,
    model_failure,
    step_taken,
)
from fencepost.policy.developer_log import MODEL, raised
from fencepost.policy.keys import overage_key, step_key
from fencepost.policy.may_go_on import check_before_acting
from fencepost.policy.recursion_limit import NEEDS_DECIDE, recursion_stop
from fencepost.policy.reservations import step_hold, stop_for_exceeded
from fencepost.policy.turns import shown_turns
from fencepost.policy.usage import (
    UsageKind,
    UsageReport,
    input_text,
    reply_size,
    reply_text,
    step_settlement,
    usage_report,
)


async def step_estimate(io: NodeIO, state: AgentState, ctx: RunContext, sent: int) -> int:
    """Tokens a step holds before the model is asked: ``reservations.step_hold`` of the
    ``sent`` tokens it is about to send, the model's output cap (``tokens_per_step``) and what
    the run's chain has not spent (read from the ledger)."""
    return step_hold(sent, io.cfg.tokens_per_step, await tokens_left(io, state, ctx))


def decision_input(state: AgentState, cfg: LoopConfig) -> DecisionInput:
    """What the model is shown: the question, the observations as data, the tool catalog, and
    the thread's earlier turns (question and answer) within a window."""
    shown = shown_turns(state.turns)
    return DecisionInput.model_construct(
        run_id=state.run_id,
        question=state.question,
        observations=state.observations,
        proposals=state.proposals,
        catalog=tuple(cfg.registry.model_catalog()),
        budget=state.budget,
        step=state.step,
        pending_tasks=state.open_tasks,
        final_turn=final_turn(state.budget.steps_remaining, cfg.answer_margin),
        repair=state.repair_notes,
        answered=state.answered,
        turns=shown[0],
        turns_left_out=shown[1],
    )


class _ModelRaised(Exception):
    """A BaseException the decision model raised, carried as data off its task."""

    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.value)
        self.code = code


async def _contained(cfg: LoopConfig, inp: DecisionInput, deadline: Deadline) -> object:
    try:
        return await cfg.model.decide(inp, deadline=deadline)
    except (KeyboardInterrupt, SystemExit) as exc:
        # asyncio re-raises these two out of the event loop after failing the task: caught
        # here they are this step's failure, as they are for a tool.
        _model_raised(exc, inp.run_id, ErrorCode.INTERNAL_ERROR)
    raise _ModelRaised(ErrorCode.INTERNAL_ERROR)


def _model_raised(exc: BaseException, run_id: str, code: ErrorCode) -> None:
    raised(MODEL, "the decision model", exc, run_id=run_id, call_id=None, code=code.value)


async def ask_model(
    io: NodeIO, state: AgentState, ctx: RunContext
) -> Decided | InvalidProposal | StopRequest:
    """Ask the decision model, within the run's deadline and the model's own timeout.

    The model runs as a task of its own (:mod:`fencepost.graph.containment.model`), so whatever it
    raises — an exception, a ``BaseException``, its own ``CancelledError`` — is this step's
    failure with a safe code, and a model that ignores its deadline is left behind: its text
    never reaches state and nothing it raises escapes ``invoke``. Only the caller's own
    cancellation propagates.
    """
    cfg = io.cfg
    run_deadline = ctx.deadline or Deadline.after(cfg.model_timeout_seconds, clock=cfg.clock)
    deadline = stage_deadline(
        run_deadline, max_stage_seconds=cfg.model_timeout_seconds, clock=cfg.clock
    )
    inp = decision_input(state, cfg)
    run = await io.run_model(
        lambda: _contained(cfg, inp, deadline), deadline.remaining_seconds(clock=cfg.clock)
    )
    passed = ctx.deadline is not None and ctx.deadline.expired(clock=cfg.clock)
    if not run.finished:
        return model_failure(ErrorCode.TIMEOUT, run_deadline_passed=passed)
    if run.cancelled:
        return model_failure(ErrorCode.CANCELLED, run_deadline_passed=passed)
    exc = run.error
    if isinstance(exc, InvalidProposal):
        return exc
    if isinstance(exc, _ModelRaised):
        return model_failure(exc.code, run_deadline_passed=passed)
    if exc is not None:
        code = error_code_for(exc) if isinstance(exc, Exception) else ErrorCode.INTERNAL_ERROR
        _model_raised(exc, state.run_id, code)
        return model_failure(code, run_deadline_passed=passed)
    return accept_decision(run.value)


async def decide(io: NodeIO, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
    """Refuse if terminal or out of time or budget; reserve one step; ask the model; gate."""
    cfg = io.cfg
    ctx = coerce_context(runtime.context)
    before = load_state(values)
    ended = before if before is not None and follows_input(before, values) else None
    if before is None or ended is not None:
        # A thread's first run, or its next one after new input (the ended run kept as a turn).
        state = new_run_state(request_from(values, run_id=started_run_id()), ctx, ended)
        before = None
        if ctx is not None:
            opened = await open_run(io, state, ctx)
            if isinstance(opened, StopRequest):
                return step_writes(None, state.model_copy(update={"stop": opened}))
            state = opened
    else:
        state = before
    if state.is_terminal:
        # An ending the terminal node did not make goes back to it to be judged.
        return step_writes(before, await unverified_ending(io, state) or state)
    if state.stop is not None:
        return step_writes(before, state)
    if approver_of(state, ctx, state.receipts):
        # An approver's answer ran the calls it approved; the model's next step is the
        # requester's to take, under its own capabilities: the run waits for the requester
        # (``invoke(None, config, context=<the requester's>)``), whatever anyone else resumes.
        while True:
            interrupt(waiting_for_requester(state))
    refused = check_before_acting(state, ctx, clock=cfg.clock, given=runtime.context)
    refused = refused or recursion_stop(values.get("remaining_steps"), NEEDS_DECIDE)
    if refused is not None or ctx is None:
        return step_writes(before, state.model_copy(update={"stop": refused}))
    account = account_of(state)
    # What the model will be given, counted once: the step number and budget it is also shown
    # change with the reservation, the text does not.
    sent = count_tokens(input_text(decision_input(state, cfg)))

    async def hold(facts: AgentState) -> int:
        return await step_estimate(io, facts, ctx, sent)

    while True:
        step = state.step + 1
        held, estimate = await hold_step(io, state, ctx, step_key(account, step), hold)
        if isinstance(held, StopRequest):
            return step_writes(before, state.model_copy(update={"stop": held}))
        state = with_budget_view(state.model_copy(update={"step": step}), held.balance)
        if step_taken(held_before=held.existing):
            break
    state = state.model_copy(update={"phase": Phase.DECIDE})
    asked = state
    outcome = await ask_model(io, asked, ctx)
    report = (
        usage_report(
            outcome.input_tokens,
            outcome.output_tokens,
            # Where nothing limits tokens nothing was held, and an unreported step is not
            # counted either: a reported one is still charged.
            counted=sent + count_tokens(reply_text(outcome.decision)) if estimate else 0,
            reply_chars=reply_size(outcome.decision),
        )
        if isinstance(outcome, Decided)
        # A call that failed reported nothing, and what it cost is unknown: its hold (the
        # input plus the output cap) is the most it can have.
        else UsageReport(kind=UsageKind.UNREPORTED, charged=estimate)
    )
    actual, overage = step_settlement(report, estimate)
    state = with_budget_view(
        state, (await io.settle(step_key(account, state.step), actual)).balance
    )
    over_stop: StopRequest | None = None
    if overage:
        # Spent already: charged whatever the limits say, and a limit it crosses ends the run.
        extra = await charge(
            io,
            overage_key(account, state.step),
            overage,
            account=account,
            of=step_key(account, state.step),  # in the window the step was held in
        )
        if isinstance(extra, StopRequest):
            over_stop = extra
        else:
            state = with_budget_view(state, extra.balance)
            if extra.exceeded is not None:
                over_stop = stop_for_exceeded(extra.exceeded[1])
    usage = {"input_tokens": report.input_tokens, "output_tokens": report.output_tokens}
    if isinstance(outcome, StopRequest):
        m = manifest(state, cfg, ctx, phase=Phase.DECIDE, outcome="error", code=outcome.error_code)
        state = after_model_error(state, over_stop or outcome, model_retries=cfg.model_retries)
        return step_writes(before, recorded(state, runtime, [m]))
    state = after_decision(state)
    if over_stop is not None:
        m = manifest(
            state,
            cfg,
            ctx,
            phase=Phase.DECIDE,
            outcome="denied",
            code=over_stop.error_code,
            **usage,
        )
        return step_writes(
            before, recorded(state, runtime, [m]).model_copy(update={"stop": over_stop})
        )
    conclusion = conclude(
        state,
        outcome,
        require_citations=cfg.require_citations,
        # What the model was shown is a view; a final answer is judged by the accepting receipts
        # (append-only) and the ledger's completion markers (a state edit can append a receipt
        # saying "completed", never a marker).
        pending_tasks=await _pending_if_final(io, state, outcome),
        final_turn=final_turn(asked.budget.steps_remaining, cfg.answer_margin),
        # A citation names a call the ledger marks as having had its tool return a result: an
        # observation in state can be a caller's.
        produced=await _produced_if_final(io, state, outcome),
    )
    if isinstance(conclusion, FinalRefused):
        # Work accepted is not work done: the model is asked again, shown the pending tasks.
        m = manifest(
            state,
            cfg,
            ctx,
            phase=Phase.DECIDE,
            outcome="denied",
            decision_kind="final",
            code=conclusion.code,
            **usage,
        )
        state = state.model_copy(update={"last_error_code": conclusion.code})
        return step_writes(before, recorded(state, runtime, [m]))
    if isinstance(conclusion, StopRequest):
        kind, result, code = decision_record(outcome, conclusion)
        m = manifest(
            state,
            cfg,
            ctx,
            phase=Phase.DECIDE,
            outcome=result,
            decision_kind=kind,
            code=code,
            **usage,
        )
        return step_writes(
            before, recorded(state, runtime, [m]).model_copy(update={"stop": conclusion})
        )
    state, manifests = await gate(io, state, ctx, conclusion, usage)
    return step_writes(before, recorded(state, runtime, manifests))


async def _pending_if_final(io: NodeIO, state: AgentState, outcome: Any) -> tuple[str, ...]:
    if isinstance(outcome, Decided) and isinstance(outcome.decision, FinalProposal):
        return await pending_work(io, state)
    return state.open_tasks


async def _produced_if_final(io: NodeIO, state: AgentState, outcome: Any) -> frozenset[str]:
    if isinstance(outcome, Decided) and isinstance(outcome.decision, FinalProposal):
        return await produced(io, account_of(state), outcome.decision.answer.citations)
    return frozenset()
