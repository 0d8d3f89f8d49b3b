"""The approver policy: asked first about each call that needs approval, with the proposal, its
verdict, the trusted context and the run's evidence; it approves, rejects with a safe code or
asks a human (the interrupt path). Its answer is in the verdict, the receipt and the manifest; a
sync or async approver works in the sync and the async graph; one that raises, hangs or answers
anything else rejects the call, with a safe code and never its exception text."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.types import Command
from pydantic import ValidationError

import fencepost as fp
from fencepost.policy import VerdictCode
from tests.graph.kit import budget, call, context, final_citing_last, harness, thread

ABSTAIN = fp.AbstainProposal(reason="insufficient_evidence")
DONE = fp.FinalProposal(answer=fp.AnswerPayload(text=""))


def note(n: int, text: str = "restart api") -> fp.ToolProposal:
    return call("write_note", n=n, note=text)


def by_note(request: fp.ApproverInput) -> fp.ApproverDecision:
    """Approve a note the caller's app_data allows, ask about "ask", reject the rest."""
    text = request.proposal.arguments.get("note")
    if text == "ask":
        return fp.ApproverDecision.ask()
    if text in request.context.app_data.get("allowed_notes", []):  # type: ignore[operator]
        return fp.ApproverDecision.approve()
    return fp.ApproverDecision.reject("note_not_allowed")


def ctx_allowing(*notes: str) -> fp.RunContext:
    base = context()
    return base.model_copy(update={"app_data": {"allowed_notes": list(notes)}})


def test_an_approved_write_runs_without_a_human_and_the_records_name_the_approver() -> None:
    h = harness([note(1), DONE], approver=by_note)  # approval="terminate": no human at all
    state = h.run(ctx=ctx_allowing("restart api"))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1
    [receipt] = state.receipts
    assert (receipt.status, receipt.approval) == (fp.ReceiptStatus.COMPLETED, "approver")
    [gated] = [m for m in state.manifests if m.phase is fp.policy.Phase.VALIDATE]
    assert (gated.verdict, gated.approval) == (VerdictCode.ALLOWED, "approver")


def test_a_rejected_write_never_runs_is_observed_and_the_run_goes_on() -> None:
    h = harness([note(1, "wipe db"), call(n=2), final_citing_last], approver=by_note)
    state = h.run(ctx=ctx_allowing("restart api"))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 0
    rejected = state.observations[0]
    assert rejected.error_code is fp.ErrorCode.PERMISSION_DENIED
    receipt = state.receipts[0]
    assert (receipt.status, receipt.approval, receipt.rule) == (
        fp.ReceiptStatus.DENIED,
        "approver",
        "note_not_allowed",
    )
    [gated] = [m for m in state.manifests if m.verdict is VerdictCode.REJECTED]
    assert (gated.approval, gated.code) == ("approver", "note_not_allowed")
    assert state.budget.mutations_used == 0


def test_asked_a_human_the_run_pauses_and_the_humans_answer_is_recorded() -> None:
    asked: list[str] = []

    def counting(request: fp.ApproverInput) -> fp.ApproverDecision:
        asked.append(request.proposal.call_id)
        return by_note(request)

    h = harness([note(1, "ask"), DONE], approver=counting, approval="interrupt")
    config, ctx = thread(), ctx_allowing()
    paused = h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    assert paused["__interrupt__"][0].value["calls"][0]["call_id"] == "call-0001"
    pending = [m for m in fp.run_output(paused).manifests if m.outcome == "approval_pending"]
    assert [(m.approval, m.code) for m in pending] == [("approver", "ask_human")]
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert h.calls.count("write_note") == 1
    assert state.receipts[0].approval == "human"
    assert asked == ["call-0001"]  # asked once: not again on resume


def test_asked_a_human_in_terminate_mode_the_run_ends_approval_required() -> None:
    h = harness([note(1, "ask"), DONE], approver=by_note)
    state = h.run(ctx=ctx_allowing())
    assert state.termination is fp.TerminationReason.APPROVAL_REQUIRED
    assert h.calls.log == []


