"""The execute phase: what the executor may run, how a crashed attempt is claimed, and what a
finished batch reports.

The executor trusts nothing state says: a call runs only if its recorded verdict is ``allowed``
for these very arguments (and sealed, with a key), the tool is registered, the principal holds
its capability now, and a write could have been approved at all.

The execute phase, as plans: the node (:mod:`fencepost.graph.execute`) gathers the facts (the
run, the context it acts in, what the ledger says) and asks one question before any call runs
and one after they all ended; each answer is a frozen plan that names the I/O the node does
and what it writes:

- :func:`plan_execute`: the run's stop, or which calls run and which are refused, what the
  ledger is asked about their dependencies, and when a dependent call may start;
  :class:`CallClaim`: what each of the ledger's answers to a call's claim means (run it, retry
  it, ``uncertain``, answered before);
- :func:`end_execute`: the run to write, the receipts, the manifests' fields, and the stop.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import JsonValue

from fencepost.policy.approval import ApprovalMode
from fencepost.policy.batch import Batch, BatchEntry
from fencepost.policy.budget import BudgetAxis, BudgetExhausted
from fencepost.policy.context import RunContext
from fencepost.policy.contract import assemble
from fencepost.policy.deadline import Clock, Deadline
from fencepost.policy.effect import Effect
from fencepost.policy.error_codes import ErrorCode, is_retryable
from fencepost.policy.events import (
    ToolFailed,
    ToolSucceeded,
    UnserializableResult,
    reduce_tool_events,
    serialize_tool_result,
)
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.gates import HumanApprovalRequired, ToolPolicyDenied, authorize
from fencepost.policy.ledger import Attempt, Reservation, ReservationStatus
from fencepost.policy.manifest import Outcome
from fencepost.policy.may_go_on import (
    NEEDS_ANOTHER_DECIDE,
    NEEDS_EXECUTE,
    RECURSION_LIMIT,
    check_before_acting,
    recursion_stop,
)
from fencepost.policy.observation import Observation
from fencepost.policy.outcome import (
    CallOutcome,
    MalformedMarker,
    RunReport,
    checked_marker,
    receipt_for,
    result_status,
    with_approvers,
)
from fencepost.policy.phase import TerminationReason
from fencepost.policy.progress import recorded_evidence
from fencepost.policy.receipt import Accepted, Completed, Receipt, ReceiptStatus
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.reservations import (
    Claim,
    answered_before,
    call_amounts,
    claim,
    stop_for_axis,
)
from fencepost.policy.state import AgentState, StopRequest, stop
from fencepost.policy.tasks import open_tasks_after
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
            if marker is None and not isinstance(value, RunReport) and _count(attempt):
                return _completed_call(entry, spec, attempt, result)
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


_SUCCEEDED_GIVEN = frozenset(("call_id", "tool_name", "result"))
_COMPLETED_GIVEN = frozenset(
    ("event", "status", "attempts", "effect", "task_id", "code", "completes", "evidence_for")
)


def _completed_call(entry: BatchEntry, spec: ToolSpec, attempt: int, result: Any) -> CallOutcome:
    """What :func:`ran` makes of a plain result (no marker, no run report): ``completed``,
    assembled as validation would make it. Every value is already one of its field's: the
    call id and tool name of a validated entry and spec, the result checked JSON data
    (``serialize_tool_result``), the attempt a count."""
    event = assemble(
        ToolSucceeded,
        {"call_id": entry.call_id, "tool_name": spec.name, "result": result},
        _SUCCEEDED_GIVEN,
    )
    return assemble(
        CallOutcome,
        {
            "event": event,
            "status": ReceiptStatus.COMPLETED,
            "attempts": attempt,
            "effect": spec.effect,
            "task_id": None,
            "completes": None,
            "evidence_for": spec.evidence_for,
            "approval": None,
            "scope_id": None,
            "approved_by": None,
            "rule": None,
            "code": None,
            "missing_capability": None,
            "provenance": None,
        },
        _COMPLETED_GIVEN,
    )


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


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


# --- The execute phase, as plans ---------------------------------------------------------------
#
# The node gathers the facts (the run, the context it acts in, what the ledger says), asks one
# question before any call runs and one after they all ended, and does the I/O each plan
# names: each call claimed, run and settled in the ledger, accepted work certified.


@dataclass(frozen=True, slots=True)
class ExecuteSettings:
    """The loop's settings the execute phase reads (``LoopSettings`` names and checks each)."""

    registry: ToolRegistry
    approval: ApprovalMode
    verdict_key: bytes | None
    approver: bool
    """Whether the graph has an approver (a write may have been approved by it)."""
    conditional: bool
    """Whether the graph has a ``needs_approval`` callable (every tool's calls were judged per
    call)."""


