"""Reservations: what each thing reserves before it starts, the stop a refused reservation means,
and how an attempt that finds its reservation already held is claimed.

The ledger (:class:`~fencepost.policy.ledger.Ledger`) is the one budget truth. A model step and a
tool call are reserved on the run's account, under a key naming them (``keys.step_key``,
``keys.call_key``), before the model or the tool is called; nothing is refunded for an attempt.
This module says what is reserved and what the ledger's answers mean; the graph's run account
(``graph/account.py``) does the I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import NamedTuple

from fencepost.policy.batch import Batch, BatchEntry
from fencepost.policy.budget import BudgetAxis, BudgetExhausted, BudgetStop, reason_for_axis
from fencepost.policy.effect import Effect
from fencepost.policy.ledger import ReservationStatus
from fencepost.policy.phase import TerminationReason
from fencepost.policy.state import StopRequest, stop
from fencepost.policy.tool import ToolSpec
from fencepost.policy.verdict import VerdictCode

# -- what each thing reserves ---------------------------------------------------------------------

# An enum member's ``.value`` is a descriptor call each time; these names are fixed.
_STEPS = BudgetAxis.STEPS.value
_TOKENS = BudgetAxis.TOKENS.value
_TOOL_CALLS = BudgetAxis.TOOL_CALLS.value
_MUTATIONS = BudgetAxis.MUTATIONS.value
_COST = BudgetAxis.COST.value
_MONEY = BudgetAxis.MONEY.value


def step_amounts(estimate: int, money: int = 0) -> dict[str, float]:
    """What a model step reserves before the model is called: one step, its token estimate
    (:func:`step_hold`; none when it is 0) and its money estimate in micro-units
    (``decide.StepPlan.hold``; none when it is 0)."""
    amounts: dict[str, float] = {_STEPS: 1.0}
    if estimate > 0:
        amounts[_TOKENS] = float(estimate)
    if money > 0:
        amounts[_MONEY] = float(money)
    return amounts


DEFAULT_OUTPUT_TOKENS = 4096
"""The output cap a step holds for when neither the graph's ``tokens_per_step`` nor the model
(a chat model's ``max_tokens``) gives one: a long answer's worth."""


def step_hold(input_tokens: int, output_cap: int, headroom: float | None) -> int:
    """Tokens a model step holds before the model is asked: a bounded estimate, never all that
    is left.

    ``input_tokens`` is what the step is about to send, counted (``usage.input_text``, by a
    tokenizer or at ``usage.CHARACTERS_PER_TOKEN``); ``output_cap`` the most the model may
    write (``tokens_per_step``, or the model's ``token_estimate``: a chat model's
    ``max_tokens``; :data:`DEFAULT_OUTPUT_TOKENS` when 0). ``headroom`` is the fewest tokens
    any account of the run's chain has not *spent* (``None``: none limits tokens, and the step
    holds none): what others
    hold in flight is theirs for now, not gone, so it does not shrink the hold (a reservation
    it crowds out waits for it: see :func:`after_step_refused`). At least one token while a
    limit applies: a chain whose spending left none is refused before the model is asked.

    >>> step_hold(100, 400, None), step_hold(100, 0, 10_000.0), step_hold(100, 400, 250.0)
    (0, 4196, 250)
    >>> step_hold(100, 400, 0.0)
    1
    """
    if headroom is None:
        return 0  # nothing limits tokens: nothing to hold (nor to count, see usage)
    estimate = max(0, input_tokens) + (output_cap if output_cap > 0 else DEFAULT_OUTPUT_TOKENS)
    if headroom >= math.inf:
        return estimate
    return max(1, min(estimate, math.floor(headroom)))


MAX_STEP_WAIT_SECONDS = 60.0
"""The longest a model step waits, in all, for steps in flight to give back the room it needs
(and for runs that started first to take their turn), whatever the run's deadline allows."""

