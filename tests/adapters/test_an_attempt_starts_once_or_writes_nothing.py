"""A call's attempt starts at most once, and an attempt that does not start writes nothing
(``Ledger.start_attempt``, on every backend): a ``begins`` that raises (an exception,
``SystemExit``, a cancellation) inside the ledger's lock or transaction, a closed account up the
chain, markers on a spent window or limit, and ledgers and processes on one store racing the
same call's first attempt.

The Postgres rows skip unless FENCEPOST_TEST_POSTGRES_DSN is set.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from fencepost.adapters import PostgresLedger, SqliteLedger
from fencepost.policy.ledger import (
    AccountClosed,
    Attempt,
    InMemoryLedger,
    Ledger,
    Reservation,
    ReservationStatus,
)
from fencepost.policy.windows import Window
from tests.conftest import worker_processes

Opener = Callable[[], Ledger]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """How to open the backend again: a second instance shares the first's store (another
    graph object, or another process's ledger, on the same file or database)."""
    opened: list[Ledger] = []
    if request.param == "memory":
        shared = InMemoryLedger()

        def make() -> Ledger:
            return shared

    elif request.param == "sqlite":
        path = str(tmp_path / "ledger.db")

        def make() -> Ledger:
            ledger = SqliteLedger(path)
            opened.append(ledger)
            return ledger

    else:
        dsn = request.getfixturevalue("postgres_schema")

        def make() -> Ledger:
            ledger = PostgresLedger(dsn)
            opened.append(ledger)
            return ledger

    yield make
    for ledger in opened:
        assert isinstance(ledger, SqliteLedger | PostgresLedger)
        ledger.close()


def _in_flight(found: Reservation) -> bool:
    return found.status is ReservationStatus.RESERVED


def _run_account(ledger: Ledger, windows: list[Window] | None = None) -> None:
    ledger.open_account("tenant", {"tool_calls": 10}, windows=windows)
    ledger.open_account("run", {"tool_calls": 9}, parent="tenant", owner={"run": "r"})


def _start(ledger: Ledger, begins: Callable[[Reservation], bool] = _in_flight) -> Any:
    return ledger.start_attempt("run", "k1", "m1", claim="c1", begins=begins)


def _written(ledger: Ledger) -> list[Reservation | None]:
    return [ledger.get(key) for key in ("c1", "m1")]


class _Refused(Exception):
    """What an application's rule raised."""


RAISED: list[type[BaseException]] = [
    _Refused,
    SystemExit,
    KeyboardInterrupt,
    asyncio.CancelledError,
]


@pytest.mark.parametrize("raised", RAISED, ids=lambda kind: kind.__name__)
def test_a_begins_that_raises_writes_nothing_and_leaves_every_writer_free_to_go_on(
    opener: Opener, raised: type[BaseException]
) -> None:
    ledger = opener()
    _run_account(ledger)
    ledger.reserve("run", "k1", {"tool_calls": 1})
    before = [ledger.balance(name) for name in ("tenant", "run")]

    def begins(found: Reservation) -> bool:
        raise raised()

    with pytest.raises(raised):
        _start(ledger, begins)
    assert _written(ledger) == [None, None]
    assert [ledger.balance(name) for name in ("tenant", "run")] == before

    # The lock (or transaction) it raised in was let go: another thread, and another ledger
    # on the same store, write; the attempt then begins once.
    other = opener()
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(_start(other)), daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the ledger's lock was kept by the begins that raised"
    found, begun = done[0]
    assert found is not None and found.status is ReservationStatus.RESERVED
    assert isinstance(begun, Attempt) and begun.claimed
    assert begun.started is not None and not begun.started.existing
    again = _start(ledger)[1]
    assert again is not None and again.started is not None and again.started.existing


@pytest.mark.parametrize("raised", RAISED, ids=lambda kind: kind.__name__)
async def test_the_async_twin_lets_a_raising_begins_through_and_writes_nothing(
    opener: Opener, raised: type[BaseException]
) -> None:
    ledger = opener()
    _run_account(ledger)
    ledger.reserve("run", "k1", {"tool_calls": 1})

    def begins(found: Reservation) -> bool:
        raise raised()

    with pytest.raises(raised):
        await ledger.astart_attempt("run", "k1", "m1", claim="c1", begins=begins)
    assert _written(ledger) == [None, None]
    found, begun = await ledger.astart_attempt("run", "k1", "m1", claim="c1", begins=_in_flight)
    assert found is not None and begun is not None and begun.started is not None
    assert not begun.started.existing


@pytest.mark.parametrize("claimed_before", [False, True], ids=["first", "claim-found"])
def test_no_claim_or_marker_is_written_under_a_closed_parent(
    opener: Opener, claimed_before: bool
) -> None:
    ledger = opener()
    _run_account(ledger)
    ledger.reserve("run", "k1", {"tool_calls": 1})
    if claimed_before:
        # A crash after an earlier begin_attempt's claim only (a backend that wrote it alone).
        ledger.reserve("run", "c1", {})
    ledger.close_account("tenant", "cancelled")
    with pytest.raises(AccountClosed):
        _start(ledger)
    assert ledger.get("m1") is None
    assert (ledger.get("c1") is not None) is claimed_before


def test_the_start_marker_of_a_reservation_that_filled_its_window_is_written(
    opener: Opener,
) -> None:
    # The gate's reservation took the last of the day's window and the run's limit: the
    # attempt's claim and marker hold nothing, so neither refuses them, on any backend.
    ledger = opener()
    _run_account(ledger, windows=[Window(axis="tool_calls", limit=1, period="day")])
    ledger.reserve("run", "k1", {"tool_calls": 1})
    found, begun = _start(ledger)
    assert found is not None and begun is not None and begun.claimed
    assert begun.started is not None and not begun.started.existing
    assert ledger.balance("tenant").windows[0].held == 1
    assert [r.amounts if r else None for r in _written(ledger)] == [{}, {}]