def test_the_approver_is_given_the_proposal_its_verdict_the_context_and_the_evidence() -> None:
    seen: list[fp.ApproverInput] = []

    def look(request: fp.ApproverInput) -> fp.ApproverDecision:
        seen.append(request)
        return fp.ApproverDecision.approve()

    h = harness([call(n=1), note(2), DONE], approver=look)
    h.run(ctx=ctx_allowing("x"))
    [request] = seen
    assert request.proposal.call_id == "call-0002"
    assert request.verdict.code is VerdictCode.APPROVAL_REQUIRED
    assert request.tool.effect is fp.Effect.WRITE
    assert request.context.app_data == {"allowed_notes": ["x"]}
    assert [o.call_id for o in request.observations] == ["call-0001"]
    assert [r.call_id for r in request.receipts] == ["call-0001"]


async def async_by_note(request: fp.ApproverInput) -> fp.ApproverDecision:
    await asyncio.sleep(0)
    return by_note(request)


def test_an_async_approver_answers_in_the_sync_graph() -> None:
    h = harness([note(1), DONE], approver=async_by_note)
    state = h.run(ctx=ctx_allowing("restart api"))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1


async def test_sync_and_async_approvers_answer_in_the_async_graph() -> None:
    for approver in (by_note, async_by_note):
        h = harness([note(1), DONE], approver=approver)
        out = await h.graph.ainvoke(
            fp.start("q", budget()), thread(), context=ctx_allowing("restart api")
        )
        assert fp.run_output(out).termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1


def test_an_approver_that_raises_rejects_the_call_safely_and_its_text_is_only_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(request: fp.ApproverInput) -> fp.ApproverDecision:
        raise RuntimeError("password=hunter2")

    h = harness([note(1), ABSTAIN], approver=broken)
    with caplog.at_level(logging.WARNING, logger="fencepost"):
        state = h.run(ctx=ctx_allowing("restart api"))
    assert h.calls.log == []
    assert state.receipts[0].rule == "approver_failed"
    assert "hunter2" not in repr(state)
    assert any("hunter2" in (r.exc_text or "") for r in caplog.records)


def test_an_async_approver_that_hangs_rejects_the_call_at_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("fencepost.graph.gate.APPROVER_TIMEOUT_SECONDS", 0.2)

    async def hangs(request: fp.ApproverInput) -> fp.ApproverDecision:
        await asyncio.sleep(30)
        return fp.ApproverDecision.approve()

    h = harness([note(1), ABSTAIN], approver=hangs)
    state = h.run(ctx=ctx_allowing("restart api"))
    assert h.calls.log == []
    assert state.receipts[0].rule == "approver_timeout"


@pytest.mark.parametrize(
    "answer",
    [
        True,
        None,
        "approve",
        {"action": "approve"},
        fp.ApproverDecision.model_construct(action="approve", code="Not Safe!"),
        fp.ApproverDecision.model_construct(action="yes"),
        # "$" alone matches before a final newline: a code is checked whole.
        fp.ApproverDecision.model_construct(action="reject", code="ok\n"),
    ],
)
def test_an_approver_answering_anything_but_a_decision_rejects_the_call(answer: Any) -> None:
    h = harness([note(1), ABSTAIN], approver=lambda request: answer)
    state = h.run(ctx=ctx_allowing("restart api"))
    assert h.calls.log == []
    assert state.receipts[0].rule == "approver_invalid_decision"


def test_a_rejection_code_must_be_safe() -> None:
    with pytest.raises(ValidationError):
        fp.ApproverDecision.reject("recipient GB29... is unknown")


def test_the_same_call_rejected_past_its_repeat_limit_ends_no_progress() -> None:
    h = harness([note(n, "wipe db") for n in range(1, 5)], approver=by_note, repeat_limit=2)
    state = h.run(steps=8, ctx=ctx_allowing())
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    assert [r.rule for r in state.receipts] == ["note_not_allowed", "note_not_allowed"]
    assert h.calls.log == []


def test_a_sealed_approval_cannot_be_relabelled() -> None:
    verdict = fp.policy.Verdict(
        call_id="call-0001",
        tool_name="write_note",
        fingerprint="f" * 64,
        code=VerdictCode.ALLOWED,
        approval="approver",
    )
    key = b"k" * 32
    sealed = fp.policy.seal_verdict(verdict, run_id="run-1", key=key)
    relabelled = sealed.model_copy(update={"approval": "human"})
    assert fp.policy.verdict_is_sealed(sealed, run_id="run-1", key=key)
    assert not fp.policy.verdict_is_sealed(relabelled, run_id="run-1", key=key)


