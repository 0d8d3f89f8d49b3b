"""Stopping is not undoing: who may stop a run, and when a child run may not start.

Seed 002: a stop blocks new children, follows the work already started to its real end, and
keeps the id and lookup path of every effect already started (the ending's plan receipts each
such call ``uncertain``: ``terminate.EndingPlan.end``). The graph's cancel and the child run
tool do the ledger and checkpoint I/O; the decisions are these functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fencepost.policy.budget import BudgetExhausted
from fencepost.policy.context import RunContext
from fencepost.policy.ledger import AccountClosed, Balance, check_open, check_room
from fencepost.policy.ownership import check_owner
from fencepost.policy.reservations import stop_for_closed, stop_for_exhausted
from fencepost.policy.state import StopRequest


class CancelRefused(PermissionError):
    """``cancel``/``acancel`` named a context that is not the run's owner: nothing was changed.

    ``code`` says why: ``context_mismatch`` (another tenant or principal) or ``account_conflict``
    (the thread's ledger account belongs to another run).
    """

    def __init__(self, code: str) -> None:
        super().__init__(
            f"cancel refused ({code}): the context is not the one this run was started for; "
            "nothing was changed"
        )
        self.code = code


def cancel_refusal(
    owner: Mapping[str, str] | None,
    ctx: RunContext | None,
    *,
    tenant_id: str | None,
    principal_id: str | None,
    run_id: str | None,
) -> str | None:
    """Why the caller in ``ctx`` may not cancel the run, or ``None`` if it may.

    ``owner`` is what the run's ledger account records (``None``: the ledger has no such account,
    e.g. a non-durable one lost with its process); the identity in state speaks only then, since
    the ledger is the truth a state update cannot reach. Without a context it is the operator's
    cancel, which anyone holding the graph and the thread may make.
    """
    if ctx is None:
        return None
    if owner is not None:
        refused = check_owner(owner, ctx, run_id)
        return None if refused is None else refused.error_code
    if tenant_id is None and principal_id is None:
        return None  # nothing ran far enough to bind an identity: nothing of anyone's to end
    if (tenant_id, principal_id) != (ctx.tenant_id, ctx.principal.id):
        return "context_mismatch"
    return None


def child_start_refusal(
    limits: Mapping[str, float],
    parents: Iterable[Balance],
    amounts: Mapping[str, float],
) -> StopRequest | None:
    """Why a child run must not start, or ``None`` if its first step can be funded.

    ``limits`` are the child's own; ``parents`` its parent account and that account's ancestors,
    nearest first. A closed parent (a cancel) or a chain that cannot hold the first step means
    no child run starts: no checkpoint thread, no ledger account, only the parent call's result.
    """
    chain = list(parents)
    try:
        check_open((b.account, b.closed) for b in chain)
        check_room(
            [("child", limits, {}), *((b.account, b.limits, b.held) for b in chain)], amounts
        )
    except AccountClosed as closed:
        return stop_for_closed(closed.reason)
    except BudgetExhausted as exhausted:
        return stop_for_exhausted(exhausted)
    return None
