"""The decide phase's model step, as plans: what a step holds, what a model's output means,
and when a model error ends the run.

The node gathers the facts (the run, the context it acts in, what the ledger says is left) and
asks one question before the model call and one after it; each answer is a frozen plan that
names the I/O the node does (hold, ask the model, settle and charge, gate) and what it writes:

- :func:`plan_step`: a stop, or the step's hold (tokens, money) and what the model is shown;
- :func:`settle_step`: what the step's reservation settles at and what is charged beyond it;
- :func:`end_step`: the run to write, its manifest fields and stop, or the calls to gate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fencepost.policy.context import RunContext
from fencepost.policy.deadline import Clock
from fencepost.policy.decision import (
    AbstainProposal,
    Decision,
    DecisionKind,
    FinalProposal,
    InvalidProposal,
    ToolBatch,
    ToolProposal,
)
from fencepost.policy.decision_model import Decided, DecisionInput
from fencepost.policy.developer_log import MODEL, raised
from fencepost.policy.error_codes import ErrorCode, error_code_for
from fencepost.policy.fingerprint import fits_checkpoint
from fencepost.policy.ledger import Reservation
from fencepost.policy.may_go_on import NEEDS_DECIDE, check_before_acting
from fencepost.policy.observation import AnswerPayload
from fencepost.policy.phase import TerminationReason
from fencepost.policy.pricing import ModelPrice, price_micros
from fencepost.policy.registry import ToolCatalog, ToolRegistry
from fencepost.policy.reservations import (
    DEFAULT_OUTPUT_TOKENS,
    step_amounts,
    step_hold,
    stop_for_exceeded,
)
from fencepost.policy.state import AgentState, StopRequest, stop
from fencepost.policy.stop_report import SAFE_CODE
from fencepost.policy.terminate import AnswerFacts, conclude
from fencepost.policy.turns import TURN_WINDOW, EarlierTurn
from fencepost.policy.usage import (
    UsageKind,
    UsageReport,
    reply_size,
    reply_text,
    step_settlement,
    usage_report,
)

RETRYABLE_MODEL_CODES = frozenset(
    {ErrorCode.RATE_LIMITED.value, ErrorCode.UNAVAILABLE.value, ErrorCode.TIMEOUT.value}
)
"""Model errors worth asking again at the next step: the provider may answer then."""


def accept_decision(raw: object) -> Decided | InvalidProposal:
    """What a decision model returned, as a :class:`Decided` or the reason it is not one.

    Run it where the model runs (its containment): what the model hands back is its code too.
    A subclass of :class:`Decided` or of a decision (a property, an attribute lookup of its
    own) and a usage count that is no plain ``int`` are read here, once, into the runtime's own
    types, so nothing read of the decision later runs the model's code."""
    if isinstance(raw, Decision):
        raw = Decided(decision=raw)
    if not isinstance(raw, Decided):
        return InvalidProposal("malformed_decision")
    if not _own_types(raw):
        copied = _copied(raw)
        if copied is None:
            return InvalidProposal("malformed_decision")
        raw = copied
    if any(not fits_checkpoint(c.arguments) for c in calls_of(raw)):
        # Valid JSON that no checkpoint could store: refused before it reaches state.
        return InvalidProposal("unrepresentable_arguments")
    return raw


_USAGE = ("input_tokens", "output_tokens", "cached_input_tokens")
_DECISIONS: tuple[type[Decision], ...] = (ToolProposal, ToolBatch, FinalProposal, AbstainProposal)


def _own_types(decided: Decided) -> bool:
    """Whether ``decided`` is made of the runtime's own classes only, each usage count a plain
    ``int`` or ``None``: type checks, which run none of the model's code (an honest adapter's
    decision passes them, and is taken as it is)."""
    if type(decided) is not Decided:
        return False
    if any(v is not None and type(v) is not int for v in map(decided.__dict__.get, _USAGE)):
        return False
    decision = decided.decision
    kind = type(decision)
    if kind is ToolBatch:
        calls = decision.calls  # type: ignore[union-attr]
        return type(calls) is tuple and all(type(c) is ToolProposal for c in calls)
    if kind is FinalProposal:
        return type(decision.answer) is AnswerPayload  # type: ignore[union-attr]
    return kind is ToolProposal or kind is AbstainProposal


