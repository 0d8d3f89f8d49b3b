"""Rules only the SQLite backend has: how it waits for another process's lock."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencepost as fp
from fencepost.adapters import SqliteLedger

# Extended result codes SQLite reports while another connection holds or rebuilds a lock.
BUSY_RECOVERY = sqlite3.SQLITE_BUSY | (1 << 8)
BUSY_SNAPSHOT = sqlite3.SQLITE_BUSY | (2 << 8)
LOCKED_SHAREDCACHE = sqlite3.SQLITE_LOCKED | (1 << 8)


class _FlakyConnection:
    """A real connection whose next ``BEGIN``s fail as if another process held the lock."""

    def __init__(self, real: sqlite3.Connection, codes: list[int]) -> None:
        self._real = real
        self.codes = codes

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql.startswith("BEGIN") and self.codes:
            error = sqlite3.OperationalError("database is locked")
            error.sqlite_errorcode = self.codes.pop(0)  # type: ignore[attr-defined]
            raise error
        return self._real.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.fixture
def flaky(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[SqliteLedger, list[int]]]:
    codes: list[int] = []
    real_connect = sqlite3.connect
    monkeypatch.setattr(
        sqlite3, "connect", lambda *a, **k: _FlakyConnection(real_connect(*a, **k), codes)
    )
    with SqliteLedger(tmp_path / "ledger.db", busy_timeout=5) as ledger:
        yield ledger, codes


@pytest.mark.parametrize(
    "code", [sqlite3.SQLITE_BUSY, BUSY_RECOVERY, BUSY_SNAPSHOT, LOCKED_SHAREDCACHE]
)
def test_a_lock_held_elsewhere_is_waited_out_whatever_its_extended_code(
    flaky: tuple[SqliteLedger, list[int]], code: int
) -> None:
    ledger, codes = flaky
    ledger.open_account("run", {"tool_calls": 2})
    codes.extend([code, code, code])
    assert not ledger.reserve("run", "call-1", {"tool_calls": 1}).existing
    assert codes == []
    assert ledger.balance("run").held == {"tool_calls": 1.0}


def test_another_database_error_is_raised_not_retried(
    flaky: tuple[SqliteLedger, list[int]],
) -> None:
    ledger, codes = flaky
    ledger.open_account("run", {})
    codes.append(sqlite3.SQLITE_IOERR)
    with pytest.raises(sqlite3.OperationalError):
        ledger.reserve("run", "call-1", {})
    assert ledger.get("call-1") is None


def test_ledgers_on_one_file_name_the_same_books_and_an_in_memory_one_names_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Steps of graphs whose ledgers name the same books wait in one line (graph/step_line.py):
    # however the file is spelled, the books are the file's.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    with (
        SqliteLedger(tmp_path / "app.db") as absolute,
        SqliteLedger("app.db") as relative,
        SqliteLedger("sub/../app.db") as roundabout,
        SqliteLedger(tmp_path / "other.db") as other,
        SqliteLedger(":memory:") as in_memory,
    ):
        assert absolute.books == relative.books == roundabout.books is not None
        assert other.books != absolute.books
        assert in_memory.books is None
    assert fp.InMemoryLedger().books is None


class _CountedLock:
    """A real lock that counts how often it was taken, and whether it is held now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        self.taken += got
        return got

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_write_takes_its_turn_on_the_writer_lock_it_shares_and_a_read_does_not(
    tmp_path: Path,
) -> None:
    lock = _CountedLock()
    held_inside: list[bool] = []
    with SqliteLedger(tmp_path / "ledger.db", writer_lock=lock) as ledger:
        ledger.open_account("run", {"tool_calls": 2})
        real = ledger._transaction

        def watched(conn: Any, work: Any, *, read_only: bool) -> Any:
            held_inside.append(lock.locked())
            return real(conn, work, read_only=read_only)

        ledger._transaction = watched  # type: ignore[method-assign]
        taken = lock.taken
        ledger.reserve("run", "call-1", {"tool_calls": 1})
        ledger.finish_attempt("run", "call-1", result="call-1:result")
        assert lock.taken == taken + 2
        assert held_inside == [True, True]
        assert not lock.locked()  # given back after each transaction
        ledger.balance("run")
        ledger.get("call-1")
        assert lock.taken == taken + 2
        assert held_inside == [True, True, False, False]


def test_a_writer_lock_held_elsewhere_delays_a_write_but_never_stops_it(
    tmp_path: Path,
) -> None:
    # The lock's holder may be waiting on something else (a saver's checkpoints read lazily):
    # the write goes on without its turn, waiting for the file as without a lock.
    lock = threading.Lock()
    with SqliteLedger(tmp_path / "ledger.db", writer_lock=lock) as ledger:
        ledger.open_account("run", {"tool_calls": 2})
        with lock:
            held = ledger.reserve("run", "call-1", {"tool_calls": 1})
        assert not held.existing
        assert ledger.balance("run").held == {"tool_calls": 1.0}
        assert not lock.locked()


