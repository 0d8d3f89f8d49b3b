"""Hostile review of cc5946f: PostgresLedger's rewritten ``fencepost_ledger_reserve`` (schema 5),
its array literals built in Python, and getconn/putconn in place of ``pool.connection()``.

Every test runs on a real Postgres server (``FENCEPOST_TEST_POSTGRES_DSN``), in a fresh schema.
Races are made deterministic where it matters: a session of the test's own holds the locks a
reservation needs, the test waits until the ledger's session is seen waiting on them
(``pg_stat_activity``), then lets go. The probe that found a bug (a key reserved by the
transaction a reservation waited on came back exhausted or closed, not existing: fixed in schema
6) now passes; the others pin a rule worth keeping.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import multiprocessing
import random
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

from fencepost.adapters import PostgresLedger
from fencepost.adapters.ledger_postgres import SCHEMA_VERSION, _float_array, _text_array
from fencepost.policy import BudgetExhausted
from fencepost.policy.ledger import (
    MAX_NAME_LENGTH,
    AccountClosed,
    InMemoryLedger,
    InvalidLedgerKey,
    Ledger,
    validate_name,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def dsn(postgres_schema: str) -> Iterator[str]:
    # Every session of the test names itself, so the waits it looks for and the session it
    # kills are its own, never another test run's on the same server.
    named = f"{postgres_schema}&application_name={_APP}"
    with PostgresLedger(named):  # set up once, before any session races
        pass
    yield named


_APP = f"hostile7-{uuid.uuid4().hex[:12]}"


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


# === idempotency under a race =====================================================================


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


# === many sessions, many processes, one shared parent =============================================

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
        with ProcessPoolExecutor(
            max_workers=PROCESSES, mp_context=multiprocessing.get_context("spawn")
        ) as pool:
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


# === connections: a deadlock retried, a session killed mid-call ==================================


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


# === the array literals =========================================================================


def _odd_names(count: int) -> list[str]:
    rnd = random.Random(5)
    alphabet = "{}\",\\ 'NULLnul\t[]:=$();"
    names = [
        '"',
        "\\",
        '\\"',
        "{",
        "}",
        ",",
        "{}",
        "{a,b}",
        '"{a,b}"',
        "NULL",
        " NULL ",
        "null",
        " ",
        "  lead and trail  ",
        "\u00a0",
        "\u2028",
        "\ufeff",
        "\u200b",
        "é",
        "😀",
        "\U0010ffff",
        "[1:1]={a}",
        "$$",
        "'",
        "a b",
        "x" * MAX_NAME_LENGTH,
        "😀" * MAX_NAME_LENGTH,
    ]
    while len(names) < count:
        n = rnd.randint(1, 30)
        names.append(
            "".join(
                rnd.choice(alphabet)
                if rnd.random() < 0.5
                else chr(
                    rnd.choice(
                        [
                            rnd.randint(0x20, 0x7E),
                            rnd.randint(0xA0, 0xD7FF),
                            rnd.randint(0xE000, 0x10FFFF),
                        ]
                    )
                )
                for _ in range(n)
            )
        )
    valid = []
    for name in names:
        with contextlib.suppress(InvalidLedgerKey):
            valid.append(validate_name(name, "axis"))
    return list(dict.fromkeys(valid))


def _odd_amounts(count: int) -> list[float]:
    rnd = random.Random(9)
    amounts = [
        0.0,
        -0.0,
        5e-324,
        2.2250738585072014e-308,
        2.225073858507201e-308,
        1e-320,
        1.7976931348623157e308,
        math.inf,
        0.1,
        1 / 3,
        2.0**53 + 2,
        1e16,
        1e22,
        1e23,
    ]
    while len(amounts) < count:
        bits = rnd.getrandbits(63)  # sign bit clear: non-negative, as validate_amounts wants
        value = struct.unpack("<d", struct.pack("<Q", bits))[0]
        if not math.isnan(value):
            amounts.append(value)
    return amounts


def test_every_valid_axis_name_and_amount_reads_back_from_its_array_literal(postgres_schema: str) -> None:
    names, amounts = _odd_names(3000), _odd_amounts(3000)
    with psycopg.connect(postgres_schema) as conn:
        for i in range(0, len(names), 250):
            chunk = names[i : i + 250]
            row = conn.execute("SELECT %s::text[]", (_text_array(chunk),)).fetchone()
            assert row is not None and row[0] == chunk
        row = conn.execute("SELECT %s::float8[]", (_float_array(amounts),)).fetchone()
        assert row is not None
        for sent, got in zip(amounts, row[0], strict=True):
            assert got == sent and math.copysign(1, got) == math.copysign(1, sent), sent


def test_odd_names_and_amounts_reserve_settle_and_balance_as_the_in_memory_ledger(
    postgres_schema: str,
) -> None:
    names = _odd_names(400)[:120]
    amounts = [a for a in _odd_amounts(400) if a < 1e300][:120]

    def script(book: Ledger) -> list[Any]:
        out: list[Any] = []
        limits = {name: 1e300 for name in names[:60]}  # the rest are unlimited axes
        book.open_account("tenant", limits)
        book.open_account("run", dict(reversed(list(limits.items()))), parent="tenant")
        for k in range(0, 120, 15):
            request = dict(zip(names[k : k + 15], amounts[k : k + 15], strict=True))
            got = book.reserve("run", f"key-{k}", request)
            out.append((got.amounts, got.balance))
            out.append(book.reserve("run", f"key-{k}", request).balance)
            out.append(book.reserve("run", f"marker-{k}", {}).balance)
        out.append(book.settle("key-0", dict.fromkeys(names[:15], 0.0)).amounts)
        out.append((book.balance("tenant"), book.balance("run")))
        return out

    with PostgresLedger(postgres_schema) as ledger:
        assert script(ledger) == script(InMemoryLedger())


# === an in-place upgrade from version 4 ===========================================================


def _version_4() -> ModuleType:
    """The ledger module as 8f704dd left it (SCHEMA_VERSION 4), from git."""
    try:
        source = subprocess.run(
            ["git", "show", "8f704dd:fencepost/adapters/ledger_postgres.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git history with 8f704dd is not available")
    spec = importlib.util.spec_from_loader("_ledger_postgres_v4", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_ledger_postgres_v4"] = module
    exec(compile(source, "ledger_postgres_v4.py", "exec"), module.__dict__)
    assert module.SCHEMA_VERSION == 4

    class PostgresLedgerV4(module.PostgresLedger):  # type: ignore[misc,name-defined]
        """The old class under today's port, which has since grown ``charge``."""

        def charge(self, account: str, key: str, amounts: Any) -> Any:
            raise NotImplementedError("version 4 had no charge")

    module.PostgresLedger = PostgresLedgerV4
    return module


