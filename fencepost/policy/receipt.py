"""What happened to each call, as a fact: the executor's receipt per call id."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, Strict

from fencepost.policy._model import Frozen
from fencepost.policy.error_codes import ErrorCode


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


class Accepted(Frozen):
    """Return this from a tool that only *accepted* work (an upload that yields a task id).

    The call's receipt is ``accepted_pending``, not ``completed``: an HTTP 200 or a task id is not
    evidence that the work is done. A later status check that finds the finished artifact is.
    """

    task_id: Annotated[str, Field(min_length=1)]
    detail: dict[str, str] = Field(default_factory=dict)
    """Safe, structured facts about the accepted work (never free text from a provider)."""
