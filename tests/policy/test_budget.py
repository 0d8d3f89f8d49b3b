"""Budgets: separate axes, a view that is never negative, and the stop each axis ends a run with.

What a step or a call reserves, and how the ledger refuses it, is pinned in
``test_reservations.py``: the ledger is the one budget truth.
"""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from fencepost.policy import BudgetAxis, RuntimeBudget, TerminationReason, reason_for_axis


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
