"""Where a run is in the loop, and why it ended."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """The loop's position. ``TERMINAL`` is absorbing: nothing leaves it."""

    OBSERVE = "observe"
    DECIDE = "decide"
    VALIDATE = "validate"
    EXECUTE = "execute"
    REDUCE = "reduce"
    TERMINAL = "terminal"


class TerminationReason(StrEnum):
    """Why a run ended. Every run ends with exactly one of these, as data."""

    COMPLETED = "completed"
    INSUFFICIENT_EVIDENCE = "insufficient_evidence"
    NEEDS_CLARIFICATION = "needs_clarification"
    STEP_BUDGET_EXHAUSTED = "step_budget_exhausted"
    TOOL_BUDGET_EXHAUSTED = "tool_budget_exhausted"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CANCELLED = "cancelled"
    INVALID_PROPOSAL = "invalid_proposal"
    NO_PROGRESS = "no_progress"
    POLICY_DENIED = "policy_denied"
    APPROVAL_REQUIRED = "approval_required"
    FAILED = "failed"
