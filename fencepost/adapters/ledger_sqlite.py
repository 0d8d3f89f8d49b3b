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

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from fencepost.adapters._ledger_sql import SCHEMA, SqlLedger, Transaction

__all__ = ["SqliteLedger"]

_T = TypeVar("_T")

_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


class SqliteLedger(SqlLedger):
    """Accounts and reservations in a SQLite file; atomic across threads and processes.

    ``path`` is the database file (created if missing; ``":memory:"`` works but is neither durable
    nor shared). ``busy_timeout`` is how many seconds a transaction waits for another process's
    write lock before SQLite gives up with ``database is locked``. Tables are created on
    construction (:meth:`setup` is idempotent). One connection per instance, serialised by a lock;
    the async twins run the sync methods in a worker thread.
    """

    # In the order the axes were first held, as InMemoryLedger keeps them.
    _HELD = "SELECT axis, amount FROM fencepost_ledger_held WHERE account = ? ORDER BY rowid"

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

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout,
            isolation_level=None,  # transactions are begun and ended explicitly in _run
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

    def _run(self, work: Callable[[Transaction], _T], *, read_only: bool = False) -> _T:
        """Run ``work`` in one transaction: ``BEGIN IMMEDIATE`` takes the write lock up front."""
        with self._lock:
            if self._conn is None:
                raise RuntimeError("the ledger is closed")
            conn = self._conn
            conn.execute("BEGIN" if read_only else "BEGIN IMMEDIATE")
            try:
                result = work(conn)
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
            return result

    def setup(self) -> None:
        """Create the tables if they are missing. Idempotent; called on construction."""

        def work(tx: Transaction) -> None:
            for statement in SCHEMA:
                tx.execute(statement)

        self._run(work)

    def close(self) -> None:
        """Close the connection. Further calls raise ``RuntimeError``."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
