"""Whose a run's ledger account is: the owner it records, whether a caller is that owner, and
which accounts may fund a run.

The identity in state can be rewritten by any state update; the owner a ledger account recorded
when it was opened cannot. So every reservation, the terminal node's close and a cancel check
the caller's trusted context against the account's owner, never against state.
"""

from __future__ import annotations

from collections.abc import Mapping

from fencepost.policy.context import RunContext
from fencepost.policy.keys import run_tag
from fencepost.policy.ledger import InvalidLedgerKey, validate_owner
from fencepost.policy.phase import TerminationReason
from fencepost.policy.state import StopRequest, stop

RUN = "run"
"""The owner key naming the run an account was opened for (beside the caller's identity)."""


CAPABILITIES = "capabilities"
"""The owner key saying the requester's capabilities are recorded (its value: how many), each
under a key of its own, ``capability:<name>``. An account opened before they were recorded
has neither, and an approver's answer cannot carry such a run on (:func:`recorded_capabilities`)."""

CAPABILITY = "capability:"
"""The owner key prefix of one capability the requester held when the run started."""

_HELD = "held"


def run_owner(ctx: RunContext, run_id: str) -> dict[str, str]:
    """What a run's ledger account records as its owner: the caller's identity, the run, and
    the capabilities the caller held when the run started.

    The capabilities are what an approver's answer goes on with: LangGraph does not checkpoint
    ``context``, the approver's own must never act for the run, and state can be rewritten. A
    capability no ledger can store as a name (too long, a control character) leaves them all
    unrecorded: such a run waits for its requester after an approver's answer, as an older
    account's does.
    """
    owner = {**ctx.owner(), RUN: run_tag(run_id)}
    held = sorted(ctx.principal.capabilities)
    recorded = {CAPABILITIES: str(len(held)), **{CAPABILITY + c: _HELD for c in held}}
    try:
        return {**owner, **validate_owner(recorded)}
    except InvalidLedgerKey:
        return owner


def recorded_capabilities(owner: Mapping[str, str]) -> frozenset[str] | None:
    """The capabilities the run's requester held when its account was opened; ``None`` where
    the account records none (an account opened before they were recorded)."""
    if CAPABILITIES not in owner:
        return None
    return frozenset(k[len(CAPABILITY) :] for k in owner if k.startswith(CAPABILITY))


def identity(owner: Mapping[str, str]) -> dict[str, str]:
    """The identity an account's owner records (tenant and principal, those it names): what a
    caller's context is compared with; the run and the capabilities recorded beside it are not
    part of it."""
    return {k: owner[k] for k in ("tenant", "principal") if k in owner}


GRANT = "grant:"
"""An owner key ``grant:<principal id>`` lets that principal's runs be funded from an account
that records another principal (its value is not read). A run account grants nothing."""


def check_funding(parent: Mapping[str, str], ctx: RunContext) -> StopRequest | None:
    """Whether an account whose owner is ``parent`` may fund a run of the caller in ``ctx``
    (be its ``budget_account``): a run spends only what its principal owns or was granted.

    An account of another tenant funds nothing; a run account (its owner names a run) funds only
    runs of its own principal, its child runs; an account that records a principal funds that
    principal's runs and those it grants; one that records only a tenant is the tenant's pool,
    and one that records no owner is open to all.
    """
    tenant, principal = parent.get("tenant"), parent.get("principal")
    if tenant is not None and tenant != ctx.tenant_id:
        return _funding_denied()
    if RUN in parent:
        return None if principal == ctx.principal.id else _funding_denied()
    if principal is None or principal == ctx.principal.id or GRANT + ctx.principal.id in parent:
        return None
    return _funding_denied()


def _funding_denied() -> StopRequest:
    return stop(TerminationReason.POLICY_DENIED, "budget_account_denied")


def check_owner(
    owner: Mapping[str, str], ctx: RunContext, run_id: str | None = None
) -> StopRequest | None:
    """The run's ledger account was opened for the caller's identity (and, given ``run_id``,
    for that run), whatever state says.

    An account opened before owners were recorded (no owner), or before they named the run, is
    not second-guessed on what it does not record. Another run on the account is a conflict:
    two runs on one thread id (separate checkpointers, one ledger) would share its markers.
    """
    if not owner:
        return None
    # ``identity(owner) != ctx.owner()``, without building either (checked at every hold): a
    # context's tenant and principal are always strs, so an owner that lacks one differs.
    if owner.get("tenant") != ctx.tenant_id or owner.get("principal") != ctx.principal.id:
        return stop(TerminationReason.POLICY_DENIED, "context_mismatch")
    if run_id is not None:
        tag = run_tag(run_id)
        if owner.get(RUN, tag) != tag:
            return stop(TerminationReason.POLICY_DENIED, "account_conflict")
    return None