def _copied(decided: Decided) -> Decided | None:
    """``decided`` read into the runtime's own types (``None``: it holds no valid decision).
    A usage count that is no plain ``int`` is charged as an implausible report is (``-1``, a
    count no provider reports), as it was before it was read here."""
    decision: object = decided.decision
    for kind in _DECISIONS:
        if isinstance(decision, kind):
            # Dumped as the runtime's class, nested records included, and validated again.
            fields = decision.model_dump(include=set(kind.model_fields))
            try:
                own: Decision = kind.model_validate(fields)
            except ValueError:  # pydantic's ValidationError
                return None
            break
    else:
        return None
    usage = {name: getattr(decided, name) for name in _USAGE}
    try:
        return Decided(
            decision=own,
            generated_call_ids=decided.generated_call_ids,
            **{n: v if v is None or type(v) is int else -1 for n, v in usage.items()},
        )
    except ValueError:
        return None


_SAFE = re.compile(SAFE_CODE)


def safe_invalid_code(code: object) -> str | None:
    """An invalid proposal's ``code`` when it is a safe code (a plain ``str`` matching
    :data:`~fencepost.policy.stop_report.SAFE_CODE`), else ``None``. Quiet: reads nothing
    more of it, logs nothing."""
    return code if type(code) is str and _SAFE.fullmatch(code) else None


UNSAFE_INVALID = "the decision model (an InvalidProposal code that is no safe code)"
"""What the developer log names when an invalid proposal's own code was refused."""


def invalid_code(invalid: InvalidProposal, run_id: str | None = None) -> str:
    """The code an invalid proposal ends a run with: its own when it is a safe code, else
    ``malformed_decision``. A model adapter names the code, and a code made of the model's text
    (or holding what no checkpoint stores) would carry it into state, stream and report; that
    one is logged on ``fencepost.model`` only."""
    code = safe_invalid_code(getattr(invalid, "code", None))
    if code is not None:
        return code
    fallback = InvalidProposal().code
    raised(MODEL, UNSAFE_INVALID, invalid, run_id=run_id, call_id=None, code=fallback)
    return fallback


@dataclass(frozen=True, slots=True)
class ModelRaised:
    """What a decision model raised, read where it ran (:func:`read_raised`): the runtime's own
    outcome of the step, and what is logged once the step's outcome counts (never for a model
    left behind: its late failure is nobody's)."""

    invalid: InvalidProposal | None
    """The runtime's own invalid proposal, with a safe code; ``None`` for a failure."""
    code: ErrorCode
    """A failure's safe code (an invalid proposal's is ``invalid``'s own)."""
    logged: BaseException | None
    """What the developer log shows, with its traceback; ``None``: nothing to log."""


def read_raised(exc: BaseException) -> ModelRaised:
    """Read what a decision model raised: an :class:`InvalidProposal` is the runtime's own
    invalid proposal with its code, when that code is safe (else ``malformed_decision``, and
    the proposal is logged); any other exception is a failure with its safe code (from its
    type and status only, :func:`~fencepost.policy.error_codes.error_code_for`), a
    ``BaseException`` ``internal_error``.

    Reading it runs the model's code (a ``code`` property, a ``status_code`` that raises): call
    it in the model's containment, and take what reading raises as the model's failure
    (:func:`unreadable`). Nothing is logged here."""
    if issubclass(type(exc), InvalidProposal):
        code = safe_invalid_code(getattr(exc, "code", None))
        if code is not None:
            return ModelRaised(InvalidProposal(code), ErrorCode.INTERNAL_ERROR, None)
        return ModelRaised(InvalidProposal(), ErrorCode.INTERNAL_ERROR, exc)
    code_of = error_code_for(exc) if issubclass(type(exc), Exception) else ErrorCode.INTERNAL_ERROR
    return ModelRaised(None, code_of, exc)


