"""`fencepost show` ends with the run's stop report: in 80 columns, and in ``--json``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from fencepost.cli import app
from fencepost.policy import AgentState, RuntimeBudget, StopKind, TerminationReason, terminate
from fencepost.reporting import RunRecord

runner = CliRunner()


def cli(*args: str) -> Any:
    return runner.invoke(app, list(args), env={"COLUMNS": "80"})


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    url = f"sqlite:///{(tmp_path_factory.mktemp('show-report') / 'runs.db').resolve()}"
    out = cli("demo", "--db", url, "--json")
    assert out.exit_code == 0, out.stderr
    runs = json.loads(out.stdout)["runs"]
    return url, {r["scenario"]: r["run_id"] for r in runs}


def show(demo_db: tuple[str, dict[str, str]], scenario: str) -> tuple[str, dict[str, Any]]:
    url, ids = demo_db
    text = cli("show", ids[scenario], "--db", url)
    assert text.exit_code == 0, text.stderr
    data = cli("show", ids[scenario], "--db", url, "--json")
    assert data.exit_code == 0, data.stderr
    return text.stdout, json.loads(data.stdout)


def report_block(text: str) -> str:
    return text[text.index("stop report") :]


def test_show_ends_with_what_a_budget_stop_completed_and_never_started(
    demo_db: tuple[str, dict[str, str]],
) -> None:
    text, data = show(demo_db, "tool-budget")
    block = report_block(text)
    assert "stopped" in block and "tool_calls_exhausted" in block
    rows = [line.split() for line in block.splitlines()]
    assert ["completed", "call-0001", "deployment_history"] in rows
    assert ["never", "started", "call-0003", "deployment_history", "budget_exhausted"] in rows
    assert "effects made none" in block
    report = data["report"]
    assert report["kind"] == "stopped" and report["reason"] == "tool_budget_exhausted"
    assert [c["call_id"] for c in report["never_started"]] == ["call-0003"]


def test_show_reports_an_accepted_upload_as_pending_when_the_budget_stops_the_run(
    demo_db: tuple[str, dict[str, str]],
) -> None:
    text, data = show(demo_db, "upload-budget-stop")
    block = report_block(text)
    assert "stopped" in block and "tool_calls_exhausted" in block
    rows = [line.split() for line in block.splitlines()]
    assert ["completed", "call-0002", "search_logs"] in rows
    # Who answered its approval is on its row.
    assert ["pending", "call-0001", "upload_postmortem", "write", "·", "approved", "by"] in [
        r[:7] for r in rows
    ]
    assert ["never", "started", "call-0003", "upload_status", "budget_exhausted"] in rows
    # Stopping is not undoing: the accepted upload is an effect under way.
    assert "effects made call-0001" in block
    report = data["report"]
    assert report["kind"] == "stopped" and report["reason"] == "tool_budget_exhausted"
    assert [c["call_id"] for c in report["completed"]] == ["call-0002"]
    assert [c["call_id"] for c in report["pending"]] == ["call-0001"]
    assert [(c["call_id"], c["error_code"]) for c in report["never_started"]] == [
        ("call-0003", "budget_exhausted")
    ]
    assert report["effects_made"] == ["call-0001"]


def test_show_names_the_one_condition_a_waiting_run_needs(
    demo_db: tuple[str, dict[str, str]],
) -> None:
    text, data = show(demo_db, "write-needs-approval")
    assert "waiting for approval of call-0001" in report_block(text)
    assert data["report"]["waiting_for"] == {"condition": "approval", "calls": ["call-0001"]}
    text, data = show(demo_db, "needs-clarification")
    assert "waiting for clarification" in report_block(text)


def test_show_lists_the_effects_a_completed_run_made(
    demo_db: tuple[str, dict[str, str]],
) -> None:
    text, data = show(demo_db, "write-approved")
    block = report_block(text)
    assert "effects made call-0002" in block and "cited call-0001, call-0002" in block
    assert data["report"]["effects_made"] == ["call-0002"]


def test_every_shown_report_fits_80_columns_and_holds_no_answer_text(
    demo_db: tuple[str, dict[str, str]],
) -> None:
    for scenario in demo_db[1]:
        text, data = show(demo_db, scenario)
        block = report_block(text)
        assert all(cell_len(line) <= 80 for line in block.splitlines()), scenario
        assert "…" not in block
        answer = data["final_answer"]
        if answer:
            assert answer not in block and answer not in json.dumps(data["report"])


def test_a_run_ended_before_stop_reports_gets_one_from_its_receipts() -> None:
    old = terminate(
        AgentState(
            run_id="run-old",
            question="q",
            budget=RuntimeBudget(steps_remaining=0, tool_calls_remaining=0),
        ),
        TerminationReason.STEP_BUDGET_EXHAUSTED,
        error_code="steps_exhausted",
    )
    assert old.report is None
    record = RunRecord(
        thread_id="run-old",
        state=old,
        status=old.termination.value if old.termination else "",
        scenario=None,
        started_at=None,
        updated_at=None,
    )
    assert record.report is not None and record.report.kind is StopKind.STOPPED
