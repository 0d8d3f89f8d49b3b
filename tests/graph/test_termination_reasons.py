"""Every TerminationReason is reachable, and none by an exception escaping invoke."""

from __future__ import annotations

from typing import Any

import pytest

import fencepost as fp
from tests.graph.kit import call, context, final_citing_last, harness, thread

SCENARIOS: dict[fp.TerminationReason, tuple[list[Any], dict[str, Any]]] = {
    fp.TerminationReason.COMPLETED: (
        [fp.FinalProposal(answer=fp.AnswerPayload(text="nothing to look up"))],
        {},
    ),
    fp.TerminationReason.INSUFFICIENT_EVIDENCE: (
        [fp.AbstainProposal(reason="insufficient_evidence")],
        {},
    ),
    fp.TerminationReason.NEEDS_CLARIFICATION: (
        [fp.AbstainProposal(reason="needs_clarification")],
        {},
    ),
    fp.TerminationReason.STEP_BUDGET_EXHAUSTED: ([call(n=1), call(n=2)], {"steps": 1}),
    fp.TerminationReason.TOOL_BUDGET_EXHAUSTED: ([call(n=1)], {"tools": 0}),
    fp.TerminationReason.INVALID_PROPOSAL: ([{"kind": "tool", "call_id": "x"}], {}),
    fp.TerminationReason.NO_PROGRESS: ([call(n=i, query="same") for i in range(1, 5)], {}),
    fp.TerminationReason.POLICY_DENIED: ([call("admin_reset", 1)], {}),
    fp.TerminationReason.APPROVAL_REQUIRED: ([call("write_note", 1, note="hi")], {}),
    fp.TerminationReason.FAILED: ([RuntimeError("upstream said: token=abc")], {}),
}


@pytest.mark.parametrize("reason", list(SCENARIOS), ids=lambda r: r.value)
def test_reason_is_reached_as_data_not_as_an_exception(reason: fp.TerminationReason) -> None:
    script, run_kw = SCENARIOS[reason]
    h = harness(script)
    state = h.run(**run_kw)
    assert state.termination is reason
    assert state.phase is fp.policy.Phase.TERMINAL
    assert state.manifests[-1].phase is fp.policy.Phase.TERMINAL


def test_deadline_and_cancelled_are_reachable_too() -> None:
    # deadline_exceeded is pinned by the seed's case D; cancelled through fencepost.cancel.
    h = harness([call("write_note", 1, note="x")], approval="interrupt")
    config = thread()
    ctx = context()
    h.graph.invoke(
        fp.start("q", fp.RuntimeBudget(steps_remaining=3, tool_calls_remaining=3)),
        config,
        context=ctx,
    )
    state = fp.cancel(h.graph, config, context=ctx)
    assert state is not None and state.termination is fp.TerminationReason.CANCELLED
    assert h.calls.log == []


def test_every_reason_has_a_scenario() -> None:
    covered = set(SCENARIOS) | {
        fp.TerminationReason.DEADLINE_EXCEEDED,
        fp.TerminationReason.CANCELLED,
    }
    assert covered == set(fp.TerminationReason)


@pytest.mark.parametrize("recursion_limit", [*range(1, 16), None])
def test_step_budget_ends_as_data_never_as_graph_recursion_error(
    recursion_limit: int | None,
) -> None:
    script = [call(n=i) for i in range(1, 40)]
    h = harness(script)
    config = thread()
    if recursion_limit is not None:
        config["recursion_limit"] = recursion_limit
    state = h.run(steps=30, tools=30, config=config)
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    if recursion_limit is None:
        assert state.budget.steps_used == 30
    else:
        assert state.last_error_code == "recursion_limit"


def test_model_error_text_never_reaches_state() -> None:
    h = harness([RuntimeError("upstream said: token=abc")])
    state = h.run()
    assert state.last_error_code == "internal_error"
    assert "token=abc" not in state.model_dump_json()


class RateLimitError(Exception):
    status_code = 429


def test_a_retryable_model_error_is_asked_again_and_each_retry_spends_a_step() -> None:
    h = harness([RateLimitError("slow down, key=abc"), call(), final_citing_last])
    state = h.run()
    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.budget.steps_used == 3
    assert h.model.calls == 3
    assert state.last_error_code is None


def test_retryable_model_errors_past_the_retry_limit_end_as_failed_with_the_code() -> None:
    h = harness([RateLimitError("x")] * 5, model_retries=2)
    state = h.run(steps=10)
    assert state.termination is fp.TerminationReason.FAILED
    assert state.last_error_code == "rate_limited"
    assert h.model.calls == 3 and state.budget.steps_used == 3


def test_model_retries_stop_at_the_step_budget() -> None:
    h = harness([RateLimitError("x")] * 5, model_retries=4)
    state = h.run(steps=2)
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert h.model.calls == 2