ANSWERS = ("approve", "reject", "ask", "raise", "junk")


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=30)
@given(answers=st.lists(st.sampled_from(ANSWERS), min_size=1, max_size=5))
def test_a_write_runs_exactly_when_the_approver_approved_it(answers: list[str]) -> None:
    by_call = {f"call-{n:04d}": a for n, a in enumerate(answers, start=1)}

    def scripted(request: fp.ApproverInput) -> Any:
        answer = by_call[request.proposal.call_id]
        if answer == "raise":
            raise ValueError("boom")
        if answer == "junk":
            return {"approve": True}
        return getattr(fp.ApproverDecision, answer)()

    script: list[Any] = [note(n, f"note {n}") for n in range(1, len(answers) + 1)]
    h = harness([*script, ABSTAIN], approver=scripted)
    state = h.run(steps=len(answers) + 2, tools=len(answers), ctx=ctx_allowing())
    assert state.termination is not None
    ran = [ctx_key for _, _, ctx_key in h.calls.log]
    approved_until_ask = []
    for call_id, answer in by_call.items():
        if answer == "ask":
            break  # terminate mode: asking a human ends the run
        if answer == "approve":
            approved_until_ask.append(call_id)
    assert ran == approved_until_ask
    assert state.budget.mutations_used == len(ran)
    for receipt in state.receipts:
        assert receipt.approval == "approver"
        assert (receipt.status is fp.ReceiptStatus.COMPLETED) == (
            by_call[receipt.call_id] == "approve"
        )


def _late_approval(released: list[str]) -> Any:
    """An approver that swallows its cancellation and approves once it has been cancelled."""

    async def approver(request: fp.ApproverInput) -> fp.ApproverDecision:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            released.append("cancelled")
            await asyncio.sleep(0.05)  # past its timeout, and past any grace a runner gives it
        return fp.ApproverDecision.approve()

    return approver


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_an_approval_given_after_the_approvers_timeout_never_runs_the_write(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setattr("fencepost.graph.gate.APPROVER_TIMEOUT_SECONDS", 0.2)
    released: list[str] = []
    h = harness([note(1), ABSTAIN], approver=_late_approval(released))
    request, config, ctx = fp.start("q", budget()), thread(), ctx_allowing("restart api")
    if mode == "invoke":
        out = await asyncio.to_thread(h.graph.invoke, request, config, context=ctx)
    else:
        out = await h.graph.ainvoke(request, config, context=ctx)
    state = fp.run_output(out)
    assert released == ["cancelled"]  # it was told to stop, and answered anyway
    assert h.calls.log == []
    assert state.receipts[0].rule == "approver_timeout"
    assert state.budget.mutations_used == 0


CONTROL_FLOW = {
    "CancelledError": asyncio.CancelledError,
    "GeneratorExit": GeneratorExit,
    "KeyboardInterrupt": KeyboardInterrupt,
    "SystemExit": SystemExit,
}


@pytest.mark.parametrize("raised", sorted(CONTROL_FLOW))
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_an_approver_raising_control_flow_itself_rejects_the_call_and_is_logged(
    caplog: pytest.LogCaptureFixture, raised: str, kind: str, mode: str
) -> None:
    # Nobody cancelled the run: what the approver raised is its own failure (fail closed), with
    # its traceback in the log, never an exception out of invoke.
    exc_type = CONTROL_FLOW[raised]

    def sync_raises(request: fp.ApproverInput) -> fp.ApproverDecision:
        raise exc_type("password=hunter2")

    async def async_raises(request: fp.ApproverInput) -> fp.ApproverDecision:
        await asyncio.sleep(0)
        raise exc_type("password=hunter2")

    approver = sync_raises if kind == "sync" else async_raises
    h = harness([note(1), ABSTAIN], approver=approver)
    request, config, ctx = fp.start("q", budget()), thread(), ctx_allowing("restart api")
    with caplog.at_level(logging.WARNING, logger="fencepost"):
        if mode == "invoke":
            out = await asyncio.to_thread(h.graph.invoke, request, config, context=ctx)
        else:
            out = await h.graph.ainvoke(request, config, context=ctx)
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    assert h.calls.log == []
    assert state.receipts[0].rule == "approver_failed"
    assert "hunter2" not in repr(state)
    [logged] = [r for r in caplog.records if r.name.startswith("fencepost") and r.exc_info]
    assert logged.exc_info is not None and logged.exc_info[0] is exc_type
