"""What the SQLite and Postgres ledgers share: the tables and the reserve/settle/release flow.

Both backends keep the same five tables and run every operation as one transaction of the same
statements, deciding with the rules in :mod:`fencepost.policy.ledger`. A backend supplies only
what its database does differently: how a transaction is begun, committed and retried
(:meth:`SqlLedger._run`), how the account rows of a chain are locked against other writers
(:meth:`SqlLedger._lock_chain`), and the two statements whose SQL differs (``_HELD``,
``_RESERVATION_FOR_UPDATE``).

Statements are written with ``?`` placeholders, SQLite's style; the Postgres backend rewrites them
to ``%s``, so no statement may contain a literal ``?`` or ``%``.
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar, Protocol, Self, TypeVar

from fencepost.policy.ledger import (
    Balance,
    Ledger,
    Reservation,
    ReservationStatus,
    UnknownAccount,
    UnknownReservation,
    check_room,
    check_same_terms,
    existing_outcome,
    existing_reservation,
    settlement,
    validate_amounts,
    walk_chain,
)

__all__ = ["SCHEMA", "TABLES", "Cursor", "KeyRace", "Params", "SqlLedger", "Transaction"]

_T = TypeVar("_T")

Params = Sequence[Any]

TABLES = (
    "fencepost_ledger_accounts",
    "fencepost_ledger_limits",
    "fencepost_ledger_held",
    "fencepost_ledger_reservations",
    "fencepost_ledger_reservation_amounts",
)

# Portable DDL: SQLite gives a ``double precision`` column REAL affinity, the same as ``REAL``.
SCHEMA = (
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

_MAX_DEPTH = 1000
"""How far up a parent chain is followed before the chain is reported as broken."""


class Cursor(Protocol):
    """The part of a DB-API cursor the flow reads (``sqlite3`` and ``psycopg`` both fit)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> Sequence[Any]: ...


class Transaction(Protocol):
    """One open transaction taking ``?`` statements (a ``sqlite3.Connection`` fits as it is)."""

    def execute(self, sql: str, params: Params = ..., /) -> Cursor: ...

    def executemany(self, sql: str, rows: Iterable[Params], /) -> object: ...


class KeyRace(Exception):
    """Another transaction committed the same idempotency key first: retry to return it."""