@dataclass(frozen=True, slots=True)
class ClaimStep:
    """What the ledger's answer to an attempt's claim means: the call's outcome without running
    it (``outcome``; ``releases``: its reservation given back first, nothing of it ran here),
    another attempt claimed (``retries``), or, neither, the attempt runs."""

    outcome: CallOutcome | None = None
    retries: bool = False
    releases: bool = False

    @property
    def runs(self) -> bool:
        """Whether the attempt claimed runs now."""
        return self.outcome is None and not self.retries


@dataclass(frozen=True, slots=True)
class CallClaim:
    """One call's claim in the ledger, attempt by attempt: what each of the ledger's answers
    means. The start marker is durable before the tool starts: finding it means an earlier
    attempt started and never reported (a crash), which is retried only when that is safe
    (``reservations.claim``) and otherwise reported ``uncertain``."""

    entry: BatchEntry
    spec: ToolSpec

    @property
    def amounts(self) -> dict[str, float]:
        """What one attempt reserves (``reservations.call_amounts``)."""
        return call_amounts(self.spec)

    def asks_if_run_went_on(self, held: Reservation | BudgetExhausted) -> bool:
        """Whether the ledger is asked if the run went on past this step: only for an attempt
        it already holds settled or given back (:meth:`reserved` reads the answer)."""
        return (
            isinstance(held, Reservation)
            and held.existing
            and held.status is not ReservationStatus.RESERVED
        )

    def reserved(
        self, attempt: int, held: Reservation | BudgetExhausted, *, run_went_on: bool
    ) -> CallOutcome | None:
        """The call's outcome when its attempt's reservation ends the claim; ``None``: claim
        the attempt's start.

        An attempt the budget cannot cover: attempt 1 never started, ``denied``
        (``budget_exhausted``); a later one retries one that crashed, which may have had its
        effect: ``uncertain``, never guessed. An attempt the ledger shows given back, or
        settled while the run went on past this step (``reservations.answered_before``),
        means the call id was answered already: it never runs again, whatever the batch says
        (:func:`finished_before`)."""
        entry, spec = self.entry, self.spec
        if isinstance(held, BudgetExhausted):
            if attempt == 1:
                return not_run(
                    entry, spec, ErrorCode.BUDGET_EXHAUSTED, ReceiptStatus.DENIED, attempts=0
                )
            return uncertain(entry, spec, attempt - 1)
        if self.asks_if_run_went_on(held) and answered_before(held.status, run_went_on=run_went_on):
            started = held.status is ReservationStatus.SETTLED
            return finished_before(entry, spec, attempt, started=started)
        return None

    def begins_on(self, held: Reservation) -> bool:
        """Whether the first attempt's start is claimed on what the ledger found for it, in the
        same ledger step as the read (``Ledger.start_attempt``): a reservation still in flight
        (the gate's) needs no other read, and :meth:`reserved` lets its claim go on."""
        return (
            not self.asks_if_run_went_on(held) and self.reserved(1, held, run_went_on=False) is None
        )

    def begun(self, attempt: int, begun: Attempt) -> ClaimStep:
        """What the attempt's start (the thread's claim of the call id, and its start marker)
        means. A call id another run of the thread claimed (a fork's origin, another branch)
        ran there, or may have: nothing of it runs here, and nothing is spent (its reservation
        is given back), ``uncertain``. A start marker found means an earlier attempt started:
        retried when safe, else ``uncertain``."""
        if not begun.claimed or begun.started is None:
            return ClaimStep(outcome=uncertain(self.entry, self.spec, 0), releases=True)
        step = claim(self.spec, started_before=begun.started.existing)
        if step is Claim.UNCERTAIN:
            return ClaimStep(outcome=uncertain(self.entry, self.spec, attempt))
        return ClaimStep(retries=step is Claim.RETRY)

    def produced(self, outcome: CallOutcome) -> bool:
        """Whether the call's result is marked in the ledger as produced (``keys.result_key``):
        what a citation may name and a dependent may wait on. A result saying its run never
        began (a child unfunded) is no output to depend on."""
        return outcome.succeeded and outcome.status is not ReceiptStatus.DENIED


