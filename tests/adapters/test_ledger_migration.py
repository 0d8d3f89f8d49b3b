"""A database written by the first ledger version still opens, keeps its books, and migrates.

The first version's tables are created here as that version created them (no owner, no closed
column, no server-side functions), with one account chain and one reservation in them, exactly
as its ``open_account`` and ``reserve`` left them. Opening today's ledger on that database adds
what is missing; the old reservation is still known, and every new rule works on the old rows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from fencepost.adapters import PostgresLedger, SqliteLedger
from fencepost.policy.ledger import AccountClosed, Ledger, LedgerConflict, ReservationStatus

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