FIRST_STEP_WAIT_SECONDS = 0.005
"""A waiting step's first pause before it asks again; each pause doubles, up to
:data:`LONGEST_STEP_WAIT_SECONDS`."""

LONGEST_STEP_WAIT_SECONDS = 0.25
"""The longest single pause: a step in flight settling is noticed within this."""


def step_wait(*, waited: float, attempt: int, deadline_left: float | None) -> float | None:
    """How long a model step that must wait pauses before it looks again: a backoff from
    :data:`FIRST_STEP_WAIT_SECONDS` doubling per ``attempt`` up to
    :data:`LONGEST_STEP_WAIT_SECONDS`, never past :data:`MAX_STEP_WAIT_SECONDS` in all
    (``waited`` so far) nor the run's deadline (``deadline_left`` seconds; ``None``: none).
    ``None``: it has waited as long as it may.

    >>> step_wait(waited=0.0, attempt=0, deadline_left=None)
    0.005
    >>> step_wait(waited=0.0, attempt=10, deadline_left=0.1), step_wait(waited=60.0, attempt=0, deadline_left=None)
    (0.1, None)
    """
    left = MAX_STEP_WAIT_SECONDS - waited
    if deadline_left is not None:
        left = min(left, deadline_left)
    if left <= 0:
        return None
    return min(FIRST_STEP_WAIT_SECONDS * (1 << min(attempt, 16)), LONGEST_STEP_WAIT_SECONDS, left)


def others_hold_the_room(
    refused: BudgetExhausted, *, held: float, flying: float, own: float
) -> bool:
    """Whether a busy refusal by an account above the run's (``refused.account``, which holds
    ``held`` on the refused axis, ``flying`` of it in reservations in flight) would find room
    once *other* runs' reservations settle. ``own`` is what the run itself has in flight
    there: a run takes one model step at a time and no tool runs meanwhile, so that is an
    attempt a crash left unsettled, which nothing settles while the run waits for it.

    >>> from fencepost.policy.ledger import exhausted
    >>> refused = exhausted("tenant", "tokens", 400, 250, busy=True)
    >>> others_hold_the_room(refused, held=300, flying=200, own=0)
    True
    >>> others_hold_the_room(refused, held=300, flying=200, own=200)
    False
    """
    if refused.limit is None or refused.requested is None:
        return True  # a refusal that names no limit: as the ledger said
    others = flying - own
    return others > 0 and held - others + refused.requested <= refused.limit


def after_step_refused(
    refused: BudgetExhausted,
    *,
    account: str,
    asked: int,
    hold_now: int,
    waited: float,
    attempt: int,
    deadline_left: float | None,
) -> float | None:
    """What a model step does when the ledger refused its hold of ``asked`` tokens: the seconds
    it pauses before it asks again (``0``: at once), or ``None``: the refusal stands and the
    run ends as :func:`stop_for_exhausted` says.

    Busy is not exhausted: a refusal only reservations in flight cause (``refused.busy``)
    waits for them to settle (:func:`step_wait`), unless it is the run's own ``account`` that
    refused: what is in flight there is the run's own, an attempt a crash left unsettled that
    nothing will settle while the run waits for it. One that spending causes asks again at once
    for the smaller hold the chain's spending now allows (``hold_now``, :func:`step_hold` of a
    fresh read), if there is one; else it stands: a run ends exhausted only when what was spent
    leaves no room. ``asked`` and ``hold_now`` are on the refused axis (tokens, or money's
    micro-units).
    """
    if refused.busy and refused.account != account:
        return step_wait(waited=waited, attempt=attempt, deadline_left=deadline_left)
    if refused.axis in (BudgetAxis.TOKENS, BudgetAxis.MONEY) and 0 < hold_now < asked:
        return 0.0
    return None


