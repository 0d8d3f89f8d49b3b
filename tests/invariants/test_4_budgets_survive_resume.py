"""Invariant 4: budgets survive resume — ``Command(resume=...)`` or ``None`` in the same graph,
a new graph object on the same saver or files (a request's, a restarted worker's, a second
process's), and never a fresh budget when the ledger was lost.

A graph built with no ledger keeps one as durable as the checkpointer it is compiled with, shared
by every graph object compiled with it: an ``InMemorySaver``'s own in-memory ledger, a SQLite
file's own ledger tables, so a new graph on the same saver or file finds the run's account; a
checkpointer it cannot derive one from is refused at compile, saying what to pass. A ledger that
never saw the run (an in-memory one lost with its process) re-opens nothing from the checkpoint:
the run is refused, ``unknown_budget_account``, and nothing more runs. A run whose first step
died after its account was opened resumes on that account, however it was started.

Over both bindings (the ``binding`` parameter, ``tests/invariants/bindings.py``: fencepost's graph,
and ``create_agent`` with ``fp.FencepostMiddleware``), at the end of this file: tool calls and
steps across an approval's resume, ``invoke(None)`` after a pause. The other tests drive the
graph's own state, nodes or settings (``update_state``, ``Command(update=...)``, channels,
``interrupt_before``, repair, the approver, token estimates, savers and ledgers by URL), which the
middleware binding does not have: they stay graph-only.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import fencepost as fp
from fencepost.adapters import SqliteLedger
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.graph.settings import settings_of
from fencepost.policy import TerminationReason, UnknownAccount
from fencepost.policy.keys import run_account
from tests.graph.kit import (
    Calls,
    budget,
    call,
    context,
    final_citing_last,
    harness,
    make_registry,
    sqlite_files,
    thread,
)
from tests.invariants import bindings as bd
from tests.middleware import kit as mw

BATCH = fp.ToolBatch(calls=(call(n=1), call("write_note", 2, note="restart api")))
TWO_CALLS = fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=2)


@contextmanager
def saver_on(path: Path) -> Iterator[SqliteSaver]:
    """A SqliteSaver on ``path`` over a connection of its own, as a new process opens it."""
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


def new_graph(checkpointer: Any, calls: Calls, *, resumed: bool = False, **kw: Any) -> Any:
    """A graph object of its own; a ``resumed`` one's model picks up where the run is (its
    batch proposed, it answers next)."""
    model = ScriptedDecisionModel([final_citing_last] if resumed else [BATCH, final_citing_last])
    return fp.build_agent_graph(make_registry(calls), model, approval="interrupt", **kw).compile(
        checkpointer=checkpointer
    )


def held(graph: Any, config: dict[str, Any], state: fp.AgentState) -> dict[str, float]:
    cfg = settings_of(graph)
    assert cfg is not None
    account = run_account(config["configurable"]["thread_id"], state.run_id)
    return dict(cfg.ledger.balance(account).held)


@pytest.mark.parametrize("resumed_by", ["the same graph", "a new graph object"])
def test_a_batch_paused_for_approval_on_a_sqlite_file_is_charged_each_call_once_on_resume(
    tmp_path: Path, resumed_by: str
) -> None:
    calls = Calls()
    config, ctx = thread(), context()
    with saver_on(tmp_path / "runs.db") as saver:
        first = new_graph(saver, calls)  # no ledger passed
        first.invoke(fp.start("q", TWO_CALLS), config, context=ctx)
        assert first.get_state(config).next == ("approve",)
        assert calls.log == []
        if resumed_by == "the same graph":
            out = first.invoke(Command(resume="approve"), config, context=ctx)
            graph = first
        else:
            with saver_on(tmp_path / "runs.db") as again:
                graph = new_graph(again, calls, resumed=True)
                out = graph.invoke(Command(resume="approve"), config, context=ctx)
                state = fp.run_output(out)
                ledger_held = held(graph, config, state)
        state = fp.run_output(out)
        if resumed_by == "the same graph":
            ledger_held = held(graph, config, state)
    assert state.termination is fp.TerminationReason.COMPLETED, state.last_error_code
    assert sorted(name for name, _, _ in calls.log) == ["search_logs", "write_note"]
    assert state.budget.tool_calls_used == 2
    assert ledger_held["tool_calls"] == 2.0


def test_a_run_whose_ledger_was_lost_is_refused_never_given_its_budget_again(
    tmp_path: Path,
) -> None:
    # An in-memory ledger passed explicitly, lost with its process: the new graph's ledger holds
    # nothing of the run, and opens nothing from what the checkpoint says.
    calls = Calls()
    config, ctx = thread(), context()
    with saver_on(tmp_path / "runs.db") as saver:
        new_graph(saver, calls, ledger=fp.InMemoryLedger()).invoke(
            fp.start("q", TWO_CALLS), config, context=ctx
        )
    with saver_on(tmp_path / "runs.db") as saver:
        fresh = fp.InMemoryLedger()
        graph = new_graph(saver, calls, resumed=True, ledger=fresh)
        state = fp.run_output(graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "unknown_budget_account"
    assert calls.log == []
    account = run_account(config["configurable"]["thread_id"], state.run_id)
    with pytest.raises(UnknownAccount):
        fresh.balance(account)


def test_a_graph_with_no_ledger_keeps_its_budget_in_the_sqlite_file_it_checkpoints_to(
    tmp_path: Path,
) -> None:
    with saver_on(tmp_path / "runs.db") as saver:
        graph = new_graph(saver, Calls())
        cfg = settings_of(graph)
        assert cfg is not None and isinstance(cfg.ledger, SqliteLedger)
        config = thread()
        graph.invoke(fp.start("q", TWO_CALLS), config, context=context())
    with sqlite3.connect(tmp_path / "runs.db") as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        accounts = conn.execute("SELECT count(*) FROM fencepost_ledger_accounts").fetchone()
    assert {"checkpoints", "fencepost_ledger_accounts"} <= tables
    assert accounts == (1,)


def test_an_in_memory_checkpointer_keeps_one_in_memory_ledger_for_every_graph_on_it() -> None:
    saver, other = InMemorySaver(), InMemorySaver()
    ledgers = [settings_of(new_graph(s, Calls())) for s in (saver, saver, other)]
    assert all(cfg is not None and type(cfg.ledger) is fp.InMemoryLedger for cfg in ledgers)
    first, second, elsewhere = (cfg.ledger for cfg in ledgers if cfg is not None)
    assert first is second
    assert elsewhere is not first
    # An in-memory SQLite database is gone with the process too: the same rule.
    memory_db = SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False))
    try:
        on_db = [settings_of(new_graph(memory_db, Calls())) for _ in range(2)]
        assert on_db[0] is not None and on_db[1] is not None
        assert type(on_db[0].ledger) is fp.InMemoryLedger and on_db[0].ledger is on_db[1].ledger
    finally:
        memory_db.conn.close()


def test_a_checkpointer_no_ledger_can_be_derived_from_is_refused_at_compile_saying_what_to_pass(
    tmp_path: Path,
) -> None:
    class ElsewhereSaver(InMemorySaver):
        """Stands for a durable checkpointer fencepost knows no ledger for (Redis, a custom
        store): not an InMemorySaver as far as the rule is concerned."""

    # An InMemorySaver subclass is still in memory; a saver of another kind is not known to be.
    from langgraph.checkpoint.base import BaseCheckpointSaver

    class Unknown(BaseCheckpointSaver[str]):
        pass

    new_graph(ElsewhereSaver(), Calls())  # fine: in memory
    with pytest.raises(fp.GraphConfigError) as refused:
        new_graph(Unknown(), Calls())
    assert refused.value.field == "ledger"
    assert "ledger=" in str(refused.value)
    # Passing one is the way out.
    new_graph(Unknown(), Calls(), ledger=SqliteLedger(tmp_path / "ledger.db"))


def test_a_postgres_checkpointer_without_a_ledger_is_refused_saying_to_pass_a_postgres_ledger(
    postgres_schema: str,
) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver

    from fencepost.adapters import PostgresLedger

    with PostgresSaver.from_conn_string(postgres_schema) as saver:
        with pytest.raises(fp.GraphConfigError) as refused:
            new_graph(saver, Calls())
        assert "PostgresLedger" in str(refused.value)
        with PostgresLedger(postgres_schema) as ledger:
            new_graph(saver, Calls(), ledger=ledger)


def test_a_run_on_a_postgres_store_opened_by_fencepost_resumes_in_a_new_graph_charged_once(
    postgres_schema: str,
) -> None:
    from fencepost.adapters import PostgresLedger, open_checkpointer

    calls = Calls()
    config, ctx = thread(), context()
    with open_checkpointer(postgres_schema) as saver:
        new_graph(saver, calls).invoke(fp.start("q", TWO_CALLS), config, context=ctx)
    with open_checkpointer(postgres_schema) as saver:  # a worker that started since
        graph = new_graph(saver, calls, resumed=True)
        cfg = settings_of(graph)
        assert cfg is not None and isinstance(cfg.ledger, PostgresLedger)
        state = fp.run_output(graph.invoke(Command(resume="approve"), config, context=ctx))
        assert held(graph, config, state)["tool_calls"] == 2.0
    assert state.termination is fp.TerminationReason.COMPLETED, state.last_error_code
    assert sorted(name for name, _, _ in calls.log) == ["search_logs", "write_note"]


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_a_run_on_an_async_store_fencepost_opened_resumes_in_a_new_graph_charged_once(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # The async twin of the rule: aopen_checkpointer's store (an AsyncSqliteSaver, an
    # AsyncPostgresSaver), no ledger passed, resumed by a new graph object as an async worker
    # that started since builds it.
    url = (
        f"sqlite:///{tmp_path / 'runs.db'}"
        if store == "sqlite"
        else request.getfixturevalue("postgres_schema")
    )
    calls = Calls()
    config, ctx = thread(), context()
    async with fp.aopen_checkpointer(url) as saver:
        await new_graph(saver, calls).ainvoke(fp.start("q", TWO_CALLS), config, context=ctx)
    async with fp.aopen_checkpointer(url) as saver:
        graph = new_graph(saver, calls, resumed=True)
        cfg = settings_of(graph)
        assert cfg is not None and not isinstance(cfg.ledger, fp.InMemoryLedger)
        out = await graph.ainvoke(Command(resume="approve"), config, context=ctx)
        state = fp.run_output(out)
        assert held(graph, config, state)["tool_calls"] == 2.0
    assert state.termination is fp.TerminationReason.COMPLETED, state.last_error_code
    assert sorted(name for name, _, _ in calls.log) == ["search_logs", "write_note"]
    assert state.budget.tool_calls_used == 2


def test_a_call_approved_through_each_new_graph_on_one_saver_is_charged_on_the_runs_account() -> (
    None
):
    # Two tool calls: the batch's read and write use them. The run's next write, approved
    # through yet another graph object built per request, finds none left and never runs.
    calls, saver = Calls(), InMemorySaver()
    model = ScriptedDecisionModel(
        [
            BATCH,
            call("write_note", 3, note="again"),
            fp.AbstainProposal(reason="needs_clarification"),
        ]
    )

    def restarted() -> Any:
        return fp.build_agent_graph(make_registry(calls), model, approval="interrupt").compile(
            checkpointer=saver
        )

    config, ctx = thread(), context()
    restarted().invoke(fp.start("q", TWO_CALLS), config, context=ctx)
    restarted().invoke(Command(resume="approve"), config, context=ctx)
    assert sorted(name for name, _, _ in calls.log) == ["search_logs", "write_note"]
    state = fp.run_output(restarted().invoke(Command(resume="approve"), config, context=ctx))
    assert [name for name, _, _ in calls.log].count("write_note") == 1
    assert state.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert state.budget.tool_calls_used == 2


# -- resumed in the same graph -----------------------------------------------------------------


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


# -- a run whose first step died ---------------------------------------------------------------


class _CrashBeforeFirstStep(SqliteLedger):
    """A SqliteLedger whose process dies reserving a model step: the account was opened, the
    decide node's writes never reach a checkpoint. The text carries a secret."""

    def reserve(self, account: str, key: str, amounts: Any) -> fp.policy.Reservation:
        if ":step:" in key:
            raise RuntimeError("power cut password=hunter2")
        return super().reserve(account, key, amounts)


