"""Conditional approval (DESIGN, "Approvals and provenance"; invariant 2: a tool runs only if
its effect is allowed or approved): a tool's ``needs_approval`` (or the graph's, for tools
without one) decides per call, from the call's arguments and the trusted context, whether the
call needs approval — a small write may run unasked, a read of a sensitive record may wait for
a human — and the executor runs what the gate so allowed in every approval mode.
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.types import Command

import fencepost as fp
from fencepost.policy.conditional_approval import ApprovalQuestion
from tests.graph.kit import ABSTAIN, Calls, budget, call, context, harness, thread

CAPS = frozenset({"logs:read", "notes:write", "payments:send", "records:read"})


def registry(calls: Calls, asked: list[ApprovalQuestion]) -> fp.ToolRegistry:
    def small_only(question: ApprovalQuestion) -> bool:
        asked.append(question)
        return bool(question.proposal.arguments["amount"] > 100)

    @fp.tool(effect="external", capability="payments:send", needs_approval=small_only)
    def send_payment(amount: int, ctx: fp.ToolContext) -> dict[str, Any]:
        """Send a payment."""
        calls.log.append(("send_payment", {"amount": amount}, ctx.idempotency_key))
        return {"paid": amount}

    async def vip_records(question: ApprovalQuestion) -> bool:
        asked.append(question)
        return question.proposal.arguments["customer"] in question.context.app_data["vips"]

    @fp.tool(effect="read", capability="records:read", needs_approval=vip_records)
    def read_record(customer: str, ctx: fp.ToolContext) -> dict[str, Any]:
        """Read a customer's record."""
        calls.log.append(("read_record", {"customer": customer}, ctx.idempotency_key))
        return {"customer": customer}

    @fp.tool(effect="write", capability="notes:write")
    def write_note(note: str, ctx: fp.ToolContext) -> dict[str, Any]:
        """Write a note."""
        calls.log.append(("write_note", {"note": note}, ctx.idempotency_key))
        return {"written": True}

    return fp.ToolRegistry([send_payment, read_record, write_note])


def ctx() -> fp.RunContext:
    base = context(caps=CAPS)
    return base.model_copy(update={"app_data": {"vips": ["acme-ceo"]}})


def run(
    script: list[Any], **build: Any
) -> tuple[Any, dict[str, Any], dict[str, Any], list[ApprovalQuestion]]:
    calls, asked = Calls(), []
    h = harness([*script, ABSTAIN, ABSTAIN], registry=registry(calls, asked), calls=calls, **build)
    config = thread()
    out = h.graph.invoke(fp.start("q", budget()), config, context=ctx())
    return h, config, out, asked


def test_a_write_its_tool_judges_small_runs_unasked_in_terminate_mode() -> None:
    h, _, out, asked = run([call("send_payment", 1, amount=20)])
    assert h.calls.log == [("send_payment", {"amount": 20}, "call-0001")]
    assert [q.proposal.call_id for q in asked] == ["call-0001"]
    assert asked[0].context.principal.id == "u-1"  # the trusted context, not the model's
    assert fp.run_output(out).termination is not fp.TerminationReason.APPROVAL_REQUIRED


def test_a_write_its_tool_judges_large_still_needs_approval() -> None:
    h, _, out, _ = run([call("send_payment", 1, amount=500)])
    assert h.calls.log == []
    assert fp.run_output(out).termination is fp.TerminationReason.APPROVAL_REQUIRED


def test_a_read_its_tool_judges_sensitive_waits_for_a_human_and_runs_once_approved() -> None:
    h, config, out, _ = run([call("read_record", 1, customer="acme-ceo")], approval="interrupt")
    assert "__interrupt__" in out and h.calls.log == []
    h.graph.invoke(Command(resume="approve"), config, context=ctx())
    assert h.calls.log == [("read_record", {"customer": "acme-ceo"}, "call-0001")]


def test_the_callable_is_asked_only_about_calls_whose_arguments_passed_the_schema() -> None:
    # The strict ending (no repair turn): the refused call alone is what is judged here.
    h, _, out, asked = run([call("send_payment", 1, amount="lots")], repair_attempts=0)
    assert asked == [] and h.calls.log == []
    assert fp.run_output(out).termination is fp.TerminationReason.INVALID_PROPOSAL


@pytest.mark.parametrize("answer", [False, True])
def test_the_graphs_callable_decides_for_tools_without_their_own(answer: bool) -> None:
    seen: list[str] = []

    def graph_decides(question: ApprovalQuestion) -> bool:
        seen.append(question.tool.name)
        return answer

    h, _, out, _ = run([call("write_note", 1, note="hi")], needs_approval=graph_decides)
    assert seen == ["write_note"]
    ran = h.calls.log == [("write_note", {"note": "hi"}, "call-0001")]
    assert ran is (not answer)
    stopped = fp.run_output(out).termination is fp.TerminationReason.APPROVAL_REQUIRED
    assert stopped is answer
