"""A durable :class:`~fencepost.policy.ledger.Ledger` in Postgres, for many machines.

Every ``reserve``, ``settle`` and ``release`` is one transaction that first locks the account rows
of the whole parent chain with ``SELECT ... FOR UPDATE``, always in the same order (sorted by
name), so two reservations that share an ancestor are serialised and two transactions can never
wait on each other in a cycle. The budget check and the charge then run under those locks. An
idempotency key that two transactions insert at once is settled by the primary key: the loser
rolls back and returns the winner's reservation marked ``existing``. Deadlocks and serialisation
failures (which the lock order should rule out) are retried a few times.

Tables are created in the connection's ``search_path`` on construction (:meth:`setup` is
idempotent and safe to run from many processes at once). Amounts are ``double precision``.

Example::

    with PostgresLedger("postgresql://app@db/ledger") as ledger:
        ledger.open_account("tenant", {"tool_calls": 100})
        ledger.open_account("run-1", {"tool_calls": 60}, parent="tenant")
        ledger.reserve("run-1", "call-0001", {"tool_calls": 1})
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from psycopg import Connection, Cursor, errors
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from fencepost.adapters._ledger_sql import (
    SCHEMA,
    TABLES,
    KeyRace,
    Params,
    SqlLedger,
    Transaction,
)

__all__ = ["PostgresLedger"]

_T = TypeVar("_T")

_Conn = Connection[TupleRow]

# Serialises concurrent ``setup`` calls: CREATE TABLE IF NOT EXISTS is not safe under a race.
_SETUP_LOCK = 0x6665_6E63_6570_6F73  # "fencepos"


class _PostgresTransaction:
    """A psycopg connection inside a transaction, taking the shared ``?`` statements."""

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Params = (), /) -> Cursor[TupleRow]:
        # No params for a statement without placeholders, as psycopg would be called by hand.
        return self._conn.execute(sql.replace("?", "%s"), params or None)

    def executemany(self, sql: str, rows: Iterable[Params], /) -> None:
        batch = list(rows)
        if batch:
            with self._conn.cursor() as cur:
                cur.executemany(sql.replace("?", "%s"), batch)


class PostgresLedger(SqlLedger):
    """Accounts and reservations in Postgres; atomic across connections, processes and machines.

    ``conninfo`` is a libpq connection string or URI. Connections come from a
    :class:`psycopg_pool.ConnectionPool` of ``min_size`` to ``max_size`` connections, closed by
    :meth:`close` (or by leaving a ``with`` block). The async twins run the sync methods in a
    worker thread.
    """

    _HELD = "SELECT axis, amount FROM fencepost_ledger_held WHERE account = ? ORDER BY axis"
    _RESERVATION_FOR_UPDATE = SqlLedger._RESERVATION + " FOR UPDATE"

    def __init__(
        self,
        conninfo: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        max_retries: int = 5,
    ) -> None:
        self._max_retries = max(1, max_retries)
        self._closed = False
        self._pool: ConnectionPool[_Conn] = ConnectionPool(
            conninfo,
            min_size=min_size,
            max_size=max(min_size, max_size),
            kwargs={"autocommit": True},  # each operation opens its own explicit transaction
            open=True,
            name="fencepost-ledger",
        )
        try:
            self.setup()
        except BaseException:
            self.close()
            raise

    def _run(self, work: Callable[[Transaction], _T], *, read_only: bool = False) -> _T:
        """Run ``work`` in one transaction; retry on deadlock, serialisation failure, key race."""
        if self._closed:
            raise RuntimeError("the ledger is closed")
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._pool.connection() as conn, conn.transaction():
                    if read_only:
                        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    return work(_PostgresTransaction(conn))
            except KeyRace:
                if attempt >= self._max_retries + 1:
                    raise RuntimeError("idempotency key kept racing; giving up") from None
            except (errors.DeadlockDetected, errors.SerializationFailure):
                if attempt >= self._max_retries:
                    raise
                time.sleep(random.uniform(0, 0.01 * 2**attempt))  # noqa: S311 (jitter)

    def _lock_chain(self, tx: Transaction, chain: list[str]) -> None:
        """Lock the chain's account rows in name order (the order every transaction uses)."""
        tx.execute(
            "SELECT name FROM fencepost_ledger_accounts WHERE name = ANY(?)"
            " ORDER BY name FOR UPDATE",
            (sorted(chain),),
        ).fetchall()

    def setup(self) -> None:
        """Create the tables if they are missing. Idempotent; called on construction."""

        def work(tx: Transaction) -> None:
            # Skip the DDL when every table is there, so a role without CREATE can use the ledger.
            row = tx.execute(
                "SELECT count(to_regclass(name)) FROM unnest(?::text[]) AS name", (list(TABLES),)
            ).fetchone()
            if row is not None and row[0] == len(TABLES):
                return
            tx.execute("SELECT pg_advisory_xact_lock(?)", (_SETUP_LOCK,))
            for statement in SCHEMA:
                tx.execute(statement)

        self._run(work)

    def close(self) -> None:
        """Close the connection pool. Further calls raise ``RuntimeError``."""
        self._closed = True
        self._pool.close()
