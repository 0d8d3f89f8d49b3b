"""Approvals (seed 002, "waiting for input"): a human's answer is one of a few exact forms; an
edit its tool's schema refuses is asked again with the errors as data, never the run's end; a
per-call answer that leaves a waiting call out rejects it."""

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
from tests.graph.kit import (
    ABSTAIN,
    LEDGERS,
    VERDICT_KEY,
    Calls,
    budget,
    call,
    context,
    each_ledger,
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
