"""The execute phase: what the executor may run, how a crashed attempt is claimed, and what a
finished batch reports.

The executor trusts nothing state says: a call runs only if its recorded verdict is ``allowed``
for these very arguments (and sealed, with a key), the tool is registered, the principal holds
its capability now, and a write could have been approved at all.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

from fencepost.policy.approval import ApprovalMode
from fencepost.policy.batch import Batch, BatchEntry
from fencepost.policy.budget import BudgetAxis
from fencepost.policy.effect import Effect
from fencepost.policy.error_codes import ErrorCode, is_retryable
from fencepost.policy.events import (
    ToolFailed,
    ToolSucceeded,
    UnserializableResult,
    serialize_tool_result,
)
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.gates import HumanApprovalRequired, ToolPolicyDenied, authorize
from fencepost.policy.manifest import Outcome
from fencepost.policy.observation import Observation
from fencepost.policy.outcome import (
    CallOutcome,
    MalformedMarker,
    RunReport,
    checked_marker,
    result_status,
)
from fencepost.policy.phase import TerminationReason
from fencepost.policy.receipt import Accepted, Completed, ReceiptStatus
from fencepost.policy.recursion_limit import RECURSION_LIMIT
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.reservations import stop_for_axis
from fencepost.policy.state import StopRequest, stop
from fencepost.policy.tool import Principal, ToolSpec
from fencepost.policy.verdict import VerdictCode, verdict_is_sealed


def admits(
    entry: BatchEntry,
    spec: ToolSpec | None,
    principal: Principal,
    *,
    approval: ApprovalMode,
    verdict_key: bytes | None,
    run_id: str,
    approver: bool = False,
    conditional: bool = False,
) -> bool:
    """The executor's own checks on one allowed call, whatever state says. ``conditional``: the
    graph has a ``needs_approval`` callable (every tool's calls were judged per call)."""
    verdict = entry.verdict
    proposal = entry.proposal
    if spec is None or verdict.tool_name != proposal.tool_name:
        return False
    if verdict.fingerprint != proposal_fingerprint(proposal.tool_name, proposal.arguments):
        return False
    if verdict_key is not None and not verdict_is_sealed(verdict, run_id=run_id, key=verdict_key):
        return False
    try:
        # A write is runnable only where it could have been approved: by a human (interrupt
        # mode), by the graph's approver, or by a remembered scope the gate named in the
        # (sealed) verdict; never in terminate mode without one — unless its tool decides per
        # call whether it needs approval (the gate asked it).
        decided = spec.needs_approval is not None or conditional
        approvable = approval == "interrupt" or approver or decided or verdict.scope_id is not None
        authorize(spec, principal, approved=approvable)
    except (ToolPolicyDenied, HumanApprovalRequired):
        return False
    return True


@dataclass(frozen=True, slots=True)
class Admission:
    """The calls of a batch the executor will run, or the refusals that stop all of it."""

    runnable: tuple[tuple[BatchEntry, ToolSpec], ...]
    refused: tuple[CallOutcome, ...]


def admit_batch(
    batch: Batch,
    registry: ToolRegistry,
    principal: Principal,
    done: Collection[str],
    *,
    approval: ApprovalMode,
    verdict_key: bytes | None,
    run_id: str,
    approver: bool = False,
    conditional: bool = False,
) -> Admission:
    """Split a batch's allowed, not yet receipted calls into runnable ones; one refusal stops the
    whole batch, as one denial does at the gate (every allowed call is receipted denied, once).

    A call id the batch holds twice is refused too: the gate never lets one through
    (``gating.duplicate_call_ids``), so such a batch was written by somebody else, and its
    results could not be joined to its proposals by call id."""
    checked: list[tuple[BatchEntry, ToolSpec | None, bool]] = []
    ids: set[str] = set()
    repeated = False
    for entry in batch:
        if entry.call_id in ids:
            repeated = True
        ids.add(entry.call_id)
        if entry.call_id in done or not entry.verdict.allowed:
            continue
        name = entry.proposal.tool_name
        spec = registry.get(name) if name in registry else None
        ok = admits(
            entry,
            spec,
            principal,
            approval=approval,
            verdict_key=verdict_key,
            run_id=run_id,
            approver=approver,
            conditional=conditional,
        )
        checked.append((entry, spec, ok))
    if not repeated and all(ok for _, _, ok in checked):
        return Admission(tuple((e, s) for e, s, _ in checked if s is not None), ())
    refused: dict[str, CallOutcome] = {}
    for e, s, _ in checked:
        if e.call_id not in refused:
            refused[e.call_id] = not_run(
                e, s, ErrorCode.PERMISSION_DENIED, ReceiptStatus.DENIED, attempts=0
            )
    return Admission((), tuple(refused.values()))


def not_run(
    entry: BatchEntry,
    spec: ToolSpec | None,
    code: ErrorCode,
    status: ReceiptStatus,
    *,
    attempts: int,
) -> CallOutcome:
    """The outcome of a call that did not run (this time): refused, out of budget, uncertain."""
    return CallOutcome(
        event=ToolFailed(
            call_id=entry.call_id,
            tool_name=entry.proposal.tool_name,
            error_code=code,
            retryable=is_retryable(code),
        ),
        status=status,
        attempts=attempts,
        effect=spec.effect if spec is not None else None,
        provenance=entry.verdict.provenance,
    )


def finished_before(
    entry: BatchEntry, spec: ToolSpec, attempt: int, *, started: bool
) -> CallOutcome:
    """A call whose attempt ``attempt`` the ledger shows answered
    (``reservations.answered_before``): settled after it ran (``started``), or given back
    having never started. It never runs again; its outcome is not known here (state does not
    show it), so it is not guessed: ``uncertain`` if it ran, ``denied`` (``conflict``) if it
    never did."""
    if started:
        return uncertain(entry, spec, attempt)
    return not_run(entry, spec, ErrorCode.CONFLICT, ReceiptStatus.DENIED, attempts=attempt - 1)


def dependencies_met(
    outcomes: Sequence[CallOutcome | StopRequest],
    outside: Collection[str],
    produced: Collection[str],
) -> bool:
    """Whether every dependency of a call produced a verified result: each call of its batch it
    waited for returned one (completed, or accepted with a task id: an output a dependent may
    read), and each one ``outside`` the batch is among the earlier calls the ledger marks as
    having ``produced`` one (``keys.result_key``; a receipt in state is no proof)."""
    return all(isinstance(o, CallOutcome) and o.status in _OUTPUTS for o in outcomes) and all(
        d in produced for d in outside
    )


_OUTPUTS = frozenset({ReceiptStatus.COMPLETED, ReceiptStatus.ACCEPTED_PENDING})
"""The receipts of a call whose tool returned a result: what a dependent may wait on."""


def earlier_outputs(
    observations: Sequence[Observation], produced: Collection[str]
) -> dict[str, JsonValue]:
    """The results of the earlier calls in ``produced`` (those the ledger marks as having had
    their tool return one), as the checkpoint holds them: each call's first result."""
    out: dict[str, JsonValue] = {}
    if not produced:
        return out
    for observation in observations:
        call_id = observation.call_id
        if observation.is_evidence and call_id in produced and call_id not in out:
            out[call_id] = observation.result
    return out


def dependency_inputs(
    entry: BatchEntry,
    outcomes: Sequence[CallOutcome | StopRequest],
    earlier: Mapping[str, JsonValue],
) -> dict[str, JsonValue]:
    """What a dependent call may read of each call it depends on (``ToolContext.dependencies``):
    its result as its tool returned it in this batch (``outcomes``), or as the checkpoint holds
    it for an earlier one (``earlier``). For a call that only accepted work, that is its
    ``Accepted``: the task id, and the detail its tool gave."""
    inputs: dict[str, JsonValue] = {
        o.call_id: o.event.result
        for o in outcomes
        if isinstance(o, CallOutcome) and isinstance(o.event, ToolSucceeded)
    }
    for dep in entry.proposal.depends_on:
        if dep not in inputs and dep in earlier:
            inputs[dep] = earlier[dep]
    return inputs


def uncertain(entry: BatchEntry, spec: ToolSpec, attempts: int) -> CallOutcome:
    """A call whose earlier attempt may have had its effect: reported, never run again."""
    return not_run(
        entry, spec, ErrorCode.EXECUTION_UNCERTAIN, ReceiptStatus.UNCERTAIN, attempts=attempts
    )


def ran(
    entry: BatchEntry,
    spec: ToolSpec,
    attempt: int,
    *,
    value: Any = None,
    error: ErrorCode | None = None,
    cut_off: bool = False,
    started: bool = True,
) -> CallOutcome:
    """The outcome of a call that ran: its result as JSON data, or its safe error code.

    A tool that only accepted the work (``Accepted``) is ``accepted_pending``, not completed; one
    reporting a run that did not complete (``RunReport``) is ``failed`` (``outcome.result_status``). A
    write or external call ``cut_off`` (it started, and its deadline came before it reported:
    cut at its await, left behind on its thread, or too late) may have had its effect, whatever
    its body's kind: ``uncertain``, never a plain failure. A malformed ``Accepted``/``Completed``
    is the call's failure, ``unserializable_result``. A call whose body never ``started`` (no
    thread took it before its deadline, or none was free) did nothing: ``denied`` with that
    code, a call that never started (its attempt was claimed and stays charged).
    """
    if not started:
        code = error or ErrorCode.TIMEOUT
        return not_run(entry, spec, code, ReceiptStatus.DENIED, attempts=attempt)
    if cut_off and spec.effect is not Effect.READ:
        return uncertain(entry, spec, attempt)
    if error is None:
        try:
            marker = checked_marker(value)
            result = serialize_tool_result(value)
        except (UnserializableResult, MalformedMarker):
            error = ErrorCode.UNSERIALIZABLE_RESULT
        else:
            return CallOutcome(
                event=ToolSucceeded(call_id=entry.call_id, tool_name=spec.name, result=result),
                status=result_status(value if marker is None else marker),
                attempts=attempt,
                effect=spec.effect,
                task_id=marker.task_id if isinstance(marker, Accepted) else None,
                code=value.refusal_code() if _never_began(value) else None,
                completes=completed_task(spec, marker),
                evidence_for=spec.evidence_for,
            )
    return CallOutcome(
        event=ToolFailed(
            call_id=entry.call_id,
            tool_name=spec.name,
            error_code=error,
            retryable=is_retryable(error),
        ),
        status=ReceiptStatus.FAILED,
        attempts=attempt,
        effect=spec.effect,
    )


def _never_began(value: Any) -> bool:
    """A result reporting that its run was refused before it began (a child run unfunded)."""
    return isinstance(value, RunReport) and not value.started


def completed_task(spec: ToolSpec, value: Any) -> str | None:
    """The task a tool's result completes: a ``Completed`` from a tool that declares completion
    evidence (and the accepting tools it is evidence for), carrying every declared field
    non-empty. Anything less (a status that says "done", an HTTP 200) completes nothing."""
    if not isinstance(value, Completed) or not spec.completion_evidence or not spec.evidence_for:
        return None
    if all(value.evidence.get(name, "").strip() for name in spec.completion_evidence):
        return value.task_id
    return None


def budget_refusals(batch: Batch) -> list[CallOutcome]:
    """Calls of the batch the budget could not cover: receipted as not done, never run."""
    return [
        not_run(e, None, ErrorCode.BUDGET_EXHAUSTED, ReceiptStatus.DENIED, attempts=0)
        for e in batch
        if e.verdict.code is VerdictCode.BUDGET_EXHAUSTED
    ]


def batch_stop(
    batch: Batch,
    outcomes: Sequence[CallOutcome],
    *,
    deadline_passed: bool,
    last_superstep: bool,
) -> StopRequest | None:
    """Which stop, if any, a finished batch asks for; the first that applies wins:
    a refusal at the executor, the deadline, a budget that cut the batch short, and the
    recursion limit leaving no room for another decision."""
    if any(
        o.status is ReceiptStatus.DENIED
        and isinstance(o.event, ToolFailed)
        and o.event.error_code is ErrorCode.PERMISSION_DENIED
        for o in outcomes
    ):
        return stop(TerminationReason.POLICY_DENIED, "executor_refused")
    if deadline_passed:
        return stop(TerminationReason.DEADLINE_EXCEEDED, "deadline_exceeded")
    cut = next((e.verdict for e in batch if e.verdict.code is VerdictCode.BUDGET_EXHAUSTED), None)
    if cut is not None:
        return stop_for_axis(cut.exhausted_axis, otherwise=BudgetAxis.TOOL_CALLS)
    ran_out = next(
        (
            o
            for o in outcomes
            if isinstance(o.event, ToolFailed) and o.event.error_code is ErrorCode.BUDGET_EXHAUSTED
        ),
        None,
    )
    if ran_out is not None:
        return stop_for_axis(None, otherwise=BudgetAxis.TOOL_CALLS)
    if last_superstep:
        return stop(TerminationReason.STEP_BUDGET_EXHAUSTED, RECURSION_LIMIT)
    return None


def ordered(batch: Batch, outcomes: Sequence[CallOutcome]) -> list[CallOutcome]:
    """Outcomes joined to the batch by call id, in the order the model proposed the calls —
    never in the order they arrived."""
    by_id = {o.call_id: o for o in outcomes}
    # A call id the batch holds twice (refused: admit_batch) is reported once.
    return [by_id.pop(e.call_id) for e in batch if e.call_id in by_id]


def out_of_budget(entry: BatchEntry, spec: ToolSpec, attempt: int) -> CallOutcome:
    """A call whose attempt the budget cannot cover. Attempt 1 never started: denied
    (``budget_exhausted``). A later attempt retries one that crashed, which may have had its
    effect: ``uncertain``, never guessed."""
    if attempt == 1:
        return not_run(entry, spec, ErrorCode.BUDGET_EXHAUSTED, ReceiptStatus.DENIED, attempts=0)
    return uncertain(entry, spec, attempt - 1)


def may_start(
    entry: BatchEntry,
    outcomes: Sequence[CallOutcome | StopRequest],
    outside: Collection[str],
    produced: Collection[str],
    *,
    dependencies_broken: bool,
) -> bool:
    """Whether a call of a batch may start once the calls it depends on have ended: each must
    have produced a verified result (:func:`dependencies_met`), and a batch whose dependencies
    are impossible (edited since the gate saw them: a cycle, an unknown id) starts none of
    its dependent calls."""
    if dependencies_broken and entry.proposal.depends_on:
        return False
    return dependencies_met(outcomes, outside, produced)


def dependency_failed(entry: BatchEntry, spec: ToolSpec) -> CallOutcome:
    """A call that never started because a call it depends on produced no verified result:
    denied, ``dependency_failed``. Never started, so the budget the gate reserved for it is
    given back (:func:`refunded_when_not_started`)."""
    return not_run(entry, spec, ErrorCode.DEPENDENCY_FAILED, ReceiptStatus.DENIED, attempts=0)


def refunded_when_not_started(outcome: CallOutcome) -> bool:
    """Whether the budget reserved for a call is given back: only for one that never started
    (a dependency failed). Nothing is refunded for a call that was attempted."""
    return (
        outcome.attempts == 0
        and isinstance(outcome.event, ToolFailed)
        and outcome.event.error_code is ErrorCode.DEPENDENCY_FAILED
    )


def refused_at_claim(entry: BatchEntry, spec: ToolSpec, stopped: StopRequest) -> CallOutcome:
    """The receipt of a call its claim was refused (the run's account refused its attempt): a
    cancel closed the account (``cancelled``), else the caller may not spend from it
    (``permission_denied``). It never started."""
    code = (
        ErrorCode.CANCELLED
        if stopped.reason is TerminationReason.CANCELLED
        else ErrorCode.PERMISSION_DENIED
    )
    return not_run(entry, spec, code, ReceiptStatus.DENIED, attempts=0)


def executed_record(outcome: CallOutcome) -> tuple[Outcome, str]:
    """An executed call's trace record: its outcome word (``success``, ``uncertain`` or
    ``error``) and its code (the receipt status of a success, else the safe error code)."""
    if outcome.succeeded:
        return "success", outcome.status.value
    word: Outcome = "uncertain" if outcome.status is ReceiptStatus.UNCERTAIN else "error"
    error = outcome.event.error_code if isinstance(outcome.event, ToolFailed) else None
    return word, error.value if error is not None else outcome.status.value
