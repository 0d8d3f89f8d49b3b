"""PostgresLedger under concurrency: sessions and processes racing on one account chain.

Every test runs on a real Postgres server (``FENCEPOST_TEST_POSTGRES_DSN``), in a fresh schema,
with separate sessions (one ledger, so one connection pool, per worker) contending for one chain.
Races are made deterministic where it matters: a session of the test's own holds the locks a
reservation needs, the test waits until the ledger's session is seen waiting on them
(``pg_stat_activity``), then lets go. Where the lock order is under test the deadlock retry is
switched off, so a cycle of waits fails the test instead of being retried away.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import psycopg
import pytest

from fencepost.adapters import PostgresLedger, ledger_postgres
from fencepost.policy import AccountClosed, BudgetExhausted
from tests.conftest import worker_processes


@pytest.fixture
def dsn(postgres_schema: str) -> Iterator[str]:
    # Every session of the test names itself, so the waits it looks for and the session it
    # kills are its own, never another test run's on the same server.
    named = f"{postgres_schema}&application_name={_APP}"
    with PostgresLedger(named):  # set up once, before any session races
        pass
    yield named


_APP = f"fp-concurrency-{uuid.uuid4().hex[:12]}"


def _waiting_on_a_lock(dsn: str, function: str, timeout: float = 10) -> None:
    """Return once a session of this test is seen waiting on a lock inside ``function``.

    Looked for from a session of its own, in autocommit: inside a transaction pg_stat_activity
    is a snapshot taken at its first read, and would never show the wait begin.
    """
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as watcher:
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND application_name = %s AND query LIKE %s",
                (_APP, f"%{function}%"),
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.01)
    raise AssertionError(f"no session waited on a lock in {function}")


def _in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["value"] = work()
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=body)
    thread.start()
    return thread, out


# -- a key reserved while this reservation waited ----------------------------------------------


def test_a_key_reserved_while_this_reservation_waited_returns_existing_not_exhausted(
    dsn: str,
) -> None:
    with PostgresLedger(dsn) as ledger, psycopg.connect(dsn) as other:
        ledger.open_account("run", {"tool_calls": 1})
        other.execute(
            "SELECT * FROM fencepost_ledger_reserve('run', 'K', '{tool_calls}', '{1}')"
        )  # its transaction stays open: K is not visible, the account row is locked
        thread, out = _in_thread(lambda: ledger.reserve("run", "K", {"tool_calls": 1}))
        _waiting_on_a_lock(dsn, "fencepost_ledger_reserve")
        other.commit()
        thread.join(30)
        assert "error" not in out, out.get("error")
        assert out["value"].existing and out["value"].amounts == {"tool_calls": 1.0}


def test_a_key_reserved_before_a_racing_close_returns_existing_not_closed(dsn: str) -> None:
    with PostgresLedger(dsn) as ledger, psycopg.connect(dsn) as other:
        ledger.open_account("run", {"tool_calls": 5})
        other.execute("SELECT * FROM fencepost_ledger_reserve('run', 'K', '{}', '{}')")  # a marker
        other.execute("SELECT * FROM fencepost_ledger_close('run', 'completed')")
        thread, out = _in_thread(lambda: ledger.reserve("run", "K", {}))
        _waiting_on_a_lock(dsn, "fencepost_ledger_reserve")
        other.commit()
        thread.join(30)
        assert "error" not in out, out.get("error")
        assert out["value"].existing


def test_a_key_another_account_inserted_while_this_one_waited_is_a_conflict(dsn: str) -> None:
    # The ON CONFLICT path: chains apart (no shared lock), so the insert itself waits for S.
    from fencepost.policy import LedgerConflict

    with PostgresLedger(dsn) as ledger, psycopg.connect(dsn) as other:
        ledger.open_account("run-a", {"tool_calls": 5})
        ledger.open_account("run-b", {"tool_calls": 5})
        other.execute("SELECT * FROM fencepost_ledger_reserve('run-a', 'K', '{tool_calls}', '{1}')")
        thread, out = _in_thread(lambda: ledger.reserve("run-b", "K", {"tool_calls": 1}))
        _waiting_on_a_lock(dsn, "fencepost_ledger_reserve")
        other.commit()
        thread.join(30)
        assert isinstance(out.get("error"), LedgerConflict), out
        assert ledger.balance("run-b").held == {}  # nothing charged for the refused key
        assert ledger.balance("run-a").held == {"tool_calls": 1.0}


# -- many sessions and processes on one chain --------------------------------------------------


PROCESSES = 6
THREADS = 3
LIMIT = 25
PER_THREAD = 12


def _spend(dsn: str, lane: int, start_at: float) -> list[tuple[str, str, str]]:
    """One process: THREADS sessions reserving their own keys, keys shared with every lane on
    one account, and keys shared across accounts; returns (key, account, outcome) per call."""
    from fencepost.policy import LedgerConflict

    out: list[tuple[str, str, str]] = []
    lock = threading.Lock()
    with PostgresLedger(dsn, max_size=THREADS) as ledger:

        def session(t: int) -> None:
            own = f"run-{lane}-{t}"
            rnd = random.Random(lane * 100 + t)
            calls = [(own, f"own-{lane}-{t}-{i}") for i in range(PER_THREAD)]
            calls += [("run-shared", f"shared-{i}") for i in range(PER_THREAD)]
            calls += [(own, f"contested-{i}") for i in range(PER_THREAD // 2)]
            rnd.shuffle(calls)
            time.sleep(max(0.0, start_at - time.time()))
            for account, key in calls:
                try:
                    got = ledger.reserve(account, key, {"tool_calls": 1})
                    outcome = "existing" if got.existing else "ok"
                except BudgetExhausted:
                    outcome = "exhausted"
                except LedgerConflict:
                    outcome = "conflict"
                with lock:
                    out.append((key, account, outcome))

        threads = [threading.Thread(target=session, args=(t,)) for t in range(THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
    return out


def test_many_processes_reserving_on_one_shared_parent_grant_exactly_its_limit(dsn: str) -> None:
    with PostgresLedger(dsn) as ledger:
        ledger.open_account("tenant", {"tool_calls": LIMIT})
        ledger.open_account("run-shared", {}, parent="tenant")
        for lane in range(PROCESSES):
            for t in range(THREADS):
                ledger.open_account(f"run-{lane}-{t}", {"tool_calls": 4}, parent="tenant")
        start_at = time.time() + 3
        with ProcessPoolExecutor(max_workers=PROCESSES, mp_context=worker_processes()) as pool:
            futures = [pool.submit(_spend, dsn, lane, start_at) for lane in range(PROCESSES)]
            results = [row for f in futures for row in f.result(timeout=300)]
        granted = [(key, account) for key, account, outcome in results if outcome == "ok"]
        assert len(granted) == LIMIT  # never more than the parent holds, and all of it used
        assert ledger.balance("tenant").held == {"tool_calls": float(LIMIT)}
        assert Counter(key for key, _ in granted).most_common(1)[0][1] == 1  # a key charged once
        by_account = Counter(account for _, account in granted)
        for account, count in by_account.items():
            assert ledger.balance(account).held == {"tool_calls": float(count)}
            if account != "run-shared":
                assert count <= 4
        holders = {key: account for key, account in granted}
        for key, account, outcome in results:
            if outcome == "existing":
                assert holders[key] == account
            if outcome == "conflict":
                assert key in holders and holders[key] != account
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT count(*), count(DISTINCT key) FROM fencepost_ledger_reservations"
            ).fetchone()
        assert rows == (LIMIT, LIMIT)


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


# -- connections: a deadlock retried, a session killed mid-call --------------------------------


def test_a_deadlock_retried_returns_its_connection_and_charges_once(dsn: str) -> None:
    # S locks the parent; reserve locks the run (name order: a-run < z-parent) and waits on the
    # parent; S then asks for the run: a cycle. S waits 20 s before looking for deadlocks, so the
    # ledger's session is the one aborted, and retries on the same (one-connection) pool.
    with PostgresLedger(dsn, min_size=1, max_size=1) as ledger, psycopg.connect(dsn) as other:
        ledger._pool.timeout = 5  # a connection not given back fails fast, not in 30 s
        ledger.open_account("z-parent", {"cost": 10})
        ledger.open_account("a-run", {"cost": 10}, parent="z-parent")
        other.execute("SET deadlock_timeout = '20s'")
        other.execute(
            "SELECT 1 FROM fencepost_ledger_accounts WHERE name = 'z-parent' FOR NO KEY UPDATE"
        )
        thread, out = _in_thread(lambda: ledger.reserve("a-run", "k1", {"cost": 1}))
        _waiting_on_a_lock(dsn, "fencepost_ledger_reserve")
        other.execute(
            "SELECT 1 FROM fencepost_ledger_accounts WHERE name = 'a-run' FOR NO KEY UPDATE"
        )  # granted once the ledger's session is aborted as the deadlock's victim
        other.commit()
        thread.join(30)
        assert "error" not in out, out.get("error")
        assert not out["value"].existing
        assert ledger.balance("z-parent").held == {"cost": 1.0}
        assert ledger.balance("a-run").held == {"cost": 1.0}
        stats = ledger._pool.get_stats()
        assert stats["pool_available"] == 1 and stats.get("requests_waiting", 0) == 0


def test_a_session_killed_mid_reserve_is_replaced_and_the_pool_stays_usable(dsn: str) -> None:
    with PostgresLedger(dsn, min_size=1, max_size=1) as ledger, psycopg.connect(dsn) as other:
        ledger._pool.timeout = 5
        ledger.open_account("run", {"cost": 10})
        other.execute(
            "SELECT 1 FROM fencepost_ledger_accounts WHERE name = 'run' FOR NO KEY UPDATE"
        )
        thread, out = _in_thread(lambda: ledger.reserve("run", "k1", {"cost": 1}))
        _waiting_on_a_lock(dsn, "fencepost_ledger_reserve")
        with psycopg.connect(dsn, autocommit=True) as killer:  # a fresh pg_stat_activity
            killer.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event_type ="
                " 'Lock' AND application_name = %s AND query LIKE '%%fencepost_ledger_reserve%%'",
                (_APP,),
            )
        other.rollback()
        thread.join(30)
        assert isinstance(out.get("error"), psycopg.OperationalError), out
        # The broken connection went back to the pool (which replaced it); nothing was charged.
        assert ledger.balance("run").held == {}
        assert ledger.reserve("run", "k1", {"cost": 1}).existing is False
        assert ledger.balance("run").held == {"cost": 1.0}
