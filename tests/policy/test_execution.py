"""The execute phase's plans: which calls of a batch run or are refused, what the ledger's
answer to a call's claim means (run, retry, ``uncertain``, answered before), when a dependent
call may start and what is given back, and what a finished batch records and which stop wins."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencepost.policy import (
    Effect,
    ErrorCode,
    Principal,
    ReceiptStatus,
    StopRequest,
    TerminationReason,
    ToolRegistry,
)
from fencepost.policy.batch import BatchEntry
from fencepost.policy.budget import BudgetExhausted
from fencepost.policy.context import RunContext
from fencepost.policy.deadline import Deadline, FakeClock
from fencepost.policy.execution import (
    CallClaim,
    ExecutePlan,
    ExecuteSettings,
    end_execute,
    plan_execute,
    ran,
)
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.ledger import Attempt, Reservation, ReservationStatus
from fencepost.policy.state import AgentState
from fencepost.policy.verdict import Verdict, VerdictCode
from tests.policy.factories import make_proposal, make_spec, make_state

SPEC = make_spec()
CTX = RunContext(tenant_id="tenant-a", principal=Principal(id="user-1", capabilities={"logs:read"}))
SETTINGS = ExecuteSettings(
    registry=ToolRegistry([SPEC]),
    approval="interrupt",
    verdict_key=None,
    approver=False,
    conditional=False,
)


def _entry(
    call_id: str = "call-0001",
    depends_on: tuple[str, ...] = (),
    code: VerdictCode = VerdictCode.ALLOWED,
    tool_name: str = "search_logs",
) -> BatchEntry:
    proposal = make_proposal({"query": "q"}, call_id=call_id, tool_name=tool_name).model_copy(
        update={"depends_on": depends_on}
    )
    return BatchEntry(
        proposal=proposal,
        verdict=Verdict(
            call_id=call_id,
            tool_name=proposal.tool_name,
            fingerprint=proposal_fingerprint(proposal.tool_name, proposal.arguments),
            code=code,
        ),
    )


def _planned(*entries: BatchEntry, **fields: object) -> tuple[ExecutePlan, AgentState]:
    state = make_state(batch=entries, **fields)
    plan = plan_execute(state, CTX, SETTINGS, given=CTX, remaining_steps=None, clock=FakeClock())
    return plan, state


def _held(status: ReservationStatus, *, existing: bool = True) -> Reservation:
    return Reservation(account="a", key="k", amounts={}, status=status, existing=existing)


def _exhausted() -> BudgetExhausted:
    return BudgetExhausted(TerminationReason.TOOL_BUDGET_EXHAUSTED)


# -- which calls run -----------------------------------------------------------------------------


def test_a_run_that_may_not_go_on_runs_nothing_and_stops() -> None:
    state = make_state(batch=(_entry(),))
    plan = plan_execute(state, None, SETTINGS, given=None, remaining_steps=None, clock=FakeClock())
    assert plan.stop is not None and plan.stop.reason is TerminationReason.POLICY_DENIED
    assert plan.runnable == ()


def test_allowed_calls_not_answered_yet_run_in_batch_order() -> None:
    first, second = _entry("call-0001"), _entry("call-0002")
    denied, answered = _entry("call-0003", code=VerdictCode.CAPABILITY_DENIED), _entry("call-0004")
    plan, _ = _planned(first, second, denied, answered, answered={"call-0004": 0})
    assert plan.stop is None and plan.refused == ()
    assert [c.entry.call_id for c in plan.runnable] == ["call-0001", "call-0002"]
    assert plan.inside == {"call-0001", "call-0002"}


@pytest.mark.parametrize(
    "entries",
    [
        (_entry("call-0001"), _entry("call-0002", tool_name="not_registered")),
        (_entry("call-0001"), _entry("call-0001")),  # a call id twice: no gate let it through
    ],
)
def test_one_call_the_executor_refuses_refuses_every_allowed_call_once(
    entries: tuple[BatchEntry, ...],
) -> None:
    plan, _ = _planned(*entries)
    assert plan.runnable == ()
    assert len(plan.refused) == len({e.call_id for e in entries})
    assert all(o.status is ReceiptStatus.DENIED and o.attempts == 0 for o in plan.refused)
    assert all(o.event.error_code is ErrorCode.PERMISSION_DENIED for o in plan.refused)  # type: ignore[union-attr]


def test_only_dependencies_outside_the_runnable_calls_are_asked_of_the_ledger() -> None:
    first = _entry("call-0001")
    second = _entry("call-0002", depends_on=("call-0001", "call-0000"))
    plan, _ = _planned(first, second)
    assert plan.outside == {"call-0000"} and not plan.alone
    alone, _ = _planned(_entry("call-0001"))
    assert alone.alone and alone.outside == frozenset()


# -- what the ledger's answer to a claim means ----------------------------------------------------


def test_a_first_attempt_the_budget_cannot_cover_never_started_and_is_denied() -> None:
    outcome = CallClaim(_entry(), SPEC).reserved(1, _exhausted(), run_went_on=False)
    assert outcome is not None
    assert outcome.status is ReceiptStatus.DENIED and outcome.attempts == 0
    assert outcome.event.error_code is ErrorCode.BUDGET_EXHAUSTED  # type: ignore[union-attr]


@given(attempt=st.integers(2, 20))
def test_a_retry_the_budget_cannot_cover_is_uncertain_never_denied(attempt: int) -> None:
    # The attempt before it started and crashed: it may have had its effect.
    outcome = CallClaim(_entry(), SPEC).reserved(attempt, _exhausted(), run_went_on=False)
    assert outcome is not None and outcome.status is ReceiptStatus.UNCERTAIN
    assert outcome.attempts == attempt - 1


def test_an_attempt_answered_before_never_runs_again() -> None:
    call = CallClaim(_entry(), SPEC)
    released = call.reserved(1, _held(ReservationStatus.RELEASED), run_went_on=False)
    assert released is not None and released.status is ReceiptStatus.DENIED
    assert released.event.error_code is ErrorCode.CONFLICT  # type: ignore[union-attr]
    settled = call.reserved(1, _held(ReservationStatus.SETTLED), run_went_on=True)
    assert settled is not None and settled.status is ReceiptStatus.UNCERTAIN
    # Settled in the run's latest step: a crash before the checkpoint; the claim goes on.
    assert call.reserved(1, _held(ReservationStatus.SETTLED), run_went_on=False) is None
    assert call.reserved(1, _held(ReservationStatus.RESERVED), run_went_on=True) is None


def test_the_ledger_is_asked_whether_the_run_went_on_only_for_an_answered_attempt() -> None:
    call = CallClaim(_entry(), SPEC)
    assert call.asks_if_run_went_on(_held(ReservationStatus.SETTLED))
    assert call.asks_if_run_went_on(_held(ReservationStatus.RELEASED))
    assert not call.asks_if_run_went_on(_held(ReservationStatus.RESERVED))
    assert not call.asks_if_run_went_on(_held(ReservationStatus.SETTLED, existing=False))
    assert not call.asks_if_run_went_on(_exhausted())


def _begun(*, claimed: bool = True, started_before: bool = False) -> Attempt:
    started = _held(ReservationStatus.RESERVED, existing=started_before) if claimed else None
    return Attempt(claimed=claimed, started=started)


def test_an_attempt_nobody_started_before_runs() -> None:
    step = CallClaim(_entry(), SPEC).begun(1, _begun())
    assert step.runs and step.outcome is None and not step.releases


def test_a_crashed_attempt_is_retried_only_when_safe_else_uncertain() -> None:
    read = CallClaim(_entry(), SPEC).begun(1, _begun(started_before=True))
    assert read.retries and not read.runs  # a read is idempotent
    write = make_spec("write_note", effect=Effect.WRITE)
    step = CallClaim(_entry(tool_name="write_note"), write).begun(2, _begun(started_before=True))
    assert step.outcome is not None and step.outcome.status is ReceiptStatus.UNCERTAIN
    assert step.outcome.attempts == 2 and not step.releases


def test_a_call_id_another_run_of_the_thread_claimed_is_uncertain_and_spends_nothing() -> None:
    step = CallClaim(_entry(), SPEC).begun(1, _begun(claimed=False))
    assert step.outcome is not None and step.outcome.status is ReceiptStatus.UNCERTAIN
    assert step.outcome.attempts == 0 and step.releases


def test_nothing_is_given_back_for_a_call_that_was_attempted() -> None:
    # Only a call that never started here gives its reservation back (above, and a dependency
    # that failed, below); one whose earlier attempt started is retried or uncertain, charged.
    write = make_spec("write_note", effect=Effect.WRITE)
    call = CallClaim(_entry(tool_name="write_note"), write)
    assert not call.begun(1, _begun(started_before=True)).releases


def test_a_result_whose_run_never_began_is_no_output_to_depend_on() -> None:
    call = CallClaim(_entry(), SPEC)
    assert call.produced(ran(_entry(), SPEC, 1, value={"hits": []}))
    assert not call.produced(ran(_entry(), SPEC, 1, error=ErrorCode.NOT_FOUND))
    assert not call.produced(ran(_entry(), SPEC, 1, started=False))


# -- when a dependent call starts -----------------------------------------------------------------


def test_a_dependent_call_starts_only_on_its_dependencies_verified_results() -> None:
    done = ran(_entry("call-0001"), SPEC, 1, value={"hits": []})
    failed = ran(_entry("call-0001"), SPEC, 1, error=ErrorCode.INTERNAL_ERROR)
    dependent = _entry("call-0002", depends_on=("call-0001",))
    plan, _ = _planned(_entry("call-0001"), dependent)
    assert plan.awaits(CallClaim(dependent, SPEC), broken=False) == ("call-0001",)
    assert plan.start(CallClaim(dependent, SPEC), [done], {}, broken=False) == {
        "call-0001": {"hits": []}
    }
    refused = plan.start(CallClaim(dependent, SPEC), [failed], {}, broken=False)
    assert not isinstance(refused, dict)
    # It never started: denied, and the budget the gate reserved for it is given back.
    assert refused.status is ReceiptStatus.DENIED and refused.attempts == 0
    assert refused.event.error_code is ErrorCode.DEPENDENCY_FAILED  # type: ignore[union-attr]


def test_a_batch_edited_into_impossible_dependencies_starts_none_of_them() -> None:
    done = ran(_entry("call-0001"), SPEC, 1, value={"hits": []})
    dependent = _entry("call-0002", depends_on=("call-0001",))
    plan, _ = _planned(_entry("call-0001"), dependent, _entry("call-0003"))
    assert plan.awaits(CallClaim(dependent, SPEC), broken=True) == ()
    assert not isinstance(plan.start(CallClaim(dependent, SPEC), [done], {}, broken=True), dict)
    # A call that depends on nothing starts, however broken the rest of its batch.
    assert plan.start(CallClaim(_entry("call-0003"), SPEC), [], {}, broken=True) == {}


def test_a_dependency_outside_the_batch_must_be_one_the_ledger_marks_as_produced() -> None:
    outside = _entry("call-0004", depends_on=("call-0009",))
    plan, _ = _planned(outside)
    earlier = {"call-0009": {"hits": ["x"]}}
    assert plan.start(CallClaim(outside, SPEC), [], earlier, broken=False) == earlier
    assert not isinstance(plan.start(CallClaim(outside, SPEC), [], {}, broken=False), dict)


# -- what a finished batch records ----------------------------------------------------------------


def _ended(
    entries: tuple[BatchEntry, ...],
    results: list[object],
    **fields: object,
) -> tuple[AgentState, list[dict[str, object]], StopRequest | None]:
    plan, state = _planned(*entries, **fields)
    end = end_execute(plan, state, results)  # type: ignore[arg-type]
    closed = end.closed((), None)
    return closed, list(end.records), closed.stop


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        (TerminationReason.CANCELLED, ErrorCode.CANCELLED),
        (TerminationReason.POLICY_DENIED, ErrorCode.PERMISSION_DENIED),
    ],
)
def test_a_call_whose_claim_was_refused_is_denied_with_why_and_stops_the_run(
    reason: TerminationReason, code: ErrorCode
) -> None:
    refusal = StopRequest(reason=reason)
    state, _, stopped = _ended((_entry(),), [refusal])
    [receipt] = state.receipts
    assert receipt.status is ReceiptStatus.DENIED and receipt.attempts == 0
    assert receipt.error_code is code
    assert stopped == refusal


def test_outcomes_are_joined_to_the_batch_by_call_id_never_by_arrival() -> None:
    first, second = _entry("call-0001"), _entry("call-0002")
    results: list[object] = [
        ran(first, SPEC, 1, value={"hits": [1]}),
        ran(second, SPEC, 1, error=ErrorCode.NOT_FOUND),
    ]
    state, _, stopped = _ended((first, second), results)
    assert [r.call_id for r in state.receipts] == ["call-0001", "call-0002"]
    assert [o.call_id for o in state.observations] == ["call-0001", "call-0002"]
    assert state.batch == () and stopped is None


def test_an_executed_calls_trace_record_says_success_error_or_uncertain() -> None:
    write = make_spec("write_note", effect=Effect.WRITE)
    entries = (_entry("call-0001"), _entry("call-0002"), _entry("call-0003"))
    results: list[object] = [
        ran(entries[0], SPEC, 1, value={"hits": []}),
        ran(entries[1], SPEC, 1, error=ErrorCode.NOT_FOUND),
        ran(entries[2], write, 1, error=ErrorCode.TIMEOUT, cut_off=True),
    ]
    _, records, _ = _ended(entries, results)
    assert [(r["outcome"], r["code"]) for r in records] == [
        ("success", "completed"),
        ("error", "not_found"),
        ("uncertain", "execution_uncertain"),
    ]
    assert all(r["verdict"] is VerdictCode.ALLOWED for r in records)


def test_a_refusal_at_the_executor_wins_over_the_deadline() -> None:
    entries = (_entry("call-0001"), _entry("call-0002", tool_name="not_registered"))
    passed = Deadline(at=datetime(2025, 1, 1, tzinfo=UTC))
    plan = ExecutePlan(
        stop=None,
        settings=SETTINGS,
        clock=FakeClock(),
        refused=_planned(*entries)[0].refused,
        started=datetime(2026, 1, 1, tzinfo=UTC),
        deadline=passed,
    )
    end = end_execute(plan, make_state(batch=entries), [])
    stopped = end.closed((), None).stop
    assert stopped is not None and stopped.error_code == "executor_refused"


def test_a_batch_the_budget_cut_short_stops_on_its_axis() -> None:
    cut = _entry("call-0002", code=VerdictCode.BUDGET_EXHAUSTED)
    first = _entry("call-0001")
    state, _, stopped = _ended((first, cut), [ran(first, SPEC, 1, value={"hits": []})])
    assert stopped is not None and stopped.reason is TerminationReason.TOOL_BUDGET_EXHAUSTED
    # The call the budget could not cover is receipted too, never run.
    assert [(r.call_id, r.status) for r in state.receipts] == [
        ("call-0001", ReceiptStatus.COMPLETED),
        ("call-0002", ReceiptStatus.DENIED),
    ]


def test_a_retry_the_budget_refused_stops_the_run_out_of_tool_calls() -> None:
    entry = _entry()
    refused = CallClaim(entry, SPEC).reserved(1, _exhausted(), run_went_on=False)
    _, _, stopped = _ended((entry,), [refused])
    assert stopped is not None and stopped.reason is TerminationReason.TOOL_BUDGET_EXHAUSTED


def test_the_last_superstep_stops_the_run_before_another_decision() -> None:
    state = make_state(batch=(_entry(),))
    plan = plan_execute(state, CTX, SETTINGS, given=CTX, remaining_steps=2, clock=FakeClock())
    assert plan.last_superstep
    end = end_execute(plan, state, [ran(_entry(), SPEC, 1, value={"hits": []})])
    stopped = end.closed((), None).stop
    assert stopped is not None and stopped.reason is TerminationReason.STEP_BUDGET_EXHAUSTED


def test_a_refused_completion_marker_is_the_runs_stop() -> None:
    plan, state = _planned(_entry())
    end = end_execute(plan, state, [ran(_entry(), SPEC, 1, value={"hits": []})])
    refusal = StopRequest(reason=TerminationReason.CANCELLED)
    assert end.closed((), refusal).stop == refusal
