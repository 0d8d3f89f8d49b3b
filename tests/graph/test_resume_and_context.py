"""Budgets survive resume; trusted context is bound to the thread and checked on every resume."""

from __future__ import annotations

from langgraph.types import Command

import fencepost as fp
from tests.graph.kit import budget, call, context, final_citing_last, harness, thread


def test_command_resume_continues_the_same_budget() -> None:
    script = [call(n=1), call("write_note", 2, note="x"), call(n=3), final_citing_last]
    h = harness(script, approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(
        fp.start("q", fp.RuntimeBudget(steps_remaining=3, tool_calls_remaining=5)),
        config,
        context=ctx,
    )
    paused = fp.run_output(h.graph.get_state(config).values)
    assert paused.budget.steps_used == 2
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    # Two steps were spent before the pause; the third is the last one, the fourth is refused.
    assert state.budget.steps_used == 3
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert h.model.calls == 3


def test_invoke_none_continues_the_same_budget() -> None:
    # No step is kept for answering here: every step may call a tool.
    h = harness([call(n=1), call(n=2), call(n=3), final_citing_last], answer_margin=0)
    config, ctx = thread(), context()
    h.graph.invoke(
        fp.start("q", fp.RuntimeBudget(steps_remaining=3, tool_calls_remaining=5)),
        config,
        context=ctx,
        interrupt_after=["execute"],
    )
    mid = fp.run_output(h.graph.get_state(config).values)
    assert mid.budget.steps_used == 1
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert state.budget.steps_used == 3
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert h.calls.count("search_logs") == 3


def test_resume_without_context_is_policy_denied_before_any_tool_runs() -> None:
    h = harness([call("write_note", 1, note="x")], approval="interrupt")
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context())
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config))
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "missing_context"
    assert h.calls.log == []


def test_resume_as_another_tenant_or_principal_is_policy_denied() -> None:
    for other in (context(tenant="globex"), context(principal="u-2")):
        h = harness([call("write_note", 1, note="x")], approval="interrupt")
        config = thread()
        h.graph.invoke(fp.start("q", budget()), config, context=context())
        state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=other))
        assert state.termination is fp.TerminationReason.POLICY_DENIED
        assert state.last_error_code == "context_mismatch"
        assert h.calls.log == []


def test_model_arguments_cannot_set_tenant_or_principal() -> None:
    sneaky = fp.ToolProposal(
        call_id="call-0001",
        tool_name="search_logs",
        arguments={"query": "x", "tenant_id": "globex"},
    )
    h = harness([sneaky])
    state = h.run()
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "schema_violation"
    assert h.calls.log == []
    assert state.tenant_id == "acme"


def test_thread_is_bound_to_the_identity_it_started_with() -> None:
    h = harness([call(), final_citing_last])
    state = h.run(ctx=context(tenant="acme", principal="u-9"))
    assert (state.tenant_id, state.principal_id) == ("acme", "u-9")
