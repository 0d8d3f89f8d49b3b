"""A tenant's spend window stops its runs when spent, the stop report saying which account and
which window stopped it and until when to wait; once the window resets its runs go on."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from fencepost.adapters import SqliteLedger
from fencepost.policy.deadline import FakeClock
from fencepost.policy.windows import Window
from tests.graph.kit import Calls, make_registry, thread
from tests.graph.test_token_holds import TENANT, TwoStepModel, budget, tenant_context

# 21:00 in Berlin: the tenant's day ends at 23:00 UTC.
EVENING = datetime(2026, 3, 2, 20, 0, tzinfo=UTC)
DAILY = Window(axis="tokens", limit=1000, period="day", tz="Europe/Berlin")


@pytest.fixture(params=["memory", "sqlite"])
def clocked(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[fp.Ledger, FakeClock]]:
    clock = FakeClock(EVENING)
    if request.param == "memory":
        yield fp.InMemoryLedger(clock=clock), clock
    else:
        with SqliteLedger(tmp_path / "ledger.db", clock=clock) as durable:
            yield durable, clock


def test_a_spent_daily_window_stops_the_tenants_next_run_naming_the_window(
    clocked: tuple[fp.Ledger, FakeClock],
) -> None:
    ledger, clock = clocked
    ledger.open_account(TENANT, {}, windows=[DAILY])
    graph = fp.build_agent_graph(make_registry(Calls()), TwoStepModel(500), ledger=ledger).compile(
        checkpointer=InMemorySaver()
    )

    def run() -> fp.AgentState:
        return fp.run_output(
            graph.invoke(fp.start("q", budget()), thread(), context=tenant_context())
        )

    assert run().termination is fp.TerminationReason.COMPLETED  # two steps of 500: the day's 1000
    stopped = run()
    assert stopped.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert stopped.last_error_code == "tokens_exhausted"
    report = stopped.report
    assert report is not None and report.budget is not None
    assert report.budget.account == TENANT
    assert report.budget.window == "tokens per day (Europe/Berlin)"
    assert report.budget.resets_at == datetime(2026, 3, 2, 23, 0, tzinfo=UTC)
    assert report.what_to_do is not None
    assert "wait until 2026-03-02T23:00:00+00:00" in report.what_to_do
    assert "tokens per day (Europe/Berlin)" in str(report)
    assert f"account {TENANT}" in str(report)

    clock.advance(3 * 3600)  # the next day in Berlin
    assert run().termination is fp.TerminationReason.COMPLETED
