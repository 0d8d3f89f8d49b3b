"""The decide phase: what a model's output means, and when a model error ends the run.

The node calls the model; these functions say what came back means.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Literal

from fencepost.policy.contract import Frozen
from fencepost.policy.decision import (
    AbstainProposal,
    Decision,
    DecisionKind,
    FinalProposal,
    InvalidProposal,
    ToolBatch,
    ToolProposal,
)
from fencepost.policy.decision_model import Decided
from fencepost.policy.developer_log import MODEL, raised
from fencepost.policy.error_codes import ErrorCode
from fencepost.policy.fingerprint import fits_checkpoint
from fencepost.policy.manifest import Outcome
from fencepost.policy.observation import AnswerPayload
from fencepost.policy.phase import TerminationReason
from fencepost.policy.reservations import stop_for_unknown_account
from fencepost.policy.state import AgentState, StopRequest, stop
from fencepost.policy.stop_report import SAFE_CODE
from fencepost.policy.tasks import pending_tasks
from fencepost.policy.terminate import MissingCitation, UnsupportedCitation, validate_final_answer

RETRYABLE_MODEL_CODES = frozenset(
    {ErrorCode.RATE_LIMITED.value, ErrorCode.UNAVAILABLE.value, ErrorCode.TIMEOUT.value}
)
"""Model errors worth asking again at the next step: the provider may answer then."""


def accept_decision(raw: object) -> Decided | InvalidProposal:
    """What a decision model returned, as a :class:`Decided` or the reason it is not one."""
    if isinstance(raw, Decision):
        raw = Decided(decision=raw)
    if not isinstance(raw, Decided):
        return InvalidProposal("malformed_decision")
    if any(not fits_checkpoint(c.arguments) for c in calls_of(raw)):
        # Valid JSON that no checkpoint could store: refused before it reaches state.
        return InvalidProposal("unrepresentable_arguments")
    return raw


_SAFE = re.compile(SAFE_CODE)


def invalid_code(invalid: InvalidProposal, run_id: str | None = None) -> str:
    """The code an invalid proposal ends a run with: its own when it is a safe code, else
    ``malformed_decision``. A model adapter names the code, and a code made of the model's text
    (or holding what no checkpoint stores) would carry it into state, stream and report; that
    one is logged on ``fencepost.model`` only."""
    code = getattr(invalid, "code", None)
    if type(code) is str and _SAFE.fullmatch(code):
        return code
    fallback = InvalidProposal().code
    raised(
        MODEL,
        "the decision model (an InvalidProposal code that is no safe code)",
        invalid,
        run_id=run_id,
        call_id=None,
        code=fallback,
    )
    return fallback


def calls_of(decided: Decided) -> tuple[ToolProposal, ...]:
    """The tool proposals of a decision (none for a final answer or an abstention)."""
    decision = decided.decision
    if isinstance(decision, ToolBatch):
        return decision.calls
    if isinstance(decision, ToolProposal):
        return (decision,)
    return ()


def model_error_stop(code: ErrorCode, *, run_deadline_passed: bool) -> StopRequest:
    """The stop a model error asks for: a passed run deadline wins over the error itself."""
    if run_deadline_passed:
        return stop(TerminationReason.DEADLINE_EXCEEDED, "deadline_exceeded")
    return stop(TerminationReason.FAILED, code.value)


def after_model_error(state: AgentState, failure: StopRequest, *, model_retries: int) -> AgentState:
    """Retry a retryable model error at the next step (each retry spends its own step), up to
    ``model_retries`` in a row; otherwise the run ends with the failure."""
    retryable = (
        failure.reason is TerminationReason.FAILED
        and failure.error_code in RETRYABLE_MODEL_CODES
        and state.model_failures < model_retries
    )
    if retryable:
        return state.model_copy(
            update={
                "model_failures": state.model_failures + 1,
                "last_error_code": failure.error_code,
            }
        )
    return state.model_copy(update={"stop": failure})


class FinalRefused(Frozen):
    """A final answer that cannot end the run yet; the model is asked again (a step each)."""

    code: Literal["tasks_pending"] = "tasks_pending"


def conclude(
    state: AgentState,
    decided: Decided | InvalidProposal,
    *,
    require_citations: bool,
    pending_tasks: Sequence[str] = (),
    final_turn: bool = False,
    produced: Collection[str] | None = None,
) -> StopRequest | FinalRefused | Sequence[ToolProposal]:
    """A decision's consequence: the tool calls to gate, or the stop it asks for.

    A final answer must cite evidence that is in the observations and that a tool of this run
    produced (``produced``: the cited calls the ledger marks so; server-verified); an invalid
    proposal or an unsupported citation ends the run ``invalid_proposal``, never ``completed``.
    While accepted work is pending, a final answer is refused (work accepted is not work done).
    In the final turn kept for answering, tool calls end the run ``step_budget_exhausted``.
    """
    if isinstance(decided, InvalidProposal):
        return stop(TerminationReason.INVALID_PROPOSAL, invalid_code(decided, state.run_id))
    decision = decided.decision
    if isinstance(decision, FinalProposal) and pending_tasks:
        return FinalRefused()
    if isinstance(decision, ToolProposal | ToolBatch) and final_turn:
        return stop(TerminationReason.STEP_BUDGET_EXHAUSTED, "answer_margin")
    if isinstance(decision, FinalProposal):
        return _completed(
            decision.answer, state, require_citations=require_citations, produced=produced
        )
    if isinstance(decision, AbstainProposal):
        return StopRequest(reason=TerminationReason(decision.reason))
    return calls_of(decided)


def verified_stop(
    state: AgentState,
    ending: StopRequest,
    *,
    require_citations: bool,
    pending: Collection[str] | None = None,
    produced: Collection[str] | None = None,
    account_known: bool = True,
) -> StopRequest:
    """The stop a run ends with, verified again against the state it ends in.

    A ``completed`` stop is only what :func:`conclude` makes of a final answer; one that reached
    the end by another road (written into state by a caller) must pass the same checks: an
    answer, no accepted work pending, every citation an observation of the run. Otherwise the
    run ends ``invalid_proposal``, never ``completed``. Any other stop is returned as it is.

    ``pending``: the tasks accepted work still waits on as the ledger's completion markers tell
    it (``tasks.unfinished``); a receipt saying ``completed`` can be a caller's. ``produced``:
    the cited calls the ledger marks as having had their tool return a result; an observation
    can be a caller's. ``None`` for either: only state is left to judge by (no ledger was
    asked). ``account_known=False``: the ledger holds no account of the run (it never saw it,
    or lost it with its process), so nothing can verify the answer and the run is refused as
    every reservation on that ledger refuses it (``unknown_budget_account``).
    """
    if ending.reason is not TerminationReason.COMPLETED:
        return ending
    if not account_known:
        return stop_for_unknown_account()
    if ending.answer is None:
        return stop(TerminationReason.INVALID_PROPOSAL, InvalidProposal().code)
    if pending if pending is not None else pending_tasks(state.receipts):
        return stop(TerminationReason.INVALID_PROPOSAL, FinalRefused().code)
    verified = _completed(
        ending.answer, state, require_citations=require_citations, produced=produced
    )
    return ending if verified.reason is TerminationReason.COMPLETED else verified


def _completed(
    answer: AnswerPayload,
    state: AgentState,
    *,
    require_citations: bool,
    produced: Collection[str] | None,
) -> StopRequest:
    """``completed`` with ``answer`` if its citations are server-verified, else the stop the
    failed check means (``invalid_proposal``, never ``completed``)."""
    try:
        answer = validate_final_answer(
            answer, state, require_citations=require_citations, produced=produced
        )
    except (UnsupportedCitation, MissingCitation) as exc:
        return stop(TerminationReason.INVALID_PROPOSAL, exc.code)
    return StopRequest(reason=TerminationReason.COMPLETED, answer=answer)


DecisionRecord = tuple[DecisionKind, Outcome, str | None]


def decision_record(outcome: Decided | InvalidProposal, conclusion: StopRequest) -> DecisionRecord:
    """A decision that ended the model's part of the run, as its trace records it: what the
    model decided, whether it stands (``decided``) or was refused (``denied``), and its code
    (the stop's error code; an abstention's reason). A final answer stands only as
    ``completed``; a malformed decision or a tool call that ends the run here was refused."""
    code = conclusion.error_code
    if isinstance(outcome, InvalidProposal):
        return "invalid", "denied", code
    decision = outcome.decision
    if isinstance(decision, AbstainProposal):
        return "abstain", "decided", code or conclusion.reason.value
    if isinstance(decision, FinalProposal):
        completed = conclusion.reason is TerminationReason.COMPLETED
        return "final", "decided" if completed else "denied", code
    return "tool", "denied", code


def final_turn(steps_remaining: int, answer_margin: int) -> bool:
    """Whether a step is one of the run's last ``answer_margin`` steps, kept for answering: the
    model is told so, and tool calls are refused in it."""
    return steps_remaining < answer_margin


def model_failure(code: ErrorCode, *, run_deadline_passed: bool) -> StopRequest:
    """The stop a failed model step asks for. A timeout once the run's own deadline has passed
    is the deadline's (``deadline_exceeded``): the deadline wins over the error it caused; any
    other failure is ``failed`` with its safe code (retried by :func:`after_model_error` when
    it is retryable)."""
    return model_error_stop(
        code, run_deadline_passed=code is ErrorCode.TIMEOUT and run_deadline_passed
    )


def after_decision(state: AgentState) -> AgentState:
    """The run after a model step that returned a decision: its run of retryable model errors
    is over, so the retry count starts again (and the last error is no longer the run's)."""
    if state.model_failures:
        return state.model_copy(update={"model_failures": 0, "last_error_code": None})
    return state


def step_taken(held_before: bool) -> bool:
    """Whether a step reserved under the next step number is this attempt's: a number the
    ledger already held was an earlier attempt that started and crashed (it stays charged, and
    this attempt reserves the number after it)."""
    return not held_before
