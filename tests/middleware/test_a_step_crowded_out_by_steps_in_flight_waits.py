"""Busy is not exhausted, in the middleware binding: a model step the ledger cannot hold only
because other runs' steps in flight hold the shared pool waits for them (bounded by its
deadline), in the ledger's line, as the graph binding's decide node does; a run ends exhausted
only when what was spent leaves no room (DESIGN, "Budgets and the ledger")."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from langchain_core.messages import AIMessage

import fencepost as fp
from tests.middleware.kit import Ran, agent, ask, budget, chat, ctx, lc_tools, specs, thread

TENANT = "tenant"


class WatchedLedger(fp.InMemoryLedger):
    """Tells when steps read the tenant's pool twice while the first run's model step is in
    flight: a step of another run waiting for that room (a step reads it once per look)."""

    def __init__(self) -> None:
        super().__init__()
        self.first_in_model = threading.Event()
        self.another_waits = threading.Event()
        self._reads = 0
        self._lock = threading.Lock()

    def in_flight(self, account: str) -> dict[str, float]:
        if account == TENANT and self.first_in_model.is_set():
            with self._lock:
                self._reads += 1
                if self._reads >= 2:
                    self.another_waits.set()
        return super().in_flight(account)


def test_a_run_whose_step_another_runs_step_in_flight_crowds_out_waits_and_completes() -> None:
    ledger = WatchedLedger()
    ledger.open_account(TENANT, {"tokens": 600})  # one step's hold in flight, not two
    tools = lc_tools(Ran())
    tenant = ctx().model_copy(update={"budget_account": TENANT})

    def slow() -> Iterator[AIMessage]:
        ledger.first_in_model.set()
        # In flight until the other run is seen waiting (or long past what that takes).
        ledger.another_waits.wait(20)
        yield AIMessage("checkout is down")

    def run(script: Iterator[AIMessage]) -> dict[str, Any]:
        guard = fp.FencepostMiddleware(
            specs(tools), budget=budget(), ledger=ledger, tokens_per_step=200
        )
        out: dict[str, Any] = agent(chat(script), tools, [guard]).invoke(
            ask(), thread(), context=tenant
        )
        return out

    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(run, slow())
        assert ledger.first_in_model.wait(20)
        second = run(iter([AIMessage("the database is down")]))
        assert first.result()["termination"] == "completed"
    assert ledger.another_waits.is_set()
    assert (second["termination"], second["last_error_code"]) == ("completed", None)