def test_the_ledger_of_a_sqlite_saver_takes_turns_on_the_savers_lock(tmp_path: Path) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    from fencepost.adapters.default_ledger import durable_ledger

    conn = sqlite3.connect(tmp_path / "app.db", check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    lock = _CountedLock()
    saver.lock = lock  # type: ignore[assignment]
    ledger = durable_ledger(saver)
    assert isinstance(ledger, SqliteLedger)
    try:
        taken = lock.taken
        ledger.open_account("run", {"tool_calls": 2})
        assert lock.taken == taken + 1
    finally:
        ledger.close()
        conn.close()


def _writer_lock_free(path: Path) -> bool:
    """Whether the writer file's lock is free for another open file (taken and given back)."""
    fd = os.open(f"{path}-fencepost-writer", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing the only descriptor of this open file gives its lock back
    return True


def test_a_write_holds_the_writer_queue_through_its_transaction_and_a_read_takes_none(
    tmp_path: Path,
) -> None:
    # Writers wait for each other in the kernel, on a lock beside the file, not by polling
    # SQLite's lock: the lock is held for the whole transaction, and given back after it.
    path = tmp_path / "ledger.db"
    free_inside: list[bool] = []
    with SqliteLedger(path) as ledger:
        ledger.open_account("run", {"tool_calls": 2})
        real = ledger._transaction

        def watched(conn: Any, work: Any, *, read_only: bool) -> Any:
            free_inside.append(_writer_lock_free(path))
            return real(conn, work, read_only=read_only)

        ledger._transaction = watched  # type: ignore[method-assign]
        ledger.reserve("run", "call-1", {"tool_calls": 1})
        ledger.balance("run")
        assert free_inside == [False, True]
        assert _writer_lock_free(path)


def test_two_ledgers_of_one_process_on_one_file_queue_as_two_processes(tmp_path: Path) -> None:
    # flock locks belong to an open file: each ledger opens its own, so one ledger's write
    # holds the lock against the other ledger of the same process too.
    path = tmp_path / "ledger.db"
    free_inside: list[bool] = []
    with SqliteLedger(path) as first, SqliteLedger(path) as second:
        first.open_account("run", {"tool_calls": 2})
        real = first._transaction

        def watched(conn: Any, work: Any, *, read_only: bool) -> Any:
            free_inside.append(_writer_lock_free(path))
            return real(conn, work, read_only=read_only)

        first._transaction = watched  # type: ignore[method-assign]
        first.reserve("run", "call-1", {"tool_calls": 1})
        assert free_inside == [False]
        held = second.reserve("run", "call-2", {"tool_calls": 1})
        assert held.balance is not None
        assert held.balance.held == {"tool_calls": 2.0}


def test_an_in_memory_ledger_needs_no_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with SqliteLedger(":memory:") as ledger:
        ledger.open_account("run", {"tool_calls": 1})
        ledger.reserve("run", "call-1", {"tool_calls": 1})
    assert list(tmp_path.iterdir()) == []


def test_a_writer_ahead_that_never_lets_go_fails_the_next_write_after_busy_timeout_not_never(
    tmp_path: Path,
) -> None:
    # A holder of the writer lock that is stopped (SIGSTOP, a hung disk) would hold every writer
    # behind it for good if the kernel wait had no end: the wait ends at busy_timeout, as
    # SQLite's own lock did, and the write fails typed. Once the holder lets go, the next write
    # goes through, and no waiting thread is left per failed write.
    path = tmp_path / "ledger.db"
    with SqliteLedger(path, busy_timeout=0.3) as ledger:
        ledger.open_account("run", {"tool_calls": 3})
        holder = os.open(f"{path}-fencepost-writer", os.O_RDWR)
        fcntl.flock(holder, fcntl.LOCK_EX)
        try:
            for call in ("call-1", "call-2"):
                with pytest.raises(sqlite3.OperationalError, match="database is locked"):
                    ledger.reserve("run", call, {"tool_calls": 1})
            waiting = [t for t in threading.enumerate() if t.name == "fencepost-ledger-queue"]
            assert len(waiting) == 1  # the second write took up the first one's wait
        finally:
            fcntl.flock(holder, fcntl.LOCK_UN)
            os.close(holder)
        held = ledger.reserve("run", "call-3", {"tool_calls": 1})
        assert held.balance is not None and held.balance.held == {"tool_calls": 1.0}
        assert _writer_lock_free(path)
