"""A durable :class:`~fencepost.policy.ledger.Ledger` in one SQLite file.

Safe for many threads and many processes on one machine: every ``reserve``, ``settle`` and
``release`` is a single ``BEGIN IMMEDIATE`` transaction (SQLite's write lock is taken before
anything is read, so the check and the charge cannot interleave with another writer), the file is
in WAL mode so readers never block the writer, and a busy timeout makes a second process wait for
the lock instead of failing. Not for several machines sharing a network file system: use
:class:`~fencepost.adapters.ledger_postgres.PostgresLedger` there.

Example::

    with SqliteLedger("ledger.db") as ledger:
        ledger.open_account("tenant", {"tool_calls": 100})
        ledger.open_account("run-1", {"tool_calls": 60}, parent="tenant")
        ledger.reserve("run-1", "call-0001", {"tool_calls": 1})
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Self

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

__all__ = ["SqliteLedger"]

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_accounts (
        name TEXT PRIMARY KEY,
        parent TEXT REFERENCES fencepost_ledger_accounts (name)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_limits (
        account TEXT NOT NULL REFERENCES fencepost_ledger_accounts (name),
        axis TEXT NOT NULL,
        position INTEGER NOT NULL,
        amount REAL NOT NULL,
        PRIMARY KEY (account, axis)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_held (
        account TEXT NOT NULL REFERENCES fencepost_ledger_accounts (name),
        axis TEXT NOT NULL,
        amount REAL NOT NULL,
        PRIMARY KEY (account, axis)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_reservations (
        key TEXT PRIMARY KEY,
        account TEXT NOT NULL REFERENCES fencepost_ledger_accounts (name),
        status TEXT NOT NULL CHECK (status IN ('reserved', 'settled', 'released'))
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_reservation_amounts (
        key TEXT NOT NULL REFERENCES fencepost_ledger_reservations (key),
        axis TEXT NOT NULL,
        position INTEGER NOT NULL,
        amount REAL NOT NULL,
        PRIMARY KEY (key, axis)
    )
    """,
)

_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


