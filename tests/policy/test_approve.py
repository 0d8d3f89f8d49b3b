"""The approve phase's plans: which calls are asked about and the refusal shown with them; who
answered and in which context their answer acts; what an answer from someone who may not give
it does (the run waits again, nothing else changes); what the run records of the answers."""

from __future__ import annotations

from fencepost.policy import Effect, Principal, ToolRegistry
from fencepost.policy.approval import ApprovalAnswer, ApprovalResult
from fencepost.policy.approve import (
    ApprovalSettings,
    ask_approval,
    end_approval,
    plan_approval,
)
from fencepost.policy.batch import BatchEntry
from fencepost.policy.context import RunContext
from fencepost.policy.deadline import SystemClock
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.ownership import run_owner
from fencepost.policy.phase import TerminationReason
from fencepost.policy.rule_runner import run_directly
from fencepost.policy.state import stop
from fencepost.policy.verdict import Verdict, VerdictCode
from tests.policy.factories import make_proposal, make_spec, make_state

REGISTRY = ToolRegistry([make_spec("send_money", effect=Effect.WRITE, capability="payments:send")])
SETTINGS = ApprovalSettings(
    registry=REGISTRY, approval_right=None, four_eyes=False, repeat_limit=3, verdict_key=None
)
CLOCK = SystemClock()


def _ctx(principal: str, *capabilities: str, tenant: str = "tenant-a") -> RunContext:
    return RunContext(
        tenant_id=tenant, principal=Principal(id=principal, capabilities=frozenset(capabilities))
    )


REQUESTER = _ctx("user-1", "payments:send", "logs:read")
OWNER = run_owner(REQUESTER, "run-0001")


def _waiting(call_id: str = "call-0001") -> BatchEntry:
    proposal = make_proposal({"query": "pay"}, tool_name="send_money", call_id=call_id)
    verdict = Verdict(
        call_id=call_id,
        tool_name="send_money",
        fingerprint=proposal_fingerprint("send_money", proposal.arguments),
        code=VerdictCode.APPROVAL_PENDING,
    )
    return BatchEntry(proposal=proposal, verdict=verdict)


APPROVE = {"call-0001": ApprovalAnswer(decision="approve")}


def test_only_calls_the_gate_left_waiting_are_asked_about() -> None:
    forged = _waiting("call-0002").model_copy(
        update={"verdict": _waiting("call-0002").verdict.model_copy(update={"fingerprint": "x"})}
    )
    ask = ask_approval(make_state(batch=(_waiting(), forged)), SETTINGS)
    assert [e.call_id for e in ask.asked] == ["call-0001"]
    assert [c["call_id"] for c in ask.request(None)["calls"]] == ["call-0001"]
    assert ask.refused is None and "error" not in ask.request(None)


def test_the_last_refused_answer_is_shown_with_who_may_answer() -> None:
    state = make_state(batch=(_waiting(),), last_error_code="approval_right_missing")
    ask = ask_approval(state, SETTINGS)
    assert ask.refused is not None
    assert ask.request(None)["error"] == {
        "code": "approval_right_missing",
        "rights": ["approve:payments:send"],
        "four_eyes": False,
    }


def test_an_approver_acts_as_the_requester_and_is_marked() -> None:
    state = make_state(batch=(_waiting(),))
    ask = ask_approval(state, SETTINGS)
    lead = _ctx("lead-7", "approve:payments:send")
    plan = plan_approval(state, ask, APPROVE, owner=OWNER, ctx=lead, given=lead, clock=CLOCK)
    assert plan.stop is None and plan.refusal is None
    assert plan.answerer == "lead-7" and plan.marks_approver == "lead-7"
    assert plan.acting is not None and plan.acting.principal == REQUESTER.principal


def test_the_requesters_own_answer_acts_as_itself_and_marks_nobody() -> None:
    state = make_state(batch=(_waiting(),))
    ask = ask_approval(state, SETTINGS)
    plan = plan_approval(
        state, ask, APPROVE, owner=OWNER, ctx=REQUESTER, given=REQUESTER, clock=CLOCK
    )
    assert plan.acting == REQUESTER and plan.marks_approver is None


def test_an_answer_from_someone_who_may_not_give_it_keeps_the_run_waiting() -> None:
    state = make_state(batch=(_waiting(),))
    ask = ask_approval(state, SETTINGS)
    for ctx, code in [
        (_ctx("peer-2", "payments:send"), "approval_right_missing"),
        (_ctx("lead-7", "approve:payments:send", tenant="tenant-b"), "wrong_tenant"),
        (None, "missing_context"),
    ]:
        plan = plan_approval(state, ask, APPROVE, owner=OWNER, ctx=ctx, given=ctx, clock=CLOCK)
        assert plan.refusal == code
        assert plan.stop is None and plan.acting is None


def test_with_nothing_waiting_a_caller_without_context_stops_the_run() -> None:
    state = make_state()
    ask = ask_approval(state, SETTINGS)
    plan = plan_approval(state, ask, {}, owner=OWNER, ctx=None, given=None, clock=CLOCK)
    assert plan.refusal is None and plan.acting is None
    assert plan.stop is not None and plan.stop.reason is TerminationReason.POLICY_DENIED


def test_an_answer_records_one_manifest_per_call_and_reserves_only_what_it_approved() -> None:
    state = make_state(batch=(_waiting(),), last_error_code="wrong_tenant")
    ask = ask_approval(state, SETTINGS)
    plan = plan_approval(
        state, ask, APPROVE, owner=OWNER, ctx=REQUESTER, given=REQUESTER, clock=CLOCK
    )
    result = plan.apply(state, run_directly, CLOCK.now())
    end = end_approval(plan, state, result, result.batch)
    assert end.state.last_error_code is None
    assert [r["approval"] for r in end.records] == ["human"]
    assert [r["approved_by"] for r in end.records] == ["user-1"]
    assert end.reserves == frozenset({"call-0001"})
    # Answers that stop the run reserve nothing: the stop is written instead.
    no_progress = stop(TerminationReason.NO_PROGRESS, "no_progress")
    stopped = ApprovalResult(batch=result.batch, fingerprints={}, rejected=(), stop=no_progress)
    ended = end_approval(plan, state, stopped, result.batch)
    assert ended.reserves is None and ended.stop == no_progress
    assert ended.closed(ended.state, ended.stop).stop == no_progress
