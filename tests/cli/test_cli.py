"""The `fencepost` command: the demo ends every scenario as scripted, and the reading commands
work on the database it leaves — SQLite and Postgres alike — and fail with one line, never a
traceback.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from typer.testing import CliRunner

import fencepost as fp
from fencepost import demo as demo_module
from fencepost import reporting
from fencepost.adapters.child_run import ChildRunResult
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.cli import app
from fencepost.demo import SCENARIOS, build_demo_graph, demo_context, demo_registry

FENCEPOST = Path(sys.executable).with_name("fencepost")
runner = CliRunner()


def sqlite_url(path: Path) -> str:
    # Four slashes: an absolute path (the SQLAlchemy convention the CLI follows).
    return f"sqlite:///{path.resolve()}"


def cli(*args: str, columns: int = 80) -> Any:
    # Piped, as under CliRunner, rich lays tables out for $COLUMNS: pin it.
    return runner.invoke(app, list(args), env={"COLUMNS": str(columns)})


def cli_json(*args: str) -> Any:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def assert_one_line_error(result: Any, code: str | None = None, *, as_json: bool = False) -> str:
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    if as_json:
        payload = json.loads(lines[0])
        if code is not None:
            assert payload["error"] == code
        return str(payload["message"])
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    """`fencepost demo --json` run once, as a user would: the installed console script."""
    db = tmp_path_factory.mktemp("demo") / "nested" / "runs.db"
    url = sqlite_url(db)
    out = subprocess.run(
        [str(FENCEPOST), "demo", "--db", url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    yield url, json.loads(out.stdout)


# --- demo -----------------------------------------------------------------------------------------


def test_demo_ends_every_scenario_with_its_expected_reason(
    demo_db: tuple[str, dict[str, Any]],
) -> None:
    _, result = demo_db
    by_name = {r["scenario"]: r for r in result["runs"]}
    assert list(by_name) == [s.name for s in SCENARIOS]
    for scenario in SCENARIOS:
        run = by_name[scenario.name]
        assert run["termination"] == scenario.expected.value, scenario.name
        assert run["as_expected"] is True
    # Between them the scenarios end every way a run can end.
    assert {s.expected for s in SCENARIOS} == set(fp.TerminationReason)


def test_demo_write_pauses_for_approval_then_runs_once(
    demo_db: tuple[str, dict[str, Any]],
) -> None:
    url, result = demo_db
    approved = next(r for r in result["runs"] if r["scenario"] == "write-approved")
    assert approved["paused_for"] == ["restart_service"]
    shown = cli_json("show", approved["run_id"], "--db", url)
    restarts = [r for r in shown["receipts"] if r["tool_name"] == "restart_service"]
    assert [(r["status"], r["attempts"]) for r in restarts] == [("completed", 1)]
    assert any(m["outcome"] == "approval_pending" for m in shown["manifests"])


def test_demo_upload_is_done_only_when_the_status_shows_the_document(
    demo_db: tuple[str, dict[str, Any]],
) -> None:
    url, result = demo_db
    run = next(r for r in result["runs"] if r["scenario"] == "upload-verified")
    assert run["paused_for"] == ["upload_postmortem"]  # a write: approved, then only accepted
    shown = cli_json("show", run["run_id"], "--db", url)
    receipts = [
        (r["call_id"], r["status"], r["task_id"], r["completed_by"]) for r in shown["receipts"]
    ]
    assert receipts == [
        ("call-0001", "accepted_pending", "task-17", None),
        ("call-0003", "completed", None, None),
        ("call-0001", "completed", "task-17", "call-0003"),
    ]
    # "Uploaded successfully" at step 2 was refused: task-17 was still pending.
    refused = [m for m in shown["manifests"] if m["code"] == "tasks_pending"]
    assert [(m["step"], m["outcome"]) for m in refused] == [(2, "denied")]
    answer = shown["final_answer"]
    assert "document-42" in answer and "version 3" in answer
    assert "/docs/postmortems/document-42/v3" in answer
    assert [c["call_id"] for c in shown["citations"]] == ["call-0003"]
    assert shown["report"]["effects_made"] == ["call-0001"] and shown["report"]["pending"] == []


def test_demo_child_run_spends_the_parents_budget(demo_db: tuple[str, dict[str, Any]]) -> None:
    url, result = demo_db
    run = next(r for r in result["runs"] if r["scenario"] == "child-run")
    shown = cli_json("show", run["run_id"], "--db", url)
    assert [(r["tool_name"], r["status"]) for r in shown["receipts"]] == [
        ("investigate", "completed")
    ]
    # The parent's own two steps and one call, plus the child's three steps and two calls.
    assert (run["steps"], run["tool_calls"]) == (5, 3)
    assert shown["budget"]["steps"] == {"used": 5, "left": 3}
    assert "sub-agent (run child-" in shown["final_answer"]


def test_demo_child_run_comes_back_as_a_typed_result_under_the_parents_account() -> None:
    scenario = next(s for s in SCENARIOS if s.name == "child-run")
    run = demo_module.run_scenario(scenario, InMemorySaver())
    assert run.termination is fp.TerminationReason.COMPLETED
    [observation] = [o for o in run.state.observations if o.tool_name == "investigate"]
    child = ChildRunResult.model_validate(observation.result)
    assert child.completed and child.termination is fp.TerminationReason.COMPLETED
    assert [(r.tool_name, r.status) for r in child.receipts] == [
        ("search_logs", fp.ReceiptStatus.COMPLETED),
        ("deployment_history", fp.ReceiptStatus.COMPLETED),
    ]
    assert (child.budget.steps_used, child.budget.tool_calls_used) == (3, 2)
    assert child.final_answer_text is not None and "2026.11.3" in child.final_answer_text
    assert run.state.budget.steps_used == 2 + child.budget.steps_used


def test_demo_creates_the_default_database_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(demo_module, "SCENARIOS", SCENARIOS[:1])
    result = cli("demo", "--json")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / ".fencepost" / "runs.db").is_file()
    assert json.loads(result.stdout)["db"] == reporting.DEFAULT_DB


def test_demo_shows_progress_pauses_and_the_final_table(tmp_path: Path) -> None:
    result = cli("demo", "--db", sqlite_url(tmp_path / "runs.db"))
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for scenario in SCENARIOS:
        assert scenario.name in out
        assert scenario.expected.value in out
    assert "needs approval: restart_service (write) → approve" in out
    for header in ("run id", "scenario", "terminal reason", "steps / calls", "left"):
        assert header in out
    assert "✘" not in out


def test_demo_fails_when_a_scenario_ends_with_an_unexpected_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = replace(SCENARIOS[0], expected=fp.TerminationReason.NO_PROGRESS)
    monkeypatch.setattr(demo_module, "SCENARIOS", (wrong,))
    result = cli("demo", "--db", sqlite_url(tmp_path / "runs.db"), columns=200)
    line = assert_one_line_error(result)
    assert wrong.name in line
    assert "(expected no_progress)" in result.stdout


# --- runs / show / report / graph -----------------------------------------------------------------


def test_runs_lists_every_demo_run_newest_first_with_its_reason(
    demo_db: tuple[str, dict[str, Any]],
) -> None:
    url, result = demo_db
    runs = cli_json("runs", "--db", url)
    assert len(runs) == len(SCENARIOS)
    expected = {r["run_id"]: r["termination"] for r in result["runs"]}
    assert {r["run_id"]: r["status"] for r in runs} == expected
    assert {r["run_id"]: r["scenario"] for r in runs} == {
        r["run_id"]: r["scenario"] for r in result["runs"]
    }
    updated = [r["updated_at"] for r in runs]
    assert updated == sorted(updated, reverse=True)
    # The demo ran them in order, so newest first is the reverse of the scenario order.
    assert [r["scenario"] for r in runs] == [s.name for s in reversed(SCENARIOS)]
    table = cli("runs", "--db", url)
    assert table.exit_code == 0
    for run_id in expected:
        assert run_id in table.stdout  # ids are never shortened: they go into `show`


def test_runs_limit_keeps_the_newest(demo_db: tuple[str, dict[str, Any]]) -> None:
    url, _ = demo_db
    runs = cli_json("runs", "--db", url, "--limit", "2")
    assert [r["scenario"] for r in runs] == [s.name for s in reversed(SCENARIOS)][:2]


def test_show_gives_the_timeline_receipts_answer_citations_and_end(
    demo_db: tuple[str, dict[str, Any]],
) -> None:
    url, result = demo_db
    run_id = next(r["run_id"] for r in result["runs"] if r["scenario"] == "incident-release")
    shown = cli_json("show", run_id, "--db", url)
    assert shown["termination"] == "completed"
    assert shown["last_error_code"] is None
    phases = [m["phase"] for m in shown["manifests"]]
    assert phases[-1] == "terminal" and phases.count("terminal") == 1
    assert [m["tool_name"] for m in shown["manifests"] if m["phase"] == "execute"] == [
        "search_logs",
        "deployment_history",
    ]
    assert [(r["call_id"], r["status"]) for r in shown["receipts"]] == [
        ("call-0001", "completed"),
        ("call-0002", "completed"),
    ]
    assert "2026.11.3" in shown["final_answer"]
    assert shown["citations"] == [
        {"call_id": "call-0001", "tool_name": "search_logs"},
        {"call_id": "call-0002", "tool_name": "deployment_history"},
    ]
    text = cli("show", run_id, "--db", url)
    assert text.exit_code == 0
    for part in ("timeline", "receipts", "deployment_history", "cites call-0002", "completed"):
        assert part in text.stdout


def test_show_says_where_the_runs_logs_and_traces_are(
    demo_db: tuple[str, dict[str, Any]],
) -> None:
    url, result = demo_db
    run_id = next(r["run_id"] for r in result["runs"] if r["scenario"] == "incident-release")
    shown = cli_json("show", run_id, "--db", url)
    thread_id = shown["run"]["thread_id"]
    assert shown["telemetry"]["traces"] == {
        "span": "invoke_agent",
        "gen_ai.conversation.id": thread_id,
        "fencepost.run_id": run_id,
    }
    assert "fencepost" in shown["telemetry"]["logs"]
    text = cli("show", run_id, "--db", url).stdout
    assert "logs the `fencepost` loggers" in text
    assert "traces OpenTelemetry invoke_agent spans" in " ".join(text.split())
    assert thread_id in text and run_id in text


def test_show_reports_the_error_code_of_a_denied_run(demo_db: tuple[str, dict[str, Any]]) -> None:
    url, result = demo_db
    run_id = next(r["run_id"] for r in result["runs"] if r["scenario"] == "capability-denied")
    shown = cli_json("show", run_id, "--db", url)
    assert shown["termination"] == "policy_denied"
    assert shown["last_error_code"] == "capability_denied"
    assert shown["receipts"] == []
    text = cli("show", run_id, "--db", url).stdout
    assert "capability_denied" in text and "no tool call was executed" in text


def test_no_secret_from_a_failing_tool_or_model_reaches_the_cli_or_the_database(
    demo_db: tuple[str, dict[str, Any]],
) -> None:
    url, result = demo_db
    for scenario, code in (("tool-failure", "unavailable"), ("model-failure", "unavailable")):
        run_id = next(r["run_id"] for r in result["runs"] if r["scenario"] == scenario)
        shown = cli("show", run_id, "--db", url, "--json")
        assert "sk-demo" not in shown.output
        data = json.loads(shown.stdout)
        codes = {r["error_code"] for r in data["receipts"]} | {data["last_error_code"]}
        assert code in codes
    db_path = Path(url.removeprefix("sqlite:///"))
    for part in db_path.parent.glob(db_path.name + "*"):  # the file and any WAL beside it
        assert b"sk-demo" not in part.read_bytes()


def test_report_counts_reasons_and_summarises_steps_calls_and_budget(
    demo_db: tuple[str, dict[str, Any]],
) -> None:
    url, result = demo_db
    report = cli_json("report", "--db", url)
    assert report["runs"] == report["ended"] == len(SCENARIOS)
    assert report["batch"] == result["batch"] and report["batches"] == [result["batch"]]
    expected: dict[str, int] = {}
    for s in SCENARIOS:
        expected[s.expected.value] = expected.get(s.expected.value, 0) + 1
    assert report["by_reason"] == expected
    steps = sorted(r["steps"] for r in result["runs"])
    assert report["steps"]["max"] == steps[-1]
    assert report["tool_calls"]["max"] == max(r["tool_calls"] for r in result["runs"])
    axes = {a["axis"]: a for a in report["budget"]}
    assert set(axes) == {axis.value for axis in fp.policy.BudgetAxis}
    assert axes["steps"]["runs_limited"] == len(SCENARIOS)
    assert axes["steps"]["used_total"] == sum(steps)
    assert axes["steps"]["runs_exhausted"] == 1  # the step-budget scenario
    # the tool-budget scenario, and the upload whose status check found no call left
    assert axes["tool_calls"]["runs_exhausted"] == 2
    assert axes["tokens"]["share_of_limit"] is None  # no demo run limits tokens
    assert report["by_scenario"]["deadline"] == {"deadline_exceeded": 1}
    text = cli("report", "--db", url)
    assert text.exit_code == 0
    for part in ("terminal reasons", "per ended run", "median", "p90", "budget use by axis"):
        assert part in text.stdout


def test_report_distribution_uses_nearest_rank_p90() -> None:
    d = reporting.Distribution.of([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert (d.median, d.p90, d.max) == (5.5, 9, 10)
    assert reporting.Distribution.of([]).max == 0


def test_graph_prints_the_loop_as_mermaid() -> None:
    result = cli("graph")
    assert result.exit_code == 0
    assert "graph TD;" in result.stdout
    for edge in ("decide -.-> execute;", "execute -.-> decide;", "terminal -.-> __end__;"):
        assert edge in result.stdout
    assert cli_json("graph")["mermaid"] == result.stdout.rstrip("\n") + "\n"


def test_paused_and_unfinished_runs_are_listed_as_such(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "runs.db")
    with reporting.open_store(url, create=True) as saver:
        write = fp.ToolProposal(
            call_id="call-0001",
            tool_name="restart_service",
            arguments={"service": "checkout", "reason": "stuck"},
        )
        paused = build_demo_graph(ScriptedDecisionModel([write]), checkpointer=saver)
        paused.invoke(
            fp.start("restart checkout", run_id="run-paused"),
            {"configurable": {"thread_id": "run-paused"}},
            context=demo_context(),
        )
        read = fp.ToolProposal(
            call_id="call-0001", tool_name="search_logs", arguments={"service": "checkout"}
        )
        # A run stopped between its steps (as a crash would leave it): not ended, not paused.
        stopped = fp.build_agent_graph(demo_registry(), ScriptedDecisionModel([read])).compile(
            checkpointer=saver, interrupt_before=["execute"]
        )
        stopped.invoke(
            fp.start("search", run_id="run-stopped"),
            {"configurable": {"thread_id": "run-stopped"}},
            context=demo_context(),
        )
    runs = {r["run_id"]: r for r in cli_json("runs", "--db", url)}
    assert runs["run-paused"]["status"] == reporting.PAUSED
    assert runs["run-paused"]["waiting_for"] == ["restart_service"]
    assert runs["run-stopped"]["status"] == reporting.RUNNING
    text = cli("show", "run-paused", "--db", url).stdout
    assert "waiting for approval of restart_service" in text
    report = cli_json("report", "--db", url)
    # No terminal reason yet: counted apart, not in the reasons table or the distributions.
    assert report["by_reason"] == {}
    counts = (report["runs"], report["ended"], report["paused"], report["in_progress"])
    assert counts == (2, 0, 1, 1)
    assert report["steps"]["max"] == 0
    text = cli("report", "--db", url).stdout
    assert "not ended (no terminal reason yet): 1 paused for approval, 1 in progress" in text
    assert "terminal reasons: none" in text


def test_a_paused_run_whose_answer_is_already_written_is_in_progress(tmp_path: Path) -> None:
    # A crash right after `Command(resume=...)` can leave the resume value next to the interrupt
    # on the latest checkpoint: the human has answered, so it no longer waits for one.
    url = sqlite_url(tmp_path / "runs.db")
    write = fp.ToolProposal(
        call_id="call-0001",
        tool_name="restart_service",
        arguments={"service": "checkout", "reason": "stuck"},
    )
    with reporting.open_store(url, create=True) as saver:
        graph = build_demo_graph(ScriptedDecisionModel([write]), checkpointer=saver)
        config: Any = {"configurable": {"thread_id": "run-answered"}}
        graph.invoke(fp.start("restart", run_id="run-answered"), config, context=demo_context())
        assert cli_json("runs", "--db", url)[0]["status"] == reporting.PAUSED
        latest = saver.get_tuple(config)
        assert latest is not None
        task_id = next(w[0] for w in latest.pending_writes or () if w[1] == "__interrupt__")
        saver.put_writes(latest.config, [("__resume__", "approve")], task_id)
    assert cli_json("runs", "--db", url)[0]["status"] == reporting.RUNNING


def test_an_empty_store_has_no_runs(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "runs.db")
    with reporting.open_store(url, create=True):
        pass
    assert cli_json("runs", "--db", url) == []
    assert cli_json("report", "--db", url)["runs"] == 0
    assert "No runs" in cli("runs", "--db", url).stdout


# --- errors: one line, non-zero exit, no traceback --------------------------------------------------


def _other_sqlite(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.execute("INSERT INTO invoices (total) VALUES (9.5)")
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize("command", [["runs"], ["report"], ["show", "run-x"]])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_missing_database_is_one_line_and_is_not_created(
    tmp_path: Path, command: list[str], as_json: bool
) -> None:
    db = tmp_path / "missing.db"
    result = cli(*command, "--db", sqlite_url(db), *(["--json"] if as_json else []))
    message = assert_one_line_error(result, "no_such_database", as_json=as_json)
    assert "no such database" in message
    assert not db.exists()


@pytest.mark.parametrize("command", [["runs"], ["report"], ["show", "run-x"]])
@pytest.mark.parametrize("kind", ["text file", "other sqlite database"])
def test_a_database_that_is_not_a_checkpoint_store_is_one_line_and_left_unchanged(
    tmp_path: Path, command: list[str], kind: str
) -> None:
    if kind == "text file":
        db = tmp_path / "notes.db"
        db.write_text("not a database\n" * 100)
    else:
        db = _other_sqlite(tmp_path / "billing.db")
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    result = cli(*command, "--db", sqlite_url(db), "--json")
    message = assert_one_line_error(result, "not_a_checkpoint_store", as_json=True)
    assert "is not a checkpoint store" in message
    # Read commands open read-only: LangGraph's tables were not created in someone else's file.
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_a_checkpoint_store_of_some_other_graph_is_not_a_fencepost_store(tmp_path: Path) -> None:
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class Other(TypedDict):
        n: int

    g: StateGraph[Any, Any, Any, Any] = StateGraph(Other)
    g.add_node("inc", lambda s: {"n": s["n"] + 1})
    g.add_edge(START, "inc")
    g.add_edge("inc", END)
    url = sqlite_url(tmp_path / "other-graph.db")
    with reporting.open_store(url, create=True) as saver:
        g.compile(checkpointer=saver).invoke({"n": 1}, {"configurable": {"thread_id": "t"}})
    message = assert_one_line_error(cli("runs", "--db", url))
    assert "none of them is a fencepost run" in message


def test_no_such_run_is_one_line(demo_db: tuple[str, dict[str, Any]]) -> None:
    url, _ = demo_db
    assert "no such run: 'run-nope'" in assert_one_line_error(cli("show", "run-nope", "--db", url))
    assert_one_line_error(
        cli("show", "run-nope", "--db", url, "--json"), "no_such_run", as_json=True
    )


def test_an_unsupported_url_is_one_line() -> None:
    line = assert_one_line_error(cli("runs", "--db", "mysql://db/runs"))
    assert "unsupported scheme 'mysql'" in line


def test_an_unexpected_failure_is_one_line_without_its_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = sqlite_url(tmp_path / "runs.db")
    with reporting.open_store(url, create=True):
        pass

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("password=hunter2 at db.internal")

    monkeypatch.setattr("fencepost.cli.load_runs", boom)
    line = assert_one_line_error(cli("runs", "--db", url))
    assert "hunter2" not in line and "RuntimeError" in line


def test_the_installed_command_fails_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(FENCEPOST), "report", "--db", sqlite_url(tmp_path / "nope.db")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"error: no such database: {sqlite_url(tmp_path / 'nope.db')}"
    ]


# --- the same on Postgres ---------------------------------------------------------------------------


def test_demo_and_every_reading_command_work_on_postgres(postgres_schema: str) -> None:
    # A schema with no checkpoint tables yet: not a store, and the read did not create them.
    assert_one_line_error(
        cli("runs", "--db", postgres_schema, "--json"), "not_a_checkpoint_store", as_json=True
    )
    assert_one_line_error(cli("runs", "--db", postgres_schema), "not_a_checkpoint_store")

    result = cli("demo", "--db", postgres_schema, "--json")
    assert result.exit_code == 0, result.stderr
    demo_runs = json.loads(result.stdout)["runs"]
    assert all(r["as_expected"] for r in demo_runs)
    assert {r["scenario"]: r["termination"] for r in demo_runs} == {
        s.name: s.expected.value for s in SCENARIOS
    }

    runs = cli_json("runs", "--db", postgres_schema)
    assert {r["run_id"]: r["status"] for r in runs} == {
        r["run_id"]: r["termination"] for r in demo_runs
    }
    run_id = next(r["run_id"] for r in demo_runs if r["scenario"] == "incident-database")
    shown = cli_json("show", run_id, "--db", postgres_schema)
    assert [c["tool_name"] for c in shown["citations"]] == ["search_logs", "db_metrics"]
    report = cli_json("report", "--db", postgres_schema)
    assert report["runs"] == len(SCENARIOS)
    completed = [s for s in SCENARIOS if s.expected is fp.TerminationReason.COMPLETED]
    assert report["by_reason"]["completed"] == len(completed) == 6
    assert_one_line_error(cli("show", "run-nope", "--db", postgres_schema), "no_such_run")


def test_postgres_errors_are_one_line_without_the_password(postgres_dsn: str) -> None:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(postgres_dsn)
    missing = make_conninfo("", **{**params, "dbname": f"fp_missing_{uuid.uuid4().hex[:8]}"})
    line = assert_one_line_error(cli("runs", "--db", _as_url(missing)))
    assert "no such database" in line

    unreachable = "postgresql://app:hunter2@127.0.0.1:1/runs?connect_timeout=2"
    line = assert_one_line_error(cli("report", "--db", unreachable))
    assert "cannot connect" in line and "hunter2" not in line


def _as_url(conninfo: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    p = conninfo_to_dict(conninfo)
    user = f"{p['user']}@" if p.get("user") else ""
    port = f":{p['port']}" if p.get("port") else ""
    return f"postgresql://{user}{p.get('host', '127.0.0.1')}{port}/{p['dbname']}"
