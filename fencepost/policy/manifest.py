"""The per-step trace manifest: what happened, with no prompt, argument or result text."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, Strict

from fencepost.policy.contract import Frozen
from fencepost.policy.decision import DecisionKind
from fencepost.policy.effect import Effect
from fencepost.policy.phase import Phase
from fencepost.policy.value_source import Recorded
from fencepost.policy.verdict import VerdictCode

Outcome = Literal[
    "decided",
    "allowed",
    "denied",
    "success",
    "error",
    "uncertain",
    "approval_pending",
    "terminal",
]


class StepManifest(Frozen):
    """One node's record for the trace and for eval. Safe to log: it holds no payload text."""

    run_id: str
    step: Annotated[int, Field(ge=0)]
    """The model step this record belongs to (1-based; 0 before the first decision)."""
    phase: Annotated[Phase, Strict(False)]
    decision_kind: DecisionKind | None = None
    tool_name: str | None = None
    effect: Annotated[Effect | None, Strict(False)] = None
    verdict: Annotated[VerdictCode | None, Strict(False)] = None
    steps_remaining: int
    tool_calls_remaining: int
    tokens_used: int = 0
    deadline_remaining_ms: int | None = None
    outcome: Outcome
    code: str | None = None
    """A safe code: the error code, verdict code or termination reason for this record."""
    input_tokens: int | None = None
    output_tokens: int | None = None
    approval: Literal["approver", "human"] | None = None
    """Who answered this call's approval, on the record of the answer: the approver policy or
    a human."""
    approved_by: str | None = None
    """With ``approval="human"``: the id of the principal who answered."""
    provenance: Annotated[Recorded | None, Strict(False)] = None
    """On a gated call's record: where its argument values were seen, per argument, as the
    sources' labels (``{"recipient": ["tool:call_3"]}``) — by call id and kind, never a value.
    ``None``: not traced (see :func:`fencepost.policy.provenance.traced`)."""


def verdict_outcome(code: VerdictCode) -> Outcome:
    """A gated or answered call's record: ``allowed``, ``approval_pending`` (waiting for a
    human), or ``denied`` (every other verdict)."""
    if code is VerdictCode.ALLOWED:
        return "allowed"
    if code is VerdictCode.APPROVAL_PENDING:
        return "approval_pending"
    return "denied"