class SqlLedger(Ledger):
    """The :class:`~fencepost.policy.ledger.Ledger` flow over SQL; see the module docstring."""

    _HELD: ClassVar[str]
    """Select ``axis, amount`` held by one account (``?``), in the backend's order."""

    _RESERVATION: ClassVar[str] = (
        "SELECT account, status FROM fencepost_ledger_reservations WHERE key = ?"
    )
    _RESERVATION_FOR_UPDATE: ClassVar[str] = _RESERVATION
    """``_RESERVATION`` that also locks the row, where the database has row locks."""

    # -- what a backend supplies ------------------------------------------------------------------

    @abstractmethod
    def _run(self, work: Callable[[Transaction], _T], *, read_only: bool = False) -> _T:
        """Run ``work`` in one transaction (retrying it as the backend needs) and commit."""

    def _lock_chain(self, tx: Transaction, chain: list[str]) -> None:
        """Lock the chain's account rows until the transaction ends.

        Nothing by default: a backend whose transactions already exclude every other writer
        (SQLite's ``BEGIN IMMEDIATE``) needs no row locks.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the connection(s). Further calls raise ``RuntimeError``."""

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
    def _account(tx: Transaction, account: str) -> tuple[str | None, dict[str, float]]:
        row = tx.execute(
            "SELECT parent FROM fencepost_ledger_accounts WHERE name = ?", (account,)
        ).fetchone()
        if row is None:
            raise UnknownAccount(account)
        limits = tx.execute(
            "SELECT axis, amount FROM fencepost_ledger_limits WHERE account = ? ORDER BY position",
            (account,),
        ).fetchall()
        return row[0], {axis: float(amount) for axis, amount in limits}

    def _held(self, tx: Transaction, account: str) -> dict[str, float]:
        rows = tx.execute(self._HELD, (account,)).fetchall()
        return {axis: float(amount) for axis, amount in rows}

    def _balance(self, tx: Transaction, account: str) -> Balance:
        parent, limits = self._account(tx, account)
        return Balance(account=account, parent=parent, limits=limits, held=self._held(tx, account))

    @staticmethod
    def _chain(tx: Transaction, account: str) -> list[str]:
        """``account`` and its ancestors, nearest first, in one query."""
        rows = tx.execute(
            """
            WITH RECURSIVE chain (name, parent, depth) AS (
                SELECT name, parent, 0 FROM fencepost_ledger_accounts WHERE name = ?
                UNION ALL
                SELECT a.name, a.parent, c.depth + 1
                FROM fencepost_ledger_accounts a JOIN chain c ON a.name = c.parent
                WHERE c.depth < ?
            )
            SELECT name, parent FROM chain ORDER BY depth
            """,
            (account, _MAX_DEPTH),
        ).fetchall()
        # A chain cut off at _MAX_DEPTH ends on a parent the rows do not hold: UnknownAccount.
        return walk_chain(account, dict(rows))

    @staticmethod
    def _holdings(
        tx: Transaction, chain: list[str]
    ) -> list[tuple[str, dict[str, float], dict[str, float]]]:
        """``(account, limits, held)`` for every account of ``chain``, in chain order."""
        limits: dict[str, dict[str, float]] = {name: {} for name in chain}
        held: dict[str, dict[str, float]] = {name: {} for name in chain}
        # Only our table names and one placeholder per account are formatted in; the account names
        # themselves go in as parameters.
        marks = ", ".join("?" for _ in chain)
        for table, into in (("fencepost_ledger_limits", limits), ("fencepost_ledger_held", held)):
            query = f"SELECT account, axis, amount FROM {table} WHERE account IN ({marks})"  # noqa: S608
            for name, axis, value in tx.execute(query, chain).fetchall():
                into[name][axis] = float(value)
        return [(name, limits[name], held[name]) for name in chain]

    def _reservation(self, tx: Transaction, key: str, *, lock: bool = False) -> Reservation | None:
        query = self._RESERVATION_FOR_UPDATE if lock else self._RESERVATION
        found = tx.execute(query, (key,)).fetchone()
        if found is None:
            return None
        amounts = tx.execute(
            "SELECT axis, amount FROM fencepost_ledger_reservation_amounts"
            " WHERE key = ? ORDER BY position",
            (key,),
        ).fetchall()
        return Reservation(
            account=found[0],
            key=key,
            amounts={axis: float(amount) for axis, amount in amounts},
            status=ReservationStatus(found[1]),
        )

    def _locked_reservation(self, tx: Transaction, key: str) -> tuple[Reservation, list[str]]:
        """The reservation under ``key`` and its account's chain, both locked."""
        row = tx.execute(
            "SELECT account FROM fencepost_ledger_reservations WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            raise UnknownReservation(key)
        chain = self._chain(tx, row[0])  # an account's parent never changes once opened
        self._lock_chain(tx, chain)
        reservation = self._reservation(tx, key, lock=True)
        if reservation is None:  # pragma: no cover - reservations are never deleted
            raise UnknownReservation(key)
        return reservation, chain

    # -- writes inside a transaction --------------------------------------------------------------

    @staticmethod
    def _add_held(tx: Transaction, chain: list[str], delta: Mapping[str, float]) -> None:
        tx.executemany(
            "INSERT INTO fencepost_ledger_held (account, axis, amount) VALUES (?, ?, ?)"
            " ON CONFLICT (account, axis)"
            " DO UPDATE SET amount = fencepost_ledger_held.amount + excluded.amount",
            [(name, axis, amount) for name in chain for axis, amount in delta.items()],
        )

    @staticmethod
    def _set_status(tx: Transaction, key: str, status: ReservationStatus) -> None:
        tx.execute(
            "UPDATE fencepost_ledger_reservations SET status = ? WHERE key = ?",
            (status.value, key),
        )

    # -- the port ---------------------------------------------------------------------------------

    def open_account(
        self, account: str, limits: Mapping[str, float], *, parent: str | None = None
    ) -> Balance:
        clean = validate_amounts(limits)

        def work(tx: Transaction) -> Balance:
            if parent is not None:
                self._account(tx, parent)  # raises UnknownAccount
            inserted = tx.execute(
                "INSERT INTO fencepost_ledger_accounts (name, parent) VALUES (?, ?)"
                " ON CONFLICT (name) DO NOTHING",
                (account, parent),
            ).rowcount
            if inserted == 0:
                check_same_terms(account, self._account(tx, account), (parent, clean))
            else:
                tx.executemany(
                    "INSERT INTO fencepost_ledger_limits (account, axis, position, amount)"
                    " VALUES (?, ?, ?, ?)",
                    [(account, axis, i, value) for i, (axis, value) in enumerate(clean.items())],
                )
            return self._balance(tx, account)

        return self._run(work)

    def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        clean = validate_amounts(amounts)

        def work(tx: Transaction) -> Reservation:
            prior = self._reservation(tx, key)
            if prior is not None:
                return existing_reservation(prior, account)
            chain = self._chain(tx, account)
            self._lock_chain(tx, chain)
            check_room(self._holdings(tx, chain), clean)
            inserted = tx.execute(
                "INSERT INTO fencepost_ledger_reservations (key, account, status)"
                " VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
                (key, account, ReservationStatus.RESERVED.value),
            ).rowcount
            if inserted == 0:
                raise KeyRace  # committed by another transaction since the first look
            self._add_held(tx, chain, clean)
            tx.executemany(
                "INSERT INTO fencepost_ledger_reservation_amounts (key, axis, position, amount)"
                " VALUES (?, ?, ?, ?)",
                [(key, axis, i, value) for i, (axis, value) in enumerate(clean.items())],
            )
            return Reservation(account=account, key=key, amounts=clean)

        return self._run(work)

    def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        def work(tx: Transaction) -> Reservation:
            reservation, chain = self._locked_reservation(tx, key)
            if (outcome := existing_outcome(reservation)) is not None:
                return outcome
            refund, final = settlement(reservation.amounts, actual)
            self._add_held(tx, chain, {axis: -amount for axis, amount in refund.items()})
            tx.executemany(
                "UPDATE fencepost_ledger_reservation_amounts SET amount = ?"
                " WHERE key = ? AND axis = ?",
                [(final[axis], key, axis) for axis in refund],
            )
            self._set_status(tx, key, ReservationStatus.SETTLED)
            return reservation.model_copy(
                update={"amounts": final, "status": ReservationStatus.SETTLED}
            )

        return self._run(work)

    def release(self, key: str) -> Reservation:
        def work(tx: Transaction) -> Reservation:
            reservation, chain = self._locked_reservation(tx, key)
            if (outcome := existing_outcome(reservation)) is not None:
                return outcome
            refund = {axis: -amount for axis, amount in reservation.amounts.items()}
            self._add_held(tx, chain, refund)
            self._set_status(tx, key, ReservationStatus.RELEASED)
            return reservation.model_copy(update={"status": ReservationStatus.RELEASED})

        return self._run(work)

    def get(self, key: str) -> Reservation | None:
        return self._run(lambda tx: self._reservation(tx, key), read_only=True)

    def balance(self, account: str) -> Balance:
        return self._run(lambda tx: self._balance(tx, account), read_only=True)

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
