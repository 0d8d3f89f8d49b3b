"""Conditional approval: a tool (or the graph) decides per call whether the call needs approval.

By default exactly the calls of a ``write`` or ``external`` tool need approval. A tool's
``needs_approval`` (or the graph's, for every tool without one of its own) decides per call
instead, from the call's arguments and the run's trusted context — what openai-agents'
``needs_approval`` and LangChain's HITL ``when`` do: a transfer under a limit may run unasked,
a read of a customer's record may need a human.

It is asked at the gate, once per call that passed every check before authorization, and
contained as an approver is: it gets at most :data:`NEEDS_APPROVAL_TIMEOUT_SECONDS` (or what is
left of the run's deadline), a sync one on a thread of its own and an ``async`` one on a leash,
either left behind at its timeout. Fail closed: anything but ``True`` or ``False`` in time — it
raised (its own ``CancelledError``, ``GeneratorExit`` or ``SystemExit`` included), it hung, it
returned ``1`` or ``None`` — means the call needs approval, and what went wrong is logged on
``fencepost.approval`` (with the traceback of what it raised), never kept in state.

Example::

    def large_transfers(question: ApprovalQuestion) -> bool:
        limit = question.context.app_data.get("transfer_limit", 0)
        return question.proposal.arguments.get("amount", limit + 1) > limit
"""

from __future__ import annotations

from dataclasses import dataclass

from fencepost.policy.context import RunContext
from fencepost.policy.decision import ToolProposal
from fencepost.policy.effect import Effect
from fencepost.policy.tool import NeedsApproval, ToolSpec

NEEDS_APPROVAL_TIMEOUT_SECONDS = 5.0
"""The longest a ``needs_approval`` callable is given for one call (the run's deadline may cut
it): it judges arguments, it does not wait for anyone."""

NEEDS_APPROVAL_FAILED = "needs_approval_failed"
"""The code logged when a ``needs_approval`` callable did not answer ``True`` or ``False`` in
time (the call then needs approval)."""


@dataclass(frozen=True, slots=True)
class ApprovalQuestion:
    """What a ``needs_approval`` callable is given for one call."""

    proposal: ToolProposal
    """The call as the model proposed it: tool name, call id, arguments (untrusted values,
    which passed the tool's strict schema and semantic rules)."""
    tool: ToolSpec
    """The registered tool: its effect and capability (trusted configuration)."""
    context: RunContext
    """The run's trusted context: tenant, principal, deadline and the caller's ``app_data``."""


def deciding(spec: ToolSpec, graph: NeedsApproval | None) -> NeedsApproval | None:
    """The callable that decides whether a call of ``spec`` needs approval: the tool's own,
    else the graph's, else none (the effect decides)."""
    return spec.needs_approval if spec.needs_approval is not None else graph


def by_effect(spec: ToolSpec) -> bool:
    """Whether a call of ``spec`` needs approval when nothing decides per call."""
    return spec.effect is not Effect.READ


def read_needs_approval(value: object) -> bool | None:
    """A ``needs_approval`` answer: ``True`` or ``False`` exactly, else ``None`` (the caller
    fails closed: the call needs approval). ``1``, ``"no"`` and ``None`` are no answer."""
    return value if type(value) is bool else None


__all__ = [
    "NEEDS_APPROVAL_FAILED",
    "NEEDS_APPROVAL_TIMEOUT_SECONDS",
    "ApprovalQuestion",
    "by_effect",
    "deciding",
    "read_needs_approval",
]
