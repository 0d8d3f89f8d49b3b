"""Reservations against the run's own budget view, for code that has no ledger at hand.

The loop itself reserves through a :class:`~fencepost.policy.ledger.Ledger` (the one budget
truth); these are the same rules on a bare :class:`AgentState`, for tests and notebooks.
"""

from __future__ import annotations

from fencepost.policy.budget import BudgetAxis
from fencepost.policy.state import AgentState


def reserve_step(state: AgentState) -> AgentState:
    """Reserve one model step before the model is called; raise if none is left."""
    state.budget.check_before_step()
    return state.model_copy(update={"budget": state.budget.spend(BudgetAxis.STEPS)})


def reserve_tool_call(state: AgentState, *, mutation: bool = False, cost: float = 0) -> AgentState:
    """Reserve one tool call (and a mutation for a write/external effect) before the call starts.

    Nothing is refunded if the call then fails: a failed call still spent time and quota.
    """
    budget = state.budget.spend(BudgetAxis.TOOL_CALLS)
    if mutation:
        budget = budget.spend(BudgetAxis.MUTATIONS)
    if cost:
        budget = budget.spend(BudgetAxis.COST, cost)
    return state.model_copy(update={"budget": budget})