def unreadable(exc: BaseException) -> ModelRaised:
    """A model's failure that raised ``exc`` as it was read (:func:`read_raised`, or its reply
    as :func:`accept_decision` read it): ``internal_error``, ``exc`` logged (its traceback
    shows what the model raised first, as its context). In containment too."""
    return ModelRaised(None, ErrorCode.INTERNAL_ERROR, exc)


def log_raised(read: ModelRaised, run_id: str) -> None:
    """Log, once, what :func:`read_raised` read, where the step's outcome counts."""
    if read.invalid is not None:
        what, code = UNSAFE_INVALID, read.invalid.code
    else:
        what, code = "the decision model", read.code.value
    if read.logged is not None:
        raised(MODEL, what, read.logged, run_id=run_id, call_id=None, code=code)


def calls_of(decided: Decided) -> tuple[ToolProposal, ...]:
    """The tool proposals of a decision (none for a final answer or an abstention)."""
    decision = decided.decision
    if isinstance(decision, ToolBatch):
        return decision.calls
    if isinstance(decision, ToolProposal):
        return (decision,)
    return ()


def after_model_failure(state: AgentState, failure: StopRequest, model_retries: int) -> AgentState:
    """The run after a failed model step, in either binding: asked again at the next step (a
    step each) when the failure is retryable (``RETRYABLE_MODEL_CODES``) and fewer than
    ``model_retries`` failures came in a row, its stop set otherwise."""
    retryable = (
        failure.reason is TerminationReason.FAILED
        and failure.error_code in RETRYABLE_MODEL_CODES
        and state.model_failures < model_retries
    )
    if not retryable:
        return state.model_copy(update={"stop": failure})
    return state.model_copy(
        update={"model_failures": state.model_failures + 1, "last_error_code": failure.error_code}
    )


def model_failure(code: ErrorCode, *, run_deadline_passed: bool) -> StopRequest:
    """The stop a failed model step asks for. A timeout once the run's own deadline has passed
    is the deadline's (``deadline_exceeded``): the deadline wins over the error it caused; any
    other failure is ``failed`` with its safe code (retried at the next step when it is
    retryable: :func:`end_step`)."""
    if code is ErrorCode.TIMEOUT and run_deadline_passed:
        return stop(TerminationReason.DEADLINE_EXCEEDED, "deadline_exceeded")
    return stop(TerminationReason.FAILED, code.value)


# --- The model step, as plans -----------------------------------------------------------------
#
# The node gathers the facts (the run, the context it acts in, what the ledger says is left),
# asks one question before the model call and one after it, and does the I/O each plan names.


@dataclass(frozen=True, slots=True)
class StepSettings:
    """The loop's settings a model step reads (``LoopSettings`` names and checks each)."""

    registry: ToolRegistry
    tool_catalog: ToolCatalog
    tokens_per_step: int
    price: ModelPrice | None
    answer_margin: int
    model_retries: int
    require_citations: bool


