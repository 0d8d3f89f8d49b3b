"""A database written by an older ledger version still opens, keeps its books, and migrates.

The first version's tables are created here as that version created them (no owner, no closed
column, no server-side functions), with one account chain and one reservation in them, exactly
as its ``open_account`` and ``reserve`` left them. Opening today's ledger on that database adds
what is missing; the old reservation is still known, and every new rule works on the old rows.
A version 4 Postgres database (read from git history) upgraded in place by a newer process keeps
its books, and the version 4 clients still running go on working on the new functions.
"""

from __future__ import annotations

import importlib.util
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

from fencepost.adapters import PostgresLedger, SqliteLedger
from fencepost.adapters.ledger_postgres import SCHEMA_VERSION
from fencepost.policy import BudgetExhausted
from fencepost.policy.ledger import (
    AccountClosed,
    Ledger,
    LedgerConflict,
    ReservationStatus,
)

FIRST_VERSION_SCHEMA = (
    """
    CREATE TABLE fencepost_ledger_accounts (
        name text PRIMARY KEY,
        parent text REFERENCES fencepost_ledger_accounts (name)
    )
    """,
    """
    CREATE TABLE fencepost_ledger_limits (
        account text NOT NULL REFERENCES fencepost_ledger_accounts (name),
        axis text NOT NULL,
        position integer NOT NULL,
        amount double precision NOT NULL,
        PRIMARY KEY (account, axis)
    )
    """,
    """
    CREATE TABLE fencepost_ledger_held (
        account text NOT NULL REFERENCES fencepost_ledger_accounts (name),
        axis text NOT NULL,
        amount double precision NOT NULL,
        PRIMARY KEY (account, axis)
    )
    """,
    """
    CREATE TABLE fencepost_ledger_reservations (
        key text PRIMARY KEY,
        account text NOT NULL REFERENCES fencepost_ledger_accounts (name),
        status text NOT NULL CHECK (status IN ('reserved', 'settled', 'released'))
    )
    """,
    """
    CREATE TABLE fencepost_ledger_reservation_amounts (
        key text NOT NULL REFERENCES fencepost_ledger_reservations (key),
        axis text NOT NULL,
        position integer NOT NULL,
        amount double precision NOT NULL,
        PRIMARY KEY (key, axis)
    )
    """,
)

# tenant (tool_calls 10) <- run (tool_calls 5); "call-1" holds 2 tool calls on both.
FIRST_VERSION_ROWS = (
    "INSERT INTO fencepost_ledger_accounts (name, parent) VALUES ('tenant', NULL), ('run', 'tenant')",
    "INSERT INTO fencepost_ledger_limits VALUES ('tenant', 'tool_calls', 0, 10), ('run', 'tool_calls', 0, 5)",
    "INSERT INTO fencepost_ledger_held VALUES ('tenant', 'tool_calls', 2), ('run', 'tool_calls', 2)",
    "INSERT INTO fencepost_ledger_reservations VALUES ('call-1', 'run', 'reserved')",
    "INSERT INTO fencepost_ledger_reservation_amounts VALUES ('call-1', 'tool_calls', 0, 2)",
)


@pytest.fixture(params=["sqlite", "postgres"])
def first_version_database(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[], Ledger]]:
    opened: list[SqliteLedger | PostgresLedger] = []
    if request.param == "sqlite":
        path = tmp_path / "ledger.db"
        with sqlite3.connect(path) as conn:
            for statement in FIRST_VERSION_SCHEMA + FIRST_VERSION_ROWS:
                conn.execute(statement)

        def opener() -> Ledger:
            opened.append(SqliteLedger(path))
            return opened[-1]
    else:
        dsn = request.getfixturevalue("postgres_schema")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in FIRST_VERSION_SCHEMA + FIRST_VERSION_ROWS:
                conn.execute(statement)

        def opener() -> Ledger:
            opened.append(PostgresLedger(dsn))
            return opened[-1]

    yield opener
    for ledger in opened:
        ledger.close()


def test_a_first_version_database_opens_with_its_books_intact(
    first_version_database: Callable[[], Ledger],
) -> None:
    ledger = first_version_database()
    run = ledger.balance("run")
    assert (run.parent, run.limits, run.held) == (
        "tenant",
        {"tool_calls": 5.0},
        {"tool_calls": 2.0},
    )
    assert (run.owner, run.closed) == ({}, None)  # accounts from before owners: none, open
    again = ledger.reserve("run", "call-1", {"tool_calls": 2})
    assert again.existing and again.amounts == {"tool_calls": 2.0}
    assert again.balance == run
    ledger.open_account("run", {"tool_calls": 5}, parent="tenant")  # same terms, no owner
    with pytest.raises(LedgerConflict):
        ledger.open_account("run", {"tool_calls": 5}, parent="tenant", owner={"tenant": "a"})


def test_every_new_rule_works_on_a_migrated_database(
    first_version_database: Callable[[], Ledger],
) -> None:
    ledger = first_version_database()
    fresh = ledger.reserve("run", "call-2", {"tool_calls": 1})
    assert fresh.balance is not None and fresh.balance.held == {"tool_calls": 3.0}
    assert ledger.reserve("run", "marker", {}).amounts == {}
    ledger.open_account("child", {}, parent="run", owner={"tenant": "acme"})
    assert ledger.balance("child").owner == {"tenant": "acme"}
    ledger.close_account("tenant", "cancelled")
    with pytest.raises(AccountClosed) as caught:
        ledger.reserve("child", "call-3", {"tool_calls": 1})
    assert caught.value.account == "tenant"
    assert ledger.settle("call-1", {"tool_calls": 1}).status is ReservationStatus.SETTLED
    assert ledger.balance("tenant").held == {"tool_calls": 2.0}


def test_opening_a_migrated_database_again_changes_nothing(
    first_version_database: Callable[[], Ledger],
) -> None:
    first = first_version_database()
    first.close_account("run", "completed")
    before = first.balance("run")
    second = first_version_database()  # setup runs again: already current
    assert second.balance("run") == before
    assert second.get("call-1") == first.get("call-1")


# -- a version 4 database upgraded in place while its old clients run ----------------------------

REPO = Path(__file__).resolve().parents[2]
VERSION_4 = "8f704dd"
"""A commit whose ``ledger_postgres.py`` is schema version 4 (the one before the rewritten
``fencepost_ledger_reserve``)."""


def _version_4() -> ModuleType:
    """The Postgres ledger module at schema version 4, read from git."""
    try:
        source = subprocess.run(
            ["git", "show", f"{VERSION_4}:fencepost/adapters/ledger_postgres.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"git history with {VERSION_4} is not available")
    spec = importlib.util.spec_from_loader("_ledger_postgres_v4", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_ledger_postgres_v4"] = module
    exec(compile(source, "ledger_postgres_v4.py", "exec"), module.__dict__)
    assert module.SCHEMA_VERSION == 4

    class PostgresLedgerV4(module.PostgresLedger):  # type: ignore[misc,name-defined]
        """The old class under today's port, which has since grown ``charge``."""

        def charge(self, account: str, key: str, amounts: Any, *, of: Any = None) -> Any:
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