class SqliteLedger(Ledger):
    """Accounts and reservations in a SQLite file; atomic across threads and processes.

    ``path`` is the database file (created if missing; ``":memory:"`` works but is neither durable
    nor shared). ``busy_timeout`` is how many seconds a transaction waits for another process's
    write lock before SQLite gives up with ``database is locked``. Tables are created on
    construction (:meth:`setup` is idempotent). One connection per instance, serialised by a lock;
    the async twins run the sync methods in a worker thread.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0) -> None:
        self._path = os.fspath(path)
        self._busy_timeout = busy_timeout
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = self._connect()
        try:
            self.setup()
        except BaseException:
            self.close()
            raise

    # -- connection and transactions ------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout,
            isolation_level=None,  # transactions are begun and ended explicitly below
            check_same_thread=False,  # the instance lock serialises use across threads
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            self._retry_busy(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone())
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
        except BaseException:
            conn.close()
            raise
        return conn

    def _retry_busy(self, action: Callable[[], object]) -> None:
        """Run ``action``, retrying while another process holds a lock it needs.

        Switching to WAL needs a lock the busy handler does not always wait for.
        """
        deadline = time.monotonic() + self._busy_timeout
        delay = 0.005
        while True:
            try:
                action()
                return
            except sqlite3.OperationalError as error:
                if error.sqlite_errorcode not in _BUSY_CODES or time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    @contextmanager
    def _transaction(self, begin: str = "BEGIN IMMEDIATE") -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise RuntimeError("the ledger is closed")
            conn = self._conn
            conn.execute(begin)
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def setup(self) -> None:
        """Create the tables if they are missing. Idempotent; called on construction."""
        with self._transaction() as conn:
            for statement in _SCHEMA:
                conn.execute(statement)

    def close(self) -> None:
        """Close the connection. Further calls raise ``RuntimeError``."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

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
    def _account(conn: sqlite3.Connection, account: str) -> tuple[str | None, dict[str, float]]:
        row = conn.execute(
            "SELECT parent FROM fencepost_ledger_accounts WHERE name = ?", (account,)
        ).fetchone()
        if row is None:
            raise UnknownAccount(account)
        limits = conn.execute(
            "SELECT axis, amount FROM fencepost_ledger_limits WHERE account = ? ORDER BY position",
            (account,),
        ).fetchall()
        return row[0], {axis: float(amount) for axis, amount in limits}

    @staticmethod
    def _held(conn: sqlite3.Connection, account: str) -> dict[str, float]:
        rows = conn.execute(
            "SELECT axis, amount FROM fencepost_ledger_held WHERE account = ? ORDER BY rowid",
            (account,),
        ).fetchall()
        return {axis: float(amount) for axis, amount in rows}

    @staticmethod
    def _chain(conn: sqlite3.Connection, account: str) -> list[str]:
        chain: list[str] = []
        current: str | None = account
        while current is not None:
            if current in chain:
                raise LedgerConflict("account parent chain has a cycle")
            row = conn.execute(
                "SELECT parent FROM fencepost_ledger_accounts WHERE name = ?", (current,)
            ).fetchone()
            if row is None:
                raise UnknownAccount(current)
            chain.append(current)
            current = row[0]
        return chain

    @staticmethod
    def _reservation(conn: sqlite3.Connection, key: str) -> Reservation | None:
        row = conn.execute(
            "SELECT account, status FROM fencepost_ledger_reservations WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            return None
        amounts = conn.execute(
            "SELECT axis, amount FROM fencepost_ledger_reservation_amounts"
            " WHERE key = ? ORDER BY position",
            (key,),
        ).fetchall()
        return Reservation(
            account=row[0],
            key=key,
            amounts={axis: float(amount) for axis, amount in amounts},
            status=ReservationStatus(row[1]),
        )

    def _balance(self, conn: sqlite3.Connection, account: str) -> Balance:
        parent, limits = self._account(conn, account)
        return Balance(
            account=account, parent=parent, limits=limits, held=self._held(conn, account)
        )

    @staticmethod
    def _add_held(conn: sqlite3.Connection, chain: list[str], delta: Mapping[str, float]) -> None:
        conn.executemany(
            "INSERT INTO fencepost_ledger_held (account, axis, amount) VALUES (?, ?, ?)"
            " ON CONFLICT (account, axis) DO UPDATE SET amount = amount + excluded.amount",
            [(name, axis, amount) for name in chain for axis, amount in delta.items()],
        )

    # -- the port ---------------------------------------------------------------------------------

    def open_account(
        self, account: str, limits: Mapping[str, float], *, parent: str | None = None
    ) -> Balance:
        clean = _validate_amounts(limits)
        with self._transaction() as conn:
            if parent is not None:
                self._account(conn, parent)  # raises UnknownAccount
            row = conn.execute(
                "SELECT parent FROM fencepost_ledger_accounts WHERE name = ?", (account,)
            ).fetchone()
            if row is not None:
                if self._account(conn, account) != (parent, clean):
                    raise LedgerConflict(f"account {account!r} already open with other terms")
            else:
                conn.execute(
                    "INSERT INTO fencepost_ledger_accounts (name, parent) VALUES (?, ?)",
                    (account, parent),
                )
                conn.executemany(
                    "INSERT INTO fencepost_ledger_limits (account, axis, position, amount)"
                    " VALUES (?, ?, ?, ?)",
                    [(account, axis, i, amount) for i, (axis, amount) in enumerate(clean.items())],
                )
            return self._balance(conn, account)

    def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        clean = _validate_amounts(amounts)
        with self._transaction() as conn:
            prior = self._reservation(conn, key)
            if prior is not None:
                if prior.account != account:
                    raise LedgerConflict(f"key {key!r} is held by another account")
                return prior.model_copy(update={"existing": True})
            chain = self._chain(conn, account)
            for name in chain:
                limits = self._account(conn, name)[1]
                held = self._held(conn, name)
                for axis, amount in clean.items():
                    if axis in limits and held.get(axis, 0.0) + amount > limits[axis]:
                        raise _exhausted(name, axis, limits[axis], amount)
            self._add_held(conn, chain, clean)
            conn.execute(
                "INSERT INTO fencepost_ledger_reservations (key, account, status) VALUES (?, ?, ?)",
                (key, account, ReservationStatus.RESERVED.value),
            )
            conn.executemany(
                "INSERT INTO fencepost_ledger_reservation_amounts (key, axis, position, amount)"
                " VALUES (?, ?, ?, ?)",
                [(key, axis, i, amount) for i, (axis, amount) in enumerate(clean.items())],
            )
            return Reservation(account=account, key=key, amounts=clean)

    def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        with self._transaction() as conn:
            reservation = self._reservation(conn, key)
            if reservation is None:
                raise UnknownReservation(key)
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
                conn.executemany(
                    "UPDATE fencepost_ledger_reservation_amounts SET amount = ?"
                    " WHERE key = ? AND axis = ?",
                    [(amount, key, axis) for axis, amount in final.items()],
                )
            conn.execute(
                "UPDATE fencepost_ledger_reservations SET status = ? WHERE key = ?",
                (ReservationStatus.SETTLED.value, key),
            )
            return reservation.model_copy(
                update={"amounts": final, "status": ReservationStatus.SETTLED}
            )

    def release(self, key: str) -> Reservation:
        with self._transaction() as conn:
            reservation = self._reservation(conn, key)
            if reservation is None:
                raise UnknownReservation(key)
            if reservation.status is not ReservationStatus.RESERVED:
                return reservation.model_copy(update={"existing": True})
            self._add_held(
                conn,
                self._chain(conn, reservation.account),
                {axis: -amount for axis, amount in reservation.amounts.items()},
            )
            conn.execute(
                "UPDATE fencepost_ledger_reservations SET status = ? WHERE key = ?",
                (ReservationStatus.RELEASED.value, key),
            )
            return reservation.model_copy(update={"status": ReservationStatus.RELEASED})

    def get(self, key: str) -> Reservation | None:
        with self._transaction("BEGIN") as conn:
            return self._reservation(conn, key)

    def balance(self, account: str) -> Balance:
        with self._transaction("BEGIN") as conn:
            return self._balance(conn, account)

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
