"""The approver's commands on a real SQLite checkpoint file: `fencepost pending` lists what a
paused run waits on (run, call, tool, arguments, requester, since when); `fencepost approve|reject`
answers it by resuming the real graph (`--graph`), through the checks a resume passes: an approved
call runs once, a rejected one never, and a second answer changes nothing. `fencepost approvals`
lists and revokes a tenant's remembered approvals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import fencepost as fp
from fencepost.adapters.checkpointers import open_checkpointer
from fencepost.cli import app
from fencepost.policy.remembered import ApprovalScope, ScopeStore
from tests.cli import approval_graph

GRAPH = "tests.cli.approval_graph:graph"
runner = CliRunner()


def cli(*args: str) -> Any:
    return runner.invoke(app, list(args), env={"COLUMNS": "120"})


def requester() -> fp.RunContext:
    return fp.RunContext(
        tenant_id="acme",
        principal=fp.Principal(id="oncall-ana", capabilities={"notes:write"}),
    )


@pytest.fixture
def paused(tmp_path: Path) -> Iterator[str]:
    """The URL of a SQLite checkpoint file holding one run paused for approval of a note."""
    url = f"sqlite:///{(tmp_path / 'runs.db').resolve()}"
    approval_graph.written.clear()
    with open_checkpointer(url) as saver:
        graph = approval_graph.graph.compile(checkpointer=saver)
        budget = fp.RuntimeBudget(steps_remaining=5, tool_calls_remaining=5)
        config = {"configurable": {"thread_id": "run-note"}}
        out = graph.invoke(
            fp.start("write it", budget, run_id="run-note"), config, context=requester()
        )
        assert out["__interrupt__"]
    yield url


def answer(url: str, verb: str, *extra: str) -> Any:
    return cli(
        verb, "run-note", "--call", "call-0001", "--as", "oncall-ana",
        "--capability", "notes:write", "--graph", GRAPH, "--db", url, "--json", *extra,
    )  # fmt: skip


def test_pending_lists_the_waiting_call_with_its_arguments_requester_and_since(paused: str) -> None:
    result = cli("pending", "--db", paused, "--json")
    assert result.exit_code == 0, result.stderr
    [waiting] = json.loads(result.stdout)
    assert waiting["run_id"] == waiting["thread_id"] == "run-note"
    assert (waiting["call_id"], waiting["tool_name"]) == ("call-0001", "write_note")
    assert waiting["arguments"] == {"note": "restart api"}
    assert (waiting["tenant_id"], waiting["requester"]) == ("acme", "oncall-ana")
    assert waiting["since"] is not None
    table = cli("pending", "--db", paused)
    assert "call-0001" in table.stdout and "restart api" in table.stdout


def test_approve_resumes_the_real_graph_and_the_call_runs_once(paused: str) -> None:
    result = answer(paused, "approve")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["status"] == "completed"
    assert [r["status"] for r in data["receipts"]] == ["completed"]
    assert approval_graph.written == ["call-0001"]
    assert json.loads(cli("pending", "--db", paused, "--json").stdout) == []


def test_reject_resumes_the_real_graph_and_the_call_never_runs(paused: str) -> None:
    result = answer(paused, "reject")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [r["status"] for r in data["receipts"]] == ["denied"]
    assert approval_graph.written == []


def test_a_second_approve_changes_nothing(paused: str) -> None:
    assert answer(paused, "approve").exit_code == 0
    again = answer(paused, "approve")
    assert again.exit_code != 0
    assert json.loads(again.stderr.strip())["error"] == "not_waiting"
    assert approval_graph.written == ["call-0001"]


def test_answering_a_call_that_does_not_wait_changes_nothing(paused: str) -> None:
    result = cli(
        "approve", "run-note", "--call", "call-9999", "--as", "oncall-ana",
        "--graph", GRAPH, "--db", paused, "--json",
    )  # fmt: skip
    assert result.exit_code != 0
    assert json.loads(result.stderr.strip())["error"] == "calls_not_waiting"
    assert approval_graph.written == []
    assert len(json.loads(cli("pending", "--db", paused, "--json").stdout)) == 1


def test_a_graph_compiled_without_a_checkpointer_is_refused_before_anything_is_answered(
    paused: str,
) -> None:
    result = answer(paused, "approve", "--graph", "fencepost.demo:graph")
    assert result.exit_code != 0
    assert json.loads(result.stderr.strip())["error"] == "graph_not_found"
    assert len(json.loads(cli("pending", "--db", paused, "--json").stdout)) == 1


def test_approvals_lists_a_tenants_scopes_and_revokes_them_never_another_tenants(
    paused: str,
) -> None:
    path = paused.removeprefix("sqlite:///")
    ledger = fp.SqliteLedger(path)
    assert isinstance(ledger, ScopeStore)
    ledger.remember_scope(
        ApprovalScope(
            scope_id="scope-x",
            tenant_id="acme",
            tool_name="write_note",
            kind="tool",
            created_at=datetime(2026, 1, 1, tzinfo=UTC),
            created_by="lead-bo",
            answered_by="human",
            run_id="run-note",
            call_id="call-0001",
        )
    )
    ledger.close()
    listed = json.loads(
        cli("approvals", "list", "--tenant", "acme", "--db", paused, "--json").stdout
    )
    assert [s["scope_id"] for s in listed] == ["scope-x"]
    assert (
        json.loads(cli("approvals", "list", "--tenant", "globex", "--db", paused, "--json").stdout)
        == []
    )
    other = cli("approvals", "revoke", "scope-x", "--tenant", "globex", "--db", paused, "--json")
    assert other.exit_code != 0
    assert json.loads(other.stderr.strip())["error"] == "no_such_scope"
    done = cli("approvals", "revoke", "scope-x", "--tenant", "acme", "--db", paused, "--json")
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["revoked_at"] is not None
    assert (
        json.loads(cli("approvals", "list", "--tenant", "acme", "--db", paused, "--json").stdout)
        == []
    )


def test_show_of_a_paused_run_says_who_may_answer_and_points_at_fencepost_approve(
    paused: str,
) -> None:
    data = json.loads(cli("show", "run-note", "--db", paused, "--json").stdout)
    assert data["answer"]["rights"] == ["approve:notes:write"]
    assert data["answer"]["four_eyes"] is False
    assert data["answer"]["requester"] == "oncall-ana"
    assert data["answer"]["command"] == (
        "fencepost approve run-note --call call-0001 --as <principal> "
        f"--capability approve:notes:write --db {paused}"
    )
    text = " ".join(cli("show", "run-note", "--db", paused).stdout.split())
    assert (
        "what to do answer as oncall-ana (the requester) or a principal of acme holding "
        "approve:notes:write: fencepost approve run-note --call call-0001" in text
    )


def test_a_lead_approving_at_the_command_line_carries_the_run_to_its_end_as_the_requester(
    paused: str,
) -> None:
    result = cli(
        "approve", "run-note", "--call", "call-0001", "--as", "lead-bo",
        "--capability", "approve:notes:write", "--graph", GRAPH, "--db", paused, "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["status"] == "completed"
    assert [(r["status"], r["approved_by"]) for r in data["receipts"]] == [("completed", "lead-bo")]
    assert approval_graph.written == ["call-0001"]