_STARTS: dict[str, Any] = {
    "start": fp.start("why is checkout failing?", budget()),
    "messages": {"messages": [HumanMessage("why is checkout failing?")]},
    "json-request": {"request": {"question": "why is checkout failing?"}},
}


@pytest.mark.parametrize(
    "form",
    [
        "start",
        "messages",
        "json-request",
    ],
)
def test_a_run_whose_first_step_died_resumes_on_a_durable_ledger_whatever_its_input_form(
    form: str, tmp_path: Path
) -> None:
    config, ctx = thread(), context()
    conn = sqlite3.connect(tmp_path / "runs.db", check_same_thread=False)
    crashing = _CrashBeforeFirstStep(tmp_path / "ledger.db")
    try:
        saver = SqliteSaver(conn)
        h = harness([final_citing_last], checkpointer=saver, ledger=crashing)
        with pytest.raises(RuntimeError):
            h.graph.invoke(_STARTS[form], config, context=ctx)
    finally:
        crashing.close()
        conn.close()
    with sqlite_files(tmp_path) as (saver, ledger):
        again = harness(
            [call("search_logs", 1), final_citing_last], checkpointer=saver, ledger=ledger
        )
        state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert (state.termination, state.last_error_code) == (TerminationReason.COMPLETED, None)
    text = json.dumps(state.model_dump(mode="json"))
    assert "hunter2" not in text and "power cut" not in text