@dataclass(frozen=True, slots=True)
class ExecutePlan:
    """Before any call runs: the run's stop, or the calls that run (``runnable``, in batch
    order) and those the executor refused (``refused``: one refusal refuses every allowed call).

    ``outside``: the dependencies the runnable calls name outside themselves, which the ledger
    is asked about (only calls whose tool returned a result may be depended on). ``started``:
    when the calls started (a poll's interval runs from then). ``last_superstep``: the
    recursion limit leaves no room for another decision after this step.
    """

    stop: StopRequest | None
    settings: ExecuteSettings
    clock: Clock
    runnable: tuple[CallClaim, ...] = ()
    inside: frozenset[str] = frozenset()
    """The call ids of ``runnable``."""
    refused: tuple[CallOutcome, ...] = ()
    started: datetime | None = None
    deadline: Deadline | None = None
    last_superstep: bool = False

    @property
    def alone(self) -> bool:
        """One call that depends on nothing: it needs no event loop of its own (the sync graph
        runs it on its thread)."""
        return len(self.runnable) == 1 and not self.runnable[0].entry.proposal.depends_on

    @property
    def outside(self) -> frozenset[str]:
        """The dependencies named outside the runnable calls: the ledger says which produced a
        result (``account.produced``)."""
        inside = self.inside
        return frozenset(
            d for c in self.runnable for d in c.entry.proposal.depends_on if d not in inside
        )

    def awaits(self, call: CallClaim, *, broken: bool) -> tuple[str, ...]:
        """The calls of the batch ``call`` waits for (holding no slot while it waits): none
        when the batch's dependencies are broken (it never starts then)."""
        if broken:
            return ()
        inside = self.inside
        return tuple(d for d in call.entry.proposal.depends_on if d in inside)

    def start(
        self,
        call: CallClaim,
        outcomes: Sequence[CallOutcome | StopRequest],
        earlier: Mapping[str, JsonValue],
        *,
        broken: bool,
    ) -> CallOutcome | dict[str, JsonValue]:
        """Once the calls ``call`` waited for ended (``outcomes``): what it may read of each
        call it depends on (:func:`dependency_inputs`), or, when one produced no verified
        result (:func:`dependencies_met`) or the batch's dependencies are ``broken``, its
        outcome: it never starts, ``denied`` (``dependency_failed``), and the budget the gate
        reserved for it is given back (nothing is refunded for a call that was attempted).
        ``earlier``: the results of earlier calls the ledger marks as produced."""
        entry, inside = call.entry, self.inside
        outside = [d for d in entry.proposal.depends_on if d not in inside]
        if (broken and entry.proposal.depends_on) or not dependencies_met(
            outcomes, outside, earlier
        ):
            return not_run(
                entry, call.spec, ErrorCode.DEPENDENCY_FAILED, ReceiptStatus.DENIED, attempts=0
            )
        return dependency_inputs(entry, outcomes, earlier)


