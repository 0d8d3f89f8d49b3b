"""The async twins never run a blocking ledger call on the event loop's thread.

Each durable backend's driver is instrumented where it blocks: SQLite's connections trace every
statement they run (``set_trace_callback`` fires in the thread that runs it), and psycopg's sync
``Connection``/``Cursor`` execute and the sync pool's ``getconn`` record their thread. Every async
method is awaited on a loop; none of the recorded calls may be on the loop's thread, and each
method must have reached the database (so the instrument was live). The in-memory ledger runs its
twins inline by design (no I/O; its lock is held for microseconds), so it is not in this file;
the base class's default twins (a worker thread) are.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from fencepost.adapters import PostgresLedger, SqliteLedger
from fencepost.policy.budget import BudgetExhausted
from fencepost.policy.ledger import (
    AccountClosed,
    Balance,
    InMemoryLedger,
    Ledger,
    LedgerConflict,
    Reservation,
)
from fencepost.policy.windows import Window


@dataclass
class Calls:
    """Blocking driver calls, by thread: ``(thread id, thread name, what)``."""

    blocking: list[tuple[int, str, str]] = field(default_factory=list)
    native_async: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, what: str) -> None:
        current = threading.current_thread()
        with self.lock:
            self.blocking.append((threading.get_ident(), current.name, what))

    def take(self) -> tuple[list[tuple[int, str, str]], int]:
        with self.lock:
            taken, self.blocking = self.blocking, []
            native, self.native_async = self.native_async, 0
        return taken, native


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
def sqlite_ledger(
    tmp_path: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SqliteLedger]:
    real_connect = sqlite3.connect

    def traced_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = real_connect(*args, **kwargs)
        conn.set_trace_callback(lambda statement: calls.record(statement.split()[0]))
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced_connect)
    with SqliteLedger(tmp_path / "ledger.db") as ledger:
        yield ledger


@pytest.fixture
def postgres_ledger(
    postgres_schema: str, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PostgresLedger]:
    def spy(cls: type, name: str) -> None:
        real = getattr(cls, name)

        def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls.record(f"{cls.__name__}.{name}")
            return real(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, recorded)

    for cls, name in (
        (psycopg.Connection, "execute"),
        (psycopg.Cursor, "execute"),
        (psycopg.Cursor, "executemany"),
        (ConnectionPool, "getconn"),
    ):
        spy(cls, name)
    real_async_execute = psycopg.AsyncConnection.execute

    async def async_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.native_async += 1
        return await real_async_execute(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", async_execute)
    with PostgresLedger(postgres_schema) as ledger:
        yield ledger


Step = tuple[str, Callable[[Ledger], Awaitable[object]]]


async def _expect(error: type[BaseException], call: Awaitable[object]) -> object:
    with pytest.raises(error):
        await call
    return None


# Every async method, in an order that makes each one do real work (and the failing paths too).
STEPS: list[Step] = [
    ("aopen_account", lambda lg: lg.aopen_account("tenant", {"cost": 3}, owner={"tenant": "a"})),
    ("aopen_account", lambda lg: lg.aopen_account("run", {"cost": 2}, parent="tenant")),
    ("aopen_account", lambda lg: _expect(LedgerConflict, lg.aopen_account("run", {"cost": 9}))),
    ("abalance", lambda lg: lg.abalance("run")),
    ("areserve", lambda lg: lg.areserve("run", "k1", {"cost": 1})),
    ("areserve", lambda lg: lg.areserve("run", "k1", {"cost": 1})),
    ("areserve", lambda lg: _expect(BudgetExhausted, lg.areserve("run", "k2", {"cost": 5}))),
    ("areserve", lambda lg: lg.areserve("run", "k2", {"cost": 1})),
    ("asettle", lambda lg: lg.asettle("k1", {"cost": 0.5})),
    ("arelease", lambda lg: lg.arelease("k2")),
    ("aget", lambda lg: lg.aget("k1")),
    ("aclose_account", lambda lg: lg.aclose_account("run", "cancelled")),
    ("areserve", lambda lg: _expect(AccountClosed, lg.areserve("run", "k3", {}))),
]
METHODS = {"aopen_account", "aclose_account", "areserve", "asettle", "arelease", "aget", "abalance"}


def _run_every_async_method(ledger: Ledger, calls: Calls) -> dict[str, list[Any]]:
    """Await every step on a fresh loop; what each step's blocking calls were, by method."""
    seen: dict[str, list[Any]] = {}

    async def scenario() -> None:
        loop_thread = threading.get_ident()
        calls.take()
        for method, step in STEPS:
            await step(ledger)
            blocking, native = calls.take()
            on_loop = [what for ident, _, what in blocking if ident == loop_thread]
            assert on_loop == [], f"{method} ran {on_loop} on the event loop's thread"
            seen.setdefault(method, []).append((blocking, native))

    asyncio.run(scenario())
    return seen


