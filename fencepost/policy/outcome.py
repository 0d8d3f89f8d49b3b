"""What happened to one call of a batch, as data, and the one function that receipts it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import Field, Strict

from fencepost.policy.batch import BatchEntry
from fencepost.policy.contract import Frozen, assemble
from fencepost.policy.effect import Effect
from fencepost.policy.error_codes import ErrorCode
from fencepost.policy.events import ToolFailed, ToolSucceeded
from fencepost.policy.receipt import Accepted, Completed, Receipt, ReceiptStatus
from fencepost.policy.value_source import Recorded


class RunReport(Frozen):
    """Base of a tool result that reports on a run of its own (a child run's
    :class:`~fencepost.adapters.child_run.ChildRunResult`).

    ``completed`` is that run's word that it reached its verified end state. A report saying
    it did not is still the call's result (data the model is shown, with the run's own reason),
    but the call's receipt is ``failed`` with ``incomplete``: work not done is never a completed
    call, an answer cannot cite it as evidence, and a call that depends on it does not run.
    """

    completed: bool
    """Whether the reported run completed: ``completed`` only with its end state verified."""
    started: bool = True
    """Whether the reported run began. ``False``: it was refused before it began (nothing left
    to fund it, a stopped parent): no run did anything, so the call is receipted ``denied``
    with :meth:`refusal_code`, among the calls that never started, never as a failure."""

    def refusal_code(self) -> ErrorCode:
        """With ``started=False``: the safe code of why the run never began (the receipt's).
        A report that knows its run's reason names it (a child run's: cancelled, out of
        budget)."""
        return ErrorCode.PERMISSION_DENIED


def result_status(value: object) -> ReceiptStatus:
    """The receipt status of a call whose tool returned ``value``: work only accepted (a task
    id) is pending, a run reported never started denied, a run reported not completed failed,
    anything else completed."""
    if isinstance(value, Accepted):
        return ReceiptStatus.ACCEPTED_PENDING
    if isinstance(value, RunReport) and not value.started:
        return ReceiptStatus.DENIED
    if isinstance(value, RunReport) and not value.completed:
        return ReceiptStatus.FAILED
    return ReceiptStatus.COMPLETED


class CallOutcome(Frozen):
    """One call's outcome: the event that becomes its observation and its receipt's status."""

    event: ToolSucceeded | ToolFailed
    status: Annotated[ReceiptStatus, Strict(False)]
    attempts: Annotated[int, Field(ge=0)]
    """Attempts started for this call id (each one reserved and charged)."""
    effect: Annotated[Effect | None, Strict(False)] = None
    """The registered tool's effect; ``None`` when the name was never registered."""
    task_id: str | None = None
    """With ``accepted_pending``: the task the tool accepted."""
    completes: str | None = None
    """The accepted task this call's result completes, its evidence having been verified."""
    evidence_for: Annotated[tuple[str, ...], Strict(False)] = ()
    """With ``completes``: the accepting tools whose tasks this call's tool is evidence for
    (``ToolSpec.evidence_for``)."""
    approval: Literal["approver", "human"] | None = None
    """Who answered the call's approval (see ``Receipt.approval``)."""
    scope_id: str | None = None
    """The remembered approval scope that approved it (see ``Receipt.scope_id``)."""
    approved_by: str | None = None
    """The principal who answered it (see ``Receipt.approved_by``)."""
    rule: str | None = None
    """With a denial: the safe code of what denied it (see ``Receipt.rule``)."""
    code: Annotated[ErrorCode | None, Strict(False)] = None
    """The receipt's code where the event carries none: why a reported run never started."""
    missing_capability: str | None = None
    """With a capability denial: the capability the principal lacks (see
    ``Receipt.missing_capability``)."""
    provenance: Annotated[Recorded | None, Strict(False)] = None
    """Where its argument values were seen (see ``Receipt.provenance``)."""

    @property
    def call_id(self) -> str:
        """The call this outcome answers."""
        return self.event.call_id

    @property
    def succeeded(self) -> bool:
        """Whether the tool returned a result."""
        return isinstance(self.event, ToolSucceeded)


