"""What happened to each call, as a fact: the executor's receipt per call id."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, Strict

from fencepost.policy.contract import Frozen
from fencepost.policy.effect import Effect
from fencepost.policy.error_codes import ErrorCode
from fencepost.policy.value_source import Recorded


class ReceiptStatus(StrEnum):
    """The reportable outcome of one call."""

    COMPLETED = "completed"
    FAILED = "failed"
    DENIED = "denied"
    ACCEPTED_PENDING = "accepted_pending"
    """The tool accepted the work (a task id) but it is not done yet."""
    UNCERTAIN = "uncertain"
    """A crash left it unknown whether the effect happened; it is not guessed."""


class Receipt(Frozen):
    """The executor's record of one call id: status, safe error code, and attempts made."""

    call_id: str
    tool_name: str
    status: Annotated[ReceiptStatus, Strict(False)]
    error_code: Annotated[ErrorCode | None, Strict(False)] = None
    attempts: Annotated[int, Field(ge=0)] = 1
    """How many times the call was started (each one reserved and charged)."""
    effect: Annotated[Effect | None, Strict(False)] = None
    """The tool's effect (``None``: not recorded, or the name was never registered): a stop
    report lists the write and external effects already made."""
    task_id: str | None = None
    """With ``accepted_pending``: the task the tool accepted (see :class:`Accepted`)."""
    completed_by: str | None = None
    """Set on the receipt that turns an accepted task ``completed``: the call id of the later
    call whose observation carried the completion evidence (see :class:`Completed`)."""
    approval: Literal["approver", "human"] | None = None
    """Who answered the call's approval: the graph's approver policy or a human (``None``: it
    needed none)."""
    scope_id: str | None = None
    """The remembered approval scope that approved the call (or that its "approve always"
    answer created): see :mod:`fencepost.policy.remembered` and ``fencepost approvals``."""
    approved_by: str | None = None
    """With ``approval="human"``: the id of the principal who answered (the requester, or an
    approver of the run's tenant holding the approval right)."""
    rule: str | None = None
    """With ``denied``: the safe code of what denied the call — the gate's verdict code
    (``capability_denied``), a semantic rule's name (``unknown_payee``) or the approver's own
    code. Never text of the call's arguments."""
    missing_capability: str | None = None
    """With ``denied`` by ``capability_denied``: the capability the trusted principal lacks (the
    registered tool's). For the operator (the stop report); the model's observation of the call
    carries the safe code ``permission_denied`` only."""
    provenance: Annotated[Recorded | None, Strict(False)] = None
    """Where the call's argument values were seen when it was gated, per argument: the
    sources' labels (``{"recipient": ["tool:call_3", "user"]}``), by call id and kind, never a
    value (:mod:`fencepost.policy.provenance`). ``None``: the call was not traced."""


class Accepted(Frozen):
    """Return this from a tool that only *accepted* work (an upload that yields a task id).

    The call's receipt is ``accepted_pending``, not ``completed``: an HTTP 200 or a task id is not
    evidence that the work is done. A later status check that finds the finished artifact is.
    """

    task_id: Annotated[str, Field(min_length=1)]
    detail: dict[str, str] = Field(default_factory=dict)
    """Safe, structured facts about the accepted work (never free text from a provider)."""


class Completed(Frozen):
    """Return this from a status tool that found accepted work finished, with its evidence.

    The task's original receipt becomes ``completed`` only when this carries every evidence field
    the tool declares in ``ToolSpec.completion_evidence`` (for an upload: the document id, its
    version and its access path). A status that merely says "done" is not evidence.

    Example: ``Completed(task_id="task-17", evidence={"document_id": "document-42",
    "version": "3", "access_path": "/docs/42"})``.
    """

    task_id: Annotated[str, Field(min_length=1)]
    evidence: dict[str, str] = Field(default_factory=dict)
    """Where the finished work is: identifiers and paths, never free text from a provider."""


def current_receipts(receipts: Iterable[Receipt]) -> tuple[Receipt, ...]:
    """Each call id's latest receipt, in the order the calls were first receipted.

    Receipts are append-only: a task completed later gets a new receipt for the call that
    accepted it, and that one is current.
    """
    latest: dict[str, Receipt] = {}
    for receipt in receipts:
        latest[receipt.call_id] = receipt
    return tuple(latest.values())