@dataclass(frozen=True, slots=True)
class StepPlan:
    """Before the model is asked: the stop the run ends in here, or what the step holds.

    ``holds_money``: the step is priced, so its hold reads what the chain has left of money.
    """

    stop: StopRequest | None
    settings: StepSettings
    catalog: tuple[dict[str, Any], ...] = ()
    """The tools the model is shown: all of them, or, ``tool_catalog="permitted"``, what the
    principal the step acts for (the one its calls are gated under) may call, none without
    one. Worked out once per step by :func:`plan_step`, never kept across runs."""

    @property
    def holds_money(self) -> bool:
        """Whether the step holds money (it is priced) beside its tokens."""
        return self.settings.price is not None

    def hold(
        self, sent: Callable[[], int], tokens_left: float | None, money_left: float | None
    ) -> tuple[int, int]:
        """Tokens and micro-units of money the step holds before the model is asked.

        Tokens: ``reservations.step_hold`` of the ``sent()`` tokens it is about to send, the
        model's output cap (``tokens_per_step``) and what the run's chain has not spent
        (``tokens_left``). Where nothing limits tokens the text is not counted: counting it
        walks the whole run, every step. Money: the sent tokens and the output cap priced,
        capped at ``money_left`` (``None``: no limit, still held so the step's charge is
        recorded), at least one micro-unit while a limit applies; 0 unpriced.
        """
        cfg = self.settings
        tokens = step_hold(
            sent() if tokens_left is not None else 0, cfg.tokens_per_step, tokens_left
        )
        price = cfg.price
        if price is None:
            return tokens, 0
        cap = cfg.tokens_per_step or DEFAULT_OUTPUT_TOKENS
        money = price_micros(price, sent(), cap)
        if money_left is not None and money_left < math.inf:
            money = max(1, min(money, math.floor(money_left)))
        return tokens, money

    def decision_input(self, state: AgentState) -> DecisionInput:
        """What the model is shown: the question, the observations as data, the plan's tool
        :attr:`catalog`, and the latest ``turns.TURN_WINDOW`` earlier turns of the thread
        (question and answer text, never an earlier run's tool output) with how many were left
        out."""
        kept = state.turns[-TURN_WINDOW:]
        return DecisionInput.model_construct(
            run_id=state.run_id,
            question=state.question,
            observations=state.observations,
            proposals=state.proposals,
            catalog=self.catalog,
            budget=state.budget,
            step=state.step,
            pending_tasks=state.open_tasks,
            final_turn=self.final_turn(state),
            repair=state.repair_notes,
            answered=state.answered,
            turns=tuple(
                EarlierTurn(
                    run_id=t.run_id,
                    question=t.question,
                    answer=t.final_answer.text if t.final_answer is not None else None,
                    termination=t.termination.value if t.termination is not None else None,
                )
                for t in kept
            ),
            turns_left_out=len(state.turns) - len(kept),
        )

    def final_turn(self, state: AgentState) -> bool:
        """Whether the step is one of the run's last ``answer_margin`` steps, kept for
        answering: the model is told so, and tool calls are refused in it (a margin of 0 turns
        it off)."""
        return state.budget.steps_remaining < self.settings.answer_margin


def reads_money_limit(state: AgentState, settings: StepSettings) -> bool:
    """Whether the facts a step is planned on include what the chain has left of money: an
    unpriced run's first step, whose money limit :func:`plan_step` refuses (a limit the graph
    cannot price is refused, never guessed; an account's limits are fixed when it opens, so
    once is enough)."""
    return settings.price is None and state.step == 0


def plan_step(
    state: AgentState,
    ctx: RunContext | None,
    settings: StepSettings,
    *,
    given: object,
    remaining_steps: object,
    clock: Clock,
    money_left: float | None = None,
) -> StepPlan:
    """Before a model step: whether the run may go on (``may_go_on.check_before_acting``, the
    recursion limit included), and what the step holds. ``money_left``: what the chain has
    left of money where :func:`reads_money_limit` says it was read: any limit on an unpriced
    run is its stop (``policy_denied``, ``money_unpriced``); else the tools the model is shown,
    for the principal ``ctx`` names (:attr:`StepPlan.catalog`)."""
    refused = check_before_acting(
        state, ctx, clock=clock, given=given, remaining_steps=remaining_steps, needs=NEEDS_DECIDE
    )
    unpriced = ctx is not None and money_left is not None and reads_money_limit(state, settings)
    if refused is None and unpriced:
        refused = stop(TerminationReason.POLICY_DENIED, "money_unpriced")
    if refused is not None or ctx is None:
        return StepPlan(stop=refused, settings=settings)
    catalog = settings.registry.model_catalog(settings.tool_catalog, ctx.principal)
    return StepPlan(stop=None, settings=settings, catalog=tuple(catalog))


