"""A run ends once, through terminate, and a final answer cites only what was observed."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from fencepost.policy import (
    AgentState,
    AnswerPayload,
    Effect,
    ErrorCode,
    MissingCitation,
    Phase,
    TerminalStateError,
    TerminationReason,
    ToolFailed,
    ToolProposal,
    ToolSucceeded,
    UnsupportedCitation,
    Verdict,
    VerdictCode,
    proposal_fingerprint,
    reduce_tool_events,
    terminate,
    validate_final_answer,
)
from fencepost.policy.batch import BatchEntry
from fencepost.policy.context import RunContext
from fencepost.policy.ledger import Balance
from fencepost.policy.ownership import run_owner
from fencepost.policy.receipt import Receipt, ReceiptStatus
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.state import StopRequest, stop
from fencepost.policy.tasks import evidence_ids
from fencepost.policy.terminate import AnswerFacts, EndingPlan, plan_ending
from fencepost.policy.tool import Principal
from tests.policy.factories import make_proposal, make_spec, make_state


def test_terminal_state_cannot_terminate_twice() -> None:
    done = terminate(make_state(), TerminationReason.COMPLETED)
    with pytest.raises(RuntimeError, match="already terminal"):
        terminate(done, TerminationReason.FAILED)


@pytest.mark.parametrize("reason", list(TerminationReason))
def test_every_reason_ends_the_run_exactly_once(reason: TerminationReason) -> None:
    done = terminate(make_state(), reason)
    assert done.is_terminal
    assert done.phase is Phase.TERMINAL
    assert done.termination is reason
    with pytest.raises(TerminalStateError):
        terminate(done, reason)


def test_terminate_records_answer_and_error_code_and_drops_pending_calls() -> None:
    proposal = make_proposal()
    verdict = Verdict(
        call_id=proposal.call_id,
        tool_name=proposal.tool_name,
        fingerprint=proposal_fingerprint(proposal.tool_name, proposal.arguments),
        code=VerdictCode.ALLOWED,
    )
    state = make_state(batch=(BatchEntry(proposal=proposal, verdict=verdict),))
    answer = AnswerPayload(text="It was a 500.", citations=())
    done = terminate(state, TerminationReason.COMPLETED, answer=answer, error_code="none")
    assert done.final_answer == answer
    assert done.last_error_code == "none"
    assert done.batch == ()
    assert not state.is_terminal
    assert state.pending == (make_proposal(),)


def test_terminal_state_error_is_a_runtime_error() -> None:
    assert issubclass(TerminalStateError, RuntimeError)


def _observed() -> AgentState:
    return reduce_tool_events(
        make_state(),
        (
            ToolSucceeded(call_id="call-0001", tool_name="search_logs", result={"hits": 1}),
            ToolFailed(call_id="call-0002", tool_name="search_logs", error_code=ErrorCode.TIMEOUT),
        ),
    )


def test_final_answer_may_cite_observed_results() -> None:
    answer = AnswerPayload(text="One hit.", citations=("call-0001",))
    assert validate_final_answer(answer, _observed()) is answer


@pytest.mark.parametrize("citation", ["call-0002", "call-9999", ""])
def test_final_answer_citing_unobserved_or_failed_calls_is_rejected(citation: str) -> None:
    answer = AnswerPayload(text="Trust me.", citations=("call-0001", citation))
    with pytest.raises(UnsupportedCitation):
        validate_final_answer(answer, _observed())


def test_missing_citations_are_rejected_only_when_required() -> None:
    answer = AnswerPayload(text="No sources.")
    assert validate_final_answer(answer, _observed()) is answer
    with pytest.raises(MissingCitation):
        validate_final_answer(answer, _observed(), require_citations=True)


def test_duplicate_citations_are_collapsed_in_order() -> None:
    answer = AnswerPayload(text="x", citations=("b", "a", "b"))
    assert answer.citations == ("b", "a")


def test_a_completed_stop_is_concluded_at_the_end_as_a_final_answer_would_be() -> None:
    from fencepost.policy.terminate import conclude

    def completed(answer: AnswerPayload | None) -> StopRequest:
        return StopRequest(reason=TerminationReason.COMPLETED, answer=answer)

    observed = _observed()
    good = completed(AnswerPayload(text="One hit.", citations=("call-0001",)))
    facts = AnswerFacts.from_state(observed)
    assert conclude(good, facts, require_citations=True).stop is good
    for ending, code, required in (
        (completed(None), "malformed_decision", False),
        (
            completed(AnswerPayload(text="x", citations=("call-0002",))),
            "unsupported_citation",
            False,
        ),
        (completed(AnswerPayload(text="x")), "missing_citation", True),
    ):
        verified = conclude(ending, facts, require_citations=required).stop
        assert (verified.reason, verified.error_code, verified.answer) == (
            TerminationReason.INVALID_PROPOSAL,
            code,
            None,
        )
    # Accepted work still pending: the answer is not taken as done, however well it cites.
    from fencepost.policy import Receipt

    accepted = Receipt(
        call_id="call-0003",
        tool_name="upload_document",
        status=ReceiptStatus.ACCEPTED_PENDING,
        task_id="task-1",
    )
    pending = observed.model_copy(update={"receipts": (*observed.receipts, accepted)})
    verified = conclude(good, AnswerFacts.from_state(pending), require_citations=False).stop
    assert (verified.reason, verified.error_code) == (
        TerminationReason.INVALID_PROPOSAL,
        "tasks_pending",
    )
    other = StopRequest(reason=TerminationReason.POLICY_DENIED, error_code="x")
    assert conclude(other, facts, require_citations=True).stop is other


# --- The terminal node's plan ---------------------------------------------------------------

_CTX = RunContext(tenant_id="tenant-a", principal=Principal(id="user-1"))
_COMPLETED = StopRequest(
    reason=TerminationReason.COMPLETED,
    answer=AnswerPayload(text="One hit.", citations=("call-0001",)),
)


def _balance(ctx: RunContext = _CTX, closed: str | None = None) -> Balance:
    return Balance(
        account="acct", parent=None, limits={}, owner=run_owner(ctx, "run-0001"), closed=closed
    )


def _plan(state: AgentState, balance: Balance | None, ctx: RunContext = _CTX) -> EndingPlan:
    return plan_ending(
        state,
        ctx,
        balance,
        account="acct",
        remaining_steps=None,
        require_citations=True,
        registry=ToolRegistry([]),
    )


def _vouched(state: AgentState, produced: Collection[str]) -> AnswerFacts:
    """The ledger's facts about an answer when it marks ``produced`` as having returned a
    result and no accepted work is pending (``graph.account.answer_facts``)."""
    return AnswerFacts(
        pending=(), citable=evidence_ids(state.receipts, state.observations, produced)
    )


def test_a_completed_stop_is_judged_by_the_ledgers_facts_on_the_callers_own_account() -> None:
    plan = _plan(_observed().model_copy(update={"stop": _COMPLETED}), _balance())
    assert (plan.owned, plan.citations) == (True, ("call-0001",))
    vouched = plan.end(facts=_vouched(plan.current, {"call-0001"}))
    assert (vouched.stop, vouched.state.termination, vouched.closes) == (
        _COMPLETED,
        TerminationReason.COMPLETED,
        True,
    )
    assert vouched.state.report is not None
    # The observation in state is no marker: a citation the ledger does not vouch for fails.
    refused = plan.end(facts=_vouched(plan.current, ()))
    unvouched = refused.stop
    assert (unvouched.reason, unvouched.error_code) == (
        TerminationReason.INVALID_PROPOSAL,
        "unsupported_citation",
    )
    # The terminal state holds the stop it ended with, not the refused answer.
    assert refused.state.stop == unvouched and refused.state.final_answer is None


def test_another_callers_account_vouches_for_nothing_and_is_not_closed() -> None:
    other = RunContext(tenant_id="tenant-b", principal=Principal(id="user-9"))
    plan = _plan(_observed().model_copy(update={"stop": _COMPLETED}), _balance(other))
    assert (plan.owned, plan.citations) == (False, None)
    end = plan.end()
    assert (end.stop.reason, end.stop.error_code, end.closes) == (
        TerminationReason.INVALID_PROPOSAL,
        "unsupported_citation",
        False,
    )


def test_a_completed_stop_on_no_account_of_the_ledger_is_unknown_budget_account() -> None:
    plan = _plan(_observed().model_copy(update={"stop": _COMPLETED}), None)
    assert plan.owned is None
    end = plan.end()
    assert (end.stop.error_code, end.closes) == ("unknown_budget_account", False)


def test_an_ending_stands_unless_it_reads_completed_on_an_account_not_closed_completed() -> None:
    done = terminate(_observed(), TerminationReason.COMPLETED, answer=_COMPLETED.answer)
    assert _plan(done, _balance(closed="completed")).stands
    assert _plan(done, None).stands
    failed = terminate(_observed(), TerminationReason.FAILED)
    assert _plan(failed, _balance()).stands
    with pytest.raises(TerminalStateError):
        _plan(failed, _balance()).end()
    # Written by a caller: the account is still open, or closed for another reason.
    for closed, reason in ((None, "policy_denied"), ("cancelled", "cancelled")):
        plan = _plan(done, _balance(closed=closed))
        assert not plan.stands and plan.asked == stop(TerminationReason(reason), "invalid_state")
        assert plan.current.final_answer is None


def test_a_cancel_that_closed_the_account_first_wins() -> None:
    plan = _plan(_observed().model_copy(update={"stop": _COMPLETED}), _balance())
    end = plan.end(facts=_vouched(plan.current, {"call-0001"}))
    assert end.after_close("completed") is end
    assert end.after_close(None) is end
    cancel = stop(TerminationReason.CANCELLED, "cancelled")
    own = _plan(_observed().model_copy(update={"stop": cancel}), _balance()).end()
    assert own.after_close("cancelled") is own  # the run's own cancel: nothing to change
    cancelled = end.after_close("cancelled")
    assert (cancelled.stop.reason, cancelled.state.termination) == (
        TerminationReason.CANCELLED,
        TerminationReason.CANCELLED,
    )
    assert cancelled.state.stop == cancelled.stop


def test_a_batch_call_the_ledger_shows_started_without_a_receipt_ends_uncertain() -> None:
    proposal = make_proposal(call_id="call-0005")
    entry = BatchEntry(
        proposal=proposal,
        verdict=Verdict(
            call_id=proposal.call_id,
            tool_name=proposal.tool_name,
            fingerprint=proposal_fingerprint(proposal.tool_name, proposal.arguments),
            code=VerdictCode.ALLOWED,
        ),
    )
    stopped = stop(TerminationReason.CANCELLED, "cancelled")
    state = _observed().model_copy(update={"batch": (entry,), "stop": stopped})
    plan = _plan(state, _balance())
    assert plan.unreported == ("call-0005",)
    [receipt] = [r for r in plan.end(("call-0005",)).state.receipts if r.call_id == "call-0005"]
    assert receipt.status is ReceiptStatus.UNCERTAIN
    assert not [r for r in plan.end().state.receipts if r.call_id == "call-0005"]


def test_a_call_started_and_never_reported_is_uncertain_with_its_effect() -> None:
    registry = ToolRegistry([make_spec("send", effect=Effect.WRITE, capability="x")])

    def entry(n: int) -> BatchEntry:
        proposal = ToolProposal(call_id=f"call-000{n}", tool_name="send", arguments={})
        verdict = Verdict(
            call_id=proposal.call_id,
            tool_name="send",
            fingerprint=proposal_fingerprint("send", {}),
            code=VerdictCode.ALLOWED,
        )
        return BatchEntry(proposal=proposal, verdict=verdict)

    ran = Receipt(call_id="call-0001", tool_name="send", status=ReceiptStatus.COMPLETED)
    state = _observed().model_copy(
        update={
            "batch": (entry(1), entry(2), entry(3)),
            "receipts": (*_observed().receipts, ran),
            "stop": stop(TerminationReason.CANCELLED, "cancelled"),
        }
    )
    plan = plan_ending(
        state,
        _CTX,
        _balance(),
        account="acct",
        remaining_steps=None,
        require_citations=False,
        registry=registry,
    )
    assert plan.unreported == ("call-0002", "call-0003")
    receipts = plan.end(("call-0001", "call-0002")).state.receipts
    (receipt,) = receipts[len(state.receipts) :]
    assert receipt.call_id == "call-0002"
    assert receipt.status is ReceiptStatus.UNCERTAIN
    assert receipt.effect is Effect.WRITE
    assert receipt.error_code is ErrorCode.EXECUTION_UNCERTAIN
    assert receipt.attempts == 1


# -- the end of a run: a stop nobody asked for, which account closes -------------------------------


@pytest.mark.parametrize(("left", "code"), [(100, "invalid_state"), (0, "recursion_limit")])
def test_a_run_at_the_terminal_node_with_no_stop_ends_invalid_state_unless_out_of_steps(
    left: int, code: str
) -> None:
    plan = plan_ending(
        _observed(),
        _CTX,
        _balance(),
        account="acct",
        remaining_steps=left,
        require_citations=True,
        registry=ToolRegistry([]),
    )
    assert plan.asked is not None and plan.asked.error_code == code


@pytest.mark.parametrize(
    "code",
    ["account_conflict", "unknown_budget_account", "context_mismatch", "missing_context"],
)
def test_an_account_not_provably_the_callers_is_never_closed(code: str) -> None:
    def closes(stopped: StopRequest, balance: Balance) -> bool:
        return _plan(_observed().model_copy(update={"stop": stopped}), balance).end().closes

    other = RunContext(tenant_id="tenant-b", principal=Principal(id="user-9"))
    spent = stop(TerminationReason.TOOL_BUDGET_EXHAUSTED, "tool_budget_exhausted")
    assert not closes(stop(TerminationReason.POLICY_DENIED, code), _balance())
    assert not closes(spent, _balance(other))
    assert closes(spent, _balance())
    assert closes(stop(TerminationReason.INSUFFICIENT_EVIDENCE), _balance())
