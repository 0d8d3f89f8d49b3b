"""A durable :class:`~fencepost.policy.ledger.Ledger` in one SQLite file.

Safe for many threads and many processes on one machine: every ``reserve``, ``settle`` and
``release`` is a single ``BEGIN IMMEDIATE`` transaction (SQLite's write lock is taken before
anything is read, so the check and the charge cannot interleave with another writer), and the file
is in WAL mode so readers never block the writer. ``begin_attempt`` and ``finish_attempt`` write
a call's two markers (a marker and a settlement) in one such transaction, one commit and one sync
instead of two, ``start_attempt`` reads a call's reservation and begins its attempt in one,
and ``settle_and_reserve`` a model step's settlement with its calls' holds; ``reserved`` is a
read, which takes no write lock. Not for several machines sharing a network file
system: use :class:`~fencepost.adapters.ledger_postgres.PostgresLedger` there.

Durability: ``synchronous="FULL"`` by default: every commit is synced to disk before it returns,
so a reservation that ``reserve`` returned survives a power cut, not just a crash of the process.
Each commit then waits for one fsync, which bounds reservations per second by the disk. Two
commits of the loop do not wait (``settle_and_reserve``, ``finish_attempt``): what they record is
synced by the ledger's next commit, which the loop makes before any external call that depends on
it (a call's ``start_attempt`` or ``begin_attempt``, the next step's ``reserve``); a power cut
in between loses at most a settlement (the step stays held at its estimate) or a result marker
(a resumed call reads ``uncertain``), never a reservation an external call was made under.
``synchronous="NORMAL"`` is the documented trade: commits are not synced one by one (the WAL is
synced at checkpoints), so a reservation survives a crash of the process but the last ones before
a power cut or an OS crash may be lost (the file stays consistent). Choose it only where losing
the record that an attempt started is acceptable.

Fairness: writers queue in the kernel, not in SQLite. SQLite's own busy handler lets a waiting
process sleep up to 100 ms between attempts, so a process in a tight loop re-takes the write lock
again and again while the others sleep (8 processes against one account: one got 1,445 of 1,600
reservations, three got none); retrying after short jittered sleeps instead still starves a
waiter on a loaded machine (a process woken a few milliseconds late finds the lock re-taken, and
a writer descheduled mid-transaction holds it while the waiters spin on the CPU it needs). So each
write transaction first takes an exclusive ``flock`` on ``<path>-fencepost-writer``, through a
gate: it takes ``<path>-fencepost-queue``, then the writer lock, then lets go of the gate. Waiters
sleep in the kernel (no CPU; a contended wait runs on a thread so that it can end at
``busy_timeout``, and a wait given up keeps its place for the ledger's next write), which queues
``flock`` waiters in the order they came; the gate keeps a writer that has just committed from taking the lock straight back
before the waiter it woke has run (the one waiting on the writer lock holds the gate, so the
writer queues behind the others). A process that dies holding either lock loses it with its open
files. Uncontended, the cost is four system calls per write; reads take no lock (WAL readers never
block the writer). ``BEGIN IMMEDIATE`` still waits out SQLite's lock when a writer outside the
queue holds it (another program, a ``SqliteSaver`` of the same file): the transaction is retried
after a jittered wait (full jitter, capped at a millisecond) until ``busy_timeout``. ``flock`` is
POSIX: on Windows (not a target) and for an in-memory database there is no queue, only that wait.

Turns with a writer in this process: a ledger on the file a ``SqliteSaver`` writes (the ledger
of a graph built with none) is given the saver's ``lock``, which the saver holds around each of
its transactions, commit and sync included. Each write transaction of the ledger takes it too,
so in this process the two take turns: a write waits on the lock and is woken as the saver's
commit ends, instead of finding the file busy and sleeping (and the saver, finding the ledger's
commit in the way, sleeping a millisecond or more in SQLite's busy handler while its
checkpoints queue behind it). Reads take no turn: in WAL mode nothing blocks them. The turn is
waited for at most a quarter of a second: past it (the lock held while its holder waits on
something else), the transaction goes on as without it, waiting for the file as above.

Async twins run the sync method in a thread of the ledger's own (one per instance and process):
the connection is one and serialised anyway, so one thread is all it can use; a whole transaction
is one hop to that thread (``aiosqlite`` would hop once per statement); and a busy ledger never
occupies the event loop's default executor, which tools share.

Example::

    with SqliteLedger("ledger.db") as ledger:
        ledger.open_account("tenant", {"tool_calls": 100})
        ledger.open_account("run-1", {"tool_calls": 60}, parent="tenant")
        ledger.reserve("run-1", "call-0001", {"tool_calls": 1})
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from functools import partial
from typing import Literal, Protocol, TypeVar

from fencepost.adapters._ledger_sql import ACCOUNT_COLUMNS, SCHEMA, SqlLedger, Transaction
from fencepost.policy.budget import BudgetExhausted
from fencepost.policy.deadline import Clock, SystemClock
from fencepost.policy.ledger import Attempt, Balance, Reservation
from fencepost.policy.remembered import ApprovalScope
from fencepost.policy.windows import Window

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows is not a target: no queue there
    fcntl = None  # type: ignore[assignment]

__all__ = ["SqliteLedger", "WriterLock"]

_T = TypeVar("_T")

_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})

_FIRST_WAIT = 0.0002
"""The cap of the first jittered wait for the write lock, in seconds; it doubles per attempt."""
_LONGEST_WAIT = 0.001
"""The cap never grows beyond this: a waiting process asks at least every millisecond."""
_TURN_WAIT = 0.25
"""The longest a write transaction waits for its turn on the writer lock it shares (seconds)."""


class WriterLock(Protocol):
    """A lock another writer of the same file in this process holds around each of its
    transactions (a ``threading.Lock`` fits: a ``SqliteSaver``'s ``lock`` is one)."""

    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...


def _is_busy(error: sqlite3.OperationalError) -> bool:
    """Whether another connection holds a lock: SQLITE_BUSY or SQLITE_LOCKED, extended codes
    included (SQLITE_BUSY_RECOVERY while another process recovers the WAL, for one)."""
    code = getattr(error, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _BUSY_CODES


def _lock_file(name: str) -> int | None:
    """An open descriptor of the lock file ``name`` (created if missing), or ``None`` where it can
    be neither created nor opened (a read-only directory: writers then wait as without a queue)."""
    try:
        return os.open(name, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        pass
    try:
        return os.open(name, os.O_RDONLY)  # flock needs no write access
    except OSError:
        return None


class _Waiting:
    """One wait for a ``flock`` in the kernel queue, on a thread: a wait can be given up at its
    time limit (``flock`` has none) and taken up again by the next write, so a holder that never
    lets go costs each ledger at most one waiting thread per lock file, never one per write."""

    def __init__(self, name: str) -> None:
        # A descriptor of its own: a lock belongs to an open file description, and one taken
        # after the wait was given up must never be the lock this ledger writes under.
        fd = _lock_file(name)
        if fd is None:
            raise sqlite3.OperationalError("database is locked")
        self.fd = fd
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.got = False
        self.abandoned = False
        threading.Thread(target=self._wait, name="fencepost-ledger-queue", daemon=True).start()

    def _wait(self) -> None:
        assert fcntl is not None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            with self.lock:
                self.abandoned = True  # nobody takes up a wait that failed
            os.close(self.fd)
            self.done.set()
            return
        with self.lock:
            if self.abandoned:  # given up: the lock goes on to the next in the queue
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
            else:
                self.got = True
        self.done.set()

    def taken_within(self, seconds: float) -> bool:
        """Whether the lock is held within ``seconds``; if not, the wait is given up."""
        self.done.wait(max(0.0, seconds))
        with self.lock:
            if self.got:
                return True
            self.abandoned = True
            return False

    def take_up(self) -> bool:
        """Take up a wait given up earlier and still in the queue (its place kept)."""
        with self.lock:
            if self.done.is_set():
                return False
            self.abandoned = False
            return True


class _WriterQueue:
    """The kernel queue of this ledger's writers: a gate file and a writer file beside the database.

    One per ledger object and process: ``flock`` locks belong to an open file description, so
    two ledgers of one process on one file queue like two processes, while the threads of one
    ledger are serialised by its own lock before they get here. A forked child shares its
    parent's descriptions (its lock would be the parent's): it opens its own
    (:meth:`SqliteLedger._connection`). Where ``fcntl`` is missing (Windows, not a target), for
    an in-memory database, or where the files cannot be opened, every method is a no-op.

    A wait is bounded (``enter(seconds)``): a writer ahead that never lets go (a process stopped
    with its lock, a hung disk) fails the writers behind it with ``database is locked`` after
    ``busy_timeout``, as SQLite's own lock did, instead of holding their runs past any deadline.
    """

    def __init__(self, database: str) -> None:
        self._gate: int | None = None
        self._writer: int | None = None
        self._names = (f"{database}-fencepost-queue", f"{database}-fencepost-writer")
        self._pending: dict[str, _Waiting] = {}
        self._held: int | None = None
        if fcntl is None or database in ("", ":memory:"):
            return
        gate = _lock_file(self._names[0])
        writer = _lock_file(self._names[1]) if gate is not None else None
        if writer is None:
            if gate is not None:
                os.close(gate)
            return
        self._gate, self._writer = gate, writer

    def _take(self, name: str, fd: int, deadline: float) -> int:
        """The descriptor holding the exclusive lock on ``name`` (``fd`` when it was free, else
        the one a wait took it with), waiting until ``deadline`` at most."""
        assert fcntl is not None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        waiting = self._pending.pop(name, None)
        if waiting is None or not waiting.take_up():
            waiting = _Waiting(name)
        if waiting.taken_within(deadline - time.monotonic()):
            return waiting.fd
        self._pending[name] = waiting  # given up, kept in the queue for the next write
        raise sqlite3.OperationalError("database is locked")

    def _let_go(self, held: int, own: int) -> None:
        assert fcntl is not None
        fcntl.flock(held, fcntl.LOCK_UN)
        if held != own:
            os.close(held)

    def enter(self, seconds: float) -> None:
        """Wait in the kernel until this ledger is the file's one writer (through the gate), for
        ``seconds`` at most (then ``sqlite3.OperationalError``: database is locked)."""
        if self._gate is None or self._writer is None or fcntl is None:
            return
        deadline = time.monotonic() + seconds
        gate = self._take(self._names[0], self._gate, deadline)
        try:
            self._held = self._take(self._names[1], self._writer, deadline)
        finally:
            self._let_go(gate, self._gate)

    def leave(self) -> None:
        """Hand the writer lock to the next in the queue."""
        if self._held is not None and self._writer is not None and fcntl is not None:
            held, self._held = self._held, None
            self._let_go(held, self._writer)

    def close(self) -> None:
        """Close the files. In a forked child this never unlocks the parent's lock: a ``flock``
        goes with the last descriptor of its open file, and the parent keeps its own. A wait
        still in the queue is given up (its thread lets the lock go if it ever gets it)."""
        for waiting in self._pending.values():
            waiting.taken_within(0)
        self._pending.clear()
        for fd in (self._gate, self._writer):
            if fd is not None:
                os.close(fd)
        self._gate = self._writer = None


class SqliteLedger(SqlLedger):
    """Accounts and reservations in a SQLite file; atomic across threads and processes.

    ``path`` is the database file (created if missing; ``":memory:"`` works but is neither durable
    nor shared). ``busy_timeout`` is how many seconds a transaction waits for SQLite's write lock
    (in the ledgers' queue, or held by a writer outside it) before it fails with ``database is
    locked``: a writer ahead that never lets go (a stopped process, a hung disk) holds the others
    that long, never past it. ``synchronous`` is the durability
    setting (see the module docstring: ``"FULL"``, the default, or ``"NORMAL"``).
    ``writer_lock`` is the lock another writer of the same file in this process holds around
    its transactions (a ``SqliteSaver``'s ``lock``): write transactions take turns with it (see
    the module docstring), in the process the ledger was made in. Tables are created (and a
    database of the first version migrated) on construction (:meth:`setup` is idempotent). One
    connection per instance and process, serialised by a lock.
    """

    # In the order the axes were first held, as InMemoryLedger keeps them.
    _HELD = "SELECT axis, amount FROM fencepost_ledger_held WHERE account = ? ORDER BY rowid"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 30.0,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        clock: Clock | None = None,
        writer_lock: WriterLock | None = None,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be 'FULL' or 'NORMAL'")
        self._clock = clock or SystemClock()
        self._path = os.fspath(path)
        self._busy_timeout = busy_timeout
        self._synchronous = synchronous
        self._lock = threading.RLock()
        self._pid = os.getpid()
        # A lock is only this process's: a forked child (which may inherit it held by a thread
        # it does not have) takes no turns.
        self._turns = (writer_lock, self._pid) if writer_lock is not None else None
        self._closed = False
        self._executor: ThreadPoolExecutor | None = None
        self._executor_pid = self._pid
        self._executor_lock = threading.Lock()
        self._inherited: list[sqlite3.Connection] = []
        self._queue = _WriterQueue(self._path)
        try:
            self._conn: sqlite3.Connection | None = self._connect()
        except BaseException:
            self._queue.close()
            raise
        try:
            self.setup()
        except BaseException:
            self.close()
            raise

    @property
    def books(self) -> str | None:
        """The database file, resolved (``None`` for an in-memory database: this object's own)."""
        if self._path in ("", ":memory:"):
            return None
        return f"sqlite:{os.path.realpath(self._path)}"

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._path,
            timeout=0,  # waits for the write lock happen in _run, jittered (see module docstring)
            isolation_level=None,  # transactions are begun and ended explicitly in _run
            check_same_thread=False,  # the instance lock serialises use across threads
        )
        try:
            conn.execute("PRAGMA busy_timeout = 0")
            # Queued like a write: processes opening a new file at once do not spin on it.
            self._queue.enter(self._busy_timeout)
            try:
                self._retry_busy(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone())
            finally:
                self._queue.leave()
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
        except BaseException:
            conn.close()
            raise
        return conn

    def _retry_busy(self, action: Callable[[], object]) -> None:
        """Run ``action``, retrying while another process holds a lock it needs."""
        deadline = time.monotonic() + self._busy_timeout
        attempt = 0
        while True:
            try:
                action()
                return
            except sqlite3.OperationalError as error:
                if not _is_busy(error) or time.monotonic() >= deadline:
                    raise
            attempt += 1
            self._wait(attempt)

    @staticmethod
    def _wait(attempt: int) -> None:
        """Sleep a random time below a cap that doubles per attempt (full jitter)."""
        cap = min(_FIRST_WAIT * 2 ** min(attempt - 1, 16), _LONGEST_WAIT)
        time.sleep(random.uniform(0, cap))  # noqa: S311 (jitter, not secrecy)

    def _connection(self) -> sqlite3.Connection:
        """The connection of this process (a forked child opens its own; the parent's stays)."""
        if self._closed or self._conn is None:
            raise RuntimeError("the ledger is closed")
        if self._pid != os.getpid():
            # SQLite forbids using a connection in a process it was not opened in. Keep the
            # inherited object (closing it here could disturb the parent's locks) and start over.
            self._inherited.append(self._conn)
            self._pid = os.getpid()
            self._lock = threading.RLock()
            self._queue.close()  # the parent's open files: locking them would lock the parent's
            self._queue = _WriterQueue(self._path)
            self._conn = self._connect()
        return self._conn

    def _run(
        self,
        work: Callable[[Transaction], _T],
        *,
        read_only: bool = False,
        covered: bool = False,
    ) -> _T:
        """Run ``work`` in one transaction: ``BEGIN IMMEDIATE`` takes the write lock up front.

        A write first waits for its turn in the writer queue (see the module docstring), then on
        the writer lock it shares. While a writer outside the queue holds SQLite's lock, the
        whole transaction is retried after a jittered wait, until ``busy_timeout`` has passed.
        """
        self._connection()  # a forked child reconnects before it takes the (new) lock
        with self._lock:
            conn = self._connection()
            queue = None if read_only else self._queue
            if queue is not None:
                queue.enter(self._busy_timeout)
            try:
                # Queue first, then the turn: a saver's transaction never waits on the queue, so
                # holding the queue while waiting for the turn cannot close a cycle.
                turn = self._turn(read_only)
                # SQLite refuses to change the setting inside a transaction: around it.
                loose = covered and not read_only and self._synchronous == "FULL"
                if loose:
                    conn.execute("PRAGMA synchronous = NORMAL")
                try:
                    return self._retrying(conn, work, read_only=read_only)
                finally:
                    if loose:
                        conn.execute("PRAGMA synchronous = FULL")
                    if turn is not None:
                        turn.release()
            finally:
                if queue is not None:
                    queue.leave()

    def _retrying(
        self, conn: sqlite3.Connection, work: Callable[[Transaction], _T], *, read_only: bool
    ) -> _T:
        """The transaction, retried after a jittered wait while another connection holds a lock
        it needs, until ``busy_timeout`` has passed."""
        deadline = time.monotonic() + self._busy_timeout
        attempt = 0
        while True:
            try:
                return self._transaction(conn, work, read_only=read_only)
            except sqlite3.OperationalError as error:
                if not _is_busy(error) or time.monotonic() >= deadline:
                    raise
            attempt += 1
            self._wait(attempt)

    def _turn(self, read_only: bool) -> WriterLock | None:
        """The writer lock this write transaction took its turn on (see the module docstring),
        or ``None``: a read, no lock shared, another process, or not had in time."""
        if read_only or self._turns is None:
            return None
        lock, pid = self._turns
        if pid != os.getpid() or not lock.acquire(timeout=_TURN_WAIT):
            return None
        return lock

    @staticmethod
    def _transaction(
        conn: sqlite3.Connection, work: Callable[[Transaction], _T], *, read_only: bool
    ) -> _T:
        conn.execute("BEGIN" if read_only else "BEGIN IMMEDIATE")
        try:
            result = work(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    def setup(self) -> None:
        """Create the tables if they are missing, and add the columns a database made by the
        first version lacks. Idempotent; called on construction."""

        def work(tx: Transaction) -> None:
            for statement in SCHEMA:
                tx.execute(statement)
            columns = {
                row[1]
                for row in tx.execute("PRAGMA table_info(fencepost_ledger_accounts)").fetchall()
            }
            for column, declaration in ACCOUNT_COLUMNS.items():
                if column not in columns:
                    # Our own constant names and declarations only.
                    tx.execute(
                        f"ALTER TABLE fencepost_ledger_accounts ADD COLUMN {column} {declaration}"
                    )

        self._run(work)

    def close(self) -> None:
        """Close the connection. Further calls raise ``RuntimeError``."""
        with self._executor_lock:
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=False)
                self._executor = None
        with self._lock:
            if self._conn is not None:
                if self._pid == os.getpid():
                    self._conn.close()
                    self._queue.close()
                self._conn = None

    # -- async twins: the whole sync transaction in the ledger's own thread -----------------------

    async def _in_thread(self, call: Callable[[], _T]) -> _T:
        # Only the executor lock is taken here: it is never held across I/O, so the event loop
        # never waits on a transaction (which holds the connection lock) in another thread.
        with self._executor_lock:
            if self._closed:
                raise RuntimeError("the ledger is closed")
            if self._executor is None or self._executor_pid != os.getpid():
                self._executor = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="fencepost-sqlite-ledger"
                )
                self._executor_pid = os.getpid()
            executor = self._executor
        try:
            future = asyncio.get_running_loop().run_in_executor(executor, call)
        except RuntimeError:  # shut down by a close() since
            raise RuntimeError("the ledger is closed") from None
        return await future

    async def aopen_account(
        self,
        account: str,
        limits: Mapping[str, float],
        *,
        parent: str | None = None,
        owner: Mapping[str, str] | None = None,
        windows: Iterable[Window] | None = None,
    ) -> Balance:
        return await self._in_thread(
            partial(self.open_account, account, limits, parent=parent, owner=owner, windows=windows)
        )

    async def aclose_account(self, account: str, reason: str) -> Balance:
        return await self._in_thread(partial(self.close_account, account, reason))

    async def areserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        return await self._in_thread(partial(self.reserve, account, key, amounts))

    async def asettle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        return await self._in_thread(partial(self.settle, key, actual))

    async def arelease(self, key: str) -> Reservation:
        return await self._in_thread(partial(self.release, key))

    async def asettle_and_reserve(
        self,
        key: str,
        actual: Mapping[str, float] | None,
        account: str,
        holds: Sequence[tuple[str, Mapping[str, float]]],
    ) -> tuple[Reservation, list[Reservation | BudgetExhausted]]:
        return await self._in_thread(partial(self.settle_and_reserve, key, actual, account, holds))

    async def areserved(self, account: str, key: str) -> Reservation | None:
        return await self._in_thread(partial(self.reserved, account, key))

    async def abegin_attempt(
        self, account: str, marker: str, *, claim: str | None = None
    ) -> Attempt:
        return await self._in_thread(partial(self.begin_attempt, account, marker, claim=claim))

    async def astart_attempt(
        self,
        account: str,
        key: str,
        marker: str,
        *,
        claim: str | None = None,
        begins: Callable[[Reservation], bool],
    ) -> tuple[Reservation | None, Attempt | None]:
        return await self._in_thread(
            partial(self.start_attempt, account, key, marker, claim=claim, begins=begins)
        )

    async def afinish_attempt(
        self,
        account: str,
        key: str,
        *,
        result: str | None = None,
        actual: Mapping[str, float] | None = None,
    ) -> Reservation:
        return await self._in_thread(
            partial(self.finish_attempt, account, key, result=result, actual=actual)
        )

    async def acharge(
        self, account: str, key: str, amounts: Mapping[str, float], *, of: str | None = None
    ) -> Reservation:
        return await self._in_thread(partial(self.charge, account, key, amounts, of=of))

    async def aget(self, key: str) -> Reservation | None:
        return await self._in_thread(partial(self.get, key))

    async def abalance(self, account: str) -> Balance:
        return await self._in_thread(partial(self.balance, account))

    async def aremember_scope(self, scope: ApprovalScope) -> ApprovalScope:
        return await self._in_thread(partial(self.remember_scope, scope))

    async def aapproval_scopes(
        self, tenant_id: str, *, tool_name: str | None = None, include_revoked: bool = False
    ) -> list[ApprovalScope]:
        return await self._in_thread(
            partial(
                self.approval_scopes,
                tenant_id,
                tool_name=tool_name,
                include_revoked=include_revoked,
            )
        )

    async def arevoke_scope(
        self, tenant_id: str, scope_id: str, *, at: datetime
    ) -> ApprovalScope | None:
        return await self._in_thread(partial(self.revoke_scope, tenant_id, scope_id, at=at))

    async def ain_flight(self, account: str) -> dict[str, float]:
        return await self._in_thread(partial(self.in_flight, account))