@dataclass(frozen=True, slots=True)
class Settlement:
    """After the model answered or failed: what the step's reservation settles at, what is
    charged beyond its hold (spent already: charged whatever the limits say), and what the
    ledger is asked about a final answer before it is judged (:func:`end_step`)."""

    actual: dict[str, float]
    overage: dict[str, float]
    usage: dict[str, Any]
    """The reported tokens its manifests record."""
    final_turn: bool
    """Whether the step was asked as one of the run's last ``answer_margin`` steps."""
    settles_now: bool = True
    """Whether the settlement is written at once: it gives back part of the hold (the budget
    view the hold wrote is then stale) or charges beyond it. ``False``: it waits to be written
    with the holds of the calls the step proposes, in one ledger write."""
    citations: tuple[str, ...] | None = None
    """The model's final answer's citations (``None``: no final answer): the ledger is asked
    about the work the answer still waits on and which cited calls had their tool return a
    result (``terminate.AnswerFacts``). What the model was shown is a view: the accepting
    receipts and the ledger's markers judge it."""


def settle_step(
    plan: StepPlan,
    asked: AgentState,
    outcome: Decided | InvalidProposal | StopRequest,
    held: tuple[int, int],
    sent: Callable[[], int],
    count: Callable[[str], int],
) -> Settlement:
    """What a step that held ``held`` (tokens, micro-units) and was ``asked`` settles at.

    A decision's usage is its provider's report, checked against the text sent (``sent()``)
    and received (``count`` of the reply), both counted only where a token limit or a price
    needs them; where nothing limits tokens nothing was held, and an unreported step is not
    counted either (a reported one is still charged). A call that failed reported nothing, and
    what it cost is unknown: its hold (the input plus the output cap) is the most it can have,
    for tokens and money alike. Money is the reported usage priced (cached input at the cached
    price), or, when the report was not trusted, the text sent and received priced.
    """
    estimate, money_held = held
    price = plan.settings.price
    money: tuple[int, int] | None = None
    citations = None
    if isinstance(outcome, Decided):
        if isinstance(outcome.decision, FinalProposal):
            citations = outcome.decision.answer.citations
        received = count(reply_text(outcome.decision)) if estimate or price is not None else 0
        report = usage_report(
            outcome.input_tokens,
            outcome.output_tokens,
            counted=sent() + received if estimate else 0,
            reply_chars=reply_size(outcome.decision),
            cached_input_tokens=outcome.cached_input_tokens,
        )
        if price is not None:
            cost = (
                price_micros(
                    price,
                    report.input_tokens or 0,
                    report.output_tokens or 0,
                    report.cached_input_tokens or 0,
                )
                if report.kind is UsageKind.REPORTED
                else price_micros(price, sent(), received)
            )
            money = (money_held, cost)
    else:
        report = UsageReport(kind=UsageKind.UNREPORTED, charged=estimate)
        if price is not None:
            money = (money_held, money_held)
    actual, overage = step_settlement(report, estimate, money=money)
    usage: dict[str, Any] = {
        "input_tokens": report.input_tokens,
        "output_tokens": report.output_tokens,
    }
    # The ledger's own rule (``ledger.settlement``): an axis settled below what was held gives
    # the rest back; an axis the actual does not name keeps all of it.
    gives_back = any(
        actual.get(axis, amount) < amount for axis, amount in step_amounts(*held).items()
    )
    return Settlement(
        actual=actual,
        overage=overage,
        usage=usage,
        final_turn=plan.final_turn(asked),
        settles_now=gives_back or bool(overage),
        citations=citations,
    )


@dataclass(frozen=True, slots=True)
class StepEnd:
    """After the model step: the run to write, and either the manifest fields it records (its
    stop, if any, written into ``state``) or, ``record is None``, the calls the gate judges."""

    state: AgentState
    record: dict[str, Any] | None
    calls: Sequence[ToolProposal] = ()


