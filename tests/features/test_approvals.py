"""Approvals (seed 002, "waiting for input"): terminate mode ends the run at a write; interrupt
mode pauses, and only approved calls run — once, with their call id as the idempotency key, as
approved or edited (an edit passes every gate again), for a principal still authorized, and never
with arguments changed after the verdict. A human's answer is one of a few exact forms; an edit
its tool's schema refuses is asked again with the errors as data, never the run's end; a per-call
answer that leaves a waiting call out rejects it.
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.policy.approval import (
    ApprovalAnswer,
    ApprovalProblem,
    edit_problems,
    parse_approval,
    read_answer,
)
from fencepost.policy.tool_decorator import tool
from tests.graph.kit import (
    ABSTAIN,
    LEDGERS,
    VERDICT_KEY,
    Calls,
    budget,
    call,
    context,
    each_ledger,
    final_citing_last,
    forge_batch,
    harness,
    interrupt_payload,
    make_registry,
    state_of,
    thread,
    thread_account,
)

ledger = pytest.fixture(params=LEDGERS, name="ledger")(each_ledger)


class PaymentArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    amount: int


def _registry(calls: Calls) -> fp.ToolRegistry:
    def pay(args: PaymentArgs, ctx: fp.ToolContext) -> dict[str, Any]:
        calls.log.append(("send_payment", {"amount": args.amount}, ctx.idempotency_key))
        return {"paid": args.amount}

    payment = fp.ToolSpec(
        name="send_payment",
        description="Send a payment.",
        args_model=PaymentArgs,
        effect=fp.Effect.EXTERNAL,
        capability="notes:write",
        timeout_seconds=5,
        execute=pay,
    )
    return make_registry(calls, extra=[payment])


PAY = fp.ToolProposal(call_id="call-0001", tool_name="send_payment", arguments={"amount": 7})


def _paused(
    script: list[Any], **build: Any
) -> tuple[Any, dict[str, Any], fp.RunContext, dict[str, Any]]:
    calls = Calls()
    h = harness(
        [*script, ABSTAIN, ABSTAIN],
        registry=_registry(calls),
        calls=calls,
        approval="interrupt",
        **build,
    )
    config, ctx = thread(), context()
    out = h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    return h, config, ctx, interrupt_payload(out)


@pytest.mark.parametrize("key", [None, VERDICT_KEY], ids=["no-key", "key"])
def test_an_edit_its_tools_schema_refuses_is_asked_again_with_paths_and_codes_never_values(
    ledger: fp.Ledger, key: bytes | None
) -> None:
    h, config, ctx, _ = _paused([PAY], ledger=ledger, verdict_key=key)
    edit = {"decision": "edit", "arguments": {"amount": "5"}}
    out = h.graph.invoke(Command(resume=edit), config, context=ctx)
    assert h.calls.log == []
    error = interrupt_payload(out)["error"]
    assert error["code"] == "invalid_arguments"
    assert error["invalid"] == [{"call_id": "call-0001", "problems": ["amount: int_type"]}]
    assert "5" not in repr(error)
    # Nothing ended: the run's account is open, and the call is still waiting.
    assert ledger.balance(thread_account(config)).closed is None
    assert not state_of(h, config).is_terminal
    h.graph.invoke(
        Command(resume={"decision": "edit", "arguments": {"amount": 5}}), config, context=ctx
    )
    assert h.calls.log == [("send_payment", {"amount": 5}, "call-0001")]


@pytest.mark.parametrize(
    "arguments",
    [{"amount": float("nan")}, {"amount": 5, "extra": 1}, {"amount": True}],
    ids=["nan", "extra-key", "bool-for-int"],
)
def test_an_edit_no_schema_or_checkpoint_takes_is_asked_again(arguments: Any) -> None:
    h, config, ctx, _ = _paused([PAY])
    out = h.graph.invoke(
        Command(resume={"decision": "edit", "arguments": arguments}), config, context=ctx
    )
    assert h.calls.log == []
    assert interrupt_payload(out)["error"]["code"] == "invalid_arguments"


def test_a_per_call_edit_asks_again_naming_only_the_call_whose_edit_failed() -> None:
    second = PAY.model_copy(update={"call_id": "call-0002"})
    h, config, ctx, payload = _paused([fp.ToolBatch(calls=(PAY, second))])
    assert [c["call_id"] for c in payload["calls"]] == ["call-0001", "call-0002"]
    answer = {
        "call-0001": {"decision": "edit", "arguments": {"amount": 1}},
        "call-0002": {"decision": "edit", "arguments": {"amount": "1"}},
    }
    out = h.graph.invoke(Command(resume=answer), config, context=ctx)
    assert h.calls.log == []
    invalid = interrupt_payload(out)["error"]["invalid"]
    assert [i["call_id"] for i in invalid] == ["call-0002"]


def test_the_accepted_forms_read_as_one_answer_each() -> None:
    ids = ["call-0001", "call-0002"]
    approve, reject = ApprovalAnswer(decision="approve"), ApprovalAnswer(decision="reject")
    assert parse_approval("approve", ids) == {"call-0001": approve, "call-0002": approve}
    assert parse_approval({"type": "reject"}, ids) == {"call-0001": reject, "call-0002": reject}
    assert parse_approval({"call-0002": {"decision": "approve"}}, ids) == {
        "call-0001": reject,
        "call-0002": approve,
    }
    edit = parse_approval({"decision": "edit", "arguments": {"note": "x"}}, ids[:1])
    assert edit == {"call-0001": ApprovalAnswer(decision="edit", arguments={"note": "x"})}


@pytest.mark.parametrize(
    "answer",
    [
        {"decision": "approve", "call-0001": "reject"},
        {"decision": "approve", "type": "approve"},
        {"decision": "reject", "why": "no"},
        {"decision": "edit", "arguments": {}, "type": "edit"},
        {"call-0001": "approve", "call-9999": "approve"},
        {"call-0001": "approve", 7: "approve"},
        "Approve",
        None,
    ],
)
def test_an_answer_that_is_not_exactly_one_form_is_a_problem(answer: Any) -> None:
    assert parse_approval(answer, ["call-0001"]) == ApprovalProblem()


def test_a_call_id_spelt_like_a_key_of_a_form_must_mean_the_same_both_ways() -> None:
    # "decision" is a valid call id: {"decision": "approve"} approves every call globally, but
    # per call it approves that one and rejects the rest. Read both ways, it is asked again.
    assert parse_approval({"decision": "approve"}, ["decision", "call-0002"]) == ApprovalProblem()
    assert parse_approval({"decision": "approve"}, ["decision"]) == {
        "decision": ApprovalAnswer(decision="approve")
    }


def test_an_edit_is_checked_against_its_tools_schema_before_any_gate() -> None:
    registry = _registry(Calls())
    entry = fp.policy.BatchEntry(
        proposal=PAY,
        verdict=fp.policy.Verdict(
            call_id=PAY.call_id,
            tool_name=PAY.tool_name,
            fingerprint=fp.policy.proposal_fingerprint(PAY.tool_name, PAY.arguments),
            code=fp.policy.VerdictCode.APPROVAL_PENDING,
        ),
    )
    fine = {"call-0001": ApprovalAnswer(decision="edit", arguments={"amount": 3})}
    assert edit_problems(fine, [entry], registry) is None
    bad = read_answer({"decision": "edit", "arguments": {"amount": "3"}}, [entry], registry)
    assert isinstance(bad, ApprovalProblem) and bad.code == "invalid_arguments"
    assert bad.invalid[0].problems == ("amount: int_type",)


def test_a_per_call_resume_that_leaves_a_call_out_rejects_it() -> None:
    batch = fp.ToolBatch(calls=(call("write_note", 1, note="a"), call("write_note", 2, note="b")))
    h = harness([batch, ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    state = fp.run_output(
        h.graph.invoke(Command(resume={"call-0001": "approve"}), config, context=ctx)
    )
    assert h.calls.log == [("write_note", {"note": "a"}, "call-0001")]
    receipts = {r.call_id: r.status for r in state.receipts}
    assert receipts == {
        "call-0001": fp.ReceiptStatus.COMPLETED,
        "call-0002": fp.ReceiptStatus.DENIED,
    }


# -- terminate and interrupt modes; what runs after an answer ----------------------------------


def _pause_at_the_write(h: Any, config: dict[str, Any], ctx: fp.RunContext) -> dict[str, Any]:
    out = h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    interrupts = out["__interrupt__"]
    assert len(interrupts) == 1
    return interrupts[0].value


def test_terminate_mode_ends_a_write_proposal_as_approval_required() -> None:
    h = harness([call("write_note", 1, note="hi")])
    state = h.run()
    assert state.termination is fp.TerminationReason.APPROVAL_REQUIRED
    assert h.calls.log == []


def test_interrupt_payload_names_call_tool_arguments_effect_and_capability() -> None:
    h = harness([call("write_note", 1, note="hi")], approval="interrupt")
    payload = _pause_at_the_write(h, thread(), context())
    assert payload["calls"] == [
        {
            "call_id": "call-0001",
            "tool_name": "write_note",
            "arguments": {"note": "hi"},
            "effect": "write",
            "capability": "notes:write",
            "approval_right": "approve:notes:write",
            "four_eyes": False,
            # A write is traced: its note was seen nowhere before it was proposed.
            "provenance": {"note": ["model"]},
        }
    ]
    assert h.calls.log == []


def test_approved_write_runs_once_with_its_call_id_as_idempotency_key() -> None:
    h = harness([call("write_note", 1, note="hi"), final_citing_last], approval="interrupt")
    config, ctx = thread(), context()
    _pause_at_the_write(h, config, ctx)
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.log == [("write_note", {"note": "hi"}, "call-0001")]
    assert state.budget.mutations_used == 1


def test_rejected_call_never_runs_and_the_model_sees_a_safe_code() -> None:
    h = harness(
        [call("write_note", 1, note="hi"), fp.AbstainProposal(reason="needs_clarification")],
        approval="interrupt",
    )
    config, ctx = thread(), context()
    _pause_at_the_write(h, config, ctx)
    state = fp.run_output(h.graph.invoke(Command(resume="reject"), config, context=ctx))
    assert h.calls.log == []
    assert state.termination is fp.TerminationReason.NEEDS_CLARIFICATION
    assert state.receipts[-1].status is fp.ReceiptStatus.DENIED
    assert h.model.inputs[-1].observations[-1].error_code is fp.ErrorCode.PERMISSION_DENIED
    assert state.budget.tool_calls_used == 0


def test_edited_arguments_pass_every_gate_again() -> None:
    calls = Calls()

    @tool(effect=fp.Effect.WRITE, capability="notes:write", timeout_seconds=5)
    def post_query(query: str, ctx: fp.ToolContext) -> Any:
        """Post a saved query."""
        calls.log.append(("post_query", {"query": query}, ctx.idempotency_key))
        return {"posted": True}

    proposal = fp.ToolProposal(
        call_id="call-0001", tool_name="post_query", arguments={"query": "errors"}
    )
    h = harness(
        [proposal],
        registry=make_registry(calls, extra=[post_query]),
        calls=calls,
        approval="interrupt",
    )
    config, ctx = thread(), context()
    _pause_at_the_write(h, config, ctx)
    # Well-formed, so not asked again (tests/features/test_approvals.py): an empty-like query is
    # a semantic violation, judged as the model's own would be.
    bad_edit = {"decision": "edit", "arguments": {"query": "*"}}
    state = fp.run_output(h.graph.invoke(Command(resume=bad_edit), config, context=ctx))
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "semantic_violation"
    assert h.calls.log == []


def test_edited_arguments_are_what_runs() -> None:
    h = harness([call("write_note", 1, note="hi"), final_citing_last], approval="interrupt")
    config, ctx = thread(), context()
    _pause_at_the_write(h, config, ctx)
    edit = {"decision": "edit", "arguments": {"note": "edited"}}
    state = fp.run_output(h.graph.invoke(Command(resume=edit), config, context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.log == [("write_note", {"note": "edited"}, "call-0001")]
    # What the model is shown of its own call afterwards is what actually ran.
    assert [p.arguments for p in state.proposals] == [{"note": "edited"}]
    assert h.model.inputs[-1].proposals == state.proposals


def test_authorization_is_checked_again_at_commit_time() -> None:
    h = harness([call("write_note", 1, note="hi")], approval="interrupt")
    config, ctx = thread(), context()
    _pause_at_the_write(h, config, ctx)
    revoked = context(caps=frozenset({"logs:read"}))
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=revoked))
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert h.calls.log == []


def test_unrecognised_resume_value_is_a_rejection() -> None:
    h = harness(
        [call("write_note", 1, note="hi"), fp.AbstainProposal(reason="insufficient_evidence")],
        approval="interrupt",
    )
    config, ctx = thread(), context()
    _pause_at_the_write(h, config, ctx)
    fp.run_output(h.graph.invoke(Command(resume={"decision": "yes please"}), config, context=ctx))
    assert h.calls.log == []


def test_executor_refuses_a_call_whose_arguments_changed_after_the_verdict() -> None:
    h = harness(
        [call("write_note", 1, note="hi"), fp.AbstainProposal(reason="insufficient_evidence")],
        approval="interrupt",
    )
    config, ctx = thread(), context()
    _pause_at_the_write(h, config, ctx)
    h.graph.invoke(Command(resume="approve"), config, context=ctx, interrupt_before=["execute"])
    snapshot = h.graph.get_state(config)
    assert snapshot.next == ("execute",)
    forged = call("write_note", 1, note="rm -rf /")
    h.graph.update_state(config, forge_batch(h, config, pending=(forged,)), as_node="approve")
    fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert h.calls.log == []


def test_a_denied_verdict_cannot_be_slipped_to_the_executor_by_a_state_edit() -> None:
    h = harness([call("admin_reset", 1), fp.AbstainProposal(reason="insufficient_evidence")])
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx, interrupt_after=["decide"])
    snapshot = h.graph.get_state(config)
    verdict = fp.run_output(snapshot.values).batch[0].verdict
    assert verdict.code is fp.policy.VerdictCode.CAPABILITY_DENIED
    allowed = verdict.model_copy(update={"code": fp.policy.VerdictCode.ALLOWED})
    h.graph.update_state(
        config,
        {"run": {**forge_batch(h, config, verdicts=(allowed,))["run"], "stop": None}},
        as_node="decide",
    )
    h.graph.invoke(None, config, context=ctx)
    assert h.calls.log == []


KEY = b"a-secret-the-operator-keeps-0123"


def test_with_a_verdict_key_a_forged_approval_never_runs() -> None:
    h = harness(
        [call("write_note", 1, note="hi"), fp.AbstainProposal(reason="insufficient_evidence")],
        approval="interrupt",
        verdict_key=KEY,
    )
    config, ctx = thread(), context()
    _pause_at_the_write(h, config, ctx)
    pending = fp.run_output(h.graph.get_state(config).values).batch[0].verdict
    forged = pending.model_copy(update={"code": fp.policy.VerdictCode.ALLOWED})
    # Written as if approve had allowed it, the route goes on to the executor (a goto beside the
    # waiting approval would be refused whole: graph.bounded).
    h.graph.update_state(config, forge_batch(h, config, verdicts=(forged,)), as_node="approve")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert h.calls.log == []
    # The executor refused it, receipted it and asked for the run to end as policy_denied.
    assert state.stop is not None and state.stop.reason is fp.TerminationReason.POLICY_DENIED
    assert state.stop.error_code == "executor_refused"
    assert state.receipts[-1].status is fp.ReceiptStatus.DENIED


def test_with_a_verdict_key_a_real_approval_still_runs() -> None:
    h = harness(
        [call("write_note", 1, note="hi"), final_citing_last], approval="interrupt", verdict_key=KEY
    )
    config, ctx = thread(), context()
    _pause_at_the_write(h, config, ctx)
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.log == [("write_note", {"note": "hi"}, "call-0001")]


def test_a_seal_is_bound_to_its_run_call_and_arguments() -> None:
    verdict = fp.policy.Verdict(
        call_id="call-0001",
        tool_name="write_note",
        fingerprint="f" * 64,
        code=fp.policy.VerdictCode.ALLOWED,
    )
    sealed = fp.policy.seal_verdict(verdict, run_id="run-1", key=KEY)
    assert fp.policy.verdict_is_sealed(sealed, run_id="run-1", key=KEY)
    assert not fp.policy.verdict_is_sealed(sealed, run_id="run-2", key=KEY)
    assert not fp.policy.verdict_is_sealed(
        sealed.model_copy(update={"fingerprint": "0" * 64}), run_id="run-1", key=KEY
    )
    assert not fp.policy.verdict_is_sealed(sealed, run_id="run-1", key=b"another-key-0123456789")
    assert not fp.policy.verdict_is_sealed(verdict, run_id="run-1", key=KEY)
