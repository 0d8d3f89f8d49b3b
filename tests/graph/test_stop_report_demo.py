"""Every terminal output carries its stop report: each demo scenario, run through the real graph on
a SQLite checkpoint file and read back, ends with the report of its row of the contract's table."""

from __future__ import annotations

import pytest
from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.demo import SCENARIOS, DemoRun, build_demo_graph, demo_context, run_scenario
from fencepost.policy import StopKind, VerdictCode, Waiting, kind_of
from fencepost.reporting import load_runs, open_store


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[DemoRun, fp.AgentState]]:
    """Each scenario's output, and its state as read back from the checkpoint database."""
    url = f"sqlite:///{(tmp_path_factory.mktemp('stop-report') / 'runs.db').resolve()}"
    with open_store(url, create=True) as saver:
        runs = {
            s.name: run_scenario(s, saver, run_id=f"run-{n:04d}") for n, s in enumerate(SCENARIOS)
        }
    with open_store(url) as saver:
        stored = {r.run_id: r.state for r in load_runs(saver)}
    return {name: (run, stored[run.run_id]) for name, run in runs.items()}


@pytest.mark.parametrize("scenario", [s.name for s in SCENARIOS])
def test_every_demo_run_ends_with_the_report_of_its_reason(
    demo_runs: dict[str, tuple[DemoRun, fp.AgentState]], scenario: str
) -> None:
    run, stored = demo_runs[scenario]
    state = run.state
    assert state.termination is run.scenario.expected
    report = state.report
    assert isinstance(report, fp.StopReport)
    assert report.reason is state.termination and report.kind is kind_of(state.termination)
    assert report.error_code == state.last_error_code
    # Every receipted call is accounted for once.
    receipted = {r.call_id for r in state.receipts}
    listed = [
        c.call_id
        for calls in (report.completed, report.failed, report.uncertain, report.pending)
        for c in calls
    ]
    assert receipted <= set(listed) | {c.call_id for c in report.never_started}
    assert len(listed) + len(report.never_started) == report.calls
    # The report is part of the checkpoint: read back, it is the same typed value.
    assert stored.report == report


def test_a_tool_budget_stop_lists_what_completed_and_what_never_started(
    demo_runs: dict[str, tuple[DemoRun, fp.AgentState]],
) -> None:
    report = demo_runs["tool-budget"][0].state.report
    assert report is not None and report.kind is StopKind.STOPPED
    assert [c.call_id for c in report.completed] == ["call-0001", "call-0002"]
    assert [(c.call_id, c.error_code) for c in report.never_started] == [
        ("call-0003", fp.ErrorCode.BUDGET_EXHAUSTED)
    ]
    assert report.error_code == "tool_calls_exhausted" and report.effects_made == ()


def test_a_deadline_stop_lists_the_proposed_call_that_never_ran(
    demo_runs: dict[str, tuple[DemoRun, fp.AgentState]],
) -> None:
    report = demo_runs["deadline"][0].state.report
    assert report is not None and report.kind is StopKind.STOPPED
    assert [(c.call_id, c.tool_name) for c in report.never_started] == [
        ("call-0001", "search_logs")
    ]
    assert report.completed == ()


def test_a_run_waiting_for_approval_names_the_call_it_waits_for(
    demo_runs: dict[str, tuple[DemoRun, fp.AgentState]],
) -> None:
    report = demo_runs["write-needs-approval"][0].state.report
    assert report is not None and report.kind is StopKind.WAITING_FOR_INPUT
    assert report.waiting_for == Waiting(condition="approval", calls=("call-0001",))
    assert [(c.tool_name, c.verdict) for c in report.never_started] == [
        ("restart_service", VerdictCode.APPROVAL_REQUIRED)
    ]
    clarify = demo_runs["needs-clarification"][0].state.report
    assert clarify is not None and clarify.waiting_for == Waiting(condition="clarification")


def test_a_completed_write_is_an_effect_made_and_a_cancelled_one_is_not(
    demo_runs: dict[str, tuple[DemoRun, fp.AgentState]],
) -> None:
    approved = demo_runs["write-approved"][0].state.report
    assert approved is not None and approved.kind is StopKind.COMPLETED
    assert approved.effects_made == ("call-0002",)
    assert approved.cited == ("call-0001", "call-0002")
    cancelled = demo_runs["write-cancelled"][0].state.report
    assert cancelled is not None and cancelled.kind is StopKind.STOPPED
    assert cancelled.effects_made == ()
    assert [(c.call_id, c.verdict) for c in cancelled.never_started] == [
        ("call-0001", VerdictCode.APPROVAL_PENDING)
    ]


def test_a_failure_reports_its_cause_code(
    demo_runs: dict[str, tuple[DemoRun, fp.AgentState]],
) -> None:
    tool_failure = demo_runs["tool-failure"][0].state.report
    assert tool_failure is not None and tool_failure.kind is StopKind.FAILED
    assert [(c.call_id, c.error_code) for c in tool_failure.failed] == [
        ("call-0001", fp.ErrorCode.UNAVAILABLE)
    ]
    denied = demo_runs["capability-denied"][0].state.report
    assert denied is not None and denied.error_code == "capability_denied"
    assert [c.verdict for c in denied.never_started] == [VerdictCode.CAPABILITY_DENIED]


def test_a_paused_run_reports_what_it_waits_for_until_it_ends() -> None:
    write = fp.ToolProposal(
        call_id="call-0001",
        tool_name="restart_service",
        arguments={"service": "checkout", "reason": "stuck"},
    )
    graph = build_demo_graph(ScriptedDecisionModel([write]), checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t-paused"}}
    graph.invoke(fp.start("restart", run_id="run-paused"), config, context=demo_context())
    values = graph.get_state(config).values
    assert values.get("report") is None  # derived by run_output, never stored
    state = fp.run_output(values)
    assert state.termination is None and state.report is not None
    assert state.report.kind is StopKind.WAITING_FOR_INPUT and state.report.reason is None
    assert state.report.waiting_for is not None
    assert state.report.waiting_for.calls == ("call-0001",)
    ended = fp.cancel(graph, config, context=demo_context())
    assert ended is not None and ended.report is not None
    assert ended.report.kind is StopKind.STOPPED
