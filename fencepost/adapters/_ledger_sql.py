"""What the SQL ledgers share: the tables, their migration, and the reserve/settle/release flow.

Both backends keep the same six tables, and a seventh of their own for remembered approvals
(:mod:`fencepost.policy.remembered`), read and written here for both. :class:`SqlLedger` runs every operation as one
transaction of plain statements, deciding with the rules in :mod:`fencepost.policy.ledger`; the
SQLite backend uses it as it is (its transactions are in-process, so a statement costs
microseconds). The Postgres backend keeps the same tables but runs each operation as one call of a
server-side function (one round trip), see :mod:`fencepost.adapters.ledger_postgres`.

A backend of the flow supplies how a transaction is begun, committed and retried
(:meth:`SqlLedger._run`), how the account rows of a chain are locked against other writers
(:meth:`SqlLedger._lock_chain`), and the statements whose SQL differs (``_HELD``,
``_RESERVATION_FOR_UPDATE``). Statements are written with ``?`` placeholders, SQLite's style.
"""

from __future__ import annotations

import contextlib
import json
from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, ClassVar, Protocol, Self, TypeVar

from fencepost.policy.budget import BudgetExhausted
from fencepost.policy.deadline import Clock, SystemClock
from fencepost.policy.ledger import (
    MARKER_REFUSALS,
    AccountClosed,
    Attempt,
    Balance,
    Ledger,
    LedgerConflict,
    Reservation,
    ReservationStatus,
    UnknownAccount,
    UnknownReservation,
    check_open,
    check_room,
    check_same_terms,
    check_windows,
    existing_outcome,
    existing_reservation,
    over_limit,
    settlement,
    validate_amounts,
    validate_name,
    validate_owner,
    validate_windows,
    walk_chain,
    window_uses,
)
from fencepost.policy.remembered import ApprovalScope, ScopeStore, utc
from fencepost.policy.windows import Window, WindowUse, stored_terms, stored_window

__all__ = [
    "ACCOUNT_COLUMNS",
    "SCHEMA",
    "SCOPE_INSERT",
    "SCOPE_REVOKE",
    "TABLES",
    "Cursor",
    "KeyRace",
    "Params",
    "SqlLedger",
    "Transaction",
    "decode_owner",
    "encode_owner",
    "read_scope",
    "scope_query",
    "scope_row",
]

_T = TypeVar("_T")

Params = Sequence[Any]

TABLES = (
    "fencepost_ledger_accounts",
    "fencepost_ledger_limits",
    "fencepost_ledger_held",
    "fencepost_ledger_reservations",
    "fencepost_ledger_reservation_amounts",
    "fencepost_approval_scopes",
    "fencepost_ledger_in_flight",
    "fencepost_ledger_windows",
    "fencepost_ledger_window_held",
    "fencepost_ledger_reservation_at",
)

# Portable DDL: SQLite gives a ``double precision`` column REAL affinity, the same as ``REAL``.
SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_accounts (
        name text PRIMARY KEY,
        parent text REFERENCES fencepost_ledger_accounts (name),
        owner text NOT NULL DEFAULT '{}',
        closed text
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
    # Remembered approvals: the scope as JSON (``body``), with the columns it is found by.
    # Instants are ISO 8601 UTC text, compared in Python, so both databases store them alike.
    """
    CREATE TABLE IF NOT EXISTS fencepost_approval_scopes (
        scope_id text PRIMARY KEY,
        tenant_id text NOT NULL,
        tool_name text NOT NULL,
        created_at text NOT NULL,
        body text NOT NULL,
        revoked_at text
    )
    """,
    """
    CREATE INDEX IF NOT EXISTS fencepost_approval_scopes_by_tenant
        ON fencepost_approval_scopes (tenant_id, tool_name)
    """,
    # What reservations in flight hold, per account of their chain: held but not spent, so a
    # refusal can say it is busy (``BudgetExhausted.busy``). A database made before this table
    # starts it empty: a reservation in flight then is counted as spent until it lands.
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_in_flight (
        account text NOT NULL REFERENCES fencepost_ledger_accounts (name),
        axis text NOT NULL,
        amount double precision NOT NULL,
        PRIMARY KEY (account, axis)
    )
    """,
    # Spend windows (:mod:`fencepost.policy.windows`): an account's, in its opening order, and
    # what each bucket of each holds. A database made before these tables has no windows.
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_windows (
        account text NOT NULL REFERENCES fencepost_ledger_accounts (name),
        position integer NOT NULL,
        axis text NOT NULL,
        lim double precision NOT NULL,
        kind text NOT NULL CHECK (kind IN ('day', 'month', 'rolling')),
        seconds double precision NOT NULL,
        tz text NOT NULL,
        PRIMARY KEY (account, position)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_window_held (
        account text NOT NULL REFERENCES fencepost_ledger_accounts (name),
        position integer NOT NULL,
        bucket double precision NOT NULL,
        amount double precision NOT NULL,
        PRIMARY KEY (account, position, bucket)
    )
    """,
    # When a reservation on a chain with windows was made (epoch seconds): settling it (or
    # releasing it) gives back in the buckets it was counted in.
    """
    CREATE TABLE IF NOT EXISTS fencepost_ledger_reservation_at (
        key text PRIMARY KEY REFERENCES fencepost_ledger_reservations (key),
        at double precision NOT NULL
    )
    """,
)

