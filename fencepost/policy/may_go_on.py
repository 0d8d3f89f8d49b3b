"""Whether a run may go on: the caller's trusted context given, naming the identity the run was
started for, time left, and supersteps left before LangGraph's recursion limit.

Every acting node asks :func:`check_before_acting` first. It returns a :class:`StopRequest` (the
run must end, and why) or ``None`` (go on), and never raises. What the ledger says of the run is
checked where the node reserves: the account's owner (:mod:`fencepost.policy.ownership`), a
closed account and the budget (:mod:`fencepost.policy.reservations`).

The recursion limit's stop: LangGraph raises ``GraphRecursionError`` when a run takes more
supersteps than its ``recursion_limit``; a fencepost run never does (DESIGN invariant 1). A node
that has too few supersteps left for what must still follow it asks for this stop instead:
``step_budget_exhausted`` with the code ``recursion_limit``.
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
    state: AgentState,
    ctx: RunContext | None,
    *,
    clock: Clock,
    given: object = None,
    remaining_steps: object = None,
    needs: int = 0,
) -> StopRequest | None:
    """Trusted context present and naming the identity in state, time left, and, for a node
    that reads LangGraph's ``remaining_steps``, at least ``needs`` supersteps left
    (:func:`recursion_stop`). ``given`` is the context as the caller passed it (``ctx`` is
    ``None`` when it was not usable), so a refusal says whether it was missing or malformed."""
    if ctx is None:
        return stop(TerminationReason.POLICY_DENIED, context_refusal(given))
    if state.tenant_id != ctx.tenant_id or state.principal_id != ctx.principal.id:
        return stop(TerminationReason.POLICY_DENIED, "context_mismatch")
    if ctx.deadline is not None and ctx.deadline.expired(clock=clock):
        return stop(TerminationReason.DEADLINE_EXCEEDED, "deadline_exceeded")
    return recursion_stop(remaining_steps, needs)


# Supersteps a node needs, itself included, before LangGraph's recursion limit: decide needs
# room for execute and the terminal node after it; execute needs room for the terminal node
# (and, to hand back to decide, for decide to stop).
NEEDS_DECIDE = 3
"""Supersteps ``decide`` needs, itself included: itself, ``execute`` and the terminal node."""
NEEDS_EXECUTE = 2
"""Supersteps ``execute`` needs, itself included: itself and the terminal node."""
NEEDS_ANOTHER_DECIDE = 3
"""Supersteps ``execute`` needs to hand back to ``decide``: itself, ``decide`` (to stop) and the
terminal node."""

RECURSION_LIMIT = "recursion_limit"
"""The code of a run stopped by the recursion limit."""


def out_of_supersteps(remaining: object, needs: int) -> bool:
    """True when fewer than ``needs`` supersteps remain before the graph's recursion limit.

    ``remaining`` is LangGraph's ``remaining_steps`` managed value as the node read it; anything
    but an int (a graph without it) is never out."""
    return isinstance(remaining, int) and remaining < needs


def recursion_stop(remaining_steps: object, needs: int) -> StopRequest | None:
    """The stop a node asks for when the recursion limit leaves fewer supersteps than ``needs``
    (one of the ``NEEDS_*`` above): ``step_budget_exhausted`` (``recursion_limit``), as data,
    never a ``GraphRecursionError``; ``None`` while there is room."""
    if out_of_supersteps(remaining_steps, needs):
        return stop(TerminationReason.STEP_BUDGET_EXHAUSTED, RECURSION_LIMIT)
    return None
