"""Whether a run may go on: trusted identity, deadline, and what the ledger says of it.

Every acting node asks these first. Each returns a :class:`StopRequest` (the run must end, and
why) or ``None`` (go on); none of them raises.
"""

from __future__ import annotations

from collections.abc import Mapping

from fencepost.policy.context import RunContext
from fencepost.policy.deadline import Clock
from fencepost.policy.keys import run_tag
from fencepost.policy.phase import TerminationReason
from fencepost.policy.state import AgentState, StopRequest, stop

# Supersteps a node needs, itself included, before LangGraph's recursion limit: decide needs
# room for execute and the terminal node after it; execute needs room for the terminal node
# (and, to hand back to decide, for decide to stop).
NEEDS_DECIDE = 3
NEEDS_EXECUTE = 2
NEEDS_ANOTHER_DECIDE = 3


def out_of_supersteps(remaining: object, needs: int) -> bool:
    """True when fewer than ``needs`` supersteps remain before the graph's recursion limit."""
    return isinstance(remaining, int) and remaining < needs


def context_refusal(given: object) -> str:
    """The code for a run given no usable context: ``missing_context`` when none was given (or
    an empty one), ``invalid_context`` when something was given that is not a RunContext nor
    its JSON form (``context="acme"``, a principal given as a string): the fix differs."""
    if given is None or (isinstance(given, Mapping) and not given):
        return "missing_context"
    return "invalid_context"


def check_run(
    state: AgentState, ctx: RunContext | None, *, clock: Clock, given: object = None
) -> StopRequest | None:
    """Trusted context present and naming the identity in state, and time left. ``given`` is
    the context as the caller passed it (``ctx`` is ``None`` when it was not usable), so a
    refusal says whether it was missing or malformed."""
    if ctx is None:
        return stop(TerminationReason.POLICY_DENIED, context_refusal(given))
    if state.tenant_id != ctx.tenant_id or state.principal_id != ctx.principal.id:
        return stop(TerminationReason.POLICY_DENIED, "context_mismatch")
    if ctx.deadline is not None and ctx.deadline.expired(clock=clock):
        return stop(TerminationReason.DEADLINE_EXCEEDED, "deadline_exceeded")
    return None


RUN = "run"
"""The owner key naming the run an account was opened for (beside the caller's identity)."""


def run_owner(ctx: RunContext, run_id: str) -> dict[str, str]:
    """What a run's ledger account records as its owner: the caller's identity and the run."""
    return {**ctx.owner(), RUN: run_tag(run_id)}


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
    if {k: v for k, v in owner.items() if k != RUN} != ctx.owner():
        return stop(TerminationReason.POLICY_DENIED, "context_mismatch")
    if run_id is not None and owner.get(RUN, run_tag(run_id)) != run_tag(run_id):
        return stop(TerminationReason.POLICY_DENIED, "account_conflict")
    return None
