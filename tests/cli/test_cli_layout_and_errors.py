"""The command line as a person sees it: tables fit 80 columns and nothing is cut, usage errors are
one line (JSON with ``--json``), a missing default database says what to do, repeated demos do not
double the report, and the reading commands open stores read-only through the one store layer.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from fencepost import demo as demo_module
from fencepost import reporting
from fencepost.cli import app
from fencepost.demo import SCENARIOS

FENCEPOST = Path(sys.executable).with_name("fencepost")
runner = CliRunner()


def cli(*args: str, columns: int = 80) -> Any:
    return runner.invoke(app, list(args), env={"COLUMNS": str(columns)})


def cli_json(*args: str) -> Any:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path.resolve()}"


def one_line(result: Any) -> str:
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    url = sqlite_url(tmp_path_factory.mktemp("layout") / "runs.db")
    result = runner.invoke(app, ["demo", "--db", url, "--json"])
    assert result.exit_code == 0, result.stderr
    return url, json.loads(result.stdout)


# --- 80 columns, nothing cut ----------------------------------------------------------------------


def assert_fits(text: str, width: int) -> None:
    for line in text.splitlines():
        assert cell_len(line) <= width, line
    assert "…" not in text  # rich's ellipsis: a cell was cut


def test_runs_fits_80_columns_and_shows_every_id_and_status_whole(
    demo_db: tuple[str, dict[str, Any]],
) -> None:
    url, demo = demo_db
    out = cli("runs", "--db", url).stdout
    assert_fits(out, 80)
    rows = [line for line in out.splitlines() if line.startswith("run-")]
    assert len(rows) == len(SCENARIOS)
    for run in demo["runs"]:
        row = next(line for line in rows if line.split()[0] == run["run_id"])
        assert row.split()[1] == run["termination"]  # the status column is never squeezed
        assert run["scenario"] in row


def test_show_fits_80_columns_for_every_demo_run_with_tools_and_reasons_whole(
    demo_db: tuple[str, dict[str, Any]],
) -> None:
    url, demo = demo_db
    for run in demo["runs"]:
        out = cli("show", run["run_id"], "--db", url).stdout
        assert_fits(out, 80)
        words = set(out.split())
        shown = cli_json("show", run["run_id"], "--db", url)
        for m in shown["manifests"]:
            assert not m["tool_name"] or m["tool_name"] in words, (run["scenario"], m)
            assert not m["code"] or m["code"] in words, (run["scenario"], m)
        assert run["termination"] in words


def test_report_and_demo_fit_80_columns(
    demo_db: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, _ = demo_db
    report = cli("report", "--db", url).stdout
    assert_fits(report, 80)
    for header in ("runs exhausted", "share of limit", "median / p90"):
        assert header.split()[-1] in report
    demo = cli("demo", "--db", sqlite_url(tmp_path / "runs.db"))
    assert demo.exit_code == 0, demo.stderr
    assert_fits(demo.stdout, 80)


def test_piped_output_is_not_cut_at_a_fixed_width(demo_db: tuple[str, dict[str, Any]]) -> None:
    url, demo = demo_db
    run_id = next(r["run_id"] for r in demo["runs"] if r["scenario"] == "incident-release")
    answer = cli_json("show", run_id, "--db", url)["final_answer"]
    assert len(answer) > 120
    wide = cli("show", run_id, "--db", url, columns=400).stdout
    assert f"answer {answer}" in wide.splitlines()  # one line, whole: nothing cut at 120
    narrow = cli("show", run_id, "--db", url, columns=80).stdout
    assert " ".join(answer.split()) in " ".join(narrow.split())  # wrapped, every word kept


# --- usage errors ---------------------------------------------------------------------------------

USAGE_ERRORS = [
    (["runz"], "No such command 'runz'"),
    (["runs", "--frob"], "No such option: --frob"),
    (["show"], "Missing argument"),
    (["runs", "--limit", "0"], "Invalid value for '--limit'"),
]


@pytest.mark.parametrize(("args", "says"), USAGE_ERRORS)
def test_a_usage_error_is_one_line(args: list[str], says: str) -> None:
    result = cli(*args)
    line = one_line(result)
    assert result.exit_code == 2
    assert line.startswith("error: ") and says in line
    assert "--help)" in line  # where to look next
    assert result.stdout == ""


@pytest.mark.parametrize(("args", "says"), USAGE_ERRORS)
def test_a_usage_error_honours_json(args: list[str], says: str) -> None:
    result = cli(*args, "--json")
    payload = json.loads(one_line(result))
    assert payload["error"] == "usage" and says in payload["message"]


def test_the_installed_command_reports_a_usage_error_on_one_line() -> None:
    out = subprocess.run(
        [str(FENCEPOST), "report", "--frob", "--json"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and out.stdout == ""
    [line] = out.stderr.splitlines()
    assert json.loads(line)["error"] == "usage"


def test_no_arguments_prints_the_help() -> None:
    result = runner.invoke(app, [])
    assert "Usage: fencepost" in result.output
    for command in ("demo", "runs", "show", "report", "graph"):
        assert command in result.output


# --- a missing database -----------------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_a_missing_default_database_says_to_run_the_demo_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FENCEPOST_DB", raising=False)
    result = cli("runs", *(["--json"] if as_json else []))
    line = one_line(result)
    message = json.loads(line)["message"] if as_json else line
    assert f"no such database: {reporting.DEFAULT_DB} (in {tmp_path})" in message
    assert "run `fencepost demo` first" in message and "--db" in message
    assert not (tmp_path / ".fencepost").exists()


def test_a_missing_relative_database_says_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    line = one_line(cli("report", "--db", "sqlite:///elsewhere/runs.db"))
    assert line == f"error: no such database: sqlite:///elsewhere/runs.db (relative to {tmp_path})"


def test_a_postgres_authentication_failure_says_so(postgres_dsn: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    p = conninfo_to_dict(postgres_dsn)
    url = f"postgresql://fp_nobody:pw@{p.get('host', '127.0.0.1')}:{p.get('port', 5432)}/{p['dbname']}"
    result = cli("runs", "--db", url, "--json")
    payload = json.loads(one_line(result))
    assert payload["error"] == "authentication_failed"
    assert payload["message"].startswith("authentication failed for postgresql://fp_nobody:***@")
    assert "no such database" not in payload["message"]


# --- demo batches -----------------------------------------------------------------------------------


def test_running_the_demo_twice_does_not_double_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo_module, "SCENARIOS", SCENARIOS[:3])
    url = sqlite_url(tmp_path / "runs.db")
    first = cli_json("demo", "--db", url)
    second = cli_json("demo", "--db", url)
    assert first["batch"] != second["batch"]
    assert all(r["run_id"].startswith(f"run-{second['batch']}-") for r in second["runs"])

    report = cli_json("report", "--db", url)
    assert report["batch"] == second["batch"] and report["runs"] == 3
    assert report["batches"] == [second["batch"], first["batch"]]
    assert report["by_reason"] == {"completed": 3}
    assert cli_json("report", "--db", url, "--batch", "all")["runs"] == 6
    older = cli_json("report", "--db", url, "--batch", first["batch"])
    assert older["batch"] == first["batch"] and older["runs"] == 3

    text = cli("report", "--db", url).stdout
    assert f"3 runs of demo batch {second['batch']}" in text and "the latest of 2" in text
    assert len(cli_json("runs", "--db", url)) == 6  # `runs` lists everything by default
    latest = cli_json("runs", "--db", url, "--batch", "latest")
    assert {r["batch"] for r in latest} == {second["batch"]}

    line = one_line(cli("report", "--db", url, "--batch", "ffffff"))
    assert "no demo batch 'ffffff'" in line and second["batch"] in line


def test_runs_that_are_not_demo_runs_are_all_reported(tmp_path: Path) -> None:
    import fencepost as fp
    from fencepost.adapters.scripted import ScriptedDecisionModel
    from fencepost.demo import build_demo_graph, demo_context

    url = sqlite_url(tmp_path / "runs.db")
    with reporting.open_store(url, create=True) as saver:
        for thread in ("mine-1", "mine-2"):
            model = ScriptedDecisionModel([fp.AbstainProposal(reason="needs_clarification")])
            build_demo_graph(model, checkpointer=saver).invoke(
                fp.start("q", run_id=thread),
                {"configurable": {"thread_id": thread}},
                context=demo_context(),
            )
    report = cli_json("report", "--db", url)
    assert report["batch"] is None and report["batches"] == [] and report["runs"] == 2
    assert report["by_reason"] == {"needs_clarification": 2}


# --- one store layer --------------------------------------------------------------------------------


def test_reporting_reads_stores_only_through_open_checkpointer_read_only(
    demo_db: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, demo = demo_db
    calls: list[tuple[str, bool]] = []
    real = reporting.open_checkpointer

    def spy(target: str, *, read_only: bool = False) -> Any:
        calls.append((target, read_only))
        return real(target, read_only=read_only)

    monkeypatch.setattr(reporting, "open_checkpointer", spy)
    for args in (["runs"], ["report"], ["show", demo["runs"][0]["run_id"]]):
        assert cli(*args, "--db", url).exit_code == 0
    assert calls == [(url, True)] * 3


def test_reporting_has_no_driver_or_url_code_of_its_own() -> None:
    source = Path(reporting.__file__).read_text(encoding="utf-8")
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    drivers = {"sqlite3", "psycopg", "aiosqlite"}
    assert not {m for m in imported if m.split(".")[0] in drivers}
    assert not {
        m
        for m in imported
        if m.startswith(("langgraph.checkpoint.sqlite", "langgraph.checkpoint.postgres"))
    }
    assert "mode=ro" not in source and "conninfo" not in source
