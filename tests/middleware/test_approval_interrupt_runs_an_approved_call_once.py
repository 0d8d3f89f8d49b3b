"""Approvals in the middleware binding: with approval="interrupt" a write waits for a person;
approved, it runs exactly once; rejected, never. The checkpointer is a real SQLite saver."""

from __future__ import annotations

from pathlib import Path

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import fencepost as fp
from tests.middleware.kit import (
    Ran,
    agent,
    ask,
    budget,
    call,
    chat,
    ctx,
    lc_tools,
    specs,
    then_answer,
    thread,
)


def _run(tmp_path: Path, answer: object) -> tuple[Ran, dict, dict]:
    ran = Ran()
    tools = lc_tools(ran)
    ledger = fp.SqliteLedger(str(tmp_path / "ledger.db"))
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(), approval="interrupt", ledger=ledger)
    model = chat(then_answer(call("write_note", {"note": "rollback deploy 42"}, 1)))
    with SqliteSaver.from_conn_string(str(tmp_path / "saver.db")) as saver:
        graph, config = agent(model, tools, [mw], saver=saver), thread()
        paused = graph.invoke(ask(), config, context=ctx())
        assert ran.bodies == []
        request = paused["__interrupt__"][0].value
        out = graph.invoke(Command(resume=answer), config, context=ctx())
        # A second resume of the same thread runs nothing again.
        graph.invoke(Command(resume=answer), config, context=ctx())
    return ran, request, out


def test_an_approved_write_runs_exactly_once(tmp_path: Path) -> None:
    ran, request, out = _run(tmp_path, "approve")
    assert [c["tool_name"] for c in request["calls"]] == ["write_note"]
    assert ran.bodies == ["write_note:rollback deploy 42"]
    assert out["termination"] == fp.TerminationReason.COMPLETED.value


def test_a_rejected_write_never_runs(tmp_path: Path) -> None:
    ran, _, out = _run(tmp_path, {"decisions": [{"type": "reject"}]})
    assert ran.bodies == []
    assert out["termination"] is not None


def test_a_resume_with_another_tenants_context_runs_nothing(tmp_path: Path) -> None:
    ran = Ran()
    tools = lc_tools(ran)
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(), approval="interrupt")
    model = chat(then_answer(call("write_note", {"note": "rollback deploy 42"}, 1)))
    graph, config = agent(model, tools, [mw]), thread()
    graph.invoke(ask(), config, context=ctx())
    other = fp.RunContext(
        tenant_id="evil",
        principal=fp.Principal(id="u-1", capabilities=frozenset({"logs:read", "notes:write"})),
    )
    out = graph.invoke(Command(resume="approve"), config, context=other)
    assert ran.bodies == []
    assert out["termination"] == fp.TerminationReason.POLICY_DENIED.value