SCOPE_INSERT = (
    "INSERT INTO fencepost_approval_scopes (scope_id, tenant_id, tool_name, created_at, body)"
    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (scope_id) DO NOTHING"
)
SCOPE_SELECT = "SELECT body, revoked_at FROM fencepost_approval_scopes"
SCOPE_REVOKE = (
    "UPDATE fencepost_approval_scopes SET revoked_at = ?"
    " WHERE scope_id = ? AND tenant_id = ? AND revoked_at IS NULL"
)


def scope_row(scope: ApprovalScope) -> tuple[str, str, str, str, str]:
    """The values :data:`SCOPE_INSERT` stores for ``scope``."""
    return (
        scope.scope_id,
        scope.tenant_id,
        scope.tool_name,
        utc(scope.created_at).isoformat(),
        scope.model_dump_json(exclude={"revoked_at"}),
    )


def read_scope(body: str, revoked_at: str | None) -> ApprovalScope:
    """A scope as stored: its JSON, with the revocation column's instant."""
    scope = ApprovalScope.model_validate_json(body)
    if revoked_at is None:
        return scope
    return scope.model_copy(update={"revoked_at": datetime.fromisoformat(revoked_at)})


def scope_query(
    tenant_id: str, tool_name: str | None, include_revoked: bool, *, mark: str = "?"
) -> tuple[str, tuple[str, ...]]:
    """The statement (placeholders ``mark``) listing a tenant's scopes, oldest first."""
    sql = SCOPE_SELECT + f" WHERE tenant_id = {mark}"
    params: tuple[str, ...] = (tenant_id,)
    if tool_name is not None:
        sql += f" AND tool_name = {mark}"
        params += (tool_name,)
    if not include_revoked:
        sql += " AND revoked_at IS NULL"
    return sql + " ORDER BY created_at, scope_id", params


ACCOUNT_COLUMNS = {
    "owner": "text NOT NULL DEFAULT '{}'",
    "closed": "text",
}
"""Columns of ``fencepost_ledger_accounts`` added since the first version: a database made by that
version gets them with ``ALTER TABLE ... ADD COLUMN`` (existing accounts: no owner, open)."""

_MAX_DEPTH = 1000
"""How far up a parent chain is followed before the chain is reported as broken."""


