"""Every graph object on one saver shares one budget truth; a run's limits and owner come from it.

DESIGN, budgets: the ledger is the one budget truth, and ``RuntimeBudget`` in state is only its
view; isolation: the identity bound to a thread at start cannot be changed by a state update, and
cancel from any thread stops a run before its next tool. An app that builds its agent per
request (``create_agent``/``build_agent_graph`` with no ledger) on one module-level
``InMemorySaver`` gets one in-memory ledger per saver object, so a second graph object finds the
run's account as the first left it: a budget view raised by ``update_state`` is never a limit,
another tenant's resume never runs the paused write, and a cancel through it stops the run.

A ledger that has never seen a run (an explicit fresh one, beside checkpoints that outlived the
ledger they were written with) never re-opens it from state: the resume ends ``policy_denied``,
``unknown_budget_account``, and nothing runs.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.policy.tool_decorator import tool
from tests.graph.kit import ABSTAIN, Calls, budget, call, context, make_registry, thread

KEY = b"a-secret-the-operator-keeps-0123"


def searches(first: int, last: int) -> list[fp.ToolProposal]:
    """Distinct searches (never a repeat), numbered ``first`` to ``last``."""
    return [call("search_logs", n) for n in range(first, last + 1)]


class App:
    """An app that builds its agent per request on one module-level saver: one model, one
    registry, a new graph object for every request."""

    def __init__(self, script: list[Any], saver: Any, **build: Any) -> None:
        self.calls = Calls()
        self.registry = make_registry(self.calls)
        self.model = ScriptedDecisionModel(script)
        self.saver = saver
        self.build = build

    def agent(self) -> Any:
        """The graph one request builds: nothing passed that names a ledger."""
        return fp.build_agent_graph(self.registry, self.model, **self.build).compile(
            checkpointer=self.saver
        )


@pytest.fixture
def saver() -> InMemorySaver:
    return InMemorySaver()


def test_a_limit_raised_by_update_state_through_a_second_graph_never_raises_the_limit(
    saver: InMemorySaver,
) -> None:
    app = App(
        [call("write_note", 1, note="a"), *searches(2, 14), ABSTAIN], saver, approval="interrupt"
    )
    config, owner = thread(), context()
    app.agent().invoke(fp.start("q", budget(steps=20, tools=3)), config, context=owner)
    assert app.agent().get_state(config).next == ("approve",)

    second = app.agent()
    raised = fp.RuntimeBudget(steps_remaining=100, tool_calls_remaining=100)
    second.update_state(config, {"run": {"budget": raised.model_dump(mode="json")}})
    out = app.agent().invoke(Command(resume="approve"), config, context=owner)

    state = fp.run_output(out)
    assert len(app.calls.log) == 3  # the write and two searches: the limit the run started with
    assert state.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED


@pytest.mark.parametrize("key", [None, KEY], ids=["unsealed", "sealed"])
def test_another_tenants_resume_through_a_second_graph_never_runs_the_paused_write(
    saver: InMemorySaver, key: bytes | None
) -> None:
    app = App(
        [call("write_note", 1, note="a"), ABSTAIN], saver, approval="interrupt", verdict_key=key
    )
    config = thread()
    app.agent().invoke(fp.start("q", budget()), config, context=context(tenant="acme"))

    globex = context(tenant="globex", principal="u-9")
    update = {"run": {"tenant_id": "globex", "principal_id": "u-9"}}
    # The rewrite as an update of its own (with the answer, it is refused before anything is
    # saved), then the answer, each through a graph object of its own.
    app.agent().invoke(Command(update=update), config, context=globex)
    out = app.agent().invoke(Command(resume="approve"), config, context=globex)

    # Judged against the owner the shared ledger recorded, not the state the update rewrote:
    # the answer is not taken, and the run still waits for its own tenant.
    assert app.calls.count("write_note") == 0
    assert out["__interrupt__"][0].value["error"]["code"] == "wrong_tenant"
    assert fp.run_output(out).termination is None


def test_a_cancel_through_a_second_graph_stops_the_run_before_its_next_tool(
    saver: InMemorySaver,
) -> None:
    entered, release = threading.Event(), threading.Event()
    calls = Calls()

    @tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=30)
    def slow_search(query: str, ctx: fp.ToolContext) -> Any:
        """Search logs, slowly."""
        calls.log.append(("slow_search", {"query": query}, ctx.idempotency_key))
        entered.set()
        assert release.wait(20)
        return {"hits": [query]}

    model = ScriptedDecisionModel(
        [call("slow_search", n, query=f"q{n}") for n in range(1, 7)] + [ABSTAIN]
    )
    registry = fp.ToolRegistry([slow_search])

    def agent() -> Any:
        return fp.build_agent_graph(registry, model).compile(checkpointer=saver)

    config, owner = thread(), context()
    running = agent()
    outcome: list[fp.AgentState] = []
    runner = threading.Thread(
        target=lambda: outcome.append(
            fp.run_output(
                running.invoke(
                    fp.start("q", budget(steps=10, tools=6)),
                    config,
                    context=owner,
                    # cancel finds a run through its thread's checkpoints; saved in the
                    # background (the default), the first may not be there yet on a busy machine
                    durability="sync",
                )
            )
        )
    )
    runner.start()
    try:
        assert entered.wait(20)
        returned = fp.cancel(agent(), config, context=owner)
    finally:
        release.set()
        runner.join(30)
    assert not runner.is_alive()
    assert returned is not None and returned.termination is fp.TerminationReason.CANCELLED
    assert len(calls.log) == 1  # the call running when the cancel came, and no other
    (ended,) = outcome
    assert ended.termination is fp.TerminationReason.CANCELLED


def test_create_agent_per_request_on_one_saver_keeps_the_runs_limit(
    saver: InMemorySaver,
) -> None:
    calls = Calls()
    registry = make_registry(calls)
    model = ScriptedDecisionModel([call("write_note", 1, note="a"), *searches(2, 9), ABSTAIN])
    config, owner = thread(), context()

    def agent() -> Any:
        return fp.create_agent(model, registry, checkpointer=saver, approval="interrupt")

    agent().invoke(fp.start("q", budget(steps=12, tools=2)), config, context=owner)
    raised = fp.RuntimeBudget(steps_remaining=50, tool_calls_remaining=50)
    agent().update_state(config, {"run": {"budget": raised.model_dump(mode="json")}})
    out = agent().invoke(Command(resume="approve"), config, context=owner)
    assert len(calls.log) == 2
    assert fp.run_output(out).termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED


# -- a ledger that never saw a run refuses it ----------------------------------------------------


@pytest.fixture
def runs_db(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "runs.db"


def _sqlite(path: Path) -> SqliteSaver:
    return SqliteSaver(sqlite3.connect(path, check_same_thread=False))


@pytest.mark.parametrize("key", [None, KEY], ids=["unsealed", "sealed"])
def test_a_ledger_that_never_saw_a_paused_run_refuses_its_resume_typed(
    runs_db: Path, key: bytes | None
) -> None:
    calls = Calls()
    registry = make_registry(calls)
    model = ScriptedDecisionModel([call("write_note", 1, note="a"), ABSTAIN, ABSTAIN])
    config, owner = thread(), context()
    first = _sqlite(runs_db)
    try:
        fp.build_agent_graph(
            registry, model, approval="interrupt", ledger=fp.InMemoryLedger(), verdict_key=key
        ).compile(checkpointer=first).invoke(fp.start("q", budget()), config, context=owner)
    finally:
        first.conn.close()

    # A new process: the checkpoints outlived the in-memory ledger they were written with.
    second = _sqlite(runs_db)
    try:
        graph = fp.build_agent_graph(
            registry, model, approval="interrupt", ledger=fp.InMemoryLedger(), verdict_key=key
        ).compile(checkpointer=second)
        assert graph.get_state(config).next == ("approve",)
        out = graph.invoke(Command(resume="approve"), config, context=owner)
    finally:
        second.conn.close()
    state = fp.run_output(out)
    assert calls.count("write_note") == 0
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "unknown_budget_account"


def test_a_ledger_that_never_saw_a_run_refuses_to_continue_it_typed(runs_db: Path) -> None:
    calls = Calls()
    registry = make_registry(calls)
    model = ScriptedDecisionModel([call("search_logs", 1), *searches(2, 5), ABSTAIN])
    config, owner = thread(), context()
    first = _sqlite(runs_db)
    try:
        fp.build_agent_graph(registry, model, ledger=fp.InMemoryLedger()).compile(
            checkpointer=first, interrupt_after=["execute"]
        ).invoke(fp.start("q", budget()), config, context=owner)
    finally:
        first.conn.close()
    assert len(calls.log) == 1

    second = _sqlite(runs_db)
    try:
        out = (
            fp.build_agent_graph(registry, model, ledger=fp.InMemoryLedger())
            .compile(checkpointer=second)
            .invoke(None, config, context=owner)
        )
    finally:
        second.conn.close()
    state = fp.run_output(out)
    assert len(calls.log) == 1
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "unknown_budget_account"


def test_two_graphs_on_one_sqlite_file_already_share_the_runs_account(runs_db: Path) -> None:
    calls = Calls()
    registry = make_registry(calls)
    model = ScriptedDecisionModel([call("write_note", 1, note="a"), *searches(2, 9), ABSTAIN])
    config, owner = thread(), context()
    saver = _sqlite(runs_db)
    try:

        def agent() -> Any:
            return fp.build_agent_graph(registry, model, approval="interrupt").compile(
                checkpointer=saver
            )

        agent().invoke(fp.start("q", budget(steps=12, tools=2)), config, context=owner)
        raised = fp.RuntimeBudget(steps_remaining=50, tool_calls_remaining=50)
        agent().update_state(config, {"run": {"budget": raised.model_dump(mode="json")}})
        out = agent().invoke(Command(resume="approve"), config, context=owner)
    finally:
        saver.conn.close()
    assert len(calls.log) == 2
    assert fp.run_output(out).termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