def plan_execute(
    state: AgentState,
    ctx: RunContext | None,
    settings: ExecuteSettings,
    *,
    given: object,
    remaining_steps: object,
    clock: Clock,
) -> ExecutePlan:
    """Before any call runs: whether the run may go on (``may_go_on.check_before_acting``,
    then the recursion limit), and which calls of the batch run.

    Only allowed calls not answered yet are looked at; the executor's own checks
    (:func:`admits`) refuse one, and then every allowed call of the batch is receipted
    ``denied`` once, as one denial does at the gate. A call already answered (rejected at
    approval, or run in an earlier step and written back into the batch) is skipped; answered
    only grows, so a forged entry can only skip a call (one whose earlier run state does not
    show is stopped by the ledger: :meth:`CallClaim.reserved`). A call id the batch holds
    twice is refused too: the gate never lets one through (``gating.duplicate_call_ids``),
    so such a batch was written by somebody else, and its results could not be joined to its
    proposals by call id."""
    refused = check_before_acting(state, ctx, clock=clock, given=given)
    refused = refused or recursion_stop(remaining_steps, NEEDS_EXECUTE)
    if refused is not None or ctx is None:
        return ExecutePlan(stop=refused, settings=settings, clock=clock)
    started = clock.now()
    checked: list[tuple[BatchEntry, ToolSpec | None, bool]] = []
    ids: set[str] = set()
    repeated = False
    registry, done = settings.registry, state.answered
    for entry in state.batch:
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
            ctx.principal,
            approval=settings.approval,
            verdict_key=settings.verdict_key,
            run_id=state.run_id,
            approver=settings.approver,
            conditional=settings.conditional,
        )
        checked.append((entry, spec, ok))
    runnable: tuple[CallClaim, ...] = ()
    denied: dict[str, CallOutcome] = {}
    if not repeated and all(ok for _, _, ok in checked):
        runnable = tuple(CallClaim(e, s) for e, s, _ in checked if s is not None)
    else:
        for e, s, _ in checked:
            if e.call_id not in denied:
                denied[e.call_id] = not_run(
                    e, s, ErrorCode.PERMISSION_DENIED, ReceiptStatus.DENIED, attempts=0
                )
    return ExecutePlan(
        stop=None,
        settings=settings,
        clock=clock,
        runnable=runnable,
        inside=frozenset(c.entry.call_id for c in runnable),
        refused=tuple(denied.values()),
        started=started,
        deadline=ctx.deadline,
        last_superstep=recursion_stop(remaining_steps, NEEDS_ANOTHER_DECIDE) is not None,
    )


@dataclass(frozen=True, slots=True)
class ExecuteEnd:
    """After every call ended: the run to write before accepted work is certified (``state``:
    its observations, evidence and budget view), each call's outcome joined to the batch by
    call id (``done``, in the order proposed), their receipts, one manifest's fields per call,
    and the stop a refused claim asks for."""

    plan: ExecutePlan
    state: AgentState
    done: Sequence[CallOutcome]
    receipts: tuple[Receipt, ...]
    records: tuple[dict[str, Any], ...]
    stop: StopRequest | None

    @property
    def certified_against(self) -> tuple[Receipt, ...]:
        """The receipts accepted work is certified against (``account.certify``): the run's
        and this batch's."""
        return self.state.receipts + self.receipts

    def closed(self, completed: tuple[Receipt, ...], refused: StopRequest | None) -> AgentState:
        """The run once accepted work was certified (``completed``: the completion receipts
        the ledger marked; ``refused``: the stop a refused marker means): the receipts, the
        open tasks (new accepted ones added, completed ones removed), the batch cleared, and
        its stop.

        The first stop that applies wins: a refused claim or marker, a refusal at the
        executor, the deadline, a budget that cut the batch short (at the gate, or a call's
        attempt), and the recursion limit leaving no room for another decision."""
        state = self.state
        receipts = self.receipts + completed
        update: dict[str, Any] = {
            "receipts": state.receipts + receipts,
            "batch": (),
            "stop": self.stop or refused or self._stop(state.batch),
        }
        open_tasks = open_tasks_after(state.open_tasks, self.done, completed)
        if open_tasks != state.open_tasks:
            update["open_tasks"] = open_tasks
        return state.model_copy(update=update)

    def _stop(self, batch: Batch) -> StopRequest | None:
        plan = self.plan
        if any(
            o.status is ReceiptStatus.DENIED
            and isinstance(o.event, ToolFailed)
            and o.event.error_code is ErrorCode.PERMISSION_DENIED
            for o in self.done
        ):
            return stop(TerminationReason.POLICY_DENIED, "executor_refused")
        if plan.deadline is not None and plan.deadline.expired(clock=plan.clock):
            return stop(TerminationReason.DEADLINE_EXCEEDED, "deadline_exceeded")
        cut = next(
            (e.verdict for e in batch if e.verdict.code is VerdictCode.BUDGET_EXHAUSTED), None
        )
        if cut is not None:
            return stop_for_axis(cut.exhausted_axis, otherwise=BudgetAxis.TOOL_CALLS)
        if any(
            isinstance(o.event, ToolFailed) and o.event.error_code is ErrorCode.BUDGET_EXHAUSTED
            for o in self.done
        ):
            return stop_for_axis(None, otherwise=BudgetAxis.TOOL_CALLS)
        if plan.last_superstep:
            return stop(TerminationReason.STEP_BUDGET_EXHAUSTED, RECURSION_LIMIT)
        return None