def end_step(
    plan: StepPlan,
    settled_state: AgentState,
    outcome: Decided | InvalidProposal | StopRequest,
    settled: Settlement,
    charged: Reservation | StopRequest | None,
    facts: AnswerFacts | None,
) -> StepEnd:
    """What a model step's outcome means for the run (``settled_state``: the run as the model
    was asked, its step settled and charged; ``charged``: what the ledger made of the charge
    beyond the hold, ``None`` where there was none).

    A model error is retried at the next step (each retry spends its own step) when it is
    retryable (``RETRYABLE_MODEL_CODES``), up to ``model_retries`` in a row, and otherwise ends
    the run; usage charged past a limit (or refused by the ledger) ends it, the decision
    refused; a decision starts the retry count again. An invalid proposal ends the run
    ``invalid_proposal`` (:func:`invalid_code`); tool calls go to the gate, except in the final
    turn kept for answering, where they end it ``step_budget_exhausted``. A final answer or an
    abstention is what :func:`~fencepost.policy.terminate.conclude` makes of it, given the
    ledger's ``facts`` about :attr:`Settlement.citations` (``terminate.AnswerFacts``: the
    accepted work it still waits on, what it may cite; ``None``: not read, nothing is
    citable): a final answer while work is pending is refused and the model asked again (work
    accepted is not work done); one whose citations fail ends the run ``invalid_proposal``,
    never ``completed``. A stop is recorded as the decision that made it (``decided``, or
    ``denied`` when it was refused).
    """
    cfg = plan.settings
    over_stop = charged if isinstance(charged, StopRequest) else None
    if isinstance(charged, Reservation) and charged.exceeded is not None:
        over_stop = stop_for_exceeded(charged.exceeded[1])
    if isinstance(outcome, StopRequest):
        failure = over_stop or outcome
        record: dict[str, Any] = {"outcome": "error", "code": outcome.error_code}
        return StepEnd(
            state=after_model_failure(settled_state, failure, cfg.model_retries), record=record
        )
    state = settled_state
    if state.model_failures:
        state = state.model_copy(update={"model_failures": 0, "last_error_code": None})
    if over_stop is not None:
        record = {"outcome": "denied", "code": over_stop.error_code, **settled.usage}
        return StepEnd(state=state.model_copy(update={"stop": over_stop}), record=record)
    kind: DecisionKind
    if isinstance(outcome, InvalidProposal):
        invalid = invalid_code(outcome, state.run_id)
        kind, ending = (
            "invalid",
            StopRequest(reason=TerminationReason.INVALID_PROPOSAL, error_code=invalid),
        )
    elif isinstance(outcome.decision, ToolProposal | ToolBatch):
        if not settled.final_turn:
            return StepEnd(state=state, record=None, calls=calls_of(outcome))
        # The final turn is kept for answering.
        kind, ending = "tool", stop(TerminationReason.STEP_BUDGET_EXHAUSTED, "answer_margin")
    else:
        decision = outcome.decision
        if isinstance(decision, FinalProposal):
            kind, asked = (
                "final",
                StopRequest(reason=TerminationReason.COMPLETED, answer=decision.answer),
            )
        else:
            kind, asked = "abstain", StopRequest(reason=TerminationReason(decision.reason))
        if facts is None:
            facts = AnswerFacts(pending=state.open_tasks, citable=frozenset())
        conclusion = conclude(asked, facts, require_citations=cfg.require_citations)
        if conclusion.asks_again:
            code = conclusion.stop.error_code
            record = {"outcome": "denied", "decision_kind": kind, "code": code, **settled.usage}
            return StepEnd(state=state.model_copy(update={"last_error_code": code}), record=record)
        ending = conclusion.stop
    # A decision stands only as an abstention or a final answer completed; the trace records
    # an abstention's reason as its code.
    stands = kind == "abstain" or ending.reason is TerminationReason.COMPLETED
    record = {
        "outcome": "decided" if stands else "denied",
        "decision_kind": kind,
        "code": ending.error_code or (ending.reason.value if kind == "abstain" else None),
        **settled.usage,
    }
    return StepEnd(state=state.model_copy(update={"stop": ending}), record=record)


def waiting_for_requester(state: AgentState) -> dict[str, Any]:
    """What a run shows while it waits for its requester: an approver's answer ran the calls
    it approved, on an account that records no capabilities of the requester (opened by a
    version that did not record them), so the model's next step is the requester's own to
    take, under its own context."""
    return {
        "fencepost": "waiting_for_requester",
        "run_id": state.run_id,
        "requester": state.principal_id,
    }
