"""What happened to one call of a batch, as data, and the one function that receipts it."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict

from fencepost.policy._model import Frozen
from fencepost.policy.effect import Effect
from fencepost.policy.events import ToolFailed, ToolSucceeded
from fencepost.policy.receipt import Receipt, ReceiptStatus


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

    @property
    def call_id(self) -> str:
        """The call this outcome answers."""
        return self.event.call_id

    @property
    def succeeded(self) -> bool:
        """Whether the tool returned a result."""
        return isinstance(self.event, ToolSucceeded)


def receipt_for(outcome: CallOutcome) -> Receipt:
    """The receipt ``outcome`` is reported as: status, safe error code, attempts."""
    event = outcome.event
    return Receipt(
        call_id=event.call_id,
        tool_name=event.tool_name,
        status=outcome.status,
        error_code=event.error_code if isinstance(event, ToolFailed) else None,
        attempts=outcome.attempts,
        effect=outcome.effect,
        task_id=outcome.task_id,
    )
