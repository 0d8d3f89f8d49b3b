"""Reservations: what a model step and a tool call reserve, on the ledger, before they start.

The ledger is the one budget truth: these tests reserve what the loop reserves (``step_amounts``,
``reservation_amounts``) on an ``InMemoryLedger`` account opened with the run's budget limits.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencepost.policy import (
    BudgetAxis,
    BudgetExhausted,
    Effect,
    InMemoryLedger,
    RuntimeBudget,
    TerminationReason,
)
from fencepost.policy.gating import reservation_amounts as call_amounts
from fencepost.policy.run_check import stop_for_exhausted
from fencepost.policy.usage import budget_view, step_amounts, step_hold
from tests.policy.factories import make_spec

ACCOUNT = "run-0001"
_keys = itertools.count()


def _opened(budget: RuntimeBudget) -> InMemoryLedger:
    ledger = InMemoryLedger()
    ledger.open_account(ACCOUNT, budget.limits())
    return ledger


def _reserve(ledger: InMemoryLedger, amounts: dict[str, float]) -> None:
    ledger.reserve(ACCOUNT, f"{ACCOUNT}/{next(_keys)}", amounts)


def test_a_tool_call_is_reserved_before_it_runs_and_the_next_is_refused() -> None:
    ledger = _opened(RuntimeBudget(steps_remaining=1, tool_calls_remaining=1))
    _reserve(ledger, call_amounts(make_spec()))
    balance = ledger.balance(ACCOUNT)
    view = budget_view(balance.limits, balance.held)
    assert (view.tool_calls_remaining, view.tool_calls_used) == (0, 1)
    with pytest.raises(BudgetExhausted) as caught:
        _reserve(ledger, call_amounts(make_spec()))
    assert caught.value.reason is TerminationReason.TOOL_BUDGET_EXHAUSTED
    refused = stop_for_exhausted(caught.value)
    assert (refused.reason, refused.error_code) == (
        TerminationReason.TOOL_BUDGET_EXHAUSTED,
        "tool_calls_exhausted",
    )


def test_a_model_step_is_reserved_before_the_model_is_called() -> None:
    ledger = _opened(RuntimeBudget(steps_remaining=1, tool_calls_remaining=0))
    _reserve(ledger, step_amounts(0))
    with pytest.raises(BudgetExhausted) as caught:
        _reserve(ledger, step_amounts(0))
    assert caught.value.reason is TerminationReason.STEP_BUDGET_EXHAUSTED
    assert caught.value.axis is BudgetAxis.STEPS


def test_a_step_on_an_exhausted_token_budget_is_refused_on_the_tokens_axis() -> None:
    budget = RuntimeBudget(steps_remaining=5, tool_calls_remaining=5, tokens_remaining=0)
    ledger = _opened(budget)
    with pytest.raises(BudgetExhausted) as caught:
        _reserve(ledger, step_amounts(step_hold(0, ledger.balance(ACCOUNT).remaining("tokens"))))
    assert caught.value.axis is BudgetAxis.TOKENS
    assert caught.value.reason is TerminationReason.STEP_BUDGET_EXHAUSTED


def test_tokens_charged_past_the_limit_refuse_the_next_step() -> None:
    ledger = _opened(RuntimeBudget(steps_remaining=5, tool_calls_remaining=1, tokens_remaining=100))
    ledger.charge(ACCOUNT, f"{ACCOUNT}/usage", {"tokens": 150})
    balance = ledger.balance(ACCOUNT)
    view = budget_view(balance.limits, balance.held)
    assert (view.tokens_used, view.tokens_remaining) == (150, 0)  # the view never goes negative
    with pytest.raises(BudgetExhausted) as caught:
        _reserve(ledger, step_amounts(step_hold(0, balance.remaining("tokens"))))
    assert caught.value.axis is BudgetAxis.TOKENS


def test_a_write_call_reserves_a_mutation_and_is_refused_whole_when_none_is_left() -> None:
    ledger = _opened(
        RuntimeBudget(steps_remaining=5, tool_calls_remaining=5, mutations_remaining=1)
    )
    write = make_spec("write_note", effect=Effect.WRITE, capability="notes:write")
    _reserve(ledger, call_amounts(write))
    with pytest.raises(BudgetExhausted) as caught:
        _reserve(ledger, call_amounts(write))
    assert caught.value.axis is BudgetAxis.MUTATIONS
    assert caught.value.reason is TerminationReason.TOOL_BUDGET_EXHAUSTED
    # Refused whole: the tool call it would have taken is still there.
    assert ledger.balance(ACCOUNT).remaining("tool_calls") == 4


def test_a_tool_calls_declared_cost_is_reserved_on_the_cost_axis() -> None:
    ledger = _opened(RuntimeBudget(steps_remaining=5, tool_calls_remaining=5, cost_remaining=1.0))
    _reserve(ledger, call_amounts(make_spec(cost=0.75)))
    assert ledger.balance(ACCOUNT).remaining("cost") == pytest.approx(0.25)
    with pytest.raises(BudgetExhausted) as caught:
        _reserve(ledger, call_amounts(make_spec(cost=0.5)))
    assert caught.value.axis is BudgetAxis.COST


limits = st.integers(min_value=0, max_value=8)


@settings(max_examples=100, deadline=None)
@given(
    steps=limits,
    tool_calls=limits,
    ops=st.lists(st.sampled_from(["step", "tool", "write"]), max_size=25),
)
def test_with_n_left_exactly_n_more_run_never_n_plus_one(
    steps: int, tool_calls: int, ops: list[str]
) -> None:
    ledger = _opened(RuntimeBudget(steps_remaining=steps, tool_calls_remaining=tool_calls))
    amounts = {
        "step": step_amounts(0),
        "tool": call_amounts(make_spec()),
        "write": call_amounts(make_spec("write_note", effect=Effect.WRITE)),
    }
    ran = {"step": 0, "tool": 0}
    for op in ops:
        try:
            _reserve(ledger, amounts[op])
        except BudgetExhausted as exc:
            expected = (
                TerminationReason.STEP_BUDGET_EXHAUSTED
                if op == "step"
                else TerminationReason.TOOL_BUDGET_EXHAUSTED
            )
            assert exc.reason is expected
            continue
        ran["step" if op == "step" else "tool"] += 1
    asked_steps = ops.count("step")
    asked_tools = len(ops) - asked_steps
    assert ran["step"] == min(steps, asked_steps)
    assert ran["tool"] == min(tool_calls, asked_tools)
    balance = ledger.balance(ACCOUNT)
    view = budget_view(balance.limits, balance.held)
    assert view.steps_remaining == steps - ran["step"] >= 0
    assert view.tool_calls_remaining == tool_calls - ran["tool"] >= 0
