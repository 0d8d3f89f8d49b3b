"""Spend windows under many processes: eight processes reserving and settling on runs of
one tenant never take its window past its limit, on SQLite (one file) and Postgres (one server).

The window is rolling over a day, so no reset falls inside the race; the books are checked after
it: what the window holds is exactly what the granted reservations kept, and never more than its
limit (each grant saw the window with every earlier one in it; none is given back).
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest

from fencepost.adapters import PostgresLedger, SqliteLedger
from fencepost.policy.budget import BudgetExhausted
from fencepost.policy.ledger import Ledger
from fencepost.policy.windows import Window
from tests.conftest import worker_processes

PROCESSES = 8
PER_PROCESS = 15
LIMIT = 100.0
WINDOW = Window(axis="tokens", limit=LIMIT, period=timedelta(days=1))


def _open(kind: str, where: str) -> Ledger:
    return SqliteLedger(where) if kind == "sqlite" else PostgresLedger(where, max_size=1)


def _spend(kind: str, where: str, lane: int, start_at: float) -> list[tuple[str, float | None]]:
    """One process: reserve 1-9 tokens at a time on its own run, settling each grant in full
    (nothing given back could hide an overdraw); ``(key, kept)`` per call (``None``: refused
    by the window)."""
    rnd = random.Random(lane)
    out: list[tuple[str, float | None]] = []
    ledger = _open(kind, where)
    try:
        time.sleep(max(0.0, start_at - time.time()))
        for i in range(PER_PROCESS):
            key = f"lane{lane}-{i}"
            amount = float(rnd.randint(1, 9))
            try:
                ledger.reserve(f"run-{lane}", key, {"tokens": amount})
            except BudgetExhausted as error:
                assert (error.account, error.window) == ("tenant", WINDOW.label)
                out.append((key, None))
                continue
            ledger.settle(key, {"tokens": amount})
            out.append((key, amount))
    finally:
        ledger.close()  # type: ignore[attr-defined]
    return out


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "sqlite":
        return "sqlite", str(tmp_path / "ledger.db")
    return "postgres", request.getfixturevalue("postgres_schema")


def test_many_processes_never_take_a_window_past_its_limit(where: tuple[str, str]) -> None:
    kind, place = where
    ledger = _open(kind, place)
    try:
        ledger.open_account("tenant", {}, windows=[WINDOW])
        for lane in range(PROCESSES):
            ledger.open_account(f"run-{lane}", {}, parent="tenant")
        start_at = time.time() + 3
        with ProcessPoolExecutor(max_workers=PROCESSES, mp_context=worker_processes()) as pool:
            futures = [
                pool.submit(_spend, kind, place, lane, start_at) for lane in range(PROCESSES)
            ]
            results = [row for f in futures for row in f.result(timeout=300)]
        kept = [amount for _, amount in results if amount is not None]
        (use,) = ledger.balance("tenant").windows
        assert use.held == sum(kept)  # every grant counted once
        assert sum(kept) <= LIMIT  # ...and together never more than the window allows
        assert sum(kept) > LIMIT - 9  # a refused request (9 at most) found it nearly full
        assert ledger.balance("tenant").held == {"tokens": sum(kept)}
        assert any(amount is None for _, amount in results)  # the window was pressed
    finally:
        ledger.close()  # type: ignore[attr-defined]