def test_a_marker_never_begins_on_another_tenants_reservation_it_is_shown(
    opener: Opener,
) -> None:
    # begins judges the owner before any write: refusing it leaves the other account untouched.
    ledger = opener()
    _run_account(ledger)
    ledger.open_account("victim", {"tool_calls": 3}, owner={"tenant": "b"})
    ledger.reserve("victim", "k1", {"tool_calls": 1})
    before = ledger.balance("victim")
    seen: list[dict[str, str]] = []

    def begins(found: Reservation) -> bool:
        assert found.balance is not None
        seen.append(dict(found.balance.owner))
        return found.balance.owner.get("tenant") == "a"

    found, begun = ledger.start_attempt("victim", "k1", "m1", claim="c1", begins=begins)
    assert found is not None and begun is None and seen == [{"tenant": "b"}]
    assert _written(ledger) == [None, None] and ledger.balance("victim") == before


def test_two_ledgers_on_one_store_racing_a_call_start_it_once(opener: Opener) -> None:
    first = opener()
    _run_account(first)
    first.reserve("run", "k1", {"tool_calls": 1})
    contenders = [opener() for _ in range(4)]
    barrier = threading.Barrier(len(contenders))
    answers: list[Any] = []
    lock = threading.Lock()

    def contend(ledger: Ledger) -> None:
        barrier.wait(timeout=30)
        answer = _start(ledger)
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=contend, args=(c,), daemon=True) for c in contenders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(answers) == len(contenders)
    started = [begun.started for _, begun in answers]
    assert all(s is not None for s in started)
    assert sum(1 for s in started if s is not None and not s.existing) == 1
    assert all(begun.claimed for _, begun in answers)
    # The claim and the marker each written once, nothing held for them.
    assert first.balance("run").held == {"tool_calls": 1}


def test_a_rolling_window_the_marker_is_counted_in_refuses_nothing_later(
    opener: Opener,
) -> None:
    ledger = opener()
    hour = Window(axis="tool_calls", limit=2, period=timedelta(hours=1))
    _run_account(ledger, windows=[hour])
    ledger.reserve("run", "k1", {"tool_calls": 1})
    _start(ledger)
    # The markers counted in the window hold nothing of it: one more call still fits.
    ledger.reserve("run", "k2", {"tool_calls": 1})
    assert ledger.balance("tenant").windows[0].held == 2


# -- separate processes on one SQLite file (module level: the children import them) ---------------


def _start_in_process(path: str, start_at: float) -> str:
    with SqliteLedger(path) as ledger:  # a connection of its own, in a process of its own
        time.sleep(max(0.0, start_at - time.time()))
        _, begun = _start(ledger)
    assert begun is not None and begun.claimed and begun.started is not None
    return "existing" if begun.started.existing else "started"


def _die_between_claim_and_marker(path: str) -> None:
    real = sqlite3.connect

    def dying(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = real(*args, **kwargs)
        # The process dies the moment the claim is inserted, its transaction open.
        conn.create_function("fp_die", 0, lambda: os._exit(17))
        conn.execute(
            "CREATE TEMP TRIGGER fp_die AFTER INSERT ON main.fencepost_ledger_reservations"
            " WHEN NEW.key = 'c1' BEGIN SELECT fp_die(); END"
        )
        return conn

    sqlite3.connect = dying  # type: ignore[assignment]
    _start(SqliteLedger(path))


def test_processes_on_one_sqlite_file_racing_a_call_start_it_once(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.db")
    with SqliteLedger(path) as ledger:
        _run_account(ledger)
        ledger.reserve("run", "k1", {"tool_calls": 1})
    with ProcessPoolExecutor(max_workers=3, mp_context=worker_processes()) as pool:
        start_at = time.time() + 1.0
        futures = [pool.submit(_start_in_process, path, start_at) for _ in range(3)]
        answers = sorted(future.result(timeout=60) for future in futures)
    assert answers == ["existing", "existing", "started"]


def test_a_crash_between_the_claim_and_the_marker_leaves_neither(tmp_path: Path) -> None:
    # Invariant 9: a retry after the crash must not find a claim without its marker (it would
    # run the call as never started, though nothing says it did not).
    path = str(tmp_path / "ledger.db")
    with SqliteLedger(path) as ledger:
        _run_account(ledger)
        ledger.reserve("run", "k1", {"tool_calls": 1})
    child = worker_processes().Process(target=_die_between_claim_and_marker, args=(path,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 17
    with SqliteLedger(path) as ledger:
        assert _written(ledger) == [None, None]
        found, begun = _start(ledger)  # the retry: the attempt begins as the first it is
        assert found is not None and begun is not None and begun.started is not None
        assert not begun.started.existing


@pytest.mark.parametrize("marker", ["m\ud800", "m" * 2000], ids=["lone-surrogate", "too-long"])
def test_an_invalid_marker_key_writes_no_claim_on_any_backend(opener: Opener, marker: str) -> None:
    ledger = opener()
    _run_account(ledger)
    ledger.reserve("run", "k1", {"tool_calls": 1})
    for begin in (
        lambda: ledger.start_attempt("run", "k1", marker, claim="c1", begins=_in_flight),
        lambda: ledger.begin_attempt("run", marker, claim="c1"),
    ):
        with pytest.raises(ValueError, match="key"):
            begin()
        assert ledger.get("c1") is None
