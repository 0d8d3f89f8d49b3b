"""The gate's verdict on one proposal: allowed, or denied with a code. A result, not an exception."""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Strict

from fencepost.policy.contract import Frozen
from fencepost.policy.phase import TerminationReason
from fencepost.policy.value_source import Recorded


class VerdictCode(StrEnum):
    """Why a proposal was allowed or denied."""

    ALLOWED = "allowed"
    UNKNOWN_TOOL = "unknown_tool"
    SCHEMA_VIOLATION = "schema_violation"
    SEMANTIC_VIOLATION = "semantic_violation"
    NO_PROGRESS = "no_progress"
    CAPABILITY_DENIED = "capability_denied"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_PENDING = "approval_pending"
    REJECTED = "rejected"
    BUDGET_EXHAUSTED = "budget_exhausted"
    UNTRUSTED_PROVENANCE = "untrusted_provenance"
    """A write or external call whose sensitive arguments trace only to untrusted output,
    refused by the graph's ``provenance="refuse"`` rule (:mod:`fencepost.policy.provenance`)."""


_REASON = {
    VerdictCode.UNKNOWN_TOOL: TerminationReason.INVALID_PROPOSAL,
    VerdictCode.SCHEMA_VIOLATION: TerminationReason.INVALID_PROPOSAL,
    VerdictCode.SEMANTIC_VIOLATION: TerminationReason.INVALID_PROPOSAL,
    VerdictCode.NO_PROGRESS: TerminationReason.NO_PROGRESS,
    VerdictCode.CAPABILITY_DENIED: TerminationReason.POLICY_DENIED,
    VerdictCode.APPROVAL_REQUIRED: TerminationReason.APPROVAL_REQUIRED,
    VerdictCode.REJECTED: TerminationReason.POLICY_DENIED,
    VerdictCode.UNTRUSTED_PROVENANCE: TerminationReason.POLICY_DENIED,
}


class Verdict(Frozen):
    """The recorded outcome of gating one proposal.

    The executor runs a call only when a verdict for the same ``call_id`` and the same
    ``fingerprint`` says ``allowed`` — so nothing but the gate can let a call through.
    """

    call_id: str
    tool_name: str
    fingerprint: str
    """sha256 of tool name and canonical arguments (see :func:`proposal_fingerprint`)."""
    code: Annotated[VerdictCode, Strict(False)]
    problems: Annotated[tuple[str, ...], Strict(False)] = ()
    """Why a schema or semantic check refused the call, as field paths and rule names — never
    the values the model sent (``"query: missing"``, ``"rule: reversed_range_start_end"``)."""
    exhausted_axis: str | None = None
    """With ``budget_exhausted``: the budget axis that could not cover this call."""
    seal: str | None = None
    """HMAC over run, call id and fingerprint of an allowed (or pending) verdict, when the
    runtime has a key: lets the executor (and the approval) tell a verdict the gate wrote from
    one written into state by anyone else."""
    approval: Literal["approver", "human"] | None = None
    """Who answered this call's approval: the graph's approver policy, or a human on resume
    (``None``: it needed none, or has not been answered). Sealed with the verdict."""
    scope_id: str | None = None
    """The remembered approval scope that approved this call, or that its "approve always"
    answer created (:mod:`fencepost.policy.remembered`). Sealed with the verdict."""
    missing_capability: str | None = None
    """With ``capability_denied``: the capability the trusted principal lacks (the registered
    tool's, from trusted configuration). Named to the operator — the stop report, the log, the
    span — and never to the model, whose observation keeps the safe code only."""
    approved_by: str | None = None
    """With ``approval="human"``: the id of the principal whose answer this is (the requester,
    or another principal of the run's tenant holding the approval right). Sealed too."""
    provenance: Annotated[Recorded | None, Strict(False)] = None
    """Where the call's argument values were seen, as :meth:`Provenance.record
    <fencepost.policy.provenance.Provenance.record>` labels them (``{"recipient":
    ["tool:call_3", "user"]}``): sources by call id and kind, never a value. ``None``: not
    traced (a read without sensitive arguments, an unregistered tool, an edited call)."""

    @property
    def allowed(self) -> bool:
        """Whether the executor may run this call."""
        return self.code is VerdictCode.ALLOWED

    @property
    def termination(self) -> TerminationReason | None:
        """The reason a run ends with when this verdict denies, if it ends the run."""
        return _REASON.get(self.code)


def _mac(key: bytes, run_id: str, verdict: Verdict) -> str:
    parts = [run_id, verdict.call_id, verdict.tool_name, verdict.fingerprint]
    if verdict.approval is not None:
        # Who approved is part of what is sealed (a verdict without one keeps its old seal).
        parts.append("approval:" + verdict.approval)
    if verdict.scope_id is not None:
        parts.append("scope:" + verdict.scope_id)
    if verdict.approved_by is not None:
        parts.append("approved_by:" + verdict.approved_by)
    if verdict.code is VerdictCode.APPROVAL_PENDING:
        # Its own message: a pending verdict's seal never passes for an allowed one's.
        parts.append(VerdictCode.APPROVAL_PENDING.value)
    message = "\x00".join(parts)
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).hexdigest()


_SEALED = frozenset({VerdictCode.ALLOWED, VerdictCode.APPROVAL_PENDING})


def seal_verdict(verdict: Verdict, *, run_id: str, key: bytes) -> Verdict:
    """The verdict with its seal set. Only the gate's allowed verdicts are sealed (the executor
    runs only those) and its pending ones (a human is asked only about those)."""
    if verdict.code not in _SEALED:
        return verdict
    return verdict.model_copy(update={"seal": _mac(key, run_id, verdict)})


def verdict_is_sealed(verdict: Verdict, *, run_id: str, key: bytes) -> bool:
    """Whether ``verdict`` carries a valid seal made with ``key`` for ``run_id``, for its code."""
    return (
        verdict.code in _SEALED
        and verdict.seal is not None
        and hmac.compare_digest(verdict.seal, _mac(key, run_id, verdict))
    )
