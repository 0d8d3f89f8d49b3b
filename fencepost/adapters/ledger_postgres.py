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

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Self, TypeVar

from psycopg import Connection, errors
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from fencepost.policy.ledger import (
    Balance,
    Ledger,
    LedgerConflict,
    Reservation,
    ReservationStatus,
    UnknownAccount,
    UnknownReservation,
    _exhausted,
    _validate_amounts,
)

__all__ = ["PostgresLedger"]

_T = TypeVar("_T")

_Conn = Connection[TupleRow]

# Serialises concurrent ``setup`` calls: CREATE TABLE IF NOT EXISTS is not safe under a race.
_SETUP_LOCK = 0x6665_6E63_6570_6F73  # "fencepos"

_MAX_DEPTH = 1000

_TABLES = [
    "fencepost_ledger_accounts",
    "fencepost_ledger_limits",
    "fencepost_ledger_held",
    "fencepost_ledger_reservations",
    "fencepost_ledger_reservation_amounts",
]

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_accounts (
        name text PRIMARY KEY,
        parent text REFERENCES fencepost_ledger_accounts (name)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_limits (
        account text NOT NULL REFERENCES fencepost_ledger_accounts (name),
        axis text NOT NULL,
        position integer NOT NULL,
        amount double precision NOT NULL,
        PRIMARY KEY (account, axis)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_held (
        account text NOT NULL REFERENCES fencepost_ledger_accounts (name),
        axis text NOT NULL,
        amount double precision NOT NULL,
        PRIMARY KEY (account, axis)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_reservations (
        key text PRIMARY KEY,
        account text NOT NULL REFERENCES fencepost_ledger_accounts (name),
        status text NOT NULL CHECK (status IN ('reserved', 'settled', 'released'))
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_reservation_amounts (
        key text NOT NULL REFERENCES fencepost_ledger_reservations (key),
        axis text NOT NULL,
        position integer NOT NULL,
        amount double precision NOT NULL,
        PRIMARY KEY (key, axis)
    )
    """,
)


class _KeyRace(Exception):
    """Another transaction committed the same idempotency key first: retry to return it."""


class PostgresLedger(Ledger):
    """Accounts and reservations in Postgres; atomic across connections, processes and machines.

    ``conninfo`` is a libpq connection string or URI. Connections come from a
    :class:`psycopg_pool.ConnectionPool` of ``min_size`` to ``max_size`` connections, closed by
    :meth:`close` (or by leaving a ``with`` block). The async twins run the sync methods in a
    worker thread.
    """

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

    # -- connection and transactions ------------------------------------------------------------

    def _run(self, work: Callable[[_Conn], _T], *, read_only: bool = False) -> _T:
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
                    return work(conn)
            except _KeyRace:
                if attempt >= self._max_retries + 1:
                    raise RuntimeError("idempotency key kept racing; giving up") from None
            except (errors.DeadlockDetected, errors.SerializationFailure):
                if attempt >= self._max_retries:
                    raise
                time.sleep(random.uniform(0, 0.01 * 2**attempt))  # noqa: S311 (jitter)

    def setup(self) -> None:
        """Create the tables if they are missing. Idempotent; called on construction."""

        def work(conn: _Conn) -> None:
            # Skip the DDL when every table is there, so a role without CREATE can use the ledger.
            row = conn.execute(
                "SELECT count(to_regclass(name)) FROM unnest(%s::text[]) AS name", (_TABLES,)
            ).fetchone()
            if row is not None and row[0] == len(_TABLES):
                return
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SETUP_LOCK,))
            for statement in _SCHEMA:
                conn.execute(statement)

        self._run(work)

    def close(self) -> None:
        """Close the connection pool. Further calls raise ``RuntimeError``."""
        self._closed = True
        self._pool.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- reads inside a transaction ---------------------------------------------------------------

    @staticmethod
    def _account(conn: _Conn, account: str) -> tuple[str | None, dict[str, float]]:
        row = conn.execute(
            "SELECT parent FROM fencepost_ledger_accounts WHERE name = %s", (account,)
        ).fetchone()
        if row is None:
            raise UnknownAccount(account)
        limits = conn.execute(
            "SELECT axis, amount FROM fencepost_ledger_limits WHERE account = %s ORDER BY position",
            (account,),
        ).fetchall()
        return row[0], {axis: float(amount) for axis, amount in limits}

    @staticmethod
    def _held(conn: _Conn, account: str) -> dict[str, float]:
        rows = conn.execute(
            "SELECT axis, amount FROM fencepost_ledger_held WHERE account = %s ORDER BY axis",
            (account,),
        ).fetchall()
        return {axis: float(amount) for axis, amount in rows}

    @staticmethod
    def _chain(conn: _Conn, account: str) -> list[str]:
        """``account`` and its ancestors, nearest first."""
        rows = conn.execute(
            """
            WITH RECURSIVE chain (name, parent, depth) AS (
                SELECT name, parent, 0 FROM fencepost_ledger_accounts WHERE name = %s
                UNION ALL
                SELECT a.name, a.parent, c.depth + 1
                FROM fencepost_ledger_accounts a JOIN chain c ON a.name = c.parent
                WHERE c.depth < %s
            )
            SELECT name, parent FROM chain ORDER BY depth
            """,
            (account, _MAX_DEPTH),
        ).fetchall()
        if not rows:
            raise UnknownAccount(account)
        chain = [name for name, _ in rows]
        if len(set(chain)) != len(chain):
            raise LedgerConflict("account parent chain has a cycle")
        last_parent = rows[-1][1]
        if last_parent is not None:
            raise UnknownAccount(last_parent)
        return chain

    @staticmethod
    def _lock(conn: _Conn, chain: list[str]) -> None:
        """Lock the chain's account rows in name order (the order every transaction uses)."""
        conn.execute(
            "SELECT name FROM fencepost_ledger_accounts WHERE name = ANY(%s)"
            " ORDER BY name FOR UPDATE",
            (sorted(chain),),
        ).fetchall()

    @staticmethod
    def _reservation(conn: _Conn, key: str, *, lock: bool = False) -> Reservation | None:
        query = (
            "SELECT account, status FROM fencepost_ledger_reservations WHERE key = %s FOR UPDATE"
            if lock
            else "SELECT account, status FROM fencepost_ledger_reservations WHERE key = %s"
        )
        row = conn.execute(query, (key,)).fetchone()
        if row is None:
            return None
        amounts = conn.execute(
            "SELECT axis, amount FROM fencepost_ledger_reservation_amounts"
            " WHERE key = %s ORDER BY position",
            (key,),
        ).fetchall()
        return Reservation(
            account=row[0],
            key=key,
            amounts={axis: float(amount) for axis, amount in amounts},
            status=ReservationStatus(row[1]),
        )

    def _balance(self, conn: _Conn, account: str) -> Balance:
        parent, limits = self._account(conn, account)
        return Balance(
            account=account, parent=parent, limits=limits, held=self._held(conn, account)
        )

    @staticmethod
    def _add_held(conn: _Conn, chain: list[str], delta: Mapping[str, float]) -> None:
        rows = [(name, axis, amount) for name in chain for axis, amount in delta.items()]
        if not rows:
            return
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO fencepost_ledger_held (account, axis, amount) VALUES (%s, %s, %s)"
                " ON CONFLICT (account, axis)"
                " DO UPDATE SET amount = fencepost_ledger_held.amount + excluded.amount",
                rows,
            )

    def _locked_reservation(self, conn: _Conn, key: str) -> Reservation:
        """The reservation under ``key`` with its chain and its own row locked."""
        row = conn.execute(
            "SELECT account FROM fencepost_ledger_reservations WHERE key = %s", (key,)
        ).fetchone()
        if row is None:
            raise UnknownReservation(key)
        chain = self._chain(conn, row[0])  # an account's parent never changes once opened
        self._lock(conn, chain)
        reservation = self._reservation(conn, key, lock=True)
        if reservation is None:  # pragma: no cover - reservations are never deleted
            raise UnknownReservation(key)
        return reservation

    # -- the port ---------------------------------------------------------------------------------

    def open_account(
        self, account: str, limits: Mapping[str, float], *, parent: str | None = None
    ) -> Balance:
        clean = _validate_amounts(limits)

        def work(conn: _Conn) -> Balance:
            if parent is not None:
                self._account(conn, parent)  # raises UnknownAccount
            inserted = conn.execute(
                "INSERT INTO fencepost_ledger_accounts (name, parent) VALUES (%s, %s)"
                " ON CONFLICT (name) DO NOTHING RETURNING name",
                (account, parent),
            ).fetchone()
            if inserted is None:
                if self._account(conn, account) != (parent, clean):
                    raise LedgerConflict(f"account {account!r} already open with other terms")
            elif clean:
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO fencepost_ledger_limits (account, axis, position, amount)"
                        " VALUES (%s, %s, %s, %s)",
                        [
                            (account, axis, i, value)
                            for i, (axis, value) in enumerate(clean.items())
                        ],
                    )
            return self._balance(conn, account)

        return self._run(work)

    def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        clean = _validate_amounts(amounts)

        def work(conn: _Conn) -> Reservation:
            prior = self._reservation(conn, key)
            if prior is not None:
                if prior.account != account:
                    raise LedgerConflict(f"key {key!r} is held by another account")
                return prior.model_copy(update={"existing": True})
            chain = self._chain(conn, account)
            self._lock(conn, chain)
            limits: dict[str, dict[str, float]] = {name: {} for name in chain}
            held: dict[str, dict[str, float]] = {name: {} for name in chain}
            for name, axis, value in conn.execute(
                "SELECT account, axis, amount FROM fencepost_ledger_limits WHERE account = ANY(%s)",
                (chain,),
            ).fetchall():
                limits[name][axis] = float(value)
            for name, axis, value in conn.execute(
                "SELECT account, axis, amount FROM fencepost_ledger_held WHERE account = ANY(%s)",
                (chain,),
            ).fetchall():
                held[name][axis] = float(value)
            for name in chain:
                for axis, amount in clean.items():
                    limit = limits[name].get(axis)
                    if limit is not None and held[name].get(axis, 0.0) + amount > limit:
                        raise _exhausted(name, axis, limit, amount)
            inserted = conn.execute(
                "INSERT INTO fencepost_ledger_reservations (key, account, status)"
                " VALUES (%s, %s, %s) ON CONFLICT (key) DO NOTHING RETURNING key",
                (key, account, ReservationStatus.RESERVED.value),
            ).fetchone()
            if inserted is None:
                raise _KeyRace  # committed by another transaction since the first look
            self._add_held(conn, chain, clean)
            if clean:
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO fencepost_ledger_reservation_amounts"
                        " (key, axis, position, amount) VALUES (%s, %s, %s, %s)",
                        [(key, axis, i, value) for i, (axis, value) in enumerate(clean.items())],
                    )
            return Reservation(account=account, key=key, amounts=clean)

        return self._run(work)

    def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        def work(conn: _Conn) -> Reservation:
            reservation = self._locked_reservation(conn, key)
            if reservation.status is not ReservationStatus.RESERVED:
                return reservation.model_copy(update={"existing": True})
            final = dict(reservation.amounts)
            if actual is not None:
                clean = _validate_amounts(actual)
                refund = {
                    axis: final[axis] - clean.get(axis, final[axis])
                    for axis in final
                    if clean.get(axis, final[axis]) < final[axis]
                }
                self._add_held(
                    conn,
                    self._chain(conn, reservation.account),
                    {axis: -amount for axis, amount in refund.items()},
                )
                final = {axis: final[axis] - refund.get(axis, 0.0) for axis in final}
                if refund:
                    with conn.cursor() as cur:
                        cur.executemany(
                            "UPDATE fencepost_ledger_reservation_amounts SET amount = %s"
                            " WHERE key = %s AND axis = %s",
                            [(final[axis], key, axis) for axis in refund],
                        )
            conn.execute(
                "UPDATE fencepost_ledger_reservations SET status = %s WHERE key = %s",
                (ReservationStatus.SETTLED.value, key),
            )
            return reservation.model_copy(
                update={"amounts": final, "status": ReservationStatus.SETTLED}
            )

        return self._run(work)

    def release(self, key: str) -> Reservation:
        def work(conn: _Conn) -> Reservation:
            reservation = self._locked_reservation(conn, key)
            if reservation.status is not ReservationStatus.RESERVED:
                return reservation.model_copy(update={"existing": True})
            self._add_held(
                conn,
                self._chain(conn, reservation.account),
                {axis: -amount for axis, amount in reservation.amounts.items()},
            )
            conn.execute(
                "UPDATE fencepost_ledger_reservations SET status = %s WHERE key = %s",
                (ReservationStatus.RELEASED.value, key),
            )
            return reservation.model_copy(update={"status": ReservationStatus.RELEASED})

        return self._run(work)

    def get(self, key: str) -> Reservation | None:
        return self._run(lambda conn: self._reservation(conn, key), read_only=True)

    def balance(self, account: str) -> Balance:
        return self._run(lambda conn: self._balance(conn, account), read_only=True)

    # -- async twins: the sync methods in a worker thread -----------------------------------------

    async def aopen_account(
        self, account: str, limits: Mapping[str, float], *, parent: str | None = None
    ) -> Balance:
        return await asyncio.to_thread(self.open_account, account, limits, parent=parent)

    async def areserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        return await asyncio.to_thread(self.reserve, account, key, amounts)

    async def asettle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        return await asyncio.to_thread(self.settle, key, actual)

    async def arelease(self, key: str) -> Reservation:
        return await asyncio.to_thread(self.release, key)

    async def aget(self, key: str) -> Reservation | None:
        return await asyncio.to_thread(self.get, key)