def end_execute(
    plan: ExecutePlan,
    state: AgentState,
    results: Sequence[CallOutcome | StopRequest],
) -> ExecuteEnd:
    """What the calls' ``results`` (one per runnable call, in plan order) mean for the run
    (``state``: the run with its budget view as the ledger left it).

    A call whose claim the run's account refused never started: receipted ``denied``,
    ``cancelled`` when a cancel closed the account, else ``permission_denied`` (the caller
    may not spend from it), and the refusal is the run's stop. Outcomes are joined to the
    batch by call id, in the order the model proposed the calls, never in the order they
    arrived (a call id the batch holds twice is reported once), with who approved each. What
    each returned is kept as evidence for the no-progress gate (before the batch is cleared),
    each becomes an observation, and each call the budget could not cover is receipted too.
    Each call's manifest says ``success`` (its code the receipt status), ``uncertain`` or
    ``error`` (its safe error code)."""
    outcomes: list[CallOutcome] = list(plan.refused)
    claim_stop: StopRequest | None = None
    for call, result in zip(plan.runnable, results, strict=True):
        if isinstance(result, StopRequest):
            claim_stop = claim_stop or result
            why = (
                ErrorCode.CANCELLED
                if result.reason is TerminationReason.CANCELLED
                else ErrorCode.PERMISSION_DENIED
            )
            result = not_run(call.entry, call.spec, why, ReceiptStatus.DENIED, attempts=0)
        outcomes.append(result)
    by_id = {o.call_id: o for o in outcomes}
    batch = state.batch
    done = with_approvers([by_id.pop(e.call_id) for e in batch if e.call_id in by_id], batch)
    if plan.started is None:
        raise ValueError("only a plan whose calls ran ends")
    # Every runnable call's entry passed ``admits``, which checked its verdict's fingerprint.
    verified = [call.entry for call in plan.runnable]
    evidence = recorded_evidence(state, done, now=plan.started, verified=verified)
    state = state.model_copy(update={"evidence": evidence})
    state = reduce_tool_events(state, tuple(o.event for o in done))
    receipts = tuple(receipt_for(o) for o in [*done, *budget_refusals(batch)])
    records = []
    for o in done:
        if o.succeeded:
            word: Outcome = "success"
            code: str = o.status.value
        else:
            word = "uncertain" if o.status is ReceiptStatus.UNCERTAIN else "error"
            error = o.event.error_code if isinstance(o.event, ToolFailed) else None
            code = error.value if error is not None else o.status.value
        records.append(
            {
                "outcome": word,
                "decision_kind": "tool",
                "tool_name": o.event.tool_name if o.effect is not None else None,
                "effect": o.effect,
                "verdict": VerdictCode.ALLOWED,
                "code": code,
            }
        )
    return ExecuteEnd(
        plan=plan,
        state=state,
        done=done,
        receipts=receipts,
        records=tuple(records),
        stop=claim_stop,
    )
