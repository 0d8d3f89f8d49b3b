"""The model step's plans: the final turn, what a step holds, which stop a model failure asks
for, the retry count after an error and after a decision, and what the trace records of a
decision. (A step number an earlier attempt held is skipped: tests/graph/test_crash_resume.py.)"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencepost.policy import (
    AbstainProposal,
    AnswerPayload,
    ErrorCode,
    FinalProposal,
    InvalidProposal,
    Observation,
    StopRequest,
    TerminationReason,
    ToolRegistry,
)
from fencepost.policy.context import RunContext
from fencepost.policy.deadline import SystemClock
from fencepost.policy.decide import (
    Settlement,
    StepEnd,
    StepPlan,
    StepSettings,
    end_step,
    model_failure,
    plan_step,
    settle_step,
)
from fencepost.policy.decision_model import Decided
from fencepost.policy.ledger import Reservation
from fencepost.policy.pricing import ModelPrice
from fencepost.policy.state import AgentState, stop
from fencepost.policy.terminate import AnswerFacts
from tests.policy.factories import make_proposal, make_state, reader


def _plan(**settings: Any) -> StepPlan:
    given_settings: dict[str, Any] = {
        "registry": ToolRegistry([]),
        "tool_catalog": "all",
        "tokens_per_step": 0,
        "price": None,
        "answer_margin": 1,
        "model_retries": 2,
        "require_citations": False,
        **settings,
    }
    return StepPlan(stop=None, settings=StepSettings(**given_settings))


@given(left=st.integers(0, 50), margin=st.integers(0, 5))
def test_the_last_answer_margin_steps_are_the_final_turn(left: int, margin: int) -> None:
    state = make_state(steps=left)
    assert _plan(answer_margin=margin).final_turn(state) is (left < margin)
    assert _plan(answer_margin=margin).decision_input(state).final_turn is (left < margin)
    assert not _plan(answer_margin=0).final_turn(state)  # a margin of 0 turns it off


def test_a_priced_step_holds_its_text_and_output_cap_priced_within_what_is_left() -> None:
    plan = _plan(price=ModelPrice(input=Decimal("1"), output=Decimal("2")), tokens_per_step=5)
    assert plan.holds_money
    assert plan.hold(lambda: 10, None, None) == (0, 20)  # no limit: still held, to be recorded
    assert plan.hold(lambda: 10, None, 7.0) == (0, 7)
    assert plan.hold(lambda: 10, None, 0.0) == (0, 1)  # a chain that spent it all is refused


def test_an_unpriced_step_holds_no_money_and_counts_no_text_where_nothing_limits_tokens() -> None:
    def sent() -> int:
        raise AssertionError("counted where nothing needs it")

    plan = _plan()
    assert not plan.holds_money
    assert plan.hold(sent, None, None) == (0, 0)


@pytest.mark.parametrize("money_left", [0.0, 100.0, float("inf")])
def test_any_money_limit_on_an_unpriced_run_is_its_stop_before_its_first_step(
    money_left: float,
) -> None:
    state = make_state()
    ctx = RunContext(tenant_id="tenant-a", principal=reader())
    settings = _plan().settings

    def planned(left: float | None) -> StopRequest | None:
        clock = SystemClock()
        return plan_step(
            state, ctx, settings, given=ctx, remaining_steps=None, clock=clock, money_left=left
        ).stop

    refused = planned(money_left)
    assert refused is not None
    assert (refused.reason, refused.error_code) == (
        TerminationReason.POLICY_DENIED,
        "money_unpriced",
    )
    assert planned(None) is None  # no limit: nothing to price


@pytest.mark.parametrize("passed", [False, True])
def test_a_timeout_after_the_run_deadline_is_the_deadlines(passed: bool) -> None:
    stop = model_failure(ErrorCode.TIMEOUT, run_deadline_passed=passed)
    if passed:
        assert stop.reason is TerminationReason.DEADLINE_EXCEEDED
    else:
        assert (stop.reason, stop.error_code) == (TerminationReason.FAILED, "timeout")


@pytest.mark.parametrize(
    "code", [ErrorCode.RATE_LIMITED, ErrorCode.INTERNAL_ERROR, ErrorCode.CANCELLED]
)
def test_any_other_model_failure_keeps_its_own_code_whatever_the_deadline(
    code: ErrorCode,
) -> None:
    stop = model_failure(code, run_deadline_passed=True)
    assert (stop.reason, stop.error_code) == (TerminationReason.FAILED, code.value)


_NO_FACTS = AnswerFacts(pending=(), citable=frozenset())


def _end(
    state: AgentState,
    outcome: Decided | InvalidProposal | StopRequest,
    *,
    final_turn: bool = False,
    charged: Reservation | StopRequest | None = None,
    facts: AnswerFacts | None = _NO_FACTS,
    **settings: Any,
) -> StepEnd:
    settled = Settlement(
        actual={},
        overage={},
        usage={"input_tokens": None, "output_tokens": None},
        final_turn=final_turn,
    )
    return end_step(_plan(**settings), state, outcome, settled, charged, facts)


def test_a_retryable_model_error_is_retried_up_to_model_retries_in_a_row() -> None:
    limited = model_failure(ErrorCode.RATE_LIMITED, run_deadline_passed=False)
    retried = _end(make_state(model_failures=1), limited, model_retries=2).state
    assert (retried.model_failures, retried.last_error_code, retried.stop) == (
        2,
        "rate_limited",
        None,
    )
    spent = _end(make_state(model_failures=2), limited, model_retries=2).state
    assert spent.stop == limited
    internal = model_failure(ErrorCode.INTERNAL_ERROR, run_deadline_passed=False)
    assert _end(make_state(), internal).state.stop == internal


def _decided(decision: object) -> Decided:
    return Decided(decision=decision)  # type: ignore[arg-type]


def test_a_decision_starts_the_model_retry_count_again() -> None:
    tool = _decided(make_proposal({"query": "q"}))
    failing = make_state(model_failures=2, last_error_code="rate_limited")
    after = _end(failing, tool).state
    assert (after.model_failures, after.last_error_code) == (0, None)
    clean = make_state()
    assert _end(clean, tool).state is clean


def _record(end: StepEnd) -> tuple[Any, Any, Any]:
    assert end.record is not None
    return end.record.get("decision_kind"), end.record["outcome"], end.record["code"]


def test_a_decisions_trace_record_says_whether_it_stands() -> None:
    state = make_state()
    final = _decided(FinalProposal(answer=AnswerPayload(text="x")))
    abstain = _decided(AbstainProposal(reason="insufficient_evidence"))
    tool = _decided(make_proposal({"query": "q"}))
    assert _record(_end(state, final)) == ("final", "decided", None)
    refused = _record(_end(state, final, require_citations=True))
    assert refused == ("final", "denied", "missing_citation")
    assert _record(_end(state, abstain)) == ("abstain", "decided", "insufficient_evidence")
    assert _record(_end(state, tool, final_turn=True))[:2] == ("tool", "denied")
    invalid = InvalidProposal("malformed_decision")
    assert _record(_end(state, invalid))[:2] == ("invalid", "denied")
    gated = _end(state, tool)
    assert gated.record is None and list(gated.calls) == [tool.decision]


def _charge(exceeded: tuple[str, str] | None) -> Reservation:
    return Reservation(account="acct", key="overage", amounts={"tokens": 5.0}, exceeded=exceeded)


@pytest.mark.parametrize(
    ("charged", "ending"),
    [
        (
            _charge(("acct", "tokens")),
            (TerminationReason.STEP_BUDGET_EXHAUSTED, "tokens_exhausted"),
        ),
        (
            _charge(("acct", "no_such_axis")),
            (TerminationReason.STEP_BUDGET_EXHAUSTED, "tokens_exhausted"),
        ),
        (
            stop(TerminationReason.CANCELLED, "cancelled"),
            (TerminationReason.CANCELLED, "cancelled"),
        ),
    ],
)
def test_a_charge_past_a_limit_or_refused_by_the_ledger_ends_the_step_whatever_was_decided(
    charged: Reservation | StopRequest, ending: tuple[TerminationReason, str]
) -> None:
    state = make_state()
    answered = AnswerFacts(pending=(), citable=frozenset({"call-0001"}))
    final = _decided(FinalProposal(answer=AnswerPayload(text="x", citations=("call-0001",))))
    for outcome in (final, _decided(make_proposal({"query": "q"}))):
        end = _end(state, outcome, charged=charged, facts=answered)
        assert end.state.stop is not None and end.record is not None and not end.calls
        assert (end.state.stop.reason, end.state.stop.error_code) == ending
        assert end.record["outcome"] == "denied"
    failed = model_failure(ErrorCode.INTERNAL_ERROR, run_deadline_passed=False)
    end = _end(state, failed, charged=charged)
    assert end.state.stop is not None
    assert (end.state.stop.reason, end.state.stop.error_code) == ending
    within = _end(state, final, charged=_charge(None), facts=answered)
    assert within.state.stop is not None
    assert within.state.stop.reason is TerminationReason.COMPLETED


@given(cited=st.lists(st.text(min_size=1, max_size=6), max_size=4))
def test_a_final_answers_citations_are_what_the_ledger_is_asked_to_vouch_for(
    cited: list[str],
) -> None:
    answer = AnswerPayload(text="x", citations=tuple(cited))
    state = make_state()

    def settled(outcome: Decided | InvalidProposal | StopRequest) -> tuple[str, ...] | None:
        return settle_step(_plan(), state, outcome, (0, 0), lambda: 0, len).citations

    assert settled(_decided(FinalProposal(answer=answer))) == answer.citations
    assert settled(_decided(AbstainProposal(reason="insufficient_evidence"))) is None
    assert settled(_decided(make_proposal({"query": "q"}))) is None
    assert settled(InvalidProposal("malformed_decision")) is None
    assert settled(model_failure(ErrorCode.TIMEOUT, run_deadline_passed=False)) is None


@given(cited=st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=4))
def test_a_final_answer_judged_without_the_ledgers_facts_cites_nothing(cited: list[str]) -> None:
    # Observations in state that the answer cites: state alone would vouch for them.
    observed = make_state(
        observations=tuple(
            Observation(sequence=n, call_id=c, tool_name="search_logs", kind="tool_result")
            for n, c in enumerate(dict.fromkeys(cited))
        )
    )
    final = _decided(FinalProposal(answer=AnswerPayload(text="x", citations=tuple(cited))))
    end = _end(observed, final, facts=None)
    assert end.state.stop is not None
    assert (end.state.stop.reason, end.state.stop.error_code) == (
        TerminationReason.INVALID_PROPOSAL,
        "unsupported_citation",
    )
    assert end.record is not None and end.record["outcome"] == "denied"
