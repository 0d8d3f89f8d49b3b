"""Budgets: reserved before the call, per axis, never negative, never past the limit."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from fencepost.policy import (
    BudgetAxis,
    BudgetExhausted,
    RuntimeBudget,
    TerminationReason,
    reason_for_axis,
    reserve_step,
    reserve_tool_call,
)
from tests.policy.factories import make_state

COUNTED_AXES = [BudgetAxis.STEPS, BudgetAxis.TOOL_CALLS, BudgetAxis.TOKENS, BudgetAxis.MUTATIONS]


def test_tool_budget_is_reserved_before_execution() -> None:
    state = make_state(tool_calls=1)
    reserved = reserve_tool_call(state)
    assert reserved.budget.tool_calls_remaining == 0
    assert reserved.budget.tool_calls_used == 1
    with pytest.raises(BudgetExhausted) as caught:
        reserve_tool_call(reserved)
    assert caught.value.reason is TerminationReason.TOOL_BUDGET_EXHAUSTED


def test_step_budget_is_reserved_before_the_model_is_called() -> None:
    state = make_state(steps=1)
    reserved = reserve_step(state)
    assert reserved.budget.steps_remaining == 0
    assert reserved.budget.steps_used == 1
    with pytest.raises(BudgetExhausted) as caught:
        reserve_step(reserved)
    assert caught.value.reason is TerminationReason.STEP_BUDGET_EXHAUSTED
    assert caught.value.axis is BudgetAxis.STEPS


def test_check_before_step_refuses_when_no_step_is_left() -> None:
    RuntimeBudget(steps_remaining=1, tool_calls_remaining=0).check_before_step()
    with pytest.raises(BudgetExhausted) as caught:
        RuntimeBudget(steps_remaining=0, tool_calls_remaining=5).check_before_step()
    assert caught.value.axis is BudgetAxis.STEPS


def test_reservation_leaves_the_original_state_untouched() -> None:
    state = make_state(steps=2, tool_calls=2)
    reserve_step(state)
    reserve_tool_call(state)
    assert state.budget.steps_remaining == 2
    assert state.budget.tool_calls_remaining == 2


def test_exhausted_token_budget_refuses_the_next_step() -> None:
    state = make_state().model_copy(
        update={
            "budget": RuntimeBudget(steps_remaining=5, tool_calls_remaining=5, tokens_remaining=0)
        }
    )
    with pytest.raises(BudgetExhausted) as caught:
        reserve_step(state)
    assert caught.value.axis is BudgetAxis.TOKENS
    assert caught.value.reason is TerminationReason.STEP_BUDGET_EXHAUSTED


def test_write_call_reserves_a_mutation_and_fails_whole_when_none_is_left() -> None:
    budget = RuntimeBudget(steps_remaining=5, tool_calls_remaining=5, mutations_remaining=1)
    state = make_state().model_copy(update={"budget": budget})
    once = reserve_tool_call(state, mutation=True)
    assert once.budget.mutations_remaining == 0
    assert once.budget.tool_calls_remaining == 4
    with pytest.raises(BudgetExhausted) as caught:
        reserve_tool_call(once, mutation=True)
    assert caught.value.axis is BudgetAxis.MUTATIONS
    assert caught.value.reason is TerminationReason.TOOL_BUDGET_EXHAUSTED


def test_tool_call_cost_is_reserved_on_the_cost_axis() -> None:
    budget = RuntimeBudget(steps_remaining=5, tool_calls_remaining=5, cost_remaining=1.0)
    state = make_state().model_copy(update={"budget": budget})
    spent = reserve_tool_call(state, cost=0.75)
    assert spent.budget.cost_remaining == pytest.approx(0.25)
    with pytest.raises(BudgetExhausted) as caught:
        reserve_tool_call(spent, cost=0.5)
    assert caught.value.axis is BudgetAxis.COST


def test_negative_budget_is_rejected_at_construction() -> None:
    with pytest.raises(ValidationError):
        RuntimeBudget(steps_remaining=-1, tool_calls_remaining=3)
    with pytest.raises(ValidationError):
        RuntimeBudget(steps_remaining=1, tool_calls_remaining=-3)
    with pytest.raises(ValidationError):
        RuntimeBudget(steps_remaining=1, tool_calls_remaining=1, cost_remaining=math.nan)


def test_exhaustion_names_the_axis_the_limit_and_the_request() -> None:
    budget = RuntimeBudget(steps_remaining=3, tool_calls_remaining=1, tool_calls_used=2)
    with pytest.raises(BudgetExhausted) as caught:
        budget.spend(BudgetAxis.TOOL_CALLS, 2)
    exc = caught.value
    assert (exc.axis, exc.limit, exc.requested) == (BudgetAxis.TOOL_CALLS, 3, 2)
    assert "tool_calls limit 3" in str(exc)


@pytest.mark.parametrize("amount", [-1, math.nan, math.inf, -math.inf])
def test_spend_rejects_negative_and_non_finite_amounts(amount: float) -> None:
    budget = RuntimeBudget(steps_remaining=3, tool_calls_remaining=3, cost_remaining=10.0)
    for axis in (BudgetAxis.COST, BudgetAxis.TOOL_CALLS):
        with pytest.raises(ValueError, match="finite, non-negative"):
            budget.spend(axis, amount)


@pytest.mark.parametrize("axis", COUNTED_AXES)
def test_counted_axes_are_spent_in_whole_units(axis: BudgetAxis) -> None:
    budget = RuntimeBudget(steps_remaining=3, tool_calls_remaining=3)
    with pytest.raises(ValueError, match="whole units"):
        budget.spend(axis, 0.5)
    # A whole float is fine, and the budget stays valid for a checkpoint round trip.
    spent = budget.spend(axis, 1.0)
    assert isinstance(spent.used(axis), int)
    assert RuntimeBudget.model_validate(spent.model_dump(mode="json")) == spent


def test_unlimited_axis_is_tracked_but_never_exhausted() -> None:
    budget = RuntimeBudget(steps_remaining=1, tool_calls_remaining=1)
    spent = budget.spend(BudgetAxis.COST, 1e9).spend(BudgetAxis.TOKENS, 10**9)
    assert spent.remaining(BudgetAxis.COST) is None
    assert spent.cost_used == 1e9
    assert spent.tokens_used == 10**9


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


limits = st.integers(min_value=0, max_value=8)
counted_request = st.tuples(st.sampled_from(COUNTED_AXES), st.integers(min_value=0, max_value=4))
# Quarters are exact in binary, so "never past the limit" is checked without rounding slack.
cost_request = st.tuples(
    st.just(BudgetAxis.COST), st.integers(min_value=0, max_value=12).map(lambda q: q / 4)
)


@settings(max_examples=150, deadline=None)
@given(
    steps=limits,
    tool_calls=limits,
    tokens=st.none() | limits,
    cost=st.none() | st.integers(min_value=0, max_value=12).map(lambda q: q / 4),
    mutations=st.none() | limits,
    requests=st.lists(counted_request | cost_request, max_size=30),
)
def test_successful_spends_never_exceed_the_limit(
    steps: int,
    tool_calls: int,
    tokens: int | None,
    cost: float | None,
    mutations: int | None,
    requests: list[tuple[BudgetAxis, float]],
) -> None:
    budget = RuntimeBudget(
        steps_remaining=steps,
        tool_calls_remaining=tool_calls,
        tokens_remaining=tokens,
        cost_remaining=cost,
        mutations_remaining=mutations,
    )
    start = {axis: budget.remaining(axis) for axis in BudgetAxis}
    granted = dict.fromkeys(BudgetAxis, 0.0)
    for axis, amount in requests:
        left = budget.remaining(axis)
        try:
            budget = budget.spend(axis, amount)
        except BudgetExhausted as exc:
            assert left is not None and amount > left
            assert exc.axis is axis
            continue
        granted[axis] += amount
    for axis in BudgetAxis:
        assert budget.used(axis) == granted[axis]
        left, limit = budget.remaining(axis), start[axis]
        if limit is None:
            assert left is None
        else:
            assert left is not None and left >= 0
            assert granted[axis] <= limit
            assert left == limit - granted[axis]
    # Whatever was spent, the budget is still a valid, checkpointable value.
    assert RuntimeBudget.model_validate(budget.model_dump(mode="json")) == budget


@settings(max_examples=100, deadline=None)
@given(
    steps=limits,
    tool_calls=limits,
    ops=st.lists(st.sampled_from(["step", "tool", "write"]), max_size=25),
)
def test_reserved_steps_and_calls_never_exceed_the_limit(
    steps: int, tool_calls: int, ops: list[str]
) -> None:
    state = make_state(steps=steps, tool_calls=tool_calls)
    ran = {"step": 0, "tool": 0}
    for op in ops:
        try:
            if op == "step":
                state = reserve_step(state)
            else:
                state = reserve_tool_call(state, mutation=op == "write")
        except BudgetExhausted as exc:
            expected = (
                TerminationReason.STEP_BUDGET_EXHAUSTED
                if op == "step"
                else TerminationReason.TOOL_BUDGET_EXHAUSTED
            )
            assert exc.reason is expected
            continue
        ran["step" if op == "step" else "tool"] += 1
    # With N left, exactly min(N, asked) run: never N + 1.
    asked_steps = ops.count("step")
    asked_tools = len(ops) - asked_steps
    assert ran["step"] == min(steps, asked_steps)
    assert ran["tool"] == min(tool_calls, asked_tools)
    assert state.budget.steps_remaining == steps - ran["step"] >= 0
    assert state.budget.tool_calls_remaining == tool_calls - ran["tool"] >= 0


def test_recorded_token_usage_floors_at_zero_and_then_refuses_the_next_step() -> None:
    budget = RuntimeBudget(steps_remaining=5, tool_calls_remaining=1, tokens_remaining=100)
    spent = budget.record(BudgetAxis.TOKENS, 150)
    assert (spent.tokens_used, spent.tokens_remaining) == (150, 0)
    with pytest.raises(BudgetExhausted) as info:
        spent.check_before_step()
    assert info.value.axis is BudgetAxis.TOKENS
    assert budget.record(BudgetAxis.TOKENS, 0) is budget
