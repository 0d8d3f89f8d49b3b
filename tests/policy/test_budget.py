"""Budgets: separate axes, a view that is never negative, and the stop each axis ends a run with.

What a step or a call reserves, and how the ledger refuses it, is pinned in
``test_reservations.py``: the ledger is the one budget truth.
"""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from fencepost.policy import BudgetAxis, RuntimeBudget, TerminationReason, reason_for_axis
from fencepost.policy.budget import budget_view


def test_negative_budget_is_rejected_at_construction() -> None:
    with pytest.raises(ValidationError):
        RuntimeBudget(steps_remaining=-1, tool_calls_remaining=3)
    with pytest.raises(ValidationError):
        RuntimeBudget(steps_remaining=1, tool_calls_remaining=-3)
    with pytest.raises(ValidationError):
        RuntimeBudget(steps_remaining=1, tool_calls_remaining=1, cost_remaining=math.nan)


def test_limits_are_used_plus_remaining_for_limited_axes_only() -> None:
    budget = RuntimeBudget(
        steps_remaining=4, steps_used=2, tool_calls_remaining=1, tool_calls_used=0, cost_remaining=3
    )
    assert budget.limits() == {"steps": 6, "tool_calls": 1, "cost": 3.0}


def test_every_axis_maps_to_a_budget_termination_reason() -> None:
    assert reason_for_axis(BudgetAxis.STEPS) is TerminationReason.STEP_BUDGET_EXHAUSTED
    assert reason_for_axis(BudgetAxis.TOKENS) is TerminationReason.STEP_BUDGET_EXHAUSTED
    for axis in (BudgetAxis.TOOL_CALLS, BudgetAxis.COST, BudgetAxis.MUTATIONS):
        assert reason_for_axis(axis) is TerminationReason.TOOL_BUDGET_EXHAUSTED


def test_the_view_of_a_ledger_account_never_goes_negative_and_counts_whole_units() -> None:
    view = budget_view(
        {"steps": 4, "tokens": 100, "cost": 1.0}, {"steps": 1, "tokens": 150.4, "cost": 0.25}
    )
    assert (view.steps_remaining, view.steps_used) == (3, 1)
    assert (view.tokens_remaining, view.tokens_used) == (0, 150)  # charged past its limit
    assert (view.cost_remaining, view.cost_used) == (0.75, 0.25)
    # An axis the account does not limit: unlimited, except the two every run has.
    assert view.mutations_remaining is None
    assert view.tool_calls_remaining == 0