# -- over both bindings: fencepost's graph, and create_agent + FencepostMiddleware -------------


@pytest.mark.parametrize("resumed_by", ["the same agent", "a new agent object"])
def test_the_budget_continues_across_an_approvals_resume(
    binding: type[bd.Binding], resumed_by: str
) -> None:
    script = itertools.chain([bd.call("write_note", {"note": "rollback"}, 1)], bd.searches(2))
    b = binding(script, steps=50, tools=2, approval="interrupt")
    assert b.start(mw.ctx()).paused
    if resumed_by == "a new agent object":
        b.rebuild()
    out = b.resume("approve", mw.ctx())
    assert out.bodies == ["write_note:rollback", "search_logs:checkout 500 #2"]
    assert out.termination == fp.TerminationReason.TOOL_BUDGET_EXHAUSTED.value


def test_steps_spent_before_an_approval_count_after_its_resume(binding: type[bd.Binding]) -> None:
    script = itertools.chain(
        [bd.call("search_logs", {"query": "a"}, 1), bd.call("write_note", {"note": "x"}, 2)],
        bd.searches(3),
    )
    b = binding(script, steps=3, tools=50, approval="interrupt")
    assert b.start(mw.ctx()).paused
    out = b.resume("approve", mw.ctx())
    # Two steps were spent before the pause; the third is the last one, the fourth is refused.
    assert len(out.received) == 3
    assert out.termination == fp.TerminationReason.STEP_BUDGET_EXHAUSTED.value


def test_invoke_none_continues_the_same_budget_in_either_binding(binding: type[bd.Binding]) -> None:
    b = binding(bd.searches(), steps=3, tools=50)
    assert len(b.start(mw.ctx(), interrupt_after=[binding.TOOLS]).bodies) == 1
    out = b.go_on(mw.ctx())
    assert len(out.bodies) == 3 and len(out.received) == 3
    assert out.termination == fp.TerminationReason.STEP_BUDGET_EXHAUSTED.value
