"""The decide node: reserve a step, ask the model, judge its answer, gate and reserve the batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langgraph.runtime import Runtime
from langgraph.types import interrupt

from fencepost.graph.account import (
    account_of,
    acting_in,
    charge,
    left_on,
    node_thread,
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
    BudgetAxis,
    Deadline,
    Decided,
    DecisionInput,
    ErrorCode,
    FinalProposal,
    InvalidProposal,
    Phase,
    StopRequest,
    TerminationReason,
    error_code_for,
    stage_deadline,
)
from fencepost.policy.approval import waiting_for_requester
from fencepost.policy.catalog import shown_catalog
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
from fencepost.policy.pricing import ModelPrice, price_micros, step_money_hold
from fencepost.policy.recursion_limit import NEEDS_DECIDE, recursion_stop
from fencepost.policy.reservations import DEFAULT_OUTPUT_TOKENS, step_hold, stop_for_exceeded
from fencepost.policy.state import stop
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


async def step_estimate(
    io: NodeIO, state: AgentState, ctx: RunContext, sent: Callable[[], int]
) -> int:
    """Tokens a step holds before the model is asked: ``reservations.step_hold`` of the
    ``sent()`` tokens it is about to send, the model's output cap (``tokens_per_step``) and what
    the run's chain has not spent (read from the ledger). Where nothing limits tokens the text
    is not counted: counting it walks the whole run, every step."""
    left = await tokens_left(io, state, ctx)
    return step_hold(sent() if left is not None else 0, io.cfg.tokens_per_step, left)


async def money_estimate(
    io: NodeIO, state: AgentState, ctx: RunContext, sent: Callable[[], int]
) -> int:
    """Micro-units of money a step holds (``pricing.step_money_hold``): the ``sent()`` tokens
    and the model's output cap priced, capped at what the chain has not spent; 0 unpriced."""
    price = io.cfg.price
    if price is None:
        return 0
    cap = io.cfg.tokens_per_step or DEFAULT_OUTPUT_TOKENS
    return step_money_hold(price, sent(), cap, await left_on(io, state, ctx, BudgetAxis.MONEY))


def step_cost(price: ModelPrice, report: UsageReport, sent: int, received: int) -> int:
    """Micro-units a step that answered costs: its reported usage priced (cached input at the
    cached price), or, when the report was not trusted, the text sent and received priced."""
    if report.kind is UsageKind.REPORTED:
        return price_micros(
            price,
            report.input_tokens or 0,
            report.output_tokens or 0,
            report.cached_input_tokens or 0,
        )
    return price_micros(price, sent, received)


def decision_input(state: AgentState, cfg: LoopConfig, ctx: RunContext) -> DecisionInput:
    """What the model is shown: the question, the observations as data, the tool catalog (all
    of it, or what ``ctx``'s principal may call: ``tool_catalog``), and the thread's earlier
    turns (question and answer) within a window. ``ctx`` is the context the step acts in, the
    one its calls are gated under."""
    shown = shown_turns(state.turns)
    return DecisionInput.model_construct(
        run_id=state.run_id,
        question=state.question,
        observations=state.observations,
        proposals=state.proposals,
        catalog=shown_catalog(cfg.registry, ctx.principal, cfg.tool_catalog),
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
    inp = decision_input(state, cfg, ctx)
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
        fork = values.get("fork")
        state = new_run_state(
            request_from(values, run_id=started_run_id()),
            ctx,
            ended,
            fork if isinstance(fork, str) else None,
            node_thread()[0] or None,
        )
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
    # After an approver's answer the run goes on for the requester, with the capabilities its
    # account recorded; an older account records none, and the run waits for the requester.
    acting = await acting_in(io, state, ctx)
    while acting.waits_for_requester:
        interrupt(waiting_for_requester(state))
    ctx = acting.context
    refused = check_before_acting(state, ctx, clock=cfg.clock, given=runtime.context)
    refused = refused or recursion_stop(values.get("remaining_steps"), NEEDS_DECIDE)
    if refused is not None or ctx is None:
        return step_writes(before, state.model_copy(update={"stop": refused}))
    account = account_of(state)
    # What the model will be given, counted once and only where a token limit or a price needs
    # it (the count walks the whole run): the step number and budget it is also shown change
    # with the reservation, the text does not.
    shown, counted = state, list[int]()

    def sent() -> int:
        if not counted:
            counted.append(count_tokens(input_text(decision_input(shown, cfg, ctx))))
        return counted[0]

    if (
        cfg.price is None
        and state.step == 0
        and await left_on(io, state, ctx, BudgetAxis.MONEY) is not None
    ):
        # A money limit the graph cannot price: refused before the run's first step, never
        # guessed (an account's limits are fixed when it opens: once is enough).
        unpriced = stop(TerminationReason.POLICY_DENIED, "money_unpriced")
        return step_writes(before, state.model_copy(update={"stop": unpriced}))

    async def hold(facts: AgentState) -> tuple[int, int]:
        return (
            await step_estimate(io, facts, ctx, sent),
            await money_estimate(io, facts, ctx, sent),
        )

    while True:
        step = state.step + 1
        held, (estimate, money_held) = await hold_step(
            io, state, ctx, step_key(account, step), hold
        )
        if isinstance(held, StopRequest):
            return step_writes(before, state.model_copy(update={"stop": held}))
        state = with_budget_view(state.model_copy(update={"step": step}), held.balance)
        if step_taken(held_before=held.existing):
            break
    state = state.model_copy(update={"phase": Phase.DECIDE})
    asked = state
    outcome = await ask_model(io, asked, ctx)
    received = (
        count_tokens(reply_text(outcome.decision))
        if isinstance(outcome, Decided) and (estimate or cfg.price is not None)
        else 0
    )
    report = (
        usage_report(
            outcome.input_tokens,
            outcome.output_tokens,
            # Where nothing limits tokens nothing was held, and an unreported step is not
            # counted either: a reported one is still charged.
            counted=sent() + received if estimate else 0,
            reply_chars=reply_size(outcome.decision),
            cached_input_tokens=outcome.cached_input_tokens,
        )
        if isinstance(outcome, Decided)
        # A call that failed reported nothing, and what it cost is unknown: its hold (the
        # input plus the output cap) is the most it can have.
        else UsageReport(kind=UsageKind.UNREPORTED, charged=estimate)
    )
    money: tuple[int, int] | None = None
    if cfg.price is not None:
        cost = (
            step_cost(cfg.price, report, sent(), received)
            if isinstance(outcome, Decided)
            else money_held  # a failed call: its hold, as for tokens
        )
        money = (money_held, cost)
    actual, overage = step_settlement(report, estimate, money=money)
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
