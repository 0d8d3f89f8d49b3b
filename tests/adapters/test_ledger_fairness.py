"""Durable ledgers under contention: fair, never overspent, and opened by many at once.

8 spawned processes, each with its own run account under ONE tenant account that can hold only
half of what they ask for (8 x 50 attempts against a limit of 200), all start at the same instant
and reserve in a tight loop. Every process must get at least a quarter of its fair share (200 / 8
= 25, so at least 7), and the tenant must hold exactly its limit: not one reservation more.
Throughput is the benchmark's business (``benchmarks/ledger_throughput.py``), never asserted here.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import pytest

from fencepost.adapters import PostgresLedger, SqliteLedger
from fencepost.policy.budget import BudgetExhausted
from fencepost.policy.ledger import Ledger

# `make test` runs this module on its own, before the rest of the suite goes to its two parallel
# workers: a lane that is not running gets nothing, and a test beside it in the other worker would
# take a core from the race (the SQLite ledger's waiters queue in the kernel, see the fairness note
# in fencepost.adapters.ledger_sqlite, but a lane still has to be scheduled to join the queue).
pytestmark = pytest.mark.serial

PROCESSES = 8
ATTEMPTS = 50
LIMIT = PROCESSES * ATTEMPTS // 2
FAIR_SHARE = LIMIT // PROCESSES


def _open_sqlite(path: str) -> Ledger:
    return SqliteLedger(path)


def _open_postgres(dsn: str) -> Ledger:
    return PostgresLedger(dsn, min_size=1, max_size=1)


def _contend(opener: Callable[[], Ledger], lane: int, start_at: float) -> int:
    """Reserve ``ATTEMPTS`` times on this lane's account from ``start_at``; how many were granted."""
    ledger = opener()
    granted = 0
    try:
        time.sleep(max(0.0, start_at - time.time()))
        for i in range(ATTEMPTS):
            try:
                ledger.reserve(f"run-{lane}", f"lane{lane}-call{i}", {"tool_calls": 1})
            except BudgetExhausted:
                continue
            granted += 1
        return granted
    finally:
        assert isinstance(ledger, SqliteLedger | PostgresLedger)
        ledger.close()


def _warm(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


@pytest.fixture(scope="module")
def processes() -> Iterator[ProcessPoolExecutor]:
    # Spawned, not forked from tests.conftest.worker_processes like the other races: forked so,
    # the SQLite race came out unfair on a loaded machine in two runs of three (one lane 6 of 50),
    # spawned it held; why is not known yet.
    pool = ProcessPoolExecutor(
        max_workers=PROCESSES, mp_context=multiprocessing.get_context("spawn")
    )
    # Every worker started and imported before a race: a round answered by fewer than all of
    # them (the first ready took a second item while another was still importing) is repeated,
    # else a late lane starts after the others have spent the limit ([50, 50, 50, 50, 0, ...]).
    for _ in range(20):
        if len(set(pool.map(_warm, [0.3] * PROCESSES))) == PROCESSES:
            break
    yield pool
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(params=["sqlite", "postgres"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Ledger]:
    if request.param == "sqlite":
        return partial(_open_sqlite, str(tmp_path / "ledger.db"))
    return partial(_open_postgres, request.getfixturevalue("postgres_schema"))


def test_eight_contending_processes_each_get_a_quarter_of_their_fair_share_and_never_overspend(
    opener: Callable[[], Ledger], processes: ProcessPoolExecutor
) -> None:
    ledger = opener()
    try:
        ledger.open_account("tenant", {"tool_calls": LIMIT})
        for lane in range(PROCESSES):
            ledger.open_account(f"run-{lane}", {}, parent="tenant")
        start_at = time.time() + 0.5
        futures = [processes.submit(_contend, opener, lane, start_at) for lane in range(PROCESSES)]
        granted = [future.result(timeout=120) for future in futures]
        assert sum(granted) == LIMIT
        assert ledger.balance("tenant").held == {"tool_calls": float(LIMIT)}
        for lane, count in enumerate(granted):
            assert ledger.balance(f"run-{lane}").held.get("tool_calls", 0.0) == count
        assert min(granted) * 4 >= FAIR_SHARE, f"unfair: {sorted(granted)} (fair {FAIR_SHARE})"
    finally:
        assert isinstance(ledger, SqliteLedger | PostgresLedger)
        ledger.close()


def _open_and_reserve(path: str, lane: int, start_at: float) -> int:
    time.sleep(max(0.0, start_at - time.time()))
    with SqliteLedger(path) as ledger:  # every lane creates, migrates and switches to WAL at once
        ledger.open_account("run", {"tool_calls": 1000})
        for i in range(10):
            ledger.reserve("run", f"lane{lane}-call{i}", {"tool_calls": 1})
    return lane


def test_eight_processes_opening_one_new_sqlite_file_at_once_all_get_a_working_ledger(
    tmp_path: Path, processes: ProcessPoolExecutor
) -> None:
    # While one process recovers or sets up the file, the others see SQLITE_BUSY_RECOVERY and
    # friends (extended busy codes): each must wait and go on, never fail with "locked".
    for trial in range(2):
        path = str(tmp_path / f"ledger-{trial}.db")
        start_at = time.time() + 0.3
        futures = [
            processes.submit(_open_and_reserve, path, lane, start_at) for lane in range(PROCESSES)
        ]
        assert sorted(future.result(timeout=120) for future in futures) == list(range(PROCESSES))
        with SqliteLedger(path) as ledger:
            assert ledger.balance("run").held == {"tool_calls": 10.0 * PROCESSES}
