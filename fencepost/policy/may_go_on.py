"""Whether a run may go on: the caller's trusted context given, naming the identity the run was
started for, and time left.

Every acting node asks :func:`check_before_acting` first. It returns a :class:`StopRequest` (the
run must end, and why) or ``None`` (go on), and never raises. What the ledger says of the run is
checked where the node reserves: the account's owner (:mod:`fencepost.policy.ownership`), a
closed account and the budget (:mod:`fencepost.policy.reservations`).
"""

from __future__ import annotations

from collections.abc import Mapping

from fencepost.policy.context import RunContext
from fencepost.policy.deadline import Clock
from fencepost.policy.phase import TerminationReason
from fencepost.policy.state import AgentState, StopRequest, stop


def context_refusal(given: object) -> str:
    """The code for a run given no usable context: ``missing_context`` when none was given (or
    an empty one), ``invalid_context`` when something was given that is not a RunContext nor
    its JSON form (``context="acme"``, a principal given as a string): the fix differs."""
    if given is None or (isinstance(given, Mapping) and not given):
        return "missing_context"
    return "invalid_context"


def check_before_acting(
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
