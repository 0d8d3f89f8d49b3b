"""Reservations: what each thing reserves, the stop a refusal means, how an attempt is claimed.

The ledger is the one budget truth: the tests of what is refused reserve what the loop reserves
(``step_amounts``, ``call_amounts``) on an ``InMemoryLedger`` account opened with the run's
budget limits.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencepost.policy import (
    BatchEntry,
    BudgetAxis,
    BudgetExhausted,
    Effect,
    InMemoryLedger,
    ReservationStatus,
    RuntimeBudget,
    TerminationReason,
    Verdict,
    VerdictCode,
)
from fencepost.policy.budget import budget_view
from fencepost.policy.reservations import (
    DEFAULT_OUTPUT_TOKENS,
    Claim,
    PoolShare,
    answered_before,
    call_amounts,
    claim,
    first_step_admitted,
    first_step_amounts,
    step_amounts,
    step_hold,
    stop_for_axis,
    stop_for_closed,
    stop_for_conflict,
    stop_for_exceeded,
    stop_for_exhausted,
    stop_for_unknown_account,
    to_reserve,
)
from tests.policy.factories import make_proposal, make_spec

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
        _reserve(
            ledger, step_amounts(step_hold(10, 0, ledger.balance(ACCOUNT).remaining("tokens")))
        )
    assert caught.value.axis is BudgetAxis.TOKENS
    assert caught.value.reason is TerminationReason.STEP_BUDGET_EXHAUSTED


def test_tokens_charged_past_the_limit_refuse_the_next_step() -> None:
    ledger = _opened(RuntimeBudget(steps_remaining=5, tool_calls_remaining=1, tokens_remaining=100))
    ledger.charge(ACCOUNT, f"{ACCOUNT}/usage", {"tokens": 150})
    balance = ledger.balance(ACCOUNT)
    view = budget_view(balance.limits, balance.held)
    assert (view.tokens_used, view.tokens_remaining) == (150, 0)  # the view never goes negative
    with pytest.raises(BudgetExhausted) as caught:
        _reserve(ledger, step_amounts(step_hold(10, 0, balance.remaining("tokens"))))
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


# -- what each thing reserves ---------------------------------------------------------------------


def test_a_model_step_reserves_one_step_and_its_token_estimate() -> None:
    assert step_amounts(0) == {"steps": 1.0}
    assert step_amounts(40) == {"steps": 1.0, "tokens": 40.0}


@given(
    sent=st.integers(0, 10**6),
    cap=st.integers(0, 10**5),
    headroom=st.none() | st.floats(-1e7, 1e9, allow_nan=False),
)
def test_a_step_holds_what_it_sends_plus_the_output_cap_never_more_than_is_unspent(
    sent: int, cap: int, headroom: float | None
) -> None:
    estimate = sent + (cap or DEFAULT_OUTPUT_TOKENS)
    hold = step_hold(sent, cap, headroom)
    if headroom is None:
        assert hold == 0  # nothing limits tokens: nothing to hold
    else:
        # Bounded by the estimate, capped at what the chain has not spent, one at the least.
        assert hold == max(1, min(estimate, math.floor(headroom)))


def test_a_step_holds_its_estimate_not_every_token_the_chain_has_left() -> None:
    assert step_hold(100, 400, 1_000_000.0) == 500
    assert step_hold(100, 0, 1_000_000.0) == 100 + DEFAULT_OUTPUT_TOKENS
    assert step_hold(100, 400, 250.0) == 250
    assert step_hold(0, 40, 2.5) == 2
    # Nothing (or less than nothing, after a charge past the limit) unspent: one token, refused.
    assert step_hold(10, 40, 0.0) == step_hold(10, 40, -50.0) == 1


def test_a_child_runs_first_step_reserves_at_least_one_token() -> None:
    assert first_step_amounts(0) == {"steps": 1.0, "tokens": 1.0}
    assert first_step_amounts(50) == {"steps": 1.0, "tokens": 50.0}


@pytest.mark.parametrize("effect", list(Effect))
@pytest.mark.parametrize("cost", [0, 0.5])
def test_a_call_reserves_a_tool_call_a_mutation_unless_it_reads_and_its_declared_cost(
    effect: Effect, cost: float
) -> None:
    expected = {"tool_calls": 1.0}
    if effect is not Effect.READ:
        expected["mutations"] = 1.0
    if cost:
        expected["cost"] = cost
    assert call_amounts(make_spec(effect=effect, cost=cost)) == expected


def test_only_the_calls_the_gate_allowed_are_reserved() -> None:
    def entry(n: int, code: VerdictCode) -> BatchEntry:
        proposal = make_proposal(call_id=f"call-000{n}")
        verdict = Verdict(
            call_id=proposal.call_id, tool_name=proposal.tool_name, fingerprint="f", code=code
        )
        return BatchEntry(proposal=proposal, verdict=verdict)

    batch = (
        entry(1, VerdictCode.ALLOWED),
        entry(2, VerdictCode.APPROVAL_PENDING),
        entry(3, VerdictCode.ALLOWED),
        entry(4, VerdictCode.CAPABILITY_DENIED),
    )
    assert [e.call_id for e in to_reserve(batch)] == ["call-0001", "call-0003"]


# -- the stop a refusal means ---------------------------------------------------------------------


def test_an_exhausted_reservation_stops_the_run_naming_the_axis() -> None:
    refused = BudgetExhausted(TerminationReason.STEP_BUDGET_EXHAUSTED, axis=BudgetAxis.TOKENS)
    assert stop_for_exhausted(refused) == stop_for_axis("tokens", otherwise=BudgetAxis.STEPS)
    assert stop_for_exhausted(refused).error_code == "tokens_exhausted"
    unnamed = stop_for_exhausted(BudgetExhausted(TerminationReason.TOOL_BUDGET_EXHAUSTED))
    assert (unnamed.reason, unnamed.error_code) == (
        TerminationReason.TOOL_BUDGET_EXHAUSTED,
        "budget_exhausted",
    )


@pytest.mark.parametrize("name", [None, "", "wishes"])
def test_an_axis_name_that_is_missing_or_no_axis_stops_on_the_axis_meant(name: str | None) -> None:
    refused = stop_for_axis(name, otherwise=BudgetAxis.TOOL_CALLS)
    assert (refused.reason, refused.error_code) == (
        TerminationReason.TOOL_BUDGET_EXHAUSTED,
        "tool_calls_exhausted",
    )
    mutations = stop_for_axis("mutations", otherwise=BudgetAxis.TOOL_CALLS)
    assert mutations.error_code == "mutations_exhausted"


def test_usage_charged_past_a_limit_stops_as_that_axis_refused_tokens_by_default() -> None:
    assert stop_for_exceeded("cost").error_code == "cost_exhausted"
    tokens = stop_for_exceeded("not-an-axis")
    assert (tokens.reason, tokens.error_code) == (
        TerminationReason.STEP_BUDGET_EXHAUSTED,
        "tokens_exhausted",
    )


def test_a_closed_account_stops_the_run_cancelled_only_when_a_cancel_closed_it() -> None:
    cancelled = stop_for_closed("cancelled")
    assert (cancelled.reason, cancelled.error_code) == (TerminationReason.CANCELLED, "cancelled")
    ended = stop_for_closed("completed")
    assert (ended.reason, ended.error_code) == (TerminationReason.POLICY_DENIED, "run_closed")


def test_an_account_the_ledger_lacks_or_refuses_is_a_policy_denial() -> None:
    assert stop_for_unknown_account().reason is TerminationReason.POLICY_DENIED
    assert stop_for_unknown_account().error_code == "unknown_budget_account"
    assert stop_for_conflict().reason is TerminationReason.POLICY_DENIED
    assert stop_for_conflict().error_code == "account_conflict"


# -- how an attempt is claimed --------------------------------------------------------------------


def test_an_attempt_that_started_before_is_retried_only_when_retry_safe() -> None:
    assert claim(make_spec(), started_before=False) is Claim.RUN
    assert claim(make_spec(), started_before=True) is Claim.RETRY  # a read is idempotent
    write = make_spec("write_note", effect=Effect.WRITE)
    assert claim(write, started_before=False) is Claim.RUN
    assert claim(write, started_before=True) is Claim.UNCERTAIN


def test_a_released_attempt_or_one_settled_before_a_later_step_was_answered() -> None:
    assert answered_before(ReservationStatus.RELEASED, run_went_on=False)
    assert answered_before(ReservationStatus.SETTLED, run_went_on=True)
    # Settled in the latest step: a crash lost the result, the claim goes on.
    assert not answered_before(ReservationStatus.SETTLED, run_went_on=False)
    assert not answered_before(ReservationStatus.RESERVED, run_went_on=True)


def test_a_new_runs_first_step_leaves_room_for_one_step_of_each_run_under_way() -> None:
    asked = {"tokens": 200.0}
    # 900 unspent, 200 in flight, 200 kept for runs under way: 500 left after this hold.
    assert first_step_admitted(asked, [PoolShare("t", "tokens", 900, 200, 200)])
    # 500 unspent, 200 in flight: this hold would leave 100, less than the 200 kept.
    assert not first_step_admitted(asked, [PoolShare("t", "tokens", 500, 200, 200)])
    # Any account of the chain that keeps too little makes it wait.
    assert not first_step_admitted(
        asked,
        [PoolShare("t", "tokens", 10_000, 0, 0), PoolShare("org", "tokens", 300, 0, 200)],
    )
    # Nothing under way: the ledger alone answers; spending that leaves no room is its refusal.
    assert first_step_admitted(asked, [PoolShare("t", "tokens", 250, 200, 0)])
    assert first_step_admitted(asked, [PoolShare("t", "tokens", 100, 0, 500)])
    # An axis the step holds nothing on is not its concern.
    assert first_step_admitted(asked, [PoolShare("t", "money", 0, 0, 10)])