def encode_owner(owner: Mapping[str, str]) -> str:
    """The stored form of an owner: canonical JSON, so equal owners are equal text."""
    return json.dumps(dict(owner), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def decode_owner(text: str | None) -> dict[str, str]:
    """An owner as stored by :func:`encode_owner` (``{}`` for none)."""
    if not text:
        return {}
    decoded = json.loads(text)
    return {str(field): str(value) for field, value in decoded.items()}


class Cursor(Protocol):
    """The part of a DB-API cursor the flow reads (a ``sqlite3.Cursor`` fits)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> Sequence[Any]: ...


class Transaction(Protocol):
    """One open transaction taking ``?`` statements (a ``sqlite3.Connection`` fits as it is)."""

    def execute(self, sql: str, params: Params = ..., /) -> Cursor: ...

    def executemany(self, sql: str, rows: Iterable[Params], /) -> object: ...


_REFUSALS = (AccountClosed, LookupError, ValueError)
"""What a ledger rule raises before it writes anything: a combined operation commits what its
earlier parts wrote and raises it after, as the separate calls would have."""


def _raised(done: tuple[_T | None, Exception | None]) -> _T:
    """The value of a combined operation's transaction, or the refusal it deferred past its
    commit."""
    value, refused = done
    if refused is not None:
        raise refused
    assert value is not None
    return value


class KeyRace(Exception):
    """Another transaction committed the same idempotency key first: retry to return it."""


_Link = tuple[str, str | None, str, str | None, bool]
"""One account of a chain as read: ``(name, parent, owner, closed, has windows)``. Whether an
account has spend windows is read with its row: windows are fixed when the account opens, so an
account without any costs no read of the windows table (most accounts have none)."""

_ACCOUNT_ROW = (
    "SELECT parent, owner, closed,"
    " EXISTS (SELECT 1 FROM fencepost_ledger_windows w WHERE w.account = a.name)"
    " FROM fencepost_ledger_accounts a WHERE a.name = ?"
)
"""One account's row as a :data:`_Link` holds it (its name aside)."""

_CHAIN = """
    WITH RECURSIVE chain (name, parent, owner, closed, depth) AS (
        SELECT name, parent, owner, closed, 0
        FROM fencepost_ledger_accounts WHERE name = ?
        UNION ALL
        SELECT a.name, a.parent, a.owner, a.closed, c.depth + 1
        FROM fencepost_ledger_accounts a JOIN chain c ON a.name = c.parent
        WHERE c.depth < ?
    )
    SELECT name, parent, owner, closed,
        EXISTS (SELECT 1 FROM fencepost_ledger_windows w WHERE w.account = chain.name)
    FROM chain ORDER BY depth
"""
"""An account and its ancestors as :data:`_Link` rows, nearest first."""

_ChainRead = tuple[list[_Link], dict[str, list[tuple[int, Window]]]]
"""An account's chain and the chain's windows (by account, ``(position, window)``), as read."""


class SqlLedger(Ledger, ScopeStore):
    """The :class:`~fencepost.policy.ledger.Ledger` flow over SQL; see the module docstring."""

    _HELD: ClassVar[str]
    """Select ``axis, amount`` held by one account (``?``), in the backend's order."""

    _RESERVATION: ClassVar[str] = (
        "SELECT account, status FROM fencepost_ledger_reservations WHERE key = ?"
    )
    _RESERVATION_FOR_UPDATE: ClassVar[str] = _RESERVATION
    """``_RESERVATION`` that also locks the row, where the database has row locks."""

    _clock: Clock = SystemClock()
    """Where the instant a reservation is counted at in spend windows comes from."""

    # -- what a backend supplies ------------------------------------------------------------------

    @abstractmethod
    def _run(
        self,
        work: Callable[[Transaction], _T],
        *,
        read_only: bool = False,
        covered: bool = False,
    ) -> _T:
        """Run ``work`` in one transaction (retrying it as the backend needs) and commit.

        ``covered``: what the transaction records need not be on disk when it returns, because
        the loop makes a synced write to the same ledger before any external call that depends
        on it (a settled step's calls are begun with a synced ``start_attempt`` or
        ``begin_attempt``; a finished call is followed by the next step's ``reserve``): a
        backend whose commits wait for the disk may let this one not wait."""

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
    def _account(
        tx: Transaction, account: str
    ) -> tuple[str | None, dict[str, float], str, str | None]:
        """``(parent, limits, owner as stored, closed)`` of ``account``."""
        row = tx.execute(
            "SELECT parent, owner, closed FROM fencepost_ledger_accounts WHERE name = ?",
            (account,),
        ).fetchone()
        if row is None:
            raise UnknownAccount(account)
        return row[0], SqlLedger._limits(tx, account), row[1], row[2]

    @staticmethod
    def _limits(tx: Transaction, account: str) -> dict[str, float]:
        """The limits of ``account``, in their opening order."""
        limits = tx.execute(
            "SELECT axis, amount FROM fencepost_ledger_limits WHERE account = ? ORDER BY position",
            (account,),
        ).fetchall()
        return {axis: float(amount) for axis, amount in limits}

    def _held(self, tx: Transaction, account: str) -> dict[str, float]:
        rows = tx.execute(self._HELD, (account,)).fetchall()
        return {axis: float(amount) for axis, amount in rows}

    @staticmethod
    def _in_flight(tx: Transaction, chain: list[str]) -> dict[str, dict[str, float]]:
        """What reservations in flight hold on each account of ``chain``."""
        out: dict[str, dict[str, float]] = {name: {} for name in chain}
        marks = ", ".join("?" for _ in chain)
        query = f"SELECT account, axis, amount FROM fencepost_ledger_in_flight WHERE account IN ({marks})"  # noqa: S608
        for name, axis, value in tx.execute(query, chain).fetchall():
            out[name][axis] = float(value)
        return out

    def _balance(self, tx: Transaction, account: str) -> Balance:
        row = tx.execute(_ACCOUNT_ROW, (account,)).fetchone()
        if row is None:
            raise UnknownAccount(account)
        return self._balance_of(tx, (account, row[0], row[1], row[2], bool(row[3])))

    def _balance_of(
        self, tx: Transaction, link: _Link, limits: dict[str, float] | None = None
    ) -> Balance:
        """The balance of the account of ``link`` (its row as :meth:`_chain` read it in this
        transaction: parent, owner and closed are not read again), and ``limits`` where read."""
        account, parent, owner, closed, windowed = link
        return Balance(
            account=account,
            parent=parent,
            limits=self._limits(tx, account) if limits is None else limits,
            held=self._held(tx, account),
            owner=decode_owner(owner),
            closed=closed,
            windows=self._window_uses(tx, account) if windowed else (),
        )

    @staticmethod
    def _windows(tx: Transaction, chain: list[str]) -> dict[str, list[tuple[int, Window]]]:
        """The windows of each account of ``chain`` that has any, as ``(position, window)``."""
        out: dict[str, list[tuple[int, Window]]] = {}
        marks = ", ".join("?" for _ in chain)
        query = (
            "SELECT account, position, axis, lim, kind, seconds, tz FROM fencepost_ledger_windows"  # noqa: S608
            f" WHERE account IN ({marks}) ORDER BY account, position"
        )
        for name, position, axis, lim, kind, seconds, tz in tx.execute(query, chain).fetchall():
            window = stored_window(axis, float(lim), kind, float(seconds), tz)
            out.setdefault(name, []).append((int(position), window))
        return out

    @staticmethod
    def _window_held(
        tx: Transaction, account: str, windows: list[tuple[int, Window]], now: float
    ) -> list[tuple[Window, float]]:
        """Each window of ``account`` with what it holds at ``now``."""
        out: list[tuple[Window, float]] = []
        for position, window in windows:
            row = tx.execute(
                "SELECT coalesce(sum(amount), 0) FROM fencepost_ledger_window_held"
                " WHERE account = ? AND position = ? AND bucket >= ?",
                (account, position, window.since(now)),
            ).fetchone()
            out.append((window, float(row[0])))
        return out

    def _window_uses(self, tx: Transaction, account: str) -> tuple[WindowUse, ...]:
        windows = self._windows(tx, [account]).get(account)
        if not windows:
            return ()
        now = self._clock.now().timestamp()
        return window_uses(self._window_held(tx, account, windows, now), now)

    @staticmethod
    def _add_windows(
        tx: Transaction,
        windows: Mapping[str, list[tuple[int, Window]]],
        delta: Mapping[str, float],
        at: float,
    ) -> None:
        """Count ``delta`` in every window of ``windows`` (by account), in the buckets of ``at``."""
        rows = [
            (name, position, window.bucket(at), delta[window.axis])
            for name, spans in windows.items()
            for position, window in spans
            if delta.get(window.axis)
        ]
        if rows:
            tx.executemany(
                "INSERT INTO fencepost_ledger_window_held (account, position, bucket, amount)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (account, position, bucket)"
                " DO UPDATE SET amount = fencepost_ledger_window_held.amount + excluded.amount",
                rows,
            )

    def _charged_at(self, tx: Transaction, account: str, of: str | None) -> float:
        """The instant a charge counts at: that of the reservation ``of`` of ``account``, else now."""
        if of is not None:
            row = tx.execute(
                "SELECT t.at FROM fencepost_ledger_reservation_at t"
                " JOIN fencepost_ledger_reservations s ON s.key = t.key"
                " WHERE t.key = ? AND s.account = ?",
                (of, account),
            ).fetchone()
            if row is not None:
                return float(row[0])
        return self._clock.now().timestamp()

    def _refund_windows(
        self, tx: Transaction, key: str, links: list[_Link], refund: Mapping[str, float]
    ) -> None:
        """Give ``refund`` back in the buckets the reservation under ``key`` was counted in (a
        chain without windows was counted in none: a reservation's chain never changes)."""
        if not refund or not any(link[4] for link in links):
            return
        row = tx.execute(
            "SELECT at FROM fencepost_ledger_reservation_at WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            return
        windows = self._windows(tx, [link[0] for link in links])
        self._add_windows(tx, windows, {a: -v for a, v in refund.items()}, float(row[0]))

    @staticmethod
    def _chain(tx: Transaction, account: str) -> list[_Link]:
        """``account`` and its ancestors, nearest first, in one query."""
        rows = tx.execute(_CHAIN, (account, _MAX_DEPTH)).fetchall()
        # A chain cut off at _MAX_DEPTH ends on a parent the rows do not hold: UnknownAccount.
        walk_chain(account, {row[0]: row[1] for row in rows})
        return [(row[0], row[1], row[2], row[3], bool(row[4])) for row in rows]

    @staticmethod
    def _holdings(
        tx: Transaction, chain: list[str]
    ) -> list[tuple[str, dict[str, float], dict[str, float]]]:
        """``(account, limits, held)`` for every account of ``chain``, in chain order.

        Limits come in their opening order.
        """
        limits: dict[str, dict[str, float]] = {name: {} for name in chain}
        held: dict[str, dict[str, float]] = {name: {} for name in chain}
        # Only our table names and one placeholder per account are formatted in; the account names
        # themselves go in as parameters.
        marks = ", ".join("?" for _ in chain)
        for table, into, order in (
            ("fencepost_ledger_limits", limits, " ORDER BY position"),
            ("fencepost_ledger_held", held, ""),
        ):
            query = f"SELECT account, axis, amount FROM {table} WHERE account IN ({marks}){order}"  # noqa: S608
            for name, axis, value in tx.execute(query, chain).fetchall():
                into[name][axis] = float(value)
        return [(name, limits[name], held[name]) for name in chain]

    @staticmethod
    def _room(
        tx: Transaction, chain: list[str]
    ) -> tuple[list[tuple[str, dict[str, float], dict[str, float]]], dict[str, dict[str, float]]]:
        """:meth:`_holdings` and :meth:`_in_flight` of ``chain``, read in one statement: what a
        reservation is checked against."""
        limits: dict[str, dict[str, float]] = {name: {} for name in chain}
        held: dict[str, dict[str, float]] = {name: {} for name in chain}
        flying: dict[str, dict[str, float]] = {name: {} for name in chain}
        marks = ", ".join("?" for _ in chain)
        # Only our table names and one placeholder per account are formatted in.
        query = (
            "SELECT 0, account, axis, amount, position FROM fencepost_ledger_limits"  # noqa: S608
            f" WHERE account IN ({marks})"
            " UNION ALL SELECT 1, account, axis, amount, 0 FROM fencepost_ledger_held"
            f" WHERE account IN ({marks})"
            " UNION ALL SELECT 2, account, axis, amount, 0 FROM fencepost_ledger_in_flight"
            f" WHERE account IN ({marks})"
        )
        into = (limits, held, flying)
        rows = tx.execute(query, [*chain, *chain, *chain]).fetchall()
        # Limits in their opening order; held and in flight as each table gives them (a stable
        # sort keeps their order).
        for kind, name, axis, value, _ in sorted(rows, key=lambda row: (row[0], row[4])):
            into[kind][name][axis] = float(value)
        return [(name, limits[name], held[name]) for name in chain], flying

    def _reservation(self, tx: Transaction, key: str, *, lock: bool = False) -> Reservation | None:
        query = self._RESERVATION_FOR_UPDATE if lock else self._RESERVATION
        found = tx.execute(query, (key,)).fetchone()
        if found is None:
            return None
        return self._with_amounts(tx, key, found)

    @staticmethod
    def _with_amounts(tx: Transaction, key: str, found: Sequence[Any]) -> Reservation:
        """The reservation under ``key`` whose row (``account, status``) was read as ``found``."""
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

    def _locked_reservation(
        self, tx: Transaction, key: str, read: list[_Link] | None = None
    ) -> tuple[Reservation, list[str], list[_Link]]:
        """The reservation under ``key`` and its account's chain, both locked: the chain's names
        and its rows as read (the account's first). ``read``: a chain read and locked earlier in
        ``tx``, used when it is this reservation's account's."""
        row = tx.execute(self._RESERVATION, (key,)).fetchone()
        if row is None:
            raise UnknownReservation(key)
        if read is not None and read[0][0] == row[0]:
            links = read
            chain = [link[0] for link in links]
        else:
            # an account's parent never changes once opened
            links = self._chain(tx, row[0])
            chain = [link[0] for link in links]
            self._lock_chain(tx, chain)
        if self._RESERVATION_FOR_UPDATE != self._RESERVATION:
            # A backend with row locks reads it again under its lock, after the chain's.
            row = tx.execute(self._RESERVATION_FOR_UPDATE, (key,)).fetchone()
            if row is None:  # pragma: no cover - reservations are never deleted
                raise UnknownReservation(key)
        return self._with_amounts(tx, key, row), chain, links

    # -- writes inside a transaction --------------------------------------------------------------

    @staticmethod
    def _add_held(tx: Transaction, chain: list[str], delta: Mapping[str, float]) -> None:
        if not delta:
            return
        tx.executemany(
            "INSERT INTO fencepost_ledger_held (account, axis, amount) VALUES (?, ?, ?)"
            " ON CONFLICT (account, axis)"
            " DO UPDATE SET amount = fencepost_ledger_held.amount + excluded.amount",
            [(name, axis, amount) for name in chain for axis, amount in delta.items()],
        )

    @staticmethod
    def _add_in_flight(tx: Transaction, chain: list[str], delta: Mapping[str, float]) -> None:
        if not delta:
            return
        tx.executemany(
            "INSERT INTO fencepost_ledger_in_flight (account, axis, amount) VALUES (?, ?, ?)"
            " ON CONFLICT (account, axis)"
            " DO UPDATE SET amount = fencepost_ledger_in_flight.amount + excluded.amount",
            [(name, axis, amount) for name in chain for axis, amount in delta.items()],
        )

    @staticmethod
    def _set_status(tx: Transaction, key: str, status: ReservationStatus) -> None:
        tx.execute(
            "UPDATE fencepost_ledger_reservations SET status = ? WHERE key = ?",
            (status.value, key),
        )

    def _landed(self, tx: Transaction, chain: list[str], reservation: Reservation) -> None:
        """A reservation in flight was settled or released: its chain no longer holds it in
        flight (what it reserved, whatever it settled at)."""
        self._add_in_flight(
            tx, chain, {axis: -amount for axis, amount in reservation.amounts.items()}
        )

    # -- the port ---------------------------------------------------------------------------------

    def open_account(
        self,
        account: str,
        limits: Mapping[str, float],
        *,
        parent: str | None = None,
        owner: Mapping[str, str] | None = None,
        windows: Iterable[Window] | None = None,
    ) -> Balance:
        validate_name(account, "account")
        if parent is not None:
            validate_name(parent, "parent")
        clean = validate_amounts(limits)
        who = validate_owner(owner)
        spans = validate_windows(windows)

        def work(tx: Transaction) -> Balance:
            if parent is not None:
                self._account(tx, parent)  # raises UnknownAccount
            inserted = tx.execute(
                "INSERT INTO fencepost_ledger_accounts (name, parent, owner) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO NOTHING",
                (account, parent, encode_owner(who)),
            ).rowcount
            if inserted == 0:
                opened_parent, opened_limits, opened_owner, _ = self._account(tx, account)
                opened_windows = [w for _, w in self._windows(tx, [account]).get(account, [])]
                check_same_terms(
                    account,
                    (opened_parent, opened_limits, decode_owner(opened_owner)),
                    (parent, clean, who),
                    opened_windows,
                    spans,
                )
            else:
                tx.executemany(
                    "INSERT INTO fencepost_ledger_limits (account, axis, position, amount)"
                    " VALUES (?, ?, ?, ?)",
                    [(account, axis, i, value) for i, (axis, value) in enumerate(clean.items())],
                )
                tx.executemany(
                    "INSERT INTO fencepost_ledger_windows"
                    " (account, position, axis, lim, kind, seconds, tz)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(account, i, *stored_terms(w)) for i, w in enumerate(spans)],
                )
            return self._balance(tx, account)

        return self._run(work)

    def close_account(self, account: str, reason: str) -> Balance:
        validate_name(account, "account")
        validate_name(reason, "reason")

        def work(tx: Transaction) -> Balance:
            tx.execute(
                "UPDATE fencepost_ledger_accounts SET closed = ? WHERE name = ? AND closed IS NULL",
                (reason, account),
            )
            return self._balance(tx, account)  # raises UnknownAccount

        return self._run(work)

    def _prior_in(self, tx: Transaction, account: str, key: str) -> Sequence[Any] | None:
        """The row (``account, status``) of the reservation of ``key`` made before on
        ``account``, or ``None``; ``LedgerConflict`` where another account holds the key."""
        found: Sequence[Any] | None = tx.execute(self._RESERVATION, (key,)).fetchone()
        if found is not None and found[0] != account:
            raise LedgerConflict(f"key {key!r} is held by another account")
        return found

    def _reserve_in(
        self,
        tx: Transaction,
        account: str,
        key: str,
        clean: dict[str, float],
        read: _ChainRead | None = None,
    ) -> Reservation:
        """:meth:`reserve` of checked values, inside ``tx`` (``read``: see :meth:`_insert_in`)."""
        found = self._prior_in(tx, account, key)
        if found is not None:
            prior = self._with_amounts(tx, key, found)
            return existing_reservation(prior, account, self._balance(tx, account))
        links, holdings, windows = self._insert_in(tx, account, key, clean, read)
        if holdings is None:
            # A marker holds nothing: the account's holdings are as they were.
            limits, after = self._limits(tx, account), self._held(tx, account)
        else:
            # The balance after the charge, from what was read under the lock: no second read.
            _, limits, held = holdings[0]
            after = dict(held)
            for axis, amount in clean.items():
                after[axis] = after.get(axis, 0.0) + amount
        _, parent, owner, _, _ = links[0]
        balance = Balance(
            account=account,
            parent=parent,
            limits=limits,
            held=after,
            owner=decode_owner(owner),
            windows=self._window_uses(tx, account) if account in windows else (),
        )
        return Reservation(account=account, key=key, amounts=clean, balance=balance)

    def _mark_in(
        self, tx: Transaction, account: str, key: str, read: _ChainRead | None = None
    ) -> _ChainRead | None:
        """:meth:`_reserve_in` of a zero-amount marker whose answer is dropped (a call's claim,
        a result marker): its refusals and its writes, without reading what no one reads. The
        account's chain and windows as it read them (``None``: the key was there, nothing read;
        ``read``: see :meth:`_insert_in`)."""
        if self._prior_in(tx, account, key) is not None:
            return None
        links, _, windows = self._insert_in(tx, account, key, {}, read)
        return links, windows

    def _read_of(self, tx: Transaction, links: list[_Link]) -> _ChainRead:
        """A chain read (and locked) earlier in ``tx``, with its windows, as :meth:`_insert_in`
        takes it: within one transaction nothing another writer does can change it, and a
        chain's rows and windows are never changed by the operations that pass it on."""
        if not any(link[4] for link in links):
            return links, {}
        return links, self._windows(tx, [link[0] for link in links])

    def _insert_in(
        self,
        tx: Transaction,
        account: str,
        key: str,
        clean: dict[str, float],
        read: _ChainRead | None = None,
    ) -> tuple[
        list[_Link],
        list[tuple[str, dict[str, float], dict[str, float]]] | None,
        dict[str, list[tuple[int, Window]]],
    ]:
        """Check a reservation of ``clean`` under the new ``key`` against the chain and write
        it: the chain's rows, its holdings before (``None`` for a marker of ``{}``, which no
        limit or window can refuse: they are not read) and its windows. ``read``: the account's
        chain and windows as read (and locked) earlier in ``tx``, which nothing since changed
        (a claim's, for the start marker after it): not read again."""
        if read is None:
            links = self._chain(tx, account)
            chain = [link[0] for link in links]
            self._lock_chain(tx, chain)
        else:
            links = read[0]
            chain = [link[0] for link in links]
        check_open((name, closed) for name, _, _, closed, _ in links)
        holdings = None
        flying: dict[str, dict[str, float]] = {}
        if clean:
            holdings, flying = self._room(tx, chain)
            check_room(holdings, clean, flying)
        windows = read[1] if read is not None else self._read_of(tx, links)[1]
        now = self._clock.now().timestamp() if windows else 0.0
        if windows and clean:
            check_windows(
                (
                    (name, self._window_held(tx, name, windows[name], now))
                    for name in chain
                    if name in windows
                ),
                clean,
                now,
                flying,
            )
        inserted = tx.execute(
            "INSERT INTO fencepost_ledger_reservations (key, account, status)"
            " VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
            (key, account, ReservationStatus.RESERVED.value),
        ).rowcount
        if inserted == 0:
            raise KeyRace  # committed by another transaction since the first look
        self._add_held(tx, chain, clean)
        self._add_in_flight(tx, chain, clean)
        if windows:
            self._add_windows(tx, windows, clean, now)
            tx.execute(
                "INSERT INTO fencepost_ledger_reservation_at (key, at) VALUES (?, ?)",
                (key, now),
            )
        if clean:
            tx.executemany(
                "INSERT INTO fencepost_ledger_reservation_amounts (key, axis, position, amount)"
                " VALUES (?, ?, ?, ?)",
                [(key, axis, i, value) for i, (axis, value) in enumerate(clean.items())],
            )
        return links, holdings, windows

    def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        validate_name(account, "account")
        validate_name(key)
        clean = validate_amounts(amounts)
        return self._run(lambda tx: self._reserve_in(tx, account, key, clean))

    def charge(
        self, account: str, key: str, amounts: Mapping[str, float], *, of: str | None = None
    ) -> Reservation:
        validate_name(account, "account")
        validate_name(key)
        if of is not None:
            validate_name(of)
        clean = validate_amounts(amounts)

        def work(tx: Transaction) -> Reservation:
            links = self._chain(tx, account)  # raises UnknownAccount
            chain = [link[0] for link in links]
            self._lock_chain(tx, chain)
            prior = self._reservation(tx, key)
            if prior is not None:
                found = existing_reservation(prior, account)  # raises LedgerConflict
            else:
                # Neither a closed account nor a limit refuses it: the usage already happened.
                inserted = tx.execute(
                    "INSERT INTO fencepost_ledger_reservations (key, account, status)"
                    " VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
                    (key, account, ReservationStatus.SETTLED.value),
                ).rowcount
                if inserted == 0:
                    raise KeyRace  # committed by another transaction since the first look
                self._add_held(tx, chain, clean)
                windows = self._windows(tx, chain) if any(link[4] for link in links) else {}
                if windows:
                    self._add_windows(tx, windows, clean, self._charged_at(tx, account, of))
                tx.executemany(
                    "INSERT INTO fencepost_ledger_reservation_amounts (key, axis, position, amount)"
                    " VALUES (?, ?, ?, ?)",
                    [(key, axis, i, value) for i, (axis, value) in enumerate(clean.items())],
                )
                found = Reservation(
                    account=account, key=key, amounts=clean, status=ReservationStatus.SETTLED
                )
            return found.model_copy(
                update={
                    "balance": self._balance(tx, account),
                    "exceeded": over_limit(self._holdings(tx, chain), clean),
                }
            )

        return self._run(work)

    def _settle_in(
        self,
        tx: Transaction,
        key: str,
        actual: Mapping[str, float] | None,
        read: list[_Link] | None = None,
    ) -> tuple[Reservation, list[_Link]]:
        """:meth:`settle` inside ``tx``, and the chain it read (``read``: see
        :meth:`_locked_reservation`)."""
        reservation, chain, links = self._locked_reservation(tx, key, read)
        if (outcome := existing_outcome(reservation)) is not None:
            return outcome.model_copy(update={"balance": self._balance_of(tx, links[0])}), links
        refund, final = settlement(reservation.amounts, actual)
        self._add_held(tx, chain, {axis: -amount for axis, amount in refund.items()})
        self._refund_windows(tx, key, links, refund)
        self._landed(tx, chain, reservation)
        if refund:
            tx.executemany(
                "UPDATE fencepost_ledger_reservation_amounts SET amount = ?"
                " WHERE key = ? AND axis = ?",
                [(final[axis], key, axis) for axis in refund],
            )
        self._set_status(tx, key, ReservationStatus.SETTLED)
        settled = reservation.model_copy(
            update={
                "amounts": final,
                "status": ReservationStatus.SETTLED,
                "balance": self._balance_of(tx, links[0]),
            }
        )
        return settled, links

    def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        validate_name(key)
        return self._run(lambda tx: self._settle_in(tx, key, actual)[0])

    def _reserved_in(self, tx: Transaction, account: str, key: str) -> Reservation | None:
        """:meth:`reserved` inside ``tx``."""
        prior = self._reservation(tx, key)
        if prior is None:
            return None
        return existing_reservation(prior, account, self._balance(tx, account))

    def reserved(self, account: str, key: str) -> Reservation | None:
        validate_name(account, "account")
        validate_name(key)
        return self._run(lambda tx: self._reserved_in(tx, account, key), read_only=True)

    def _begin_in(
        self,
        tx: Transaction,
        account: str,
        marker: str,
        claim: str | None,
        read: _ChainRead | None = None,
    ) -> tuple[Attempt | None, Exception | None]:
        """:meth:`begin_attempt` inside ``tx``: the attempt, or the refusal to raise once what
        was written before it (the claim) is committed, as two calls would leave it. ``read``:
        the account's chain as read earlier in ``tx`` (see :meth:`_insert_in`)."""
        if claim is not None:
            try:
                read = self._mark_in(tx, account, claim, read) or read
            except LedgerConflict:
                return Attempt(claimed=False), None
        try:
            started = self._reserve_in(tx, account, marker, {}, read)
            return Attempt(claimed=True, started=started), None
        except _REFUSALS as refused:
            return None, refused

    def begin_attempt(self, account: str, marker: str, *, claim: str | None = None) -> Attempt:
        validate_name(account, "account")
        validate_name(marker)
        if claim is not None:
            validate_name(claim)
        return _raised(self._run(lambda tx: self._begin_in(tx, account, marker, claim)))

    def start_attempt(
        self,
        account: str,
        key: str,
        marker: str,
        *,
        claim: str | None = None,
        begins: Callable[[Reservation], bool],
    ) -> tuple[Reservation | None, Attempt | None]:
        validate_name(account, "account")
        validate_name(key)
        validate_name(marker)
        if claim is not None:
            validate_name(claim)

        def work(
            tx: Transaction,
        ) -> tuple[tuple[Reservation | None, Attempt | None] | None, Exception | None]:
            prior = self._reservation(tx, key)
            if prior is None:
                return (None, None), None  # a write transaction that wrote nothing
            # The account's chain, read once: its row for the balance, all of it for the markers.
            links = self._chain(tx, account)  # raises UnknownAccount
            self._lock_chain(tx, [link[0] for link in links])
            found = existing_reservation(prior, account, self._balance_of(tx, links[0]))
            if not begins(found):
                return (found, None), None  # a write transaction that wrote nothing
            begun, refused = self._begin_in(tx, account, marker, claim, self._read_of(tx, links))
            return (None, refused) if refused is not None else ((found, begun), None)

        return _raised(self._run(work))

    def finish_attempt(
        self,
        account: str,
        key: str,
        *,
        result: str | None = None,
        actual: Mapping[str, float] | None = None,
    ) -> Reservation:
        validate_name(key)
        if result is not None:
            validate_name(account, "account")
            validate_name(result)

        def work(tx: Transaction) -> tuple[Reservation | None, Exception | None]:
            read = None
            if result is not None:
                with contextlib.suppress(*MARKER_REFUSALS):
                    read = self._mark_in(tx, account, result)
            try:
                return self._settle_in(tx, key, actual, read[0] if read else None)[0], None
            except _REFUSALS as refused:
                return None, refused  # the marker made above is kept, as two calls would

        # Covered by the next step's reserve (or the next call's start) before any external call.
        return _raised(self._run(work, covered=True))

    def settle_and_reserve(
        self,
        key: str,
        actual: Mapping[str, float] | None,
        account: str,
        holds: Sequence[tuple[str, Mapping[str, float]]],
    ) -> tuple[Reservation, list[Reservation | BudgetExhausted]]:
        validate_name(key)
        asked = list(holds)

        def work(
            tx: Transaction,
        ) -> tuple[
            tuple[Reservation, list[Reservation | BudgetExhausted]] | None, Exception | None
        ]:
            settled, links = self._settle_in(tx, key, actual)
            # The holds' chain is the step's, read above, when they are on its account.
            read = self._read_of(tx, links) if asked and links[0][0] == account else None
            held: list[Reservation | BudgetExhausted] = []
            for hold, amounts in asked:
                try:
                    # Checked here, in order, as each separate reserve would check its own.
                    validate_name(account, "account")
                    validate_name(hold)
                    clean = validate_amounts(amounts)
                    held.append(self._reserve_in(tx, account, hold, clean, read))
                except BudgetExhausted as refused:
                    held.append(refused)  # refused before it wrote: the next is asked
                except _REFUSALS as refused:
                    return None, refused  # what was written above is kept, as separate calls
            return (settled, held), None

        # Covered by start_attempt / begin_attempt, synced, before any of the held calls runs.
        return _raised(self._run(work, covered=True))

    def release(self, key: str) -> Reservation:
        validate_name(key)

        def work(tx: Transaction) -> Reservation:
            reservation, chain, links = self._locked_reservation(tx, key)
            if (outcome := existing_outcome(reservation)) is not None:
                return outcome.model_copy(update={"balance": self._balance_of(tx, links[0])})
            refund = {axis: -amount for axis, amount in reservation.amounts.items()}
            self._add_held(tx, chain, refund)
            self._refund_windows(tx, key, links, reservation.amounts)
            self._landed(tx, chain, reservation)
            self._set_status(tx, key, ReservationStatus.RELEASED)
            return reservation.model_copy(
                update={
                    "status": ReservationStatus.RELEASED,
                    "balance": self._balance_of(tx, links[0]),
                }
            )

        return self._run(work)

    def get(self, key: str) -> Reservation | None:
        validate_name(key)
        return self._run(lambda tx: self._reservation(tx, key), read_only=True)

    def balance(self, account: str) -> Balance:
        validate_name(account, "account")
        return self._run(lambda tx: self._balance(tx, account), read_only=True)

    # -- remembered approvals ---------------------------------------------------------------------

    def remember_scope(self, scope: ApprovalScope) -> ApprovalScope:
        def work(tx: Transaction) -> ApprovalScope:
            tx.execute(SCOPE_INSERT, scope_row(scope))
            row = tx.execute(SCOPE_SELECT + " WHERE scope_id = ?", (scope.scope_id,)).fetchone()
            return read_scope(row[0], row[1])

        return self._run(work)

    def approval_scopes(
        self, tenant_id: str, *, tool_name: str | None = None, include_revoked: bool = False
    ) -> list[ApprovalScope]:
        sql, params = scope_query(tenant_id, tool_name, include_revoked)
        rows = self._run(lambda tx: tx.execute(sql, params).fetchall(), read_only=True)
        return [read_scope(body, revoked) for body, revoked in rows]

    def revoke_scope(self, tenant_id: str, scope_id: str, *, at: datetime) -> ApprovalScope | None:
        def work(tx: Transaction) -> ApprovalScope | None:
            tx.execute(SCOPE_REVOKE, (utc(at).isoformat(), scope_id, tenant_id))
            row = tx.execute(
                SCOPE_SELECT + " WHERE scope_id = ? AND tenant_id = ?", (scope_id, tenant_id)
            ).fetchone()
            return None if row is None else read_scope(row[0], row[1])

        return self._run(work)

    def in_flight(self, account: str) -> dict[str, float]:
        validate_name(account, "account")

        def work(tx: Transaction) -> dict[str, float]:
            self._account(tx, account)  # raises UnknownAccount
            return self._in_flight(tx, [account])[account]

        return self._run(work, read_only=True)
