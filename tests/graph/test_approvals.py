"""Approvals: terminate mode ends the run; interrupt mode pauses, and only approved calls run."""

from __future__ import annotations

from typing import Any

from langgraph.types import Command

import fencepost as fp
from fencepost.policy.tool_decorator import tool
from tests.graph.kit import (
    Calls,
    budget,
    call,
    context,
    final_citing_last,
    forge_batch,
    harness,
    make_registry,
    thread,
)


def _paused(h: Any, config: dict[str, Any], ctx: fp.RunContext) -> dict[str, Any]:
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
    payload = _paused(h, thread(), context())
    assert payload["calls"] == [
        {
            "call_id": "call-0001",
            "tool_name": "write_note",
            "arguments": {"note": "hi"},
            "effect": "write",
            "capability": "notes:write",
        }
    ]
    assert h.calls.log == []


def test_approved_write_runs_once_with_its_call_id_as_idempotency_key() -> None:
    h = harness([call("write_note", 1, note="hi"), final_citing_last], approval="interrupt")
    config, ctx = thread(), context()
    _paused(h, config, ctx)
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
    _paused(h, config, ctx)
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
    _paused(h, config, ctx)
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
    _paused(h, config, ctx)
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
    _paused(h, config, ctx)
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
    _paused(h, config, ctx)
    fp.run_output(h.graph.invoke(Command(resume={"decision": "yes please"}), config, context=ctx))
    assert h.calls.log == []


def test_executor_refuses_a_call_whose_arguments_changed_after_the_verdict() -> None:
    h = harness(
        [call("write_note", 1, note="hi"), fp.AbstainProposal(reason="insufficient_evidence")],
        approval="interrupt",
    )
    config, ctx = thread(), context()
    _paused(h, config, ctx)
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
    _paused(h, config, ctx)
    pending = fp.run_output(h.graph.get_state(config).values).batch[0].verdict
    forged = pending.model_copy(update={"code": fp.policy.VerdictCode.ALLOWED})
    # Written as if approve had allowed it, the route goes on to the executor (a goto beside the
    # waiting approval would be refused whole: graph.compiled).
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
    _paused(h, config, ctx)
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
