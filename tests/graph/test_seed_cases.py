"""The seed's four integration cases, on a real compiled graph with a scripted model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import fencepost as fp
from tests.graph.kit import call, context, final_citing_last, harness


def test_case_a_search_then_final_completes_in_two_steps_and_one_tool_call() -> None:
    h = harness([call(), final_citing_last])
    state = h.run()
    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.budget.steps_used == 2
    assert state.budget.tool_calls_used == 1
    assert h.calls.count("search_logs") == 1
    assert state.final_answer is not None and state.final_answer.citations == ("call-0001",)


def test_case_b_unknown_tool_is_invalid_proposal_and_no_tool_body_runs() -> None:
    # The seed's strict ending: repair_attempts=0 (by default the call is given back once).
    h = harness(
        [fp.ToolProposal(call_id="call-0001", tool_name="delete_everything", arguments={})],
        repair_attempts=0,
    )
    state = h.run()
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "unknown_tool"
    assert h.calls.log == []
    assert state.budget.tool_calls_used == 0


def test_case_c_repeated_empty_search_stops_before_the_third_identical_call_runs() -> None:
    same = {"query": "checkout timeout"}
    script = [call("search_logs", n, **same) for n in range(1, 6)]
    h = harness(script, search_result={"hits": []})
    state = h.run(steps=10, tools=10)
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    assert h.calls.count("search_logs") == 2
    assert state.budget.tool_calls_used == 2


def test_case_d_deadline_already_passed_makes_no_model_and_no_tool_call() -> None:
    h = harness([call(), final_citing_last])
    past = fp.Deadline(at=datetime.now(UTC) - timedelta(seconds=1))
    state = h.run(ctx=context(deadline=past))
    assert state.termination is fp.TerminationReason.DEADLINE_EXCEEDED
    assert h.model.calls == 0
    assert h.calls.log == []
    assert state.budget.steps_used == 0
