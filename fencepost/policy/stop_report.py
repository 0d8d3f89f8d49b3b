"""The stop report: what a run that ended tells its user, derived from receipts and its reason.

One row of the contract's table per kind of end:

========================  ====================================================================
kind                      what the report says
========================  ====================================================================
``completed``             the verified results and where they are (completed calls, citations)
``failed``                the cause code and the effects already made
``waiting_for_input``     the one condition needed (approval of a call, or a clarification)
``stopped``               what completed, what never started, what is uncertain or pending
========================  ====================================================================

Nothing here reads model text: a report holds codes, call ids and registered tool names only.
Work accepted is not work done: an ``accepted_pending`` call is reported pending, never done;
a call reporting a run that did not complete (a child run) is ``failed``, ``incomplete``.
Stopping is not undoing: effects already made are listed whatever the kind.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Literal, Protocol

from pydantic import Field, Strict

from fencepost.policy._model import Frozen
from fencepost.policy.batch import BatchEntry
from fencepost.policy.effect import Effect
from fencepost.policy.error_codes import ErrorCode
from fencepost.policy.observation import AnswerPayload
from fencepost.policy.phase import TerminationReason
from fencepost.policy.receipt import Receipt, ReceiptStatus, current_receipts
from fencepost.policy.verdict import VerdictCode


class StopKind(StrEnum):
    """The row of the contract's table a run's end falls in."""

    COMPLETED = "completed"
    """The required end state was reached and verified."""
    FAILED = "failed"
    """Not achievable on the allowed path: refused, invalid, no progress, no evidence, an error."""
    WAITING_FOR_INPUT = "waiting_for_input"
    """A real user decision is needed: an approval or a clarification."""
    STOPPED = "stopped"
    """Cut short by a limit (steps, tool calls, the deadline) or a cancel: a budget stop."""


_KIND: dict[TerminationReason, StopKind] = {
    TerminationReason.COMPLETED: StopKind.COMPLETED,
    TerminationReason.INSUFFICIENT_EVIDENCE: StopKind.FAILED,
    TerminationReason.INVALID_PROPOSAL: StopKind.FAILED,
    TerminationReason.NO_PROGRESS: StopKind.FAILED,
    TerminationReason.POLICY_DENIED: StopKind.FAILED,
    TerminationReason.FAILED: StopKind.FAILED,
    TerminationReason.NEEDS_CLARIFICATION: StopKind.WAITING_FOR_INPUT,
    TerminationReason.APPROVAL_REQUIRED: StopKind.WAITING_FOR_INPUT,
    TerminationReason.STEP_BUDGET_EXHAUSTED: StopKind.STOPPED,
    TerminationReason.TOOL_BUDGET_EXHAUSTED: StopKind.STOPPED,
    TerminationReason.DEADLINE_EXCEEDED: StopKind.STOPPED,
    TerminationReason.CANCELLED: StopKind.STOPPED,
}

SAFE_CODE = r"^[a-z][a-z0-9_]{0,63}$"
_SAFE_CODE = re.compile(SAFE_CODE)
_UNREADABLE_CODE = "unreadable_code"
_WAITS_FOR_APPROVAL = frozenset({VerdictCode.APPROVAL_REQUIRED, VerdictCode.APPROVAL_PENDING})
# Effects that may have reached the world: done, possibly done, or accepted and under way.
_EFFECT_STARTED = frozenset(
    {ReceiptStatus.COMPLETED, ReceiptStatus.UNCERTAIN, ReceiptStatus.ACCEPTED_PENDING}
)


def _effect_started(receipt: Receipt) -> bool:
    """Whether the call's write or external effect may have reached the world: a call that ran
    to its report without completing (a child run stopped half-way) may have made some."""
    if receipt.effect in (None, Effect.READ):
        return False
    return receipt.status in _EFFECT_STARTED or receipt.error_code is ErrorCode.INCOMPLETE


def kind_of(reason: TerminationReason) -> StopKind:
    """The table row ``reason`` is reported in (a reason this module does not know is a failure,
    never a success)."""
    return _KIND.get(reason, StopKind.FAILED)


class ReportedCall(Frozen):
    """One call as the report lists it: ids and codes, never arguments or results."""

    call_id: str
    """The call's id: where its result (or error) is in the run's observations and receipts."""
    tool_name: str
    """The tool the call named."""
    error_code: Annotated[ErrorCode | None, Strict(False)] = None
    """The receipt's safe error code, if the call failed or did not run."""
    verdict: Annotated[VerdictCode | None, Strict(False)] = None
    """For a call with no receipt: the gate's verdict it was left with (why it never started)."""
    effect: Annotated[Effect | None, Strict(False)] = None
    """The tool's effect, when the receipt recorded it."""


class Waiting(Frozen):
    """The one condition a run that waits for input needs before it can go on."""

    condition: Literal["approval", "clarification"]
    """What is needed: a human's approval of calls, or the user's clarification of the question."""
    calls: Annotated[tuple[str, ...], Strict(False)] = ()
    """With ``approval``: the call ids waiting for it (see ``never_started`` for their tools)."""