_EVENTS = frozenset((ToolSucceeded, ToolFailed))
_RECEIPT_GIVEN = frozenset(Receipt.model_fields) - {"completed_by"}
"""The fields :func:`receipt_for` gives (validation records them as given, defaults or not)."""


def receipt_for(outcome: CallOutcome) -> Receipt:
    """The receipt ``outcome`` is reported as: status, safe error code, attempts.

    A call that returned a result yet failed reported work not done (:class:`RunReport`): its
    code is ``incomplete``.
    """
    event = outcome.event
    code = event.error_code if isinstance(event, ToolFailed) else outcome.code
    if code is None and outcome.status is ReceiptStatus.FAILED:
        code = ErrorCode.INCOMPLETE
    if type(outcome) is CallOutcome and type(event) in _EVENTS:
        # Made by validation (or copied from one with values that were): every value the
        # receipt takes is already one of its field's, so it is assembled, not checked again.
        fields = outcome.__dict__
        return assemble(
            Receipt,
            {
                "call_id": event.__dict__["call_id"],
                "tool_name": event.__dict__["tool_name"],
                "status": fields["status"],
                "error_code": code,
                "attempts": fields["attempts"],
                "effect": fields["effect"],
                "task_id": fields["task_id"],
                "completed_by": None,
                "approval": fields["approval"],
                "scope_id": fields["scope_id"],
                "approved_by": fields["approved_by"],
                "rule": fields["rule"],
                "missing_capability": fields["missing_capability"],
                "provenance": fields["provenance"],
            },
            _RECEIPT_GIVEN,
        )
    return Receipt(
        call_id=event.call_id,
        tool_name=event.tool_name,
        status=outcome.status,
        error_code=code,
        attempts=outcome.attempts,
        effect=outcome.effect,
        task_id=outcome.task_id,
        approval=outcome.approval,
        scope_id=outcome.scope_id,
        approved_by=outcome.approved_by,
        rule=outcome.rule,
        missing_capability=outcome.missing_capability,
        provenance=outcome.provenance,
    )


def with_approvers(
    outcomes: Iterable[CallOutcome], batch: Iterable[BatchEntry]
) -> list[CallOutcome]:
    """``outcomes`` with who answered each call's approval, and the provenance its arguments
    were gated with, as its verdict in ``batch`` says (the executor's outcomes know what ran,
    the verdicts who let it, and why)."""
    by_id = {
        e.call_id: e.verdict
        for e in batch
        if e.verdict.approval is not None or e.verdict.provenance is not None
    }
    if not by_id:
        return list(outcomes)
    out = []
    for o in outcomes:
        verdict = by_id.get(o.call_id)
        update: dict[str, Any] = {}
        if verdict is not None and o.approval is None and verdict.approval is not None:
            update["approval"] = verdict.approval
            update["approved_by"] = verdict.approved_by
            update["scope_id"] = verdict.scope_id
        if verdict is not None and o.provenance is None and verdict.provenance is not None:
            update["provenance"] = verdict.provenance
        out.append(o.model_copy(update=update) if update else o)
    return out


class MalformedMarker(ValueError):
    """A tool returned an ``Accepted`` or ``Completed`` that does not hold what its class
    declares. Carries no text of the value: it is the tool's, untrusted."""

    def __init__(self) -> None:
        super().__init__("malformed Accepted/Completed")


def checked_marker(value: Any) -> Accepted | Completed | None:
    """The ``Accepted``/``Completed`` a tool returned, validated; ``None`` if it returned neither.

    Built with ``model_copy(update=...)`` (or by a subclass), a marker skipped validation and may
    hold anything: a task id that is not text, evidence values that are ints or ``None``. It is
    rebuilt from the fields its class declares, read from the instance itself (never through a
    property a subclass may define), and validated strictly; one that does not validate raises
    :class:`MalformedMarker`, so the call fails with a safe code instead of crashing its node.
    """
    kind: type[Accepted] | type[Completed]
    if isinstance(value, Accepted):
        kind = Accepted
    elif isinstance(value, Completed):
        kind = Completed
    else:
        return None
    try:
        fields = vars(value)
        return kind.model_validate({name: fields.get(name) for name in kind.model_fields})
    except Exception:
        raise MalformedMarker from None
