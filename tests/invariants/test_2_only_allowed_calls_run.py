"""Invariant 2: a tool runs only if it is allowed — registered, valid, authorized, its effect
allowed or approved (by a human, or the graph's approver policy), its budget reserved. Here: what
a human's answer, the approver's, and a caller writing the batch beside them can and cannot let
run, and that a denied call never runs whether its denial ends the run or is data.

The executor is the last line. A caller can edit a thread's state between supersteps
(``update_state``, or ``Command(update=..., goto=...)``); whatever an edit wrote, the executor runs
a call only for an ``allowed`` verdict with the same call id and argument fingerprint, for a
principal who holds the capability under the context it runs with, a write only where something
could have approved it, and only a call whose budget was reserved. Both forms of edit are tried
wherever it matters.

Over both bindings (the ``binding`` parameter, ``tests/invariants/bindings.py``: fencepost's graph,
and ``create_agent`` with ``fp.FencepostMiddleware``), at the end of this file: an unknown tool, a
missing capability, an unapproved write, a denial that ends the run or is data, a rejected write, a
malformed answer. The other tests drive the graph's own state, nodes or settings (``update_state``,
``Command(update=...)``, channels, ``interrupt_before``, repair, the approver, token estimates,
savers and ledgers by URL), which the middleware binding does not have: they stay graph-only.
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.types import Command

import fencepost as fp
from fencepost.policy.approval import unasked, waiting
from fencepost.policy.gating import after_reservations
from fencepost.policy.keys import call_key, run_account
from tests.graph.kit import (
    ABSTAIN,
    LEDGERS,
    VERDICT_KEY,
    allowed_entry,
    allowed_verdict,
    budget,
    call,
    context,
    each_ledger,
    edit_and_continue,
    forge_batch,
    harness,
    interrupt_payload,
    state_of,
    thread,
    write_then_read_paused_before_read,
)
from tests.invariants import bindings as bd
from tests.middleware import kit as mw

ledger = pytest.fixture(params=LEDGERS, name="ledger")(each_ledger)


def _paused(**build: Any) -> tuple[Any, dict[str, Any], fp.RunContext]:
    h = harness(
        [call("write_note", 1, note="hi"), ABSTAIN, ABSTAIN, ABSTAIN], approval="interrupt", **build
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    assert h.graph.get_state(config).next == ("approve",)
    return h, config, ctx


NOT_ONE_FORM = {
    "global-approve-beside-a-per-call-reject": {"decision": "approve", "call-0001": "reject"},
    "per-call-approve-beside-a-global-reject": {"call-0001": "approve", "decision": "reject"},
    "decision-and-type-disagree": {"decision": "approve", "type": "reject"},
    "decision-and-type-both": {"decision": "approve", "type": "approve"},
    "an-extra-key": {"decision": "approve", "note": "x"},
    "arguments-on-an-approve": {"decision": "approve", "arguments": {"note": "hi"}},
    "an-edit-with-an-extra-key": {"decision": "edit", "arguments": {"note": "x"}, "why": "y"},
    "a-per-call-answer-not-one-form": {"call-0001": {"decision": "approve", "type": "reject"}},
    "a-per-call-answer-nested": {"call-0001": {"call-0001": "approve"}},
}


@pytest.mark.parametrize("answer", list(NOT_ONE_FORM.values()), ids=list(NOT_ONE_FORM))
@pytest.mark.parametrize("key", [None, VERDICT_KEY], ids=["no-key", "key"])
def test_an_answer_that_is_not_exactly_one_accepted_form_is_asked_again_and_runs_nothing(
    answer: dict[str, Any], key: bytes | None
) -> None:
    h, config, ctx = _paused(verdict_key=key)
    out = h.graph.invoke(Command(resume=answer), config, context=ctx)
    assert h.calls.log == []
    payload = interrupt_payload(out)
    assert payload["error"]["code"] == "unrecognized_answer"
    assert [c["call_id"] for c in payload["calls"]] == ["call-0001"]
    # Asked again, the human's clear answer is the one that counts.
    state = fp.run_output(h.graph.invoke(Command(resume="reject"), config, context=ctx))
    assert h.calls.log == []
    assert state.receipts[-1].status is fp.ReceiptStatus.DENIED


def _forged_write() -> fp.policy.BatchEntry:
    return allowed_entry(call("write_note", 2, note="forged"))


@pytest.mark.parametrize("how", ["update_state-as-decide", "command-update-beside-resume"])
def test_with_a_verdict_key_an_approval_never_seals_an_entry_the_gate_did_not_judge(
    how: str, ledger: fp.Ledger
) -> None:
    h, config, ctx = _paused(verdict_key=VERDICT_KEY, ledger=ledger)
    batch = (*state_of(h, config).batch, _forged_write())
    if how == "update_state-as-decide":
        h.graph.update_state(config, {"run": {"batch": batch}}, as_node="decide")
        h.graph.invoke(None, config, context=ctx)  # asked again, the batch as written
        out = h.graph.invoke(Command(resume="reject"), config, context=ctx)
    else:
        out = h.graph.invoke(
            Command(update={"run": {"batch": batch}}, resume="reject"), config, context=ctx
        )
    state = fp.run_output(out)
    assert h.calls.log == []
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "executor_refused"


@pytest.mark.parametrize("answer", ["approve", {"call-0001": "approve"}])
def test_with_a_verdict_key_an_approval_answers_only_the_calls_that_were_waiting(
    answer: Any, ledger: fp.Ledger
) -> None:
    h, config, ctx = _paused(verdict_key=VERDICT_KEY, ledger=ledger)
    genuine = state_of(h, config).batch[0]
    # Written beside it: a pending entry the gate never judged, and the genuine call's sealed
    # verdict under other arguments.
    slipped = _forged_write()
    pending = fp.policy.BatchEntry(
        proposal=slipped.proposal,
        verdict=slipped.verdict.model_copy(update={"code": fp.policy.VerdictCode.APPROVAL_PENDING}),
    )
    h.graph.invoke(
        Command(update={"run": {"batch": (genuine, pending)}}, resume=answer), config, context=ctx
    )
    assert h.calls.log == [("write_note", {"note": "hi"}, "call-0001")]


def test_with_a_verdict_key_a_waiting_call_whose_arguments_were_rewritten_is_not_asked_about(
    ledger: fp.Ledger,
) -> None:
    h, config, ctx = _paused(verdict_key=VERDICT_KEY, ledger=ledger)
    genuine = state_of(h, config).batch[0]
    rewritten = genuine.proposal.model_copy(update={"arguments": {"note": "rm -rf /"}})
    forged = fp.policy.BatchEntry(proposal=rewritten, verdict=genuine.verdict)
    out = h.graph.invoke(
        Command(update={"run": {"batch": (forged,)}}, resume="approve"), config, context=ctx
    )
    assert "__interrupt__" not in out
    assert h.calls.log == []


def _pending_entry(proposal: fp.ToolProposal) -> fp.policy.BatchEntry:
    entry = allowed_entry(proposal)
    pending = entry.verdict.model_copy(update={"code": fp.policy.VerdictCode.APPROVAL_PENDING})
    return entry.with_verdict(pending)


def test_only_a_pending_verdict_made_for_its_arguments_and_sealed_is_waiting() -> None:
    genuine = _pending_entry(call("write_note", 1, note="hi"))
    sealed = genuine.with_verdict(
        fp.policy.seal_verdict(genuine.verdict, run_id="run-1", key=VERDICT_KEY)
    )
    rewritten = fp.policy.BatchEntry(
        proposal=genuine.proposal.model_copy(update={"arguments": {"note": "other"}}),
        verdict=sealed.verdict,
    )
    for entry, with_key, without in [
        (sealed, [sealed], [sealed]),
        (genuine, [], [genuine]),  # no key: what state says, for these arguments
        (rewritten, [], []),
    ]:
        assert waiting((entry,), run_id="run-1", verdict_key=VERDICT_KEY) == with_key
        assert waiting((entry,)) == without
    assert waiting((sealed,), run_id="run-2", verdict_key=VERDICT_KEY) == []
    # One call id twice: neither is what the gate left waiting.
    assert waiting((sealed, genuine)) == []
    assert unasked((sealed, genuine), [sealed]) == (sealed,)


def test_a_pending_verdicts_seal_never_passes_for_an_allowed_one() -> None:
    pending = _pending_entry(call("write_note", 1, note="hi")).verdict
    sealed = fp.policy.seal_verdict(pending, run_id="run-1", key=VERDICT_KEY)
    assert fp.policy.verdict_is_sealed(sealed, run_id="run-1", key=VERDICT_KEY)
    as_allowed = sealed.model_copy(update={"code": fp.policy.VerdictCode.ALLOWED})
    assert not fp.policy.verdict_is_sealed(as_allowed, run_id="run-1", key=VERDICT_KEY)
    rejected = sealed.model_copy(update={"code": fp.policy.VerdictCode.REJECTED})
    assert fp.policy.seal_verdict(rejected, run_id="run-1", key=VERDICT_KEY) is rejected


def test_after_an_approval_only_the_calls_it_answered_are_sealed() -> None:
    answered = allowed_entry(call("write_note", 1, note="hi"))
    slipped = allowed_entry(call("write_note", 2, note="forged"))
    batch, stopped = after_reservations(
        (answered, slipped),
        {},
        run_id="run-1",
        verdict_key=VERDICT_KEY,
        only=frozenset({"call-0001"}),
    )
    assert stopped is None
    assert fp.policy.verdict_is_sealed(batch[0].verdict, run_id="run-1", key=VERDICT_KEY)
    assert batch[1] is slipped and batch[1].verdict.seal is None


@pytest.mark.parametrize("denial", ["end_run", "observe"])
def test_a_denied_call_never_runs_and_reserves_nothing_whether_its_denial_ends_the_run_or_not(
    denial: str, ledger: fp.Ledger
) -> None:
    h = harness(
        [call("admin_reset", 1), call("search_logs", 2), ABSTAIN], denial=denial, ledger=ledger
    )
    config = thread()
    state = fp.run_output(h.graph.invoke(fp.start("q", budget()), config, context=context()))
    assert h.calls.count("admin_reset") == 0
    account = run_account(config["configurable"]["thread_id"], state.run_id)
    assert ledger.get(call_key(account, "call-0001", 1)) is None
    ran_on = h.calls.count("search_logs")
    assert ran_on == (1 if denial == "observe" else 0)
    assert state.budget.tool_calls_used == ran_on


@pytest.mark.parametrize("approval", ["terminate", "interrupt"])
def test_a_write_runs_only_as_the_approver_or_a_human_approved_it(approval: str) -> None:
    def only_restarts(request: fp.ApproverInput) -> fp.ApproverDecision:
        if request.proposal.arguments.get("note") == "restart api":
            return fp.ApproverDecision.approve()
        return fp.ApproverDecision.reject("not_a_restart")

    h = harness(
        [call("write_note", 1, note="wipe db"), call("write_note", 2, note="restart api"), ABSTAIN],
        approval=approval,
        approver=only_restarts,
        verdict_key=VERDICT_KEY,
    )
    state = h.run()
    assert [args for name, args, _ in h.calls.log] == [{"note": "restart api"}]
    assert {r.call_id: (r.status, r.approval) for r in state.receipts} == {
        "call-0001": (fp.ReceiptStatus.DENIED, "approver"),
        "call-0002": (fp.ReceiptStatus.COMPLETED, "approver"),
    }


# -- the executor runs only what its verdict allowed, for the context it runs under ------------


def test_executor_runs_only_the_arguments_the_verdict_was_given_for() -> None:
    h = harness([call(n=1, query="checkout"), ABSTAIN])
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx, interrupt_before=["execute"])
    assert h.graph.get_state(config).next == ("execute",)
    forged = call(n=1, query="DROP TABLE users")
    h.graph.invoke(
        Command(update=forge_batch(h, config, pending=(forged,)), goto="execute"),
        config,
        context=ctx,
    )
    assert all(args["query"] != "DROP TABLE users" for _, args, _ in h.calls.log)
    assert h.calls.count("search_logs") == 0


def test_executor_refuses_a_forged_allowed_verdict_for_a_capability_the_principal_lacks() -> None:
    h = harness([call(n=1), ABSTAIN])
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx, interrupt_before=["execute"])
    admin = call("admin_reset", 1)
    update = forge_batch(h, config, (admin,), (allowed_verdict(admin),))
    h.graph.invoke(Command(update=update, goto="execute"), config, context=ctx)
    assert h.calls.count("admin_reset") == 0


def test_a_call_refused_at_the_executor_is_receipted_and_ends_the_run_as_policy_denied() -> None:
    h = harness([call(n=1), ABSTAIN])
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context(), interrupt_before=["execute"])
    revoked = context(caps=frozenset({"notes:write"}))
    state = fp.run_output(h.graph.invoke(None, config, context=revoked))
    assert h.calls.log == []
    assert [(r.call_id, r.status) for r in state.receipts] == [
        ("call-0001", fp.ReceiptStatus.DENIED)
    ]
    assert (state.termination, state.last_error_code) == (
        fp.TerminationReason.POLICY_DENIED,
        "executor_refused",
    )


def test_one_call_refused_at_the_executor_stops_its_whole_batch_in_proposal_order() -> None:
    # The read is allowed at the gate; by the time the approved write's batch executes, the
    # principal has lost logs:read. As at the gate, one refusal stops the whole batch: nothing
    # runs, each call is receipted denied, in the order the model proposed them.
    batch = fp.ToolBatch(calls=(call(n=1), call("write_note", 2, note="x")))
    h = harness([batch, ABSTAIN], approval="interrupt")
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context())
    writer_only = context(caps=frozenset({"notes:write"}))
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=writer_only))
    assert h.calls.log == []
    assert [(o.call_id, o.kind) for o in state.observations] == [
        ("call-0001", "tool_error"),
        ("call-0002", "tool_error"),
    ]
    assert [(r.call_id, r.status) for r in state.receipts] == [
        ("call-0001", fp.ReceiptStatus.DENIED),
        ("call-0002", fp.ReceiptStatus.DENIED),
    ]
    assert [p.call_id for p in state.proposals] == ["call-0001", "call-0002"]
    assert state.termination is fp.TerminationReason.POLICY_DENIED


def _pause_before_execute(h: Any, ctx: fp.RunContext, tools: int = 1) -> dict[str, Any]:
    config = thread()
    h.graph.invoke(
        fp.start("q", budget(steps=6, tools=tools)),
        config,
        context=ctx,
        interrupt_before=["execute"],
    )
    return config


def test_a_forged_batch_entry_never_runs_a_call_whose_budget_was_not_reserved() -> None:
    h = harness([call(n=1), ABSTAIN])
    ctx = context()
    config = _pause_before_execute(h, ctx, tools=1)
    forged = call(n=9, query="never gated")
    entry = fp.policy.BatchEntry(proposal=forged, verdict=allowed_verdict(forged))
    h.graph.update_state(
        config, {"run": {"batch": (*state_of(h, config).batch, entry)}}, as_node="decide"
    )
    try:
        h.graph.invoke(None, config, context=ctx)
    finally:
        ran = [a["query"] for _, a, _ in h.calls.log]
    assert ran == ["checkout 500 #1"]
    state = state_of(h, config)
    assert state.is_terminal
    assert state.budget.tool_calls_used <= 1


# -- a state edit cannot make a write run that nothing approved --------------------------------


@pytest.mark.parametrize("how", ["update_state", "command"])
def test_a_state_edit_cannot_make_a_rejected_write_run_in_interrupt_mode(how: str) -> None:
    h, config, ctx, write, read = write_then_read_paused_before_read("reject")
    update = forge_batch(h, config, (read, write), (allowed_verdict(read), allowed_verdict(write)))
    edit_and_continue(h, config, ctx, update, how)
    assert h.calls.count("write_note") == 0


@pytest.mark.parametrize("how", ["update_state", "command"])
def test_a_state_edit_cannot_swap_the_arguments_of_an_approved_write(how: str) -> None:
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    h.graph.invoke(Command(resume="approve"), config, context=ctx, interrupt_before=["execute"])
    forged = call("write_note", 1, note="rm -rf /")
    edit_and_continue(h, config, ctx, forge_batch(h, config, pending=(forged,)), how)
    assert all(args != {"note": "rm -rf /"} for _, args, _ in h.calls.log)


def test_terminate_mode_never_runs_a_write_whatever_the_recorded_verdict_says() -> None:
    h = harness([call(n=1), ABSTAIN])
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx, interrupt_before=["execute"])
    write = call("write_note", 2, note="hi")
    update = forge_batch(h, config, (write,), (allowed_verdict(write),))
    h.graph.invoke(Command(update=update, goto="execute"), config, context=ctx)
    assert h.calls.count("write_note") == 0


@pytest.mark.parametrize("how", ["update_state", "command"])
def test_with_a_verdict_key_a_write_waiting_for_approval_cannot_be_run_by_a_forged_verdict(
    how: str,
) -> None:
    # Without a key the executor cannot tell a human's approval from a forged "allowed"
    # verdict (documented); with one, a verdict the gate did not seal never runs.
    h = harness(
        [call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt", verdict_key=VERDICT_KEY
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    write = call("write_note", 1, note="hi")
    state = edit_and_continue(
        h, config, ctx, forge_batch(h, config, verdicts=(allowed_verdict(write),)), how
    )
    assert h.calls.count("write_note") == 0
    assert state.budget.mutations_used == 0
    if how == "update_state":
        # (With ``Command`` the approval node re-pauses in the same superstep, so the refusal
        # is held as a pending write rather than in the checkpoint's values.)
        assert state.receipts[-1].status is fp.ReceiptStatus.DENIED
        assert state.termination is fp.TerminationReason.POLICY_DENIED


def test_with_a_verdict_key_a_sealed_verdict_cannot_be_moved_to_other_arguments() -> None:
    h = harness([call(n=1, query="checkout"), ABSTAIN], verdict_key=VERDICT_KEY)
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx, interrupt_before=["execute"])
    sealed = state_of(h, config).batch[0].verdict
    assert sealed.seal is not None
    forged = call(n=1, query="DROP TABLE users")
    moved = sealed.model_copy(
        update={"fingerprint": fp.policy.proposal_fingerprint(forged.tool_name, forged.arguments)}
    )
    update = forge_batch(h, config, (forged,), (moved,))
    h.graph.invoke(Command(update=update, goto="execute"), config, context=ctx)
    assert h.calls.log == []


MALFORMED = [
    "yes",
    True,
    42,
    ["approve"],
    {"decision": "edit", "arguments": "rm -rf"},
    {"decision": "edit"},
    {"decision": "edit", "arguments": {"note": 5}},
    {"decision": "edit", "arguments": {"note": "x", "extra": 1}},
    {"decision": "approve", "arguments": {"note": "smuggled"}},
    {"call-9999": "approve"},
    {"call-0001": "yes"},
    {"\x00": "approve"},
]


@pytest.mark.parametrize("answer", MALFORMED, ids=[f"a{i}" for i in range(len(MALFORMED))])
def test_a_malformed_approval_answer_never_runs_the_write_or_escapes(answer: Any) -> None:
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    out = h.graph.invoke(Command(resume=answer), config, context=ctx)
    ran = h.calls.log
    assert all(args == {"note": "hi"} or name != "write_note" for name, args, _ in ran)
    assert "__interrupt__" in out or fp.run_output(out).is_terminal


def _pending(proposal: fp.ToolProposal) -> fp.policy.BatchEntry:
    verdict = allowed_verdict(proposal).model_copy(
        update={"code": fp.policy.VerdictCode.APPROVAL_PENDING}
    )
    return fp.policy.BatchEntry(proposal=proposal, verdict=verdict)


FORGED_PENDING = {
    "unknown-tool": fp.ToolProposal(call_id="call-0077", tool_name="rm_rf", arguments={}),
    "read-tool": call(n=77, query="*"),
    "bad-args": fp.ToolProposal(
        call_id="call-0077", tool_name="write_note", arguments={"note": 5, "x": 1}
    ),
}


@pytest.mark.parametrize("answer", ["approve", "reject"])
@pytest.mark.parametrize(
    "forged",
    ["unknown-tool", "read-tool", "bad-args"],
)
def test_a_forged_pending_entry_is_regated_on_approval_and_never_escapes(
    forged: str, answer: str
) -> None:
    h = harness([call("write_note", 1, note="hi"), ABSTAIN, ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    batch = (*state_of(h, config).batch, _pending(FORGED_PENDING[forged]))
    out = h.graph.invoke(
        Command(update={"run": {"batch": batch}}, resume=answer), config, context=ctx
    )
    if "__interrupt__" in out:
        out = h.graph.invoke(Command(resume=answer), config, context=ctx)
    assert fp.run_output(out).is_terminal
    assert [name for name, _, _ in h.calls.log] in ([], ["write_note"])
    assert all(key == "call-0001" for _, _, key in h.calls.log)


# -- over both bindings: fencepost's graph, and create_agent + FencepostMiddleware -------------


def test_an_unknown_tool_never_runs(binding: type[bd.Binding]) -> None:
    b = binding(bd.then_answer(bd.call("drop_tables", {}, 1)), steps=5, tools=5)
    out = b.start(mw.ctx())
    assert out.bodies == []
    assert out.termination == fp.TerminationReason.INVALID_PROPOSAL.value


def test_a_call_the_principal_has_no_capability_for_never_runs(binding: type[bd.Binding]) -> None:
    b = binding(bd.then_answer(bd.call("write_note", {"note": "x"}, 1)), steps=5, tools=5)
    out = b.start(mw.ctx("logs:read"))
    assert out.bodies == []
    assert out.termination == fp.TerminationReason.POLICY_DENIED.value


def test_an_unapproved_write_never_runs_in_terminate_mode(binding: type[bd.Binding]) -> None:
    b = binding(bd.then_answer(bd.call("write_note", {"note": "x"}, 1)), steps=5, tools=5)
    out = b.start(mw.ctx())
    assert out.bodies == []
    assert out.termination == fp.TerminationReason.APPROVAL_REQUIRED.value


@pytest.mark.parametrize("denial", ["end_run", "observe"])
def test_a_denied_call_never_runs_nor_reserves_in_either_binding_whether_the_run_goes_on(
    binding: type[bd.Binding], denial: str
) -> None:
    script = bd.then_answer(
        bd.call("write_note", {"note": "x"}, 1), bd.call("search_logs", {"query": "q"}, 2)
    )
    b = binding(script, steps=5, tools=5, denial=denial)
    out = b.start(mw.ctx("logs:read"))
    assert b.reservation("call-0001") is None
    assert out.bodies == (["search_logs:q"] if denial == "observe" else [])


def test_a_write_rejected_at_approval_never_runs(binding: type[bd.Binding]) -> None:
    b = bd.waiting_write(binding)
    out = b.resume("reject", mw.ctx())
    assert out.bodies == [] and b.reservation("call-0001") is None
    assert out.termination is not None


@pytest.mark.parametrize("answer", MALFORMED, ids=[f"a{i}" for i in range(len(MALFORMED))])
def test_a_malformed_approval_answer_runs_no_other_write_and_never_escapes(
    binding: type[bd.Binding], answer: Any
) -> None:
    b = bd.waiting_write(binding, "hi")
    out = b.resume(answer, mw.ctx())
    assert set(out.bodies) <= {"write_note:hi"}
    assert out.paused or out.termination is not None
