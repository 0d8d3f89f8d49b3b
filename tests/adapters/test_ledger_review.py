"""Review of the PostgresLedger functions that walk the parent chain in a loop and fold the closed
check into the locking select (SCHEMA_VERSION 4 and later).

Each test runs on a real Postgres server (``FENCEPOST_TEST_POSTGRES_DSN``), with separate
sessions (one ledger, so one connection pool, per worker thread) contending for one chain. The
deadlock retry is switched off where the lock order is under test, so a cycle of waits fails the
test instead of being retried away.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fencepost.adapters import PostgresLedger, SqliteLedger, ledger_postgres
from fencepost.policy import AccountClosed, BudgetExhausted, Ledger, UnknownAccount




def _run_all(workers: list[Callable[[], None]]) -> None:
    """Start every worker at once and re-raise the first error any of them hit."""
    start = threading.Barrier(len(workers))
    errors: list[BaseException] = []

    def body(work: Callable[[], None]) -> None:
        start.wait()
        try:
            work()
        except BaseException as exc:  # handed to the test below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    if errors:
        raise errors[0]


def _chain(ledger: Ledger, depth: int) -> str:
    """``depth`` accounts, each the parent of the next; returns the deepest."""
    ledger.open_account("a0", {"cost": 10})
    for i in range(1, depth):
        ledger.open_account(f"a{i}", {}, parent=f"a{i - 1}")
    return f"a{depth - 1}"


@pytest.mark.parametrize("depth", [1001, 1002])
def test_postgres_walks_a_parent_chain_exactly_as_deep_as_sqlite_does(
    postgres_schema: str, tmp_path: Path, depth: int
) -> None:
    # The walk in a loop stopped at 1000 accounts where the recursive query it replaced (and the
    # SQLite backend) took 1001: a run nested one level deeper was refused as unknown_account
    # on Postgres only. Settling must refund every account the reservation charged.
    outcomes: list[Any] = []
    with PostgresLedger(postgres_schema) as pg:
        sqlite = SqliteLedger(tmp_path / "ledger.db")
        try:
            for ledger in (pg, sqlite):
                deepest = _chain(ledger, depth)
                try:
                    ledger.reserve(deepest, "k", {"cost": 3})
                except UnknownAccount as exc:
                    outcomes.append(("unknown", exc.args))
                    continue
                ledger.settle("k", {"cost": 1})
                outcomes.append(("held", ledger.balance("a0").held, ledger.balance(deepest).held))
        finally:
            sqlite.close()
    assert outcomes[0] == outcomes[1]
    if depth == 1001:
        assert outcomes[0] == ("held", {"cost": 1.0}, {"cost": 1.0})


def test_siblings_reserving_at_once_from_separate_sessions_never_overspend_their_parent(
    dsn: str,
) -> None:
    with PostgresLedger(dsn) as setup:
        setup.open_account("tenant", {"tool_calls": 30})
        for name in ("run-a", "run-b", "run-c"):
            setup.open_account(name, {"tool_calls": 20}, parent="tenant")
    held: dict[str, int] = {}

    def spender(account: str) -> Callable[[], None]:
        def work() -> None:
            with PostgresLedger(dsn) as ledger:
                count = 0
                for i in range(25):
                    try:
                        ledger.reserve(account, f"{account}-{i}", {"tool_calls": 1})
                        count += 1
                    except BudgetExhausted:
                        pass
                held[account] = count

        return work

    _run_all([spender(a) for a in ("run-a", "run-b", "run-c")])
    with PostgresLedger(dsn) as ledger:
        assert sum(held.values()) == 30
        assert ledger.balance("tenant").held == {"tool_calls": 30.0}
        for account, count in held.items():
            assert count <= 20
            assert ledger.balance(account).held == {"tool_calls": float(count)}


def test_reserve_settle_and_release_on_one_chain_take_their_locks_in_one_order(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Names chosen so the chain's order (nearest first) is not the lock order (by name), and
    # the two runs sit on either side of their parents: a function locking in chain order
    # would wait in a cycle with one locking by name.
    monkeypatch.setattr(ledger_postgres, "_RETRIED", ())  # a deadlock fails the test
    with PostgresLedger(dsn) as setup:
        setup.open_account("m-root", {"cost": 10_000})
        setup.open_account("k-team", {"cost": 10_000}, parent="m-root")
        setup.open_account("a-run", {"cost": 10_000}, parent="k-team")
        setup.open_account("z-run", {"cost": 10_000}, parent="k-team")

    def worker(account: str, finish: str) -> Callable[[], None]:
        def work() -> None:
            with PostgresLedger(dsn) as ledger:
                for i in range(120):
                    key = f"{account}-{finish}-{i}"
                    ledger.reserve(account, key, {"cost": 2})
                    if finish == "settle":
                        ledger.settle(key, {"cost": 1})
                    else:
                        ledger.release(key)

        return work

    _run_all(
        [
            worker("a-run", "settle"),
            worker("z-run", "release"),
            worker("k-team", "settle"),
            worker("z-run", "settle"),
        ]
    )
    with PostgresLedger(dsn) as ledger:
        # a-run settled 120 x 1, k-team 120 x 1, z-run 120 x 1 settled and 120 released.
        assert ledger.balance("m-root").held == {"cost": 360.0}
        assert ledger.balance("k-team").held == {"cost": 360.0}


def test_a_close_racing_reservations_is_seen_by_every_reservation_after_it(dsn: str) -> None:
    with PostgresLedger(dsn) as setup:
        setup.open_account("tenant", {"cost": 10_000})
        setup.open_account("run", {"cost": 10_000}, parent="tenant")
    closed = threading.Event()
    after_close: list[str] = []
    succeeded: list[str] = []

    def reserver() -> None:
        with PostgresLedger(dsn) as ledger:
            refused = 0
            for i in range(5000):
                started_after_close = closed.is_set()
                try:
                    ledger.reserve("run", f"k{i}", {"cost": 1})
                except AccountClosed as exc:
                    assert (exc.account, exc.reason) == ("tenant", "cancelled")
                    refused += 1
                    if refused == 20:
                        return
                    continue
                # Once refused, never again allowed; and nothing started after the close ran.
                assert not refused, f"k{i} reserved after a reservation saw the close"
                if started_after_close:
                    after_close.append(f"k{i}")
                succeeded.append(f"k{i}")

    def closer() -> None:
        with PostgresLedger(dsn) as ledger:
            while len(succeeded) < 50:
                threading.Event().wait(0.001)
            ledger.close_account("tenant", "cancelled")
            closed.set()

    _run_all([reserver, closer])
    assert after_close == []
    with PostgresLedger(dsn) as ledger:
        assert ledger.balance("tenant").held == {"cost": float(len(succeeded))}
        assert 50 <= len(succeeded) < 5000


def test_the_nearest_closed_account_is_named_whatever_the_names_sort_as(postgres_schema: str) -> None:
    # The locking select walks the chain by name; the account reported is the nearest.
    with PostgresLedger(postgres_schema) as ledger:
        ledger.open_account("a-tenant", {"cost": 5})
        ledger.open_account("b-team", {}, parent="a-tenant")
        ledger.open_account("z-run", {"cost": 5}, parent="b-team")
        ledger.close_account("a-tenant", "completed")
        ledger.close_account("b-team", "cancelled")
        with pytest.raises(AccountClosed) as caught:
            ledger.reserve("z-run", "k", {"cost": 1})
        assert (caught.value.account, caught.value.reason) == ("b-team", "cancelled")
        ledger.close_account("z-run", "budget_exhausted")
        with pytest.raises(AccountClosed) as caught:
            ledger.reserve("z-run", "k", {"cost": 1})
        assert (caught.value.account, caught.value.reason) == ("z-run", "budget_exhausted")
