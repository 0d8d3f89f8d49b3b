"""Rules only the Postgres backend has: one statement per operation, setup without CREATE, a
parent chain walked exactly as deep as the SQLite backend walks it, and the nearest closed
account named whatever the names sort as."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencepost.adapters import PostgresLedger, SqliteLedger
from fencepost.adapters.ledger_postgres import SCHEMA_VERSION
from fencepost.policy import AccountClosed, BudgetExhausted, Ledger, UnknownAccount


@pytest.fixture
def ledger(postgres_schema: str) -> Iterator[PostgresLedger]:
    with PostgresLedger(postgres_schema) as made:
        yield made


def test_every_operation_is_one_statement_so_one_round_trip(
    ledger: PostgresLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger.open_account("tenant", {"cost": 10})
    ledger.open_account("run", {"cost": 5}, parent="tenant")
    sent: list[str] = []
    real_execute = psycopg.Connection.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return real_execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", counted)
    operations = {
        "open_account": lambda: ledger.open_account("other", {"cost": 1}, parent="tenant"),
        "reserve": lambda: ledger.reserve("run", "k1", {"cost": 2}),
        "reserve again": lambda: ledger.reserve("run", "k1", {"cost": 2}),
        "settle": lambda: ledger.settle("k1", {"cost": 1}),
        "release": lambda: (ledger.reserve("run", "k2", {"cost": 1}), ledger.release("k2")),
        "get": lambda: ledger.get("k1"),
        "balance": lambda: ledger.balance("run"),
        "close_account": lambda: ledger.close_account("run", "completed"),
    }
    for name, operation in operations.items():
        sent.clear()
        operation()
        expected = 2 if name == "release" else 1  # that step also reserves
        assert len(sent) == expected, f"{name} sent {sent}"
        assert all(statement.startswith("SELECT * FROM fencepost_ledger_") for statement in sent)


def test_a_role_without_create_uses_a_database_already_set_up(
    postgres_dsn: str, postgres_schema: str
) -> None:
    PostgresLedger(postgres_schema).close()  # set up by a role that may create
    schema = postgres_schema.rsplit("%3D", 1)[1]
    role = f"fp_reader_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        admin.execute(
            f'GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"'
        )
    try:
        dsn = postgres_schema.replace("postgresql://postgres@", f"postgresql://{role}@", 1)
        with PostgresLedger(dsn) as limited:
            limited.open_account("run", {"cost": 1})
            assert not limited.reserve("run", "k", {"cost": 1}).existing
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')


def test_a_database_with_older_functions_gets_the_current_ones_and_keeps_its_books(
    postgres_schema: str,
) -> None:
    # A deployment upgraded in place: its tables hold reservations, its functions are an older
    # version's. Opening the ledger replaces the functions and nothing recorded changes.
    with PostgresLedger(postgres_schema) as first:
        first.open_account("tenant", {"cost": 10})
        first.open_account("run", {"cost": 5}, parent="tenant")
        first.reserve("run", "k1", {"cost": 2})
        before = first.balance("run")
    with psycopg.connect(postgres_schema, autocommit=True) as conn:
        conn.execute(
            "CREATE OR REPLACE FUNCTION fencepost_ledger_version() RETURNS integer"
            f" LANGUAGE sql IMMUTABLE AS 'SELECT {SCHEMA_VERSION - 1}'"
        )
        # The older reserve: anything but the current one, so a call to it would show.
        conn.execute(
            "CREATE OR REPLACE FUNCTION fencepost_ledger_reserve("
            " p_account text, p_key text, p_axes text[], p_amounts double precision[])"
            " RETURNS fencepost_ledger_result LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'older function'; END $$"
        )
    with PostgresLedger(postgres_schema) as upgraded:
        assert upgraded.balance("run") == before
        assert upgraded.reserve("run", "k1", {"cost": 2}).existing
        assert not upgraded.reserve("run", "k2", {"cost": 3}).existing
        with pytest.raises(BudgetExhausted):
            upgraded.reserve("run", "k3", {"cost": 1})
    with psycopg.connect(postgres_schema, autocommit=True) as conn:
        version = conn.execute("SELECT fencepost_ledger_version()").fetchone()
    assert version == (SCHEMA_VERSION,)


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
    # Both backends walk the same depth (1001 accounts, and no further): a run nested one level
    # deeper is never refused as unknown_account on one backend only. Settling refunds every
    # account the reservation charged.
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


def test_the_nearest_closed_account_is_named_whatever_the_names_sort_as(
    postgres_schema: str,
) -> None:
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