class PoolShare(NamedTuple):
    """What a new run's first step finds on one axis of one account of its chain (facts the
    graph gathers from the ledger and from the runs under way in its process)."""

    account: str
    axis: str
    unspent: float
    """The limit less what was spent (settled, or charged)."""
    held: float
    """What reservations in flight hold."""
    under_way: float
    """The room kept for runs under way under this account: one step estimate of each (and,
    for a run still getting its first hold, that hold too, which may not be in ``held`` yet)."""


def first_step_admitted(asked: Mapping[str, float], shares: Iterable[PoolShare]) -> bool:
    """Whether a new run's first step, holding ``asked``, may ask the ledger now, or waits (as
    :func:`step_wait` says) for runs under way to take their steps.

    Work under way finishes before new work takes the pool: a run that has taken a step is
    under way until it ends, and a new run starts only when its hold leaves room, on every
    account and axis that limits it, for one step estimate of each run under way there
    (``PoolShare.under_way``, counted besides what their steps in flight hold: what a step
    spends of its hold is gone, and its run's next step needs room of its own). A run under way
    whose remaining steps together spend no more than one estimate is never starved by a
    newcomer (one whose remaining steps spend more can be: how many steps a run takes is not
    known before it ends). A step the chain's *spending* leaves no room
    for asks at once: the ledger refuses it and the run ends exhausted (waiting frees nothing).

    >>> first_step_admitted({"tokens": 200}, [PoolShare("t", "tokens", 900, 200, 200)])
    True
    >>> first_step_admitted({"tokens": 200}, [PoolShare("t", "tokens", 500, 200, 200)])
    False
    >>> first_step_admitted({"tokens": 200}, [PoolShare("t", "tokens", 100, 0, 200)])
    True
    """
    admitted = True
    for share in shares:
        want = asked.get(share.axis, 0.0)
        if want <= 0 or share.under_way <= 0:
            continue  # nothing kept there: whether it fits is the ledger's to say
        if want > share.unspent:
            return True
        if share.unspent - share.held - want < share.under_way:
            admitted = False
    return admitted


def first_step_amounts(tokens_per_step: int) -> dict[str, float]:
    """What a child run's first model step reserves: one step, and the child graph's token
    estimate (at least one token: a child always has a parent account that may limit tokens,
    as :func:`step_hold` holds one for a step under a token limit)."""
    return step_amounts(max(1, tokens_per_step))


def call_amounts(spec: ToolSpec) -> dict[str, float]:
    """What one attempt of a call of ``spec`` reserves: a tool call, a mutation for a write or
    external effect, and the tool's declared cost."""
    amounts = {_TOOL_CALLS: 1.0}
    if spec.effect is not Effect.READ:
        amounts[_MUTATIONS] = 1.0
    if spec.cost > 0:
        amounts[_COST] = float(spec.cost)
    return amounts


def to_reserve(batch: Batch) -> list[BatchEntry]:
    """The entries of a gated batch whose budget must be reserved now: those the gate allowed."""
    return [e for e in batch if e.verdict.code is VerdictCode.ALLOWED]  # ``Verdict.allowed``


# -- the stop a refusal means ---------------------------------------------------------------------


def stop_for_exhausted(exc: BudgetExhausted) -> StopRequest:
    """The stop for a reservation the ledger refused; the code names the axis that ran out."""
    axis = exc.axis.value if exc.axis is not None else "budget"
    return StopRequest(reason=exc.reason, error_code=f"{axis}_exhausted", budget=BudgetStop.of(exc))


def refused_step_stop(refused: BudgetExhausted, *, deadline_left: float | None) -> StopRequest:
    """The stop for a model step whose hold the ledger refused and that may wait no longer.
    A busy refusal (only steps in flight held the room) once the run's deadline has passed
    (``deadline_left`` seconds, ``None``: no deadline) is the deadline's: the budget had room,
    and raising it would change nothing. Otherwise the axis that ran out
    (:func:`stop_for_exhausted`), a busy refusal after :data:`MAX_STEP_WAIT_SECONDS` included.

    >>> from fencepost.policy.ledger import exhausted
    >>> refused_step_stop(exhausted("t", "tokens", 300, 250, busy=True), deadline_left=0.0).error_code
    'deadline_exceeded'
    >>> refused_step_stop(exhausted("t", "tokens", 300, 250), deadline_left=0.0).error_code
    'tokens_exhausted'
    """
    if refused.busy and deadline_left is not None and deadline_left <= 0:
        return stop(TerminationReason.DEADLINE_EXCEEDED, "deadline_exceeded")
    return stop_for_exhausted(refused)