def test_sqlite_async_twins_never_run_a_statement_on_the_event_loop_thread(
    sqlite_ledger: SqliteLedger, calls: Calls
) -> None:
    seen = _run_every_async_method(sqlite_ledger, calls)
    assert set(seen) == METHODS
    for method, runs in seen.items():
        for blocking, _ in runs:
            assert blocking, f"{method} reached no statement: the instrument saw nothing"
            names = {name for _, name, _ in blocking}
            # The ledger's own thread, not the loop's default executor that tools share.
            assert all(name.startswith("fencepost-sqlite-ledger") for name in names), names


def test_postgres_async_twins_use_async_connections_and_never_block_the_loop(
    postgres_ledger: PostgresLedger, calls: Calls
) -> None:
    seen = _run_every_async_method(postgres_ledger, calls)
    assert set(seen) == METHODS
    for method, runs in seen.items():
        for blocking, native in runs:
            assert blocking == [], f"{method} used the sync driver: {blocking}"
            assert native >= 1, f"{method} sent nothing on an AsyncConnection"


def test_postgres_async_twins_work_on_one_loop_after_another(
    postgres_ledger: PostgresLedger,
) -> None:
    # Async connections belong to the loop that opened them; a closed loop's are let go.
    async def reserve(key: str) -> Reservation:
        return await postgres_ledger.areserve("run", key, {"cost": 1})

    postgres_ledger.open_account("run", {"cost": 10})
    for i in range(3):
        assert not asyncio.run(reserve(f"k{i}")).existing
    assert postgres_ledger.balance("run").held == {"cost": 3.0}


def test_sqlite_async_twins_refuse_after_close(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "ledger.db")
    ledger.open_account("run", {})
    asyncio.run(ledger.areserve("run", "k", {}))
    ledger.close()
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(ledger.areserve("run", "k2", {}))


class _ThreadRecordingLedger(Ledger):
    """A ledger with only the sync methods: the async twins are the base class defaults."""

    def __init__(self) -> None:
        self.inner = InMemoryLedger()
        self.threads: list[int] = []

    def _seen(self) -> None:
        self.threads.append(threading.get_ident())

    def open_account(
        self,
        account: str,
        limits: Mapping[str, float],
        *,
        parent: str | None = None,
        owner: Mapping[str, str] | None = None,
        windows: Iterable[Window] | None = None,
    ) -> Balance:
        self._seen()
        return self.inner.open_account(account, limits, parent=parent, owner=owner, windows=windows)

    def close_account(self, account: str, reason: str) -> Balance:
        self._seen()
        return self.inner.close_account(account, reason)

    def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        self._seen()
        return self.inner.reserve(account, key, amounts)

    def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        self._seen()
        return self.inner.settle(key, actual)

    def release(self, key: str) -> Reservation:
        self._seen()
        return self.inner.release(key)

    def charge(
        self, account: str, key: str, amounts: Mapping[str, float], *, of: str | None = None
    ) -> Reservation:
        self._seen()
        return self.inner.charge(account, key, amounts, of=of)

    def get(self, key: str) -> Reservation | None:
        self._seen()
        return self.inner.get(key)

    def balance(self, account: str) -> Balance:
        self._seen()
        return self.inner.balance(account)


def test_the_default_async_twins_run_the_sync_methods_in_a_worker_thread() -> None:
    ledger = _ThreadRecordingLedger()

    async def scenario() -> int:
        for _, step in STEPS:
            await step(ledger)
        return threading.get_ident()

    loop_thread = asyncio.run(scenario())
    assert len(ledger.threads) == len(STEPS)
    assert loop_thread not in ledger.threads
