"""DESIGN.md invariants 1-9, pinned where a mutation probe found no test that noticed.

Each test here was written against a deliberately broken copy of ``fencepost/graph`` and
``fencepost/policy`` (the rule named in the test removed) and fails there; it passes on the real
code. All run on a real compiled graph with an InMemorySaver.

State edits. A caller can edit a thread's state between supersteps in two ways: ``update_state``
(the routers run as if the node named by ``as_node`` had written it) and an input
``Command(update=..., goto=...)``. The executor is the last line: whatever an edit wrote, it runs a
call only for an "allowed" verdict with the same call id and argument fingerprint, for a principal
who holds the capability now, a write only where something could have approved it, and never
twice for one call id. Both forms are tried wherever it matters.

Some of these began as strict xfails for bugs the review found (a state edit through
``update_state`` ended every run; the executor dropped a refused call silently and treated any write
as approved in terminate mode; integers past 64 bits raised out of ``invoke``); those are fixed and
the tests now pin the fixes.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import get_runtime
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.policy.keys import call_key, run_account
from tests.graph.kit import (
    ABSTAIN,
    VERDICT_KEY,
    Calls,
    allowed_verdict,
    budget,
    call,
    context,
    edit_and_continue,
    final_citing_last,
    forge_batch,
    harness,
    make_registry,
    state_of,
    thread,
    write_then_read_paused_before_read,
)
from tests.graph.nested_kit import Host

# -- invariant 2: the executor re-checks what it runs ---------------------------------------------


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


def test_executor_rechecks_the_capability_with_the_context_it_runs_under() -> None:
    # The gate allowed the call; the principal lost the capability before it ran (same identity,
    # so the context guard passes): the executor's own authorization must refuse it.
    h = harness([call(n=1), ABSTAIN])
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context(), interrupt_before=["execute"])
    revoked = context(caps=frozenset({"notes:write"}))
    h.graph.invoke(None, config, context=revoked)
    assert h.calls.log == []


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


# -- state edits in interrupt mode cannot make a denied write run ---------------------------------


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


def test_an_edit_that_is_not_a_valid_proposal_never_runs_the_original_arguments() -> None:
    # NaN is not JSON: the edited proposal cannot even be built. That must never fall back to
    # the arguments the human was editing away from: the edit is asked again.
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    edit = {"decision": "edit", "arguments": {"note": float("nan")}}
    out = h.graph.invoke(Command(resume=edit), config, context=ctx)
    assert h.calls.log == []
    (asked,) = out["__interrupt__"]
    assert asked.value["error"]["code"] == "invalid_arguments"


@pytest.mark.parametrize("how", ["update_state", "command"])
def test_a_state_edit_cannot_make_a_rejected_write_run_in_interrupt_mode(how: str) -> None:
    h, config, ctx, write, read = write_then_read_paused_before_read("reject")
    update = forge_batch(h, config, (read, write), (allowed_verdict(read), allowed_verdict(write)))
    edit_and_continue(h, config, ctx, update, how)
    assert h.calls.count("write_note") == 0


@pytest.mark.parametrize("how", ["update_state", "command"])
def test_a_state_edit_cannot_run_an_approved_write_a_second_time(how: str) -> None:
    h, config, ctx, write, read = write_then_read_paused_before_read("approve")
    assert h.calls.count("write_note") == 1
    update = forge_batch(h, config, (read, write), (allowed_verdict(read), allowed_verdict(write)))
    edit_and_continue(h, config, ctx, update, how)
    assert h.calls.count("write_note") == 1


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


def test_a_harmless_update_state_edit_does_not_end_the_run() -> None:
    h = harness([call(n=1), final_citing_last])
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx, interrupt_before=["execute"])
    h.graph.update_state(config, {"run": {"last_error_code": None}}, as_node="decide")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert h.calls.count("search_logs") == 1
    assert state.termination is fp.TerminationReason.COMPLETED


# -- invariant 1: model output and tool output that no checkpoint can hold -----------------------


def test_a_proposal_with_an_integer_no_checkpoint_can_hold_ends_with_a_typed_reason() -> None:
    # msgpack holds 64-bit integers; JSON has no limit. Raw model output with a bigger one must
    # end the run as data, not as a serializer TypeError escaping invoke.
    too_big = {
        "kind": "tool",
        "call_id": "call-0001",
        "tool_name": "search_logs",
        "arguments": {"query": 2**64},
    }
    h = harness([too_big])
    state = h.run()
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert h.calls.log == []


def test_a_tool_result_no_checkpoint_can_hold_is_an_unserializable_result() -> None:
    h = harness([call(n=1), ABSTAIN], search_result={"count": -(2**63) - 1})
    state = h.run()
    assert state.observations[0].error_code is fp.ErrorCode.UNSERIALIZABLE_RESULT
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE


# -- invariant 5: trusted context, never from arguments --------------------------------------------


class CustomerArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    tenant_id: str
    principal_id: str


def test_tool_context_identity_comes_from_the_run_context_even_when_args_name_one() -> None:
    # A tool may legitimately take a field called tenant_id; the model fills it. The identity
    # the tool acts for (ToolContext) is the caller's, whatever the arguments say.
    calls = Calls()
    seen: list[tuple[str | None, str | None]] = []

    def lookup(args: CustomerArgs, ctx: fp.ToolContext) -> dict[str, Any]:
        seen.append((ctx.tenant_id, ctx.principal_id))
        return {"ok": True}

    spec = fp.ToolSpec(
        name="lookup_customer",
        description="Look up a customer record.",
        args_model=CustomerArgs,
        effect=fp.Effect.READ,
        capability="logs:read",
        timeout_seconds=5,
        execute=lookup,
    )
    sneaky = call("lookup_customer", 1, tenant_id="globex", principal_id="root")
    h = harness([sneaky, ABSTAIN], registry=make_registry(calls, extra=[spec]), calls=calls)
    state = h.run(ctx=context(tenant="acme", principal="u-1"))
    assert seen == [("acme", "u-1")]
    assert (state.tenant_id, state.principal_id) == ("acme", "u-1")


@pytest.mark.parametrize(
    ("resumed_with", "reason", "code"),
    [
        (context(tenant="globex"), fp.TerminationReason.POLICY_DENIED, "context_mismatch"),
        (context(principal="u-2"), fp.TerminationReason.POLICY_DENIED, "context_mismatch"),
        (
            context(deadline=fp.Deadline(at=datetime.now(UTC) - timedelta(seconds=1))),
            fp.TerminationReason.DEADLINE_EXCEEDED,
            "deadline_exceeded",
        ),
    ],
    ids=["other-tenant", "other-principal", "deadline-passed"],
)
def test_the_executor_checks_the_context_it_is_resumed_with_before_any_tool_runs(
    resumed_with: fp.RunContext, reason: fp.TerminationReason, code: str
) -> None:
    # Paused between the gate and the executor (no approval step in between to catch it).
    h = harness([call(n=1), final_citing_last])
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context(), interrupt_before=["execute"])
    state = fp.run_output(h.graph.invoke(None, config, context=resumed_with))
    assert h.calls.log == []
    assert (state.termination, state.last_error_code) == (reason, code)


# -- invariant 7: repeats are counted once per allowed call ---------------------------------------


def test_an_approved_write_counts_once_toward_the_repeat_limit() -> None:
    # repeat_limit=2: the same write, approved twice, runs twice; the third identical proposal
    # is no_progress before anyone is asked to approve it.
    same = {"note": "restart checkout"}
    script = [call("write_note", n, **same) for n in (1, 2, 3)]
    h = harness(script, approval="interrupt", repeat_limit=2)
    config, ctx = thread(), context()
    out = h.graph.invoke(fp.start("q", budget(steps=6, tools=6)), config, context=ctx)
    approvals = 0
    while "__interrupt__" in out:
        approvals += 1
        out = h.graph.invoke(Command(resume="approve"), config, context=ctx)
    state = fp.run_output(out)
    assert approvals == 2
    assert h.calls.count("write_note") == 2
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    assert state.budget.tool_calls_used == 2


def test_edited_arguments_pass_the_no_progress_gate_again_at_approval() -> None:
    # Two identical writes were approved and ran; a third proposal with other arguments is
    # edited back to the same ones. The edit is gated again, repeat limit included.
    same = {"note": "restart checkout"}
    script = [call("write_note", 1, **same), call("write_note", 2, **same)]
    script.append(call("write_note", 3, note="something else"))
    h = harness(script, approval="interrupt", repeat_limit=2)
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget(steps=6, tools=6)), config, context=ctx)
    h.graph.invoke(Command(resume="approve"), config, context=ctx)
    h.graph.invoke(Command(resume="approve"), config, context=ctx)
    edit = {"decision": "edit", "arguments": same}
    state = fp.run_output(h.graph.invoke(Command(resume=edit), config, context=ctx))
    assert h.calls.count("write_note") == 2
    assert state.termination is fp.TerminationReason.NO_PROGRESS


# -- invariant 3: an attempted call is charged, never refunded ------------------------------------


def test_a_failed_call_stays_charged_in_the_ledger() -> None:
    ledger = fp.InMemoryLedger()
    h = harness([call("explode", 1), ABSTAIN], ledger=ledger)
    config = thread()
    state = h.run(config=config)
    assert state.observations[0].error_code is fp.ErrorCode.INTERNAL_ERROR
    account = run_account(config["configurable"]["thread_id"], state.run_id)
    reservation = ledger.get(call_key(account, "call-0001", 1))
    assert reservation is not None
    assert reservation.status is fp.policy.ReservationStatus.SETTLED
    held = ledger.balance(account).held
    assert held.get("tool_calls") == state.budget.tool_calls_used == 1


# -- invariant 8: results joined by call id --------------------------------------------------------


def test_each_recorded_proposal_is_the_one_its_observation_answers_in_a_mixed_batch() -> None:
    # A read and a write in one batch; the write (second) is rejected, the read (first) runs.
    # Observations arrive rejected-first; each must sit beside the proposal with its call id.
    batch = fp.ToolBatch(calls=(call(n=1), call("write_note", 2, note="x")))
    h = harness([batch, ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    state = fp.run_output(h.graph.invoke(Command(resume="reject"), config, context=ctx))
    assert {o.call_id for o in state.observations} == {"call-0001", "call-0002"}
    assert [p.call_id for p in state.proposals] == [o.call_id for o in state.observations]
    assert h.calls.count("search_logs") == 1 and h.calls.count("write_note") == 0


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


# -- nesting: the fencepost graph inside a user's own StateGraph ----------------------------------


class Outer(TypedDict, total=False):
    question: str
    reason: fp.TerminationReason
    answer: str
    steps_used: int


def test_the_graph_nests_in_a_parent_graph_node_and_ends_with_a_typed_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A user's node calls the compiled fencepost graph with the parent's own config (so it
    # checkpoints under the parent's thread) and the parent's trusted context. The approval
    # pause surfaces on the parent; resuming the parent resumes the nested run, not a new one.
    calls = Calls()
    model = ScriptedDecisionModel([call("write_note", 1, note="x"), final_citing_last])
    agent = fp.build_agent_graph(make_registry(calls), model, approval="interrupt").compile()

    def ask_agent(state: Outer, config: RunnableConfig) -> dict[str, Any]:
        parent_context = get_runtime(fp.RunContext).context
        request = fp.start(state["question"], budget(), run_id="run-nested")
        result = fp.run_output(agent.invoke(request, config, context=parent_context))
        answer = result.final_answer.text if result.final_answer else ""
        return {
            "reason": result.termination,
            "answer": answer,
            "steps_used": result.budget.steps_used,
        }

    parent = StateGraph(Outer, context_schema=fp.RunContext)
    parent.add_node("ask_agent", ask_agent)
    parent.add_edge(START, "ask_agent")
    parent.add_edge("ask_agent", END)
    graph: Any = parent.compile(checkpointer=InMemorySaver())
    config, ctx = thread(), context()
    with caplog.at_level(logging.WARNING):
        paused = graph.invoke({"question": "why?"}, config, context=ctx)
        assert paused["__interrupt__"][0].value["calls"][0]["call_id"] == "call-0001"
        assert calls.log == []
        out = graph.invoke(Command(resume="approve"), config, context=ctx)
    assert out["reason"] is fp.TerminationReason.COMPLETED
    assert out["answer"] == "deploy 42 broke checkout"
    assert calls.log == [("write_note", {"note": "x"}, "call-0001")]
    # Two decisions in all: the nested run went on from its checkpoint after the pause.
    assert out["steps_used"] == 2 and model.calls == 2
    assert "Blocked deserialization" not in caplog.text


def test_the_compiled_graph_is_a_subgraph_node_that_pauses_resumes_and_keeps_its_budget() -> None:
    calls = Calls()
    agent = fp.build_agent_graph(
        make_registry(calls),
        ScriptedDecisionModel([call("write_note", 1, note="x"), final_citing_last]),
        approval="interrupt",
    ).compile()

    def audit(state: Host) -> dict[str, Any]:
        return {"audit": f"ended:{fp.run_output(state).termination.value}"}

    parent = StateGraph(Host, context_schema=fp.RunContext)
    parent.add_node("agent", agent)
    parent.add_node("audit", audit)
    parent.add_edge(START, "agent")
    parent.add_edge("agent", "audit")
    parent.add_edge("audit", END)
    graph: Any = parent.compile(checkpointer=InMemorySaver())
    config, ctx = thread(), context()
    paused = graph.invoke(fp.start("q", budget(steps=4, tools=2)), config, context=ctx)
    assert paused["__interrupt__"][0].value["calls"][0]["tool_name"] == "write_note"
    assert calls.log == []
    out = graph.invoke(Command(resume="approve"), config, context=ctx)
    ended = fp.run_output(out)
    assert ended.termination is fp.TerminationReason.COMPLETED
    assert out["audit"] == "ended:completed"
    assert calls.log == [("write_note", {"note": "x"}, "call-0001")]
    # The subgraph's counters went on across the parent's resume; they did not restart.
    assert (ended.budget.steps_used, ended.budget.tool_calls_used) == (2, 1)


def test_a_nested_run_resumed_under_another_principal_is_policy_denied() -> None:
    calls = Calls()
    agent = fp.build_agent_graph(
        make_registry(calls),
        ScriptedDecisionModel([call("write_note", 1, note="x"), final_citing_last]),
        approval="interrupt",
    ).compile()
    parent = StateGraph(Host, context_schema=fp.RunContext)
    parent.add_node("agent", agent)
    parent.add_edge(START, "agent")
    parent.add_edge("agent", END)
    graph: Any = parent.compile(checkpointer=InMemorySaver())
    config = thread()
    graph.invoke(fp.start("q", budget()), config, context=context(principal="u-1"))
    out = graph.invoke(Command(resume="approve"), config, context=context(principal="u-2"))
    assert fp.run_output(out).termination is fp.TerminationReason.POLICY_DENIED
    assert calls.log == []