def stop_for_axis(name: str | None, *, otherwise: BudgetAxis) -> StopRequest:
    """The stop for a run out of the axis called ``name``, as :func:`stop_for_exhausted` makes it.
    ``otherwise`` is the axis meant when ``name`` is missing or names no axis (a value read from
    a verdict or a ledger answer, not the exception itself)."""
    try:
        axis = BudgetAxis(name) if name else otherwise
    except ValueError:
        axis = otherwise
    return stop(reason_for_axis(axis), f"{axis.value}_exhausted")


def stop_for_exceeded(axis: str) -> StopRequest:
    """The stop for usage charged past a limit (``Reservation.exceeded``): the run ends as if the
    axis had been refused, its code naming it (tokens, the only usage charged after the fact,
    when the name is not an axis)."""
    return stop_for_axis(axis, otherwise=BudgetAxis.TOKENS)


def stop_for_closed(reason: str) -> StopRequest:
    """The stop for a reservation refused because the run's account (or a parent) is closed.

    A cancel closes the account from any thread or process: the run stops before its next model
    step or tool. Any other close means the run already ended, whatever state now says.
    """
    if reason == TerminationReason.CANCELLED.value:
        return stop(TerminationReason.CANCELLED, "cancelled")
    return stop(TerminationReason.POLICY_DENIED, "run_closed")


def stop_for_unknown_account() -> StopRequest:
    """The stop when the run's or its parent's account does not exist in the ledger."""
    return stop(TerminationReason.POLICY_DENIED, "unknown_budget_account")


def stop_for_conflict() -> StopRequest:
    """The stop when the ledger refuses the account's terms or a key: another run's account on
    this thread, a key another account holds, a name it cannot store (``LedgerConflict``,
    ``ValueError``)."""
    return stop(TerminationReason.POLICY_DENIED, "account_conflict")


# -- how an attempt is claimed --------------------------------------------------------------------


class Claim(StrEnum):
    """What the executor does with an attempt it is about to start."""

    RUN = "run"
    """No earlier attempt started: run this one."""
    RETRY = "retry"
    """An earlier attempt started and never reported, and a retry is safe: reserve another."""
    UNCERTAIN = "uncertain"
    """An earlier attempt started and never reported, and its effect may have happened."""


def claim(spec: ToolSpec, *, started_before: bool) -> Claim:
    """Whether a call runs now, is retried, or is reported ``uncertain`` instead of guessed.

    ``started_before`` is the ledger's word that this attempt's start marker already existed.
    """
    if not started_before:
        return Claim.RUN
    return Claim.RETRY if spec.retry_safe else Claim.UNCERTAIN


def answered_before(status: ReservationStatus, *, run_went_on: bool) -> bool:
    """Whether an attempt the ledger already holds with ``status`` means the call id was
    answered, so that it never runs again whatever the batch says
    (``execution.finished_before``).

    Given back (``released``): it never started and was receipted as not run. Settled: when the
    run went on past the call's step (``run_went_on``: the ledger holds a later step), the batch
    was written back into state or replayed from an earlier checkpoint. A settled attempt of the
    run's latest step is a crash between the settlement and the checkpoint: its result was lost
    with it, and the claim goes on as for any attempt that started (retried when safe, else
    ``uncertain``)."""
    if status is ReservationStatus.RELEASED:
        return True
    return status is ReservationStatus.SETTLED and run_went_on