def test_a_version_4_database_upgraded_in_place_keeps_its_books_and_its_old_clients(
    postgres_schema: str,
) -> None:
    v4 = _version_4()
    with v4.PostgresLedger(postgres_schema, min_size=1, max_size=1) as old:
        old.open_account("tenant", {"cost": 10, "tool_calls": 5}, owner={"tenant": "acme"})
        old.open_account("run", {"tool_calls": 3, "cost": 8}, parent="tenant")
        old.open_account("done", {"cost": 1}, parent="tenant")
        for i in range(8):  # past psycopg's prepare threshold: the old session holds plans
            old.reserve("run", f"k{i}", {"cost": 0.5} if i else {"cost": 1, "tool_calls": 1})
        old.reserve("done", "d1", {})
        old.close_account("done", "completed")
        before = [old.balance(a) for a in ("tenant", "run", "done")]
        with PostgresLedger(postgres_schema) as new:  # another process, upgraded, starts
            assert [new.balance(a) for a in ("tenant", "run", "done")] == before
            assert new.reserve("done", "d1", {}).existing  # even on its closed account
            assert new.reserve("run", "k0", {"cost": 1, "tool_calls": 1}).existing
            with pytest.raises(AccountClosed):
                new.reserve("done", "d2", {})
            fresh = new.reserve("run", "n1", {"tool_calls": 2})
            assert fresh.balance == new.balance("run")
            with pytest.raises(BudgetExhausted) as caught:
                new.reserve("run", "n2", {"cost": 0.25, "tool_calls": 1})
            axis = caught.value.axis
            assert (caught.value.account, axis and axis.value) == ("run", "tool_calls")
        # The old process goes on, on the new functions (same signatures, same result type).
        assert old.reserve("run", "k1", {"cost": 0.5}).existing
        assert old.settle("n1", {"tool_calls": 1}).amounts == {"tool_calls": 1.0}
        assert old.reserve("run", "o1", {"tool_calls": 1}).balance == old.balance("run")
    with psycopg.connect(postgres_schema) as conn:
        assert conn.execute("SELECT fencepost_ledger_version()").fetchone() == (SCHEMA_VERSION,)