class StopReport(Frozen):
    """How a run ended, in the contract's words, derived only from receipts and its reason.

    Each call of the run is in exactly one of ``completed``, ``failed``, ``never_started``,
    ``uncertain`` and ``pending`` (its latest receipt decides; a proposal left without a receipt
    never started). ``effects_made`` and ``cited`` point into those lists by call id.
    """

    kind: Annotated[StopKind, Strict(False)]
    """The row of the contract's table: completed, failed, waiting for input, or stopped."""
    reason: Annotated[TerminationReason, Strict(False)]
    """The run's terminal reason."""
    error_code: Annotated[str | None, Field(pattern=SAFE_CODE)] = None
    """The stop's safe code: the cause of a failure, the limit that stopped a run."""
    completed: Annotated[tuple[ReportedCall, ...], Strict(False)] = ()
    """Calls whose result was verified done."""
    failed: Annotated[tuple[ReportedCall, ...], Strict(False)] = ()
    """Calls that ran and failed, with their safe error codes."""
    never_started: Annotated[tuple[ReportedCall, ...], Strict(False)] = ()
    """Calls refused (denied: policy, budget, a human) or proposed and never run."""
    uncertain: Annotated[tuple[ReportedCall, ...], Strict(False)] = ()
    """Calls whose effect may or may not have happened (a crash mid-call): not guessed."""
    pending: Annotated[tuple[ReportedCall, ...], Strict(False)] = ()
    """Calls whose work was accepted (a task id) but not shown done: accepted is not done."""
    effects_made: Annotated[tuple[str, ...], Strict(False)] = ()
    """Call ids of write or external effects that were made, may have been, or are under way.
    Stopping does not undo them."""
    cited: Annotated[tuple[str, ...], Strict(False)] = ()
    """Call ids of completed calls the final answer cites as its evidence."""
    waiting_for: Waiting | None = None
    """With ``waiting_for_input``: the one condition needed."""

    @property
    def calls(self) -> int:
        """How many calls the report accounts for (each in exactly one list)."""
        return (
            len(self.completed)
            + len(self.failed)
            + len(self.never_started)
            + len(self.uncertain)
            + len(self.pending)
        )


class Ended(Protocol):
    """What a report is derived from: a terminal state's receipts, reason, code and citations."""

    @property
    def receipts(self) -> Sequence[Receipt]: ...
    @property
    def termination(self) -> TerminationReason | None: ...
    @property
    def last_error_code(self) -> str | None: ...
    @property
    def final_answer(self) -> AnswerPayload | None: ...


def _reported(receipt: Receipt) -> ReportedCall:
    return ReportedCall(
        call_id=receipt.call_id,
        tool_name=receipt.tool_name,
        error_code=receipt.error_code,
        effect=receipt.effect,
    )


def _safe(code: str | None) -> str | None:
    if code is None or _SAFE_CODE.fullmatch(code):
        return code
    return _UNREADABLE_CODE


def stop_report(state: Ended, *, unfinished: Sequence[BatchEntry] = ()) -> StopReport:
    """The stop report of a run that ended.

    ``unfinished`` is the batch the run was carrying out when it stopped (a terminal state no
    longer holds it): its proposals without a receipt never started, and those waiting for an
    approval are the condition an ``approval_required`` run needs. Raises ``ValueError`` for a
    state with no terminal reason.
    """
    reason = state.termination
    if reason is None:
        raise ValueError("a stop report is made for a run that ended")
    buckets: dict[ReceiptStatus, list[ReportedCall]] = {status: [] for status in ReceiptStatus}
    effects: list[str] = []
    latest = current_receipts(state.receipts)
    for receipt in latest:
        buckets[receipt.status].append(_reported(receipt))
        if _effect_started(receipt):
            effects.append(receipt.call_id)
    receipted = {r.call_id for r in latest}
    left = [e for e in unfinished if e.call_id not in receipted]
    never_started = buckets[ReceiptStatus.DENIED] + [
        ReportedCall(call_id=e.call_id, tool_name=e.proposal.tool_name, verdict=e.verdict.code)
        for e in dict((e.call_id, e) for e in left).values()
    ]
    done = {c.call_id for c in buckets[ReceiptStatus.COMPLETED]}
    answer = state.final_answer
    kind = kind_of(reason)
    return StopReport(
        kind=kind,
        reason=reason,
        error_code=_safe(state.last_error_code),
        completed=tuple(buckets[ReceiptStatus.COMPLETED]),
        failed=tuple(buckets[ReceiptStatus.FAILED]),
        never_started=tuple(never_started),
        uncertain=tuple(buckets[ReceiptStatus.UNCERTAIN]),
        pending=tuple(buckets[ReceiptStatus.ACCEPTED_PENDING]),
        effects_made=tuple(effects),
        cited=tuple(c for c in (answer.citations if answer else ()) if c in done),
        waiting_for=_waiting(reason, left),
    )


def _waiting(reason: TerminationReason, left: Sequence[BatchEntry]) -> Waiting | None:
    if reason is TerminationReason.NEEDS_CLARIFICATION:
        return Waiting(condition="clarification")
    if reason is TerminationReason.APPROVAL_REQUIRED:
        calls = tuple(
            dict.fromkeys(e.call_id for e in left if e.verdict.code in _WAITS_FOR_APPROVAL)
        )
        return Waiting(condition="approval", calls=calls)
    return None
