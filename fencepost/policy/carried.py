"""What a run's re-opened ledger account carries over from its checkpoint.

A ledger that was not durable (an in-memory one) is gone when its process is: the run's
account is opened again, and the checkpoint is the only record of what the run spent. Most of
that is spent for good and is carried as one lump; but the calls of the current batch that the
gate (or an approval) reserved and that have not run yet are still reservations the executor
will look up by key. They are carried under those keys, with what each one reserves, so the
executor finds them held instead of charging them a second time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet

from fencepost.policy.budget import BudgetAxis
from fencepost.policy.contract import Frozen
from fencepost.policy.reservations import to_reserve
from fencepost.policy.state import AgentState


class Carried(Frozen):
    """A re-opened account's opening holdings: a lump, and the reservations still open."""

    spent: dict[str, float]
    """Per axis, what the checkpoint says was used beyond the open reservations (carried as one
    reservation); axes with nothing are left out."""
    open_calls: tuple[tuple[str, dict[str, float]], ...]
    """``(call id, amounts)`` of each batch call reserved and not yet run, in batch order."""


def carried_over(
    state: AgentState,
    amounts_of: Callable[[str], Mapping[str, float] | None],
    *,
    fresh: AbstractSet[str] = frozenset(),
) -> Carried:
    """What the account of the run in ``state`` re-opens with. ``amounts_of`` gives what one
    attempt of a registered tool reserves (``reservations.call_amounts``), ``None`` for a name
    the registry does not hold (such a call is not carried on its own: it never runs).

    ``fresh`` names the calls being reserved for the first time right now (just allowed by the
    gate, or just approved): allowed in ``state`` already, but not yet part of what it spent.
    """
    used = {axis.value: float(state.budget.used(axis)) for axis in BudgetAxis}
    receipted = {receipt.call_id for receipt in state.receipts}
    open_calls: list[tuple[str, dict[str, float]]] = []
    for entry in to_reserve(state.batch):
        if entry.call_id in receipted or entry.call_id in fresh:
            continue
        amounts = amounts_of(entry.proposal.tool_name)
        if amounts is None:
            continue
        # Never more than the view says was used: a state that claims an open call the budget
        # does not account for (an edit) carries no more than was spent.
        if any(used.get(axis, 0.0) < amount for axis, amount in amounts.items()):
            continue
        for axis, amount in amounts.items():
            used[axis] -= amount
        open_calls.append((entry.call_id, dict(amounts)))
    spent = {axis: amount for axis, amount in used.items() if amount > 0}
    return Carried(spent=spent, open_calls=tuple(open_calls))
