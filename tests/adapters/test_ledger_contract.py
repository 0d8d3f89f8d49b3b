"""One contract for every Ledger backend: in-memory (the reference), SQLite and Postgres.

Each test names the rule it checks. The Postgres rows skip unless FENCEPOST_TEST_POSTGRES_DSN is
set. The concurrency tests race real contenders: threads on the in-memory ledger, separate
*processes* on one SQLite file, and threads that each hold their own Postgres connection.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from fencepost.adapters import PostgresLedger, SqliteLedger
from fencepost.policy.budget import BudgetAxis, BudgetExhausted
from fencepost.policy.deadline import FakeClock
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.ledger import (
    MAX_NAME_LENGTH,
    AccountClosed,
    Attempt,
    Balance,
    InMemoryLedger,
    InvalidLedgerKey,
    Ledger,
    LedgerConflict,
    Reservation,
    ReservationStatus,
    UnknownAccount,
    UnknownReservation,
)
from fencepost.policy.phase import TerminationReason
from fencepost.policy.remembered import ApprovalScope, ScopeStore, matching_scope
from fencepost.policy.windows import ROLLING_STEPS, Window
from tests.conftest import worker_processes

Job = tuple[str, str, str, dict[str, float] | None]  # operation, account, key, amounts

LANES = 4


def stored(reservation: Reservation) -> Reservation:
    """``reservation`` as ``get`` returns it: without the balance snapshot (or a charge's
    ``exceeded``)."""
    return reservation.model_copy(update={"balance": None, "exceeded": None})


# -- racing contenders (module level so the worker processes can import them) -----------------------


def _attempt(ledger: Ledger, job: Job) -> str:
    op, account, key, amounts = job
    try:
        if op == "reserve":
            result = ledger.reserve(account, key, amounts or {})
        elif op == "charge":
            result = ledger.charge(account, key, amounts or {})
        elif op == "settle":
            result = ledger.settle(key, amounts)
        else:
            result = ledger.release(key)
    except BudgetExhausted as error:
        assert error.axis is not None
        return f"exhausted:{error.account}:{error.axis.value}"
    return "existing" if result.existing else result.status.value


def _run_lane(ledger: Ledger, jobs: list[Job], start_at: float) -> list[str]:
    time.sleep(max(0.0, start_at - time.time()))
    return [_attempt(ledger, job) for job in jobs]


def _sqlite_lane(path: str, jobs: list[Job], start_at: float) -> list[str]:
    with SqliteLedger(path) as ledger:  # a connection of its own, in a process of its own
        return _run_lane(ledger, jobs, start_at)


def _postgres_lane(dsn: str, jobs: list[Job], start_at: float) -> list[str]:
    with PostgresLedger(dsn, min_size=1, max_size=1) as ledger:  # a connection of its own
        return _run_lane(ledger, jobs, start_at)


def _warm(seconds: float) -> int:
    time.sleep(seconds)
    return 0


@pytest.fixture(scope="module")
def process_pool() -> Iterator[ProcessPoolExecutor]:
    """Spawned worker processes, started once: the SQLite races run across real processes."""
    pool = ProcessPoolExecutor(max_workers=LANES, mp_context=worker_processes())
    list(pool.map(_warm, [0.3] * LANES))  # start (and import) every worker before any race
    yield pool
    pool.shutdown(wait=True, cancel_futures=True)


# -- backends ----------------------------------------------------------------------------------


@dataclass
class Backend:
    """How to open one backend, and how to race contenders against it."""

    name: str
    opener: Callable[[], Ledger]
    lane: Callable[[list[Job], float], list[str]]
    """One contender: runs its jobs from ``start_at`` on; must pickle for the process pool."""
    executor: Executor | None = None
    """Where contenders run; ``None`` for a thread per lane."""
    durable: Callable[[], SqliteLedger | PostgresLedger] | None = None
    opened: list[Ledger] = field(default_factory=list)

    def open(self) -> Ledger:
        ledger = self.opener()
        self.opened.append(ledger)
        return ledger

    def race(self, lanes: list[list[Job]]) -> list[list[str]]:
        """Run each lane in its own contender, all starting at the same instant."""
        start_at = time.time() + (0.25 if self.executor is not None else 0.05)
        if self.executor is not None:
            futures = [self.executor.submit(self.lane, jobs, start_at) for jobs in lanes]
            return [future.result(timeout=60) for future in futures]
        with ThreadPoolExecutor(max_workers=len(lanes)) as threads:
            return list(threads.map(lambda jobs: self.lane(jobs, start_at), lanes))

    def close_all(self) -> None:
        for ledger in self.opened:
            if isinstance(ledger, SqliteLedger | PostgresLedger):
                ledger.close()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "memory":
        shared = InMemoryLedger()  # threads share the one instance
        made = Backend("memory", lambda: shared, partial(_run_lane, shared))
    elif request.param == "sqlite":
        path = str(tmp_path / "ledger.db")
        made = Backend(
            "sqlite",
            lambda: SqliteLedger(path),
            partial(_sqlite_lane, path),
            executor=request.getfixturevalue("process_pool"),
            durable=lambda: SqliteLedger(path),
        )
    else:
        dsn = request.getfixturevalue("postgres_schema")
        made = Backend(
            "postgres",
            lambda: PostgresLedger(dsn),
            partial(_postgres_lane, dsn),
            durable=lambda: PostgresLedger(dsn),
        )
    yield made
    made.close_all()


@pytest.fixture
def ledger(backend: Backend) -> Ledger:
    return backend.open()


# -- accounts ----------------------------------------------------------------------------------


def test_open_account_starts_with_nothing_held(ledger: Ledger) -> None:
    balance = ledger.open_account("tenant", {"tool_calls": 100, "cost": 2.5})
    assert balance == Balance(
        account="tenant", parent=None, limits={"tool_calls": 100.0, "cost": 2.5}
    )
    assert balance.remaining("tool_calls") == 100.0
    assert balance.remaining("tokens") is None
    assert ledger.balance("tenant") == balance


def test_reopening_an_account_with_the_same_terms_is_idempotent(ledger: Ledger) -> None:
    ledger.open_account("tenant", {"tool_calls": 100})
    ledger.open_account("run", {"tool_calls": 60, "cost": 1.0}, parent="tenant")
    ledger.reserve("run", "k", {"tool_calls": 1})
    again = ledger.open_account("run", {"cost": 1.0, "tool_calls": 60}, parent="tenant")
    assert again.held == {"tool_calls": 1.0}
    assert again.parent == "tenant"


def test_reopening_an_account_with_other_limits_raises_ledger_conflict(ledger: Ledger) -> None:
    ledger.open_account("tenant", {"tool_calls": 100})
    with pytest.raises(LedgerConflict):
        ledger.open_account("tenant", {"tool_calls": 99})
    with pytest.raises(LedgerConflict):
        ledger.open_account("tenant", {"tool_calls": 100, "cost": 1.0})
    assert ledger.balance("tenant").limits == {"tool_calls": 100.0}


def test_reopening_an_account_under_another_parent_raises_ledger_conflict(ledger: Ledger) -> None:
    ledger.open_account("a", {})
    ledger.open_account("b", {})
    ledger.open_account("run", {"tool_calls": 5}, parent="a")
    with pytest.raises(LedgerConflict):
        ledger.open_account("run", {"tool_calls": 5}, parent="b")
    with pytest.raises(LedgerConflict):
        ledger.open_account("run", {"tool_calls": 5})
    assert ledger.balance("run").parent == "a"


def test_opening_under_an_unknown_parent_raises_unknown_account(ledger: Ledger) -> None:
    with pytest.raises(UnknownAccount):
        ledger.open_account("run", {"tool_calls": 5}, parent="nobody")
    with pytest.raises(UnknownAccount):
        ledger.balance("run")


def test_negative_or_nan_limits_and_amounts_are_rejected(ledger: Ledger) -> None:
    with pytest.raises(ValueError):
        ledger.open_account("bad", {"cost": -1})
    with pytest.raises(ValueError):
        ledger.open_account("bad", {"cost": float("nan")})
    ledger.open_account("ok", {"cost": 5})
    with pytest.raises(ValueError):
        ledger.reserve("ok", "k", {"cost": -0.5})
    assert ledger.get("k") is None
    assert ledger.balance("ok").held == {}


def test_unknown_account_raises_unknown_account(ledger: Ledger) -> None:
    with pytest.raises(UnknownAccount):
        ledger.reserve("nobody", "k", {"tool_calls": 1})
    with pytest.raises(UnknownAccount):
        ledger.balance("nobody")
    assert ledger.get("k") is None


def test_unknown_reservation_raises_unknown_reservation(ledger: Ledger) -> None:
    with pytest.raises(UnknownReservation):
        ledger.settle("never")
    with pytest.raises(UnknownReservation):
        ledger.settle("never", {"cost": 1})
    with pytest.raises(UnknownReservation):
        ledger.release("never")
    assert ledger.get("never") is None


# -- reserve -----------------------------------------------------------------------------------


def test_reserve_holds_the_amounts_on_the_account_and_every_ancestor(ledger: Ledger) -> None:
    ledger.open_account("tenant", {"tool_calls": 100})
    ledger.open_account("run", {"tool_calls": 60}, parent="tenant")
    ledger.open_account("step", {}, parent="run")
    reservation = ledger.reserve("step", "call-1", {"tool_calls": 2, "cost": 0.25})
    assert stored(reservation) == Reservation(
        account="step", key="call-1", amounts={"tool_calls": 2.0, "cost": 0.25}
    )
    assert reservation.status is ReservationStatus.RESERVED
    assert not reservation.existing
    for name in ("step", "run", "tenant"):
        assert ledger.balance(name).held == {"tool_calls": 2.0, "cost": 0.25}
    assert ledger.balance("run").remaining("tool_calls") == 58.0
    assert ledger.get("call-1") == stored(reservation)


def test_reserve_is_idempotent_by_key_and_charges_nothing_the_second_time(ledger: Ledger) -> None:
    ledger.open_account("run", {"tool_calls": 3})
    first = ledger.reserve("run", "call-1", {"tool_calls": 2})
    again = ledger.reserve("run", "call-1", {"tool_calls": 1})  # other amounts: still the first
    assert again.existing
    assert again.model_copy(update={"existing": False}) == first
    assert ledger.balance("run").held == {"tool_calls": 2.0}
    assert ledger.get("call-1") == stored(first)  # the stored reservation is not marked existing


def test_reserve_of_a_key_at_its_limit_returns_the_first_instead_of_exhausting(
    ledger: Ledger,
) -> None:
    ledger.open_account("run", {"tool_calls": 1})
    ledger.reserve("run", "call-1", {"tool_calls": 1})
    assert ledger.reserve("run", "call-1", {"tool_calls": 1}).existing
    with pytest.raises(BudgetExhausted):
        ledger.reserve("run", "call-2", {"tool_calls": 1})


def test_reserve_of_a_key_held_by_another_account_raises_ledger_conflict(ledger: Ledger) -> None:
    ledger.open_account("a", {"tool_calls": 5})
    ledger.open_account("b", {"tool_calls": 5})
    ledger.reserve("a", "call-1", {"tool_calls": 1})
    with pytest.raises(LedgerConflict):
        ledger.reserve("b", "call-1", {"tool_calls": 1})
    assert ledger.balance("b").held == {}


def test_parent_of_100_cannot_fund_three_children_of_60(ledger: Ledger) -> None:
    ledger.open_account("parent", {"cost": 100})
    for child in ("c1", "c2", "c3"):
        ledger.open_account(child, {"cost": 60}, parent="parent")
    ledger.reserve("c1", "k1", {"cost": 40})
    ledger.reserve("c2", "k2", {"cost": 40})
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("c3", "k3", {"cost": 40})  # within c3's 60, beyond what the parent has
    error = caught.value
    assert error.axis is BudgetAxis.COST
    assert error.limit == 100.0
    assert error.requested == 40.0
    assert error.account == "parent"
    assert error.reason is TerminationReason.TOOL_BUDGET_EXHAUSTED
    # atomic: the child that could not be funded was charged nothing, and the key is not taken
    assert ledger.balance("c3").held == {}
    assert ledger.balance("parent").held == {"cost": 80.0}
    assert ledger.get("k3") is None
    assert ledger.reserve("c3", "k3", {"cost": 20}).amounts == {"cost": 20.0}
    assert ledger.balance("parent").remaining("cost") == 0.0


def test_exhaustion_names_the_axis_the_limit_the_request_and_the_account(ledger: Ledger) -> None:
    ledger.open_account("tenant", {"tokens": 1000})
    ledger.open_account("run", {"tool_calls": 2, "tokens": 500}, parent="tenant")
    ledger.reserve("run", "k1", {"tool_calls": 2})
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("run", "k2", {"tool_calls": 1})
    assert (caught.value.account, caught.value.axis) == ("run", BudgetAxis.TOOL_CALLS)
    assert (caught.value.limit, caught.value.requested) == (2.0, 1.0)
    assert caught.value.reason is TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert "tool_calls limit 2" in str(caught.value)
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("run", "k3", {"tokens": 501})
    assert (caught.value.account, caught.value.axis) == ("run", BudgetAxis.TOKENS)
    assert caught.value.reason is TerminationReason.STEP_BUDGET_EXHAUSTED


def test_a_reserve_that_fails_on_one_axis_charges_no_axis(ledger: Ledger) -> None:
    ledger.open_account("run", {"tool_calls": 5, "cost": 1.0})
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("run", "k", {"tool_calls": 1, "cost": 1.5})
    assert caught.value.axis is BudgetAxis.COST
    assert ledger.balance("run").held == {}


def test_reserving_exactly_up_to_the_limit_succeeds(ledger: Ledger) -> None:
    ledger.open_account("run", {"cost": 1.0})
    ledger.reserve("run", "k1", {"cost": 0.5})
    ledger.reserve("run", "k2", {"cost": 0.5})
    assert ledger.balance("run").remaining("cost") == 0.0
    with pytest.raises(BudgetExhausted):
        ledger.reserve("run", "k3", {"cost": 0.001})


def test_an_axis_the_account_does_not_limit_is_held_but_never_exhausts(ledger: Ledger) -> None:
    ledger.open_account("run", {"tool_calls": 1})
    ledger.reserve("run", "k", {"tool_calls": 1, "tokens": 1e9})
    balance = ledger.balance("run")
    assert balance.held == {"tool_calls": 1.0, "tokens": 1e9}
    assert balance.remaining("tokens") is None


# -- settle and release ------------------------------------------------------------------------


# -- held is not spent: in flight, and a busy refusal -------------------------------------------


def test_in_flight_is_what_reservations_not_yet_settled_or_released_hold_up_the_chain(
    ledger: Ledger,
) -> None:
    ledger.open_account("tenant", {"tokens": 1000})
    ledger.open_account("run-a", {"tokens": 1000}, parent="tenant")
    ledger.open_account("run-b", {"tokens": 1000}, parent="tenant")
    ledger.reserve("run-a", "a1", {"tokens": 300, "steps": 1})
    ledger.reserve("run-b", "b1", {"tokens": 200})
    assert ledger.in_flight("tenant") == {"tokens": 500.0, "steps": 1.0}
    assert ledger.in_flight("run-a") == {"tokens": 300.0, "steps": 1.0}
    ledger.settle("a1", {"tokens": 120, "steps": 1})  # lands at 120: none of it in flight
    ledger.release("b1")
    ledger.charge("run-a", "over", {"tokens": 50})  # spent already: never in flight
    assert ledger.in_flight("tenant") == {"tokens": 0.0, "steps": 0.0}
    assert ledger.balance("tenant").held == {"tokens": 170.0, "steps": 1.0}
    ledger.settle("a1", {"tokens": 0})  # an outcome recorded twice lands once
    assert ledger.in_flight("run-a") == {"tokens": 0.0, "steps": 0.0}
    with pytest.raises(UnknownAccount):
        ledger.in_flight("nobody")


def test_a_refusal_only_reservations_in_flight_cause_is_busy_and_one_spent_causes_is_not(
    ledger: Ledger,
) -> None:
    ledger.open_account("tenant", {"tokens": 1000})
    ledger.open_account("run-a", {"tokens": 1000}, parent="tenant")
    ledger.open_account("run-b", {"tokens": 1000}, parent="tenant")
    ledger.reserve("run-a", "a1", {"tokens": 700})
    with pytest.raises(BudgetExhausted) as held:
        ledger.reserve("run-b", "b1", {"tokens": 600})
    assert held.value.busy  # spent: 0; the 700 in flight takes the room
    assert held.value.account == "tenant"
    ledger.settle("a1", {"tokens": 500})
    with pytest.raises(BudgetExhausted) as spent:
        ledger.reserve("run-b", "b1", {"tokens": 600})
    assert not spent.value.busy  # 500 spent leaves 500: no wait makes 600 fit
    assert ledger.reserve("run-b", "b1", {"tokens": 500}).balance is not None


def test_a_refusal_is_not_busy_when_any_account_of_the_chain_is_short_of_what_it_spent(
    ledger: Ledger,
) -> None:
    ledger.open_account("tenant", {"tokens": 1000})
    ledger.open_account("run", {"tokens": 100}, parent="tenant")
    ledger.open_account("other", {"tokens": 1000}, parent="tenant")
    ledger.charge("run", "spent", {"tokens": 80})
    ledger.reserve("other", "o1", {"tokens": 900})
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("run", "r1", {"tokens": 50})
    # The tenant is only busy, but the run's own account has spent too much: it stands.
    assert caught.value.account == "run" and not caught.value.busy


async def test_the_async_twin_of_in_flight_gives_the_same_answer(ledger: Ledger) -> None:
    await ledger.aopen_account("run", {"tokens": 10})
    await ledger.areserve("run", "k", {"tokens": 4})
    assert await ledger.ain_flight("run") == {"tokens": 4.0}
    with pytest.raises(BudgetExhausted) as caught:
        await ledger.areserve("run", "k2", {"tokens": 7})
    assert caught.value.busy
    await ledger.asettle("k", {"tokens": 4})
    assert await ledger.ain_flight("run") == {"tokens": 0.0}
    with pytest.raises(UnknownAccount):
        await ledger.ain_flight("nobody")


def test_settle_records_actual_and_refunds_only_the_excess(ledger: Ledger) -> None:
    ledger.open_account("tenant", {"cost": 10})
    ledger.open_account("run", {"cost": 5, "tool_calls": 3}, parent="tenant")
    ledger.reserve("run", "k", {"cost": 4, "tool_calls": 1})
    settled = ledger.settle("k", {"cost": 1.5, "tool_calls": 1})
    assert settled.status is ReservationStatus.SETTLED
    assert settled.amounts == {"cost": 1.5, "tool_calls": 1.0}
    assert not settled.existing
    for name in ("run", "tenant"):
        assert ledger.balance(name).held == {"cost": 1.5, "tool_calls": 1.0}
    assert ledger.get("k") == stored(settled)


def test_settle_never_charges_more_than_was_reserved(ledger: Ledger) -> None:
    ledger.open_account("run", {"cost": 5})
    ledger.reserve("run", "k", {"cost": 2})
    settled = ledger.settle("k", {"cost": 3, "tool_calls": 7})
    assert settled.amounts == {"cost": 2.0}
    assert ledger.balance("run").held == {"cost": 2.0}


def test_settle_keeps_axes_missing_from_actual_and_everything_without_actual(
    ledger: Ledger,
) -> None:
    ledger.open_account("run", {"cost": 5, "tool_calls": 5})
    ledger.reserve("run", "k1", {"cost": 2, "tool_calls": 1})
    assert ledger.settle("k1", {"cost": 0.5}).amounts == {"cost": 0.5, "tool_calls": 1.0}
    ledger.reserve("run", "k2", {"cost": 1, "tool_calls": 1})
    assert ledger.settle("k2").amounts == {"cost": 1.0, "tool_calls": 1.0}
    assert ledger.balance("run").held == {"cost": 1.5, "tool_calls": 2.0}


def test_settle_twice_refunds_once_and_returns_the_settlement_marked_existing(
    ledger: Ledger,
) -> None:
    ledger.open_account("run", {"cost": 5})
    ledger.reserve("run", "k", {"cost": 4})
    first = ledger.settle("k", {"cost": 3})
    again = ledger.settle("k", {"cost": 0})
    assert again.existing
    assert again.model_copy(update={"existing": False}) == first
    assert ledger.balance("run").held == {"cost": 3.0}


def test_release_refunds_in_full_across_the_chain(ledger: Ledger) -> None:
    ledger.open_account("tenant", {"tool_calls": 2})
    ledger.open_account("run", {"tool_calls": 2}, parent="tenant")
    ledger.reserve("run", "k1", {"tool_calls": 2, "cost": 0.5})
    released = ledger.release("k1")
    assert released.status is ReservationStatus.RELEASED
    assert released.amounts == {"tool_calls": 2.0, "cost": 0.5}
    for name in ("run", "tenant"):
        assert ledger.balance(name).held == {"tool_calls": 0.0, "cost": 0.0}
    ledger.reserve("run", "k2", {"tool_calls": 2})  # the room is back
    assert ledger.get("k1") == stored(released)


def test_release_or_settle_after_an_outcome_changes_nothing_and_is_marked_existing(
    ledger: Ledger,
) -> None:
    ledger.open_account("run", {"cost": 10})
    ledger.reserve("run", "released", {"cost": 2})
    ledger.reserve("run", "settled", {"cost": 3})
    ledger.release("released")
    ledger.settle("settled", {"cost": 1})
    assert ledger.release("released").existing
    assert ledger.settle("released").status is ReservationStatus.RELEASED
    again = ledger.release("settled")  # an attempted call is never refunded
    assert again.existing
    assert again.status is ReservationStatus.SETTLED
    assert ledger.balance("run").held == {"cost": 1.0}
    replay = ledger.reserve("run", "settled", {"cost": 3})
    assert replay.existing
    assert replay.status is ReservationStatus.SETTLED


def _script(ledger: Ledger) -> list[Any]:
    """A mixed run whose every outcome (value or error) is compared with the reference."""
    ops: list[tuple[str, tuple[Any, ...]]] = [
        ("open", ("root", {"cost": 1.0, "tool_calls": 5}, None)),
        ("open", ("a", {"cost": 0.7}, "root")),
        ("open", ("b", {"tool_calls": 3}, "root")),
        ("reserve", ("a", "k1", {"cost": 0.3, "tool_calls": 1})),
        ("reserve", ("a", "k2", {"cost": 0.3})),
        ("reserve", ("a", "k3", {"cost": 0.3})),
        ("settle", ("k1", {"cost": 0.1})),
        ("reserve", ("b", "k4", {"cost": 0.5, "tool_calls": 3})),
        ("reserve", ("b", "k5", {"tool_calls": 1})),
        ("release", ("k2",)),
        ("settle", ("k4", None)),
        ("release", ("k4",)),
        ("reserve", ("a", "k1", {"cost": 99})),
        ("reserve", ("b", "k1", {})),
        ("settle", ("nope", None)),
        ("reserve", ("ghost", "k9", {})),
        ("open", ("a", {"cost": 0.8}, "root")),
        ("reserve", ("a", "k6", {"cost": 0.6, "mutations": 2})),
        ("reserve", ("a", "k7", {"cost": 0.2})),
        ("settle", ("k6", {"cost": 0.2, "mutations": 5})),
        ("reserve", ("a", "k7", {"cost": 0.2})),
        ("open", ("c", {"tool_calls": 1}, "b", {"tenant": "acme", "principal": "u-1"})),
        ("open", ("c", {"tool_calls": 1}, "b", {"tenant": "other", "principal": "u-1"})),
        ("reserve", ("c", "k8", {})),
        ("reserve", ("c", "k8", {"tool_calls": 1})),
        ("close", ("b", "cancelled")),
        ("close", ("b", "completed")),
        ("reserve", ("c", "k9", {})),
        ("reserve", ("c", "k8", {})),
        ("release", ("k5",)),
        ("close", ("ghost", "cancelled")),
        ("reserve", ("a", "", {})),
        ("charge", ("a", "k10", {"cost": 0.9, "tool_calls": 1})),
        ("reserve", ("a", "k11", {"cost": 0.1})),
        ("reserve", ("a", "k11", {"tool_calls": 0})),
        ("charge", ("a", "k10", {"cost": 0.9, "tool_calls": 1})),
        ("charge", ("b", "k10", {})),
        ("charge", ("a", "k6", {"cost": 1.0})),
        ("charge", ("ghost", "k12", {})),
        ("charge", ("c", "k13", {"tool_calls": 2})),
        ("charge", ("a", "k12", {"cost": -1.0})),
        ("release", ("k10",)),
    ]
    out: list[Any] = []
    for op, args in ops:
        try:
            if op == "open":
                owner = args[3] if len(args) > 3 else None
                result: Any = ledger.open_account(args[0], args[1], parent=args[2], owner=owner)
            elif op == "reserve":
                result = ledger.reserve(*args)
            elif op == "settle":
                result = ledger.settle(*args)
            elif op == "close":
                result = ledger.close_account(*args)
            elif op == "charge":
                result = ledger.charge(*args)
            else:
                result = ledger.release(*args)
            out.append(result)
        except BudgetExhausted as error:
            out.append(("BudgetExhausted", error.account, error.axis, error.limit, error.requested))
        except AccountClosed as error:
            out.append(("AccountClosed", error.account, error.reason))
        except (LookupError, ValueError) as error:
            out.append((type(error).__name__, str(error)))
    out += [ledger.balance(name) for name in ("root", "a", "b", "c")]
    out += [ledger.get(f"k{i}") for i in range(1, 14)]
    return out


def test_every_backend_matches_the_in_memory_reference_on_a_mixed_run(ledger: Ledger) -> None:
    assert _script(ledger) == _script(InMemoryLedger())


# -- charging usage already spent --------------------------------------------------------------


def test_charge_records_usage_past_a_limit_on_the_account_and_every_ancestor(
    ledger: Ledger,
) -> None:
    ledger.open_account("tenant", {"tokens": 100})
    ledger.open_account("run", {"tokens": 1_000}, parent="tenant")
    ledger.reserve("run", "step-1", {"tokens": 60})
    charged = ledger.charge("run", "step-1:over", {"tokens": 90})
    assert charged.status is ReservationStatus.SETTLED
    assert not charged.existing
    assert charged.amounts == {"tokens": 90.0}
    assert charged.exceeded == ("tenant", "tokens")
    assert charged.balance is not None and charged.balance.held == {"tokens": 150.0}
    assert ledger.balance("tenant").held == {"tokens": 150.0}
    assert ledger.get("step-1:over") == stored(charged)


def test_a_charge_within_every_limit_names_no_account_exceeded(ledger: Ledger) -> None:
    ledger.open_account("tenant", {"tokens": 100, "cost": 1.0})
    ledger.open_account("run", {"tokens": 50}, parent="tenant")
    assert ledger.charge("run", "c1", {"tokens": 30, "cost": 0.5}).exceeded is None
    # Exactly at the limit is within it; the next token is refused all the same.
    assert ledger.charge("run", "c2", {"tokens": 20}).exceeded is None
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("run", "k", {"tokens": 1})
    assert caught.value.account == "run"
    assert ledger.charge("run", "c3", {}).exceeded is None  # a charge of nothing is a marker


def test_an_axis_a_charge_took_past_its_limit_is_refused_to_every_later_reservation_below_it(
    ledger: Ledger,
) -> None:
    ledger.open_account("tenant", {"tokens": 100, "tool_calls": 10})
    ledger.open_account("a", {}, parent="tenant")
    ledger.open_account("b", {"tokens": 1_000}, parent="tenant")
    assert ledger.charge("a", "over", {"tokens": 150}).exceeded == ("tenant", "tokens")
    for account in ("a", "b"):
        with pytest.raises(BudgetExhausted) as caught:
            ledger.reserve(account, f"{account}-step", {"tokens": 1})
        assert (caught.value.account, caught.value.axis) == ("tenant", BudgetAxis.TOKENS)
    ledger.open_account("c", {}, parent="tenant")  # opened after: refused all the same
    with pytest.raises(BudgetExhausted):
        ledger.reserve("c", "c-step", {"tokens": 1})
    # Axes are separate: what the tenant still has of another axis is still there.
    assert ledger.reserve("b", "b-call", {"tool_calls": 1}).status is ReservationStatus.RESERVED
    assert ledger.balance("tenant").held == {"tokens": 150.0, "tool_calls": 1.0}


def test_charge_is_idempotent_by_key_and_records_the_usage_once(ledger: Ledger) -> None:
    ledger.open_account("run", {"tokens": 10})
    first = ledger.charge("run", "over", {"tokens": 25})
    again = ledger.charge("run", "over", {"tokens": 25})
    assert again.existing
    assert stored(again.model_copy(update={"existing": False})) == stored(first)
    assert again.exceeded == first.exceeded == ("run", "tokens")
    assert ledger.balance("run").held == {"tokens": 25.0}
    # A key reserved before is that reservation, never charged on top of it.
    ledger.open_account("other", {})
    ledger.reserve("other", "held", {"tokens": 3})
    assert ledger.charge("other", "held", {"tokens": 30}).status is ReservationStatus.RESERVED
    assert ledger.balance("other").held == {"tokens": 3.0}


def test_charge_records_usage_on_a_closed_account_and_under_a_closed_parent(
    ledger: Ledger,
) -> None:
    ledger.open_account("tenant", {"tokens": 100})
    ledger.open_account("run", {}, parent="tenant")
    ledger.close_account("tenant", "cancelled")
    charged = ledger.charge("run", "over", {"tokens": 40})
    assert charged.status is ReservationStatus.SETTLED
    assert ledger.balance("tenant").held == {"tokens": 40.0}
    assert ledger.balance("tenant").closed == "cancelled"


def test_charge_refuses_an_unknown_account_another_accounts_key_and_bad_amounts(
    ledger: Ledger,
) -> None:
    ledger.open_account("a", {})
    ledger.open_account("b", {})
    ledger.reserve("a", "k", {})
    with pytest.raises(UnknownAccount):
        ledger.charge("nobody", "k2", {"tokens": 1})
    with pytest.raises(LedgerConflict):
        ledger.charge("b", "k", {"tokens": 1})
    with pytest.raises(ValueError):
        ledger.charge("a", "k3", {"tokens": -1})
    with pytest.raises(InvalidLedgerKey):
        ledger.charge("a", "", {"tokens": 1})
    assert ledger.get("k2") is None and ledger.get("k3") is None
    assert ledger.balance("b").held == {}


def test_concurrent_charges_are_each_recorded_once_past_the_limit(
    backend: Backend, ledger: Ledger
) -> None:
    ledger.open_account("tenant", {"tokens": 10})
    ledger.open_account("run", {}, parent="tenant")
    lanes: list[list[Job]] = [
        [("charge", "run", f"over-{i}", {"tokens": 3}) for i in range(5)]
        + [("reserve", "run", f"step-{lane}", {"tokens": 1})]
        for lane in range(LANES)
    ]
    results = backend.race(lanes)
    for i in range(5):
        # Each key is charged once, whichever lane got it first; none is refused.
        column = [lane[i] for lane in results]
        assert column.count("settled") == 1
        assert column.count("existing") == LANES - 1
    assert ledger.balance("tenant").held["tokens"] == 15.0 + sum(
        lane[-1] == "reserved" for lane in results
    )
    assert all(lane[-1] in ("reserved", "exhausted:tenant:tokens") for lane in results)


def test_a_charge_survives_reopening_the_ledger(backend: Backend) -> None:
    if backend.durable is None:
        pytest.skip("the in-memory ledger is not durable")
    with backend.durable() as first:
        first.open_account("tenant", {"tokens": 10})
        first.open_account("run", {}, parent="tenant")
        first.charge("run", "over", {"tokens": 12})
    with backend.durable() as second:
        again = second.charge("run", "over", {"tokens": 12})
        assert again.existing and again.exceeded == ("tenant", "tokens")
        assert second.balance("tenant").held == {"tokens": 12.0}
        with pytest.raises(BudgetExhausted):
            second.reserve("run", "step", {"tokens": 1})


# -- owners and closed accounts ----------------------------------------------------------------


def test_an_account_records_its_owner(ledger: Ledger) -> None:
    opened = ledger.open_account(
        "tenant", {"cost": 5}, owner={"tenant": "acme", "principal": "u-1"}
    )
    assert opened.owner == {"tenant": "acme", "principal": "u-1"}
    assert opened.closed is None
    assert ledger.balance("tenant") == opened
    assert ledger.open_account("run", {}, parent="tenant").owner == {}


def test_reopening_an_account_with_another_owner_raises_ledger_conflict(ledger: Ledger) -> None:
    ledger.open_account("run", {"cost": 5}, owner={"tenant": "acme", "principal": "u-1"})
    again = ledger.open_account("run", {"cost": 5}, owner={"principal": "u-1", "tenant": "acme"})
    assert again.owner == {"tenant": "acme", "principal": "u-1"}
    for other in ({"tenant": "evil", "principal": "u-1"}, {"tenant": "acme"}, {}, None):
        with pytest.raises(LedgerConflict):
            ledger.open_account("run", {"cost": 5}, owner=other)
    assert ledger.balance("run").owner == {"tenant": "acme", "principal": "u-1"}


def test_closing_an_account_refuses_new_reservations_naming_the_account_and_reason(
    ledger: Ledger,
) -> None:
    ledger.open_account("run", {"tool_calls": 5})
    ledger.reserve("run", "k1", {"tool_calls": 1})
    closed = ledger.close_account("run", "cancelled")
    assert closed.closed == "cancelled"
    assert closed.held == {"tool_calls": 1.0}
    with pytest.raises(AccountClosed) as caught:
        ledger.reserve("run", "k2", {"tool_calls": 1})
    assert (caught.value.account, caught.value.reason) == ("run", "cancelled")
    assert not isinstance(caught.value, LookupError | ValueError)
    assert ledger.get("k2") is None
    assert ledger.balance("run").held == {"tool_calls": 1.0}


def test_a_closed_ancestor_refuses_reservations_on_every_descendant(ledger: Ledger) -> None:
    ledger.open_account("tenant", {"cost": 10})
    ledger.open_account("team", {}, parent="tenant")
    ledger.open_account("run", {"cost": 5}, parent="team")
    ledger.close_account("team", "completed")
    with pytest.raises(AccountClosed) as caught:
        ledger.reserve("run", "k", {"cost": 1})
    assert (caught.value.account, caught.value.reason) == ("team", "completed")
    assert ledger.balance("run").closed is None  # closing does not write to the children
    ledger.reserve("tenant", "k-tenant", {"cost": 1})  # the ancestor above is still open
    ledger.close_account("run", "cancelled")
    with pytest.raises(AccountClosed) as caught:
        ledger.reserve("run", "k", {"cost": 1})
    assert caught.value.account == "run"  # the nearest closed account is named


def test_closing_is_checked_before_the_budget(ledger: Ledger) -> None:
    ledger.open_account("run", {"cost": 1})
    ledger.reserve("run", "k1", {"cost": 1})
    ledger.close_account("run", "completed")
    with pytest.raises(AccountClosed):
        ledger.reserve("run", "k2", {"cost": 1})


def test_close_account_is_idempotent_and_the_first_reason_wins(ledger: Ledger) -> None:
    ledger.open_account("run", {"cost": 1}, owner={"tenant": "acme"})
    first = ledger.close_account("run", "cancelled")
    again = ledger.close_account("run", "completed")
    assert first == again
    assert again.closed == "cancelled"
    assert ledger.balance("run").closed == "cancelled"
    # Reopening with the same terms does not reopen it; other terms still conflict.
    assert ledger.open_account("run", {"cost": 1}, owner={"tenant": "acme"}).closed == "cancelled"
    with pytest.raises(LedgerConflict):
        ledger.open_account("run", {"cost": 2}, owner={"tenant": "acme"})


def test_closing_an_unknown_account_raises_unknown_account(ledger: Ledger) -> None:
    with pytest.raises(UnknownAccount):
        ledger.close_account("nobody", "cancelled")


def test_a_repeated_reserve_of_a_key_returns_it_even_on_a_closed_account(ledger: Ledger) -> None:
    ledger.open_account("tenant", {})
    ledger.open_account("run", {"tool_calls": 2}, parent="tenant")
    first = ledger.reserve("run", "call-1", {"tool_calls": 1})
    ledger.close_account("tenant", "cancelled")
    again = ledger.reserve("run", "call-1", {"tool_calls": 1})
    assert again.existing
    assert stored(again) == stored(first).model_copy(update={"existing": True})
    ledger.open_account("other", {})
    with pytest.raises(LedgerConflict):  # another account's key is still a conflict
        ledger.reserve("other", "call-1", {})


def test_settle_and_release_still_record_outcomes_on_a_closed_account(ledger: Ledger) -> None:
    ledger.open_account("tenant", {"cost": 10})
    ledger.open_account("run", {"cost": 5}, parent="tenant")
    ledger.reserve("run", "started", {"cost": 3})
    ledger.reserve("run", "never-started", {"cost": 1})
    ledger.close_account("run", "cancelled")
    ledger.close_account("tenant", "cancelled")
    settled = ledger.settle("started", {"cost": 2})
    assert settled.status is ReservationStatus.SETTLED
    released = ledger.release("never-started")
    assert released.status is ReservationStatus.RELEASED
    for name in ("run", "tenant"):
        assert ledger.balance(name).held == {"cost": 2.0}
    assert released.balance is not None
    assert released.balance.closed == "cancelled"


# -- the balance on every reservation ----------------------------------------------------------


def test_every_reservation_carries_its_account_balance_after_the_operation(
    ledger: Ledger,
) -> None:
    ledger.open_account("tenant", {"cost": 10})
    owner = {"tenant": "acme", "principal": "u-1"}
    ledger.open_account("run", {"cost": 5, "tool_calls": 2}, parent="tenant", owner=owner)
    reserved = ledger.reserve("run", "k", {"cost": 4, "tool_calls": 1})
    assert reserved.balance == Balance(
        account="run",
        parent="tenant",
        limits={"cost": 5.0, "tool_calls": 2.0},
        held={"cost": 4.0, "tool_calls": 1.0},
        owner=owner,
    )
    assert reserved.balance == ledger.balance("run")
    again = ledger.reserve("run", "k", {"cost": 4})
    assert again.balance == ledger.balance("run")
    settled = ledger.settle("k", {"cost": 1.5})
    assert settled.balance is not None
    assert settled.balance.held == {"cost": 1.5, "tool_calls": 1.0}
    assert settled.balance == ledger.balance("run")
    assert ledger.settle("k").balance == ledger.balance("run")  # existing outcome
    ledger.reserve("run", "k2", {"cost": 1})
    released = ledger.release("k2")
    assert released.balance == ledger.balance("run")
    assert released.balance is not None and released.balance.held["cost"] == 1.5
    assert ledger.release("k2").balance == ledger.balance("run")
    ledger.close_account("run", "completed")
    closed = ledger.reserve("run", "k", {})
    assert closed.balance is not None and closed.balance.closed == "completed"
    assert ledger.get("k") == stored(settled)  # get returns the stored reservation, no balance


def test_changing_what_the_ledger_returned_never_changes_the_books(ledger: Ledger) -> None:
    opened = ledger.open_account("run", {"cost": 5}, owner={"tenant": "acme"})
    opened.limits["cost"] = 1e9
    opened.owner["tenant"] = "evil"
    reserved = ledger.reserve("run", "k", {"cost": 1})
    again = ledger.reserve("run", "k", {"cost": 1})
    got = ledger.get("k")
    assert got is not None and reserved.balance is not None
    for returned in (reserved, again, got):
        returned.amounts["cost"] = 99.0
    reserved.balance.held["cost"] = 0.0
    ledger.balance("run").limits["cost"] = 1e9
    assert ledger.get("k") == Reservation(account="run", key="k", amounts={"cost": 1.0})
    assert ledger.balance("run") == Balance(
        account="run",
        parent=None,
        limits={"cost": 5.0},
        held={"cost": 1.0},
        owner={"tenant": "acme"},
    )
    settled = ledger.settle("k")
    settled.amounts["cost"] = 0.0
    assert ledger.balance("run").held == {"cost": 1.0}


# -- zero-amount markers -----------------------------------------------------------------------


def test_a_zero_amount_reservation_is_an_idempotent_attempt_marker(ledger: Ledger) -> None:
    ledger.open_account("run", {"tool_calls": 0})
    marker = ledger.reserve("run", "attempt-1", {})
    assert marker.amounts == {}
    assert not marker.existing
    assert marker.balance is not None and marker.balance.held == {}
    again = ledger.reserve("run", "attempt-1", {})
    assert again.existing
    assert ledger.get("attempt-1") == stored(marker)
    assert ledger.settle("attempt-1").status is ReservationStatus.SETTLED
    assert ledger.reserve("run", "attempt-1", {}).existing
    ledger.close_account("run", "completed")
    with pytest.raises(AccountClosed):
        ledger.reserve("run", "attempt-2", {})
    assert ledger.get("attempt-2") is None


# -- one attempt's writes at once --------------------------------------------------------------
# ``begin_attempt`` and ``finish_attempt`` write what two calls of the port would: each backend's
# combined operation is run beside the port's default (which composes ``reserve`` and ``settle``
# of the same backend) on a twin set of accounts and keys, and every answer must be the same.


def _plain(value: Any, prefix: str) -> Any:
    """``value`` (an answer, a model, an exception) as comparable plain data, with the twin's
    ``prefix`` taken out of every name."""
    if isinstance(value, BaseException):
        named = getattr(value, "account", None)
        return (type(value).__name__, None if named is None else _plain(named, prefix))
    if isinstance(value, Attempt | Reservation | Balance):
        return _plain(value.model_dump(), prefix)
    if isinstance(value, dict):
        return {_plain(k, prefix): _plain(v, prefix) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, prefix) for v in value]
    if isinstance(value, str):
        return value.replace(prefix, "")
    return value


def _answer(op: Callable[[], Any]) -> Any:
    try:
        return op()
    except (AccountClosed, LookupError, ValueError) as refused:
        return refused


def _attempt_script(
    ledger: Ledger,
    p: str,
    begin: Callable[..., Attempt],
    finish: Callable[..., Reservation],
) -> list[Any]:
    """One run's attempts on accounts and keys named with ``p``, every answer and what the
    ledger holds after each."""
    ledger.open_account(f"{p}tenant", {"tool_calls": 10})
    ledger.open_account(f"{p}run", {"tool_calls": 5}, parent=f"{p}tenant")
    ledger.open_account(f"{p}fork", {"tool_calls": 5}, parent=f"{p}tenant")
    ledger.open_account(f"{p}other", {"tool_calls": 5}, parent=f"{p}tenant")
    out: list[Any] = []

    def look(*keys: str) -> None:
        out.append([ledger.get(f"{p}{k}") for k in keys])

    # A first attempt: claim and start marker made; again (a re-run after a crash): existing.
    out.append(_answer(lambda: begin(f"{p}run", f"{p}m1", claim=f"{p}c1")))
    out.append(_answer(lambda: begin(f"{p}run", f"{p}m1", claim=f"{p}c1")))
    # A retry's attempt: no claim asked.
    out.append(_answer(lambda: begin(f"{p}run", f"{p}m2")))
    # The claim held by another account (the run a fork branches from): nothing written.
    out.append(_answer(lambda: begin(f"{p}fork", f"{p}mf", claim=f"{p}c1")))
    look("c1", "m1", "m2", "mf")
    # A marker key another account holds: the claim made first stays, as two calls leave it.
    ledger.reserve(f"{p}other", f"{p}taken", {})
    out.append(_answer(lambda: begin(f"{p}run", f"{p}taken", claim=f"{p}c2")))
    out.append(_answer(lambda: begin("ghost", f"{p}m9", claim=f"{p}c9")))
    look("c2", "taken", "c9", "m9")

    # Finishing: the result marked and the attempt settled (refunding what was not spent).
    ledger.reserve(f"{p}run", f"{p}k1", {"tool_calls": 1})
    out.append(_answer(lambda: finish(f"{p}run", f"{p}k1", result=f"{p}r1")))
    out.append(_answer(lambda: finish(f"{p}run", f"{p}k1", result=f"{p}r1")))
    ledger.reserve(f"{p}run", f"{p}k2", {"tool_calls": 1})
    out.append(_answer(lambda: finish(f"{p}run", f"{p}k2", actual={"tool_calls": 0})))
    # Settling a key never reserved, or at a negative actual: the marker stays, the settle
    # refuses (two calls would do the same).
    out.append(_answer(lambda: finish(f"{p}run", f"{p}nothing", result=f"{p}r3")))
    ledger.reserve(f"{p}run", f"{p}k4", {"tool_calls": 1})
    out.append(_answer(lambda: finish(f"{p}run", f"{p}k4", result=f"{p}r4", actual={"x": -1})))
    look("k1", "r1", "k2", "r3", "k4", "r4")
    out.append(ledger.balance(f"{p}tenant"))

    # A closed account (a cancel): a re-run's attempt finds what it wrote; nothing new starts;
    # an attempt in flight settles, its result unmarked.
    ledger.reserve(f"{p}run", f"{p}k5", {"tool_calls": 1})
    ledger.close_account(f"{p}run", "cancelled")
    out.append(_answer(lambda: begin(f"{p}run", f"{p}m1", claim=f"{p}c1")))
    out.append(_answer(lambda: begin(f"{p}run", f"{p}m6", claim=f"{p}c6")))
    out.append(_answer(lambda: begin(f"{p}run", f"{p}m7", claim=f"{p}c1")))
    out.append(_answer(lambda: finish(f"{p}run", f"{p}k5", result=f"{p}r5")))
    look("m6", "c6", "m7", "k5", "r5")
    out.append([ledger.balance(f"{p}{name}") for name in ("tenant", "run", "fork", "other")])
    return out


async def test_reserved_answers_as_a_repeated_reserve_and_reserves_nothing(ledger: Ledger) -> None:
    ledger.open_account("tenant", {"tool_calls": 3})
    ledger.open_account("run", {"tool_calls": 2}, parent="tenant", owner={"tenant": "acme"})
    ledger.open_account("other", {"tool_calls": 2}, parent="tenant")
    ledger.reserve("run", "held", {"tool_calls": 1})
    ledger.reserve("run", "done", {"tool_calls": 1})
    ledger.settle("done", {"tool_calls": 0})
    ledger.reserve("other", "theirs", {"tool_calls": 1})
    for key in ("held", "done"):
        found = ledger.reserved("run", key)
        assert found is not None and found.existing
        assert found == ledger.reserve("run", key, {"tool_calls": 1})
        assert found == await ledger.areserved("run", key)
        assert found == Ledger.reserved(ledger, "run", key)  # the port's default, composed
        assert found.balance is not None and found.balance.owner == {"tenant": "acme"}
    assert ledger.reserved("run", "new") is None and await ledger.areserved("run", "new") is None
    assert Ledger.reserved(ledger, "run", "new") is None
    assert ledger.get("new") is None
    assert ledger.balance("tenant").held == {"tool_calls": 2.0}
    with pytest.raises(LedgerConflict):
        ledger.reserved("run", "theirs")
    with pytest.raises(LedgerConflict):
        await ledger.areserved("run", "theirs")
    ledger.close_account("run", "cancelled")
    again = ledger.reserved("run", "held")
    assert again is not None and again == ledger.reserve("run", "held", {"tool_calls": 1})
    assert again.balance is not None and again.balance.closed == "cancelled"
    with pytest.raises(InvalidLedgerKey):
        ledger.reserved("run", "")


def _composed(ledger: Ledger) -> tuple[Callable[..., Attempt], Callable[..., Reservation]]:
    """The port's default ``begin_attempt`` and ``finish_attempt`` over ``ledger``'s own
    ``reserve`` and ``settle``."""
    return partial(Ledger.begin_attempt, ledger), partial(Ledger.finish_attempt, ledger)


def test_begin_and_finish_attempt_answer_and_write_as_the_separate_calls_do(
    ledger: Ledger,
) -> None:
    combined = _attempt_script(ledger, "one-", ledger.begin_attempt, ledger.finish_attempt)
    separate = _attempt_script(ledger, "two-", *_composed(ledger))
    assert _plain(combined, "one-") == _plain(separate, "two-")
    # The script reached each answer it is there for.
    first, again, retry, forked = combined[:4]
    assert first.claimed and first.started is not None and not first.started.existing
    assert again.claimed and again.started is not None and again.started.existing
    assert retry.claimed and retry.started is not None and not retry.started.existing
    assert not forked.claimed and forked.started is None
    assert combined[4] == [ledger.get(k) for k in ("one-c1", "one-m1", "one-m2")] + [None]
    assert isinstance(combined[5], LedgerConflict) and isinstance(combined[6], UnknownAccount)
    assert combined[7][0] is not None and combined[7][2:] == [None, None]
    assert combined[8].status is ReservationStatus.SETTLED and not combined[8].existing
    assert combined[9].existing
    assert isinstance(combined[11], UnknownReservation) and isinstance(combined[12], ValueError)
    held = combined[13]
    assert held[1] is not None and held[3] is not None and held[5] is not None  # r1, r3, r4
    assert held[4].status is ReservationStatus.RESERVED  # k4: the settle refused
    assert combined[15].started.existing
    assert isinstance(combined[16], AccountClosed) and isinstance(combined[17], AccountClosed)
    assert combined[18].status is ReservationStatus.SETTLED
    assert combined[19] == [None, None, None, combined[19][3], None]


async def test_the_async_twins_of_begin_and_finish_attempt_answer_as_the_sync_ones(
    ledger: Ledger,
) -> None:
    sync = _attempt_script(ledger, "one-", ledger.begin_attempt, ledger.finish_attempt)
    loop = asyncio.get_running_loop()
    twins: dict[str, Any] = {}

    def begin(*args: Any, **kwargs: Any) -> Attempt:
        return asyncio.run_coroutine_threadsafe(
            ledger.abegin_attempt(*args, **kwargs), loop
        ).result(timeout=60)

    def finish(*args: Any, **kwargs: Any) -> Reservation:
        return asyncio.run_coroutine_threadsafe(
            ledger.afinish_attempt(*args, **kwargs), loop
        ).result(timeout=60)

    twins["out"] = await asyncio.to_thread(_attempt_script, ledger, "two-", begin, finish)
    assert _plain(sync, "one-") == _plain(twins["out"], "two-")


StartAttempt = Callable[..., tuple[Reservation | None, Attempt | None]]


def _in_flight_only(found: Reservation) -> bool:
    return found.status is ReservationStatus.RESERVED


def _start_script(ledger: Ledger, p: str, start: StartAttempt) -> list[Any]:
    """A run's first attempts started on accounts and keys named with ``p`` (each attempt's
    reservation read and, where ``begins`` accepts it, the attempt begun): every answer, what
    ``begins`` was shown, and what the ledger holds after each."""
    ledger.open_account(f"{p}tenant", {"tool_calls": 10})
    ledger.open_account(f"{p}run", {"tool_calls": 9}, parent=f"{p}tenant", owner={"run": "r"})
    ledger.open_account(f"{p}other", {"tool_calls": 5}, parent=f"{p}tenant")
    out: list[Any] = []
    shown: list[Reservation] = []

    def begins(found: Reservation) -> bool:
        shown.append(found)
        return _in_flight_only(found)

    def go(account: str, n: int, *, claim: bool = True, judge: Any = begins) -> None:
        out.append(
            _answer(
                lambda: start(
                    f"{p}{account}",
                    f"{p}k{n}",
                    f"{p}m{n}",
                    claim=f"{p}c{n}" if claim else None,
                    begins=judge,
                )
            )
        )
        out.append([ledger.get(f"{p}{k}{n}") for k in ("c", "m")])

    ledger.reserve(f"{p}run", f"{p}k1", {"tool_calls": 1})
    go("run", 1)  # the gate's reservation: read, the claim and the start marker written
    go("run", 1)  # again (a re-run after a crash): the claim and marker found, existing
    go("run", 2)  # never reserved: nothing begun, nothing written
    ledger.reserve(f"{p}run", f"{p}k3", {"tool_calls": 1})
    go("run", 3, judge=lambda found: False)  # refused by the caller's rule: nothing written
    ledger.reserve(f"{p}run", f"{p}k4", {"tool_calls": 1})
    ledger.settle(f"{p}k4")
    go("run", 4)  # settled already: begins refuses it, nothing written
    ledger.reserve(f"{p}run", f"{p}k5", {"tool_calls": 1})
    go("run", 5, claim=False)  # a retry's attempt: no claim asked
    ledger.reserve(f"{p}other", f"{p}k6", {"tool_calls": 1})
    go("run", 6)  # the reservation is another account's: LedgerConflict
    ledger.reserve(f"{p}run", f"{p}k7", {"tool_calls": 1})
    ledger.reserve(f"{p}other", f"{p}c7", {})
    go("run", 7)  # the claim is another account's (a fork's origin): not claimed, no marker
    ledger.reserve(f"{p}run", f"{p}k8", {"tool_calls": 1})
    ledger.close_account(f"{p}run", "cancelled")
    go("run", 8)  # found on a closed account; the claim refused: AccountClosed, nothing written
    out.append([ledger.balance(f"{p}{name}") for name in ("tenant", "run", "other")])
    out.append(shown)
    return out


def test_start_attempt_answers_and_writes_as_reserved_then_begin_attempt_do(
    ledger: Ledger,
) -> None:
    combined = _start_script(ledger, "one-", ledger.start_attempt)
    separate = _start_script(ledger, "two-", partial(Ledger.start_attempt, ledger))
    assert _plain(combined, "one-") == _plain(separate, "two-")
    # The script reached each answer it is there for.
    first, again = combined[0], combined[2]
    assert first[0] is not None and first[0].existing and first[1] is not None
    assert first[1].claimed and first[1].started is not None and not first[1].started.existing
    assert again[1].started.existing and combined[3] == [combined[1][0], combined[1][1]]
    assert combined[4] == (None, None) and combined[5] == [None, None]
    for refused in (6, 8):
        assert combined[refused][0] is not None and combined[refused][1] is None
        assert combined[refused + 1] == [None, None]
    assert combined[10][1].started is not None and combined[11][0] is None
    assert isinstance(combined[12], LedgerConflict) and combined[13] == [None, None]
    assert not combined[14][1].claimed and combined[15][1] is None
    assert isinstance(combined[16], AccountClosed) and combined[17] == [None, None]
    shown = combined[19]
    assert all(found.balance is not None for found in shown)
    assert shown[0].balance.owner == {"run": "r"}  # the account's owner, for the caller to judge


async def test_the_async_twin_of_start_attempt_answers_as_the_sync_one(ledger: Ledger) -> None:
    sync = _start_script(ledger, "one-", ledger.start_attempt)
    loop = asyncio.get_running_loop()

    def start(*args: Any, **kwargs: Any) -> tuple[Reservation | None, Attempt | None]:
        return asyncio.run_coroutine_threadsafe(
            ledger.astart_attempt(*args, **kwargs), loop
        ).result(timeout=60)

    out = await asyncio.to_thread(_start_script, ledger, "two-", start)
    assert _plain(sync, "one-") == _plain(out, "two-")


SettleAndReserve = Callable[..., tuple[Reservation, list[Reservation | BudgetExhausted]]]


def _step_script(ledger: Ledger, p: str, settle_and_reserve: SettleAndReserve) -> list[Any]:
    """One run's model steps settled with the calls they proposed held, on accounts and keys
    named with ``p``: every answer and what the ledger holds after each."""
    ledger.open_account(f"{p}tenant", {"tool_calls": 3})
    ledger.open_account(f"{p}run", {"steps": 20, "tokens": 5000}, parent=f"{p}tenant")
    ledger.open_account(f"{p}other", {}, parent=f"{p}tenant")
    out: list[Any] = []

    def step(n: int, holds: list[tuple[str, dict[str, float]]], actual: Any = None) -> None:
        ledger.reserve(f"{p}run", f"{p}s{n}", {"steps": 1, "tokens": 100})
        out.append(
            _answer(
                lambda: settle_and_reserve(
                    f"{p}s{n}", actual, f"{p}run", [(f"{p}{k}", a) for k, a in holds]
                )
            )
        )

    def look(*keys: str) -> None:
        out.append([ledger.get(f"{p}{k}") for k in keys])
        out.append([ledger.balance(f"{p}{name}") for name in ("tenant", "run")])

    # Settled below its hold (refunded), and two calls held.
    step(1, [("k1", {"tool_calls": 1}), ("k2", {"tool_calls": 1})], {"steps": 1, "tokens": 40})
    # Again (a node re-run on resume): the settlement and the holds found, nothing written twice.
    out.append(
        _answer(
            lambda: settle_and_reserve(
                f"{p}s1",
                {"steps": 1, "tokens": 40},
                f"{p}run",
                [(f"{p}k1", {"tool_calls": 1}), (f"{p}k2", {"tool_calls": 1})],
            )
        )
    )
    look("s1", "k1", "k2")
    # The tenant has room for one call more: the next is refused as data, the one after held.
    step(2, [("k3", {"tool_calls": 1}), ("k4", {"tool_calls": 1}), ("k5", {})])
    look("s2", "k3", "k4", "k5")
    # A hold's key another account holds: the step and the hold before it stay written.
    ledger.reserve(f"{p}other", f"{p}taken", {})
    step(3, [("k6", {}), ("taken", {}), ("k7", {})])
    look("s3", "k6", "k7")
    # An invalid hold key, or amount: refused where a separate reserve would be.
    step(4, [("k8", {}), ("bad\x00", {})])
    step(5, [("k9", {"tool_calls": -1})])
    look("s4", "k8", "s5", "k9")
    # A step never reserved, or settled at a negative actual: nothing written.
    out.append(_answer(lambda: settle_and_reserve(f"{p}nothing", None, f"{p}run", [])))
    step(6, [("k10", {})], {"tokens": -1})
    look("s6", "k10")
    # A closed account (a cancel): the step settles, a call held before is found, none is new.
    ledger.reserve(f"{p}run", f"{p}s7", {"steps": 1})
    ledger.close_account(f"{p}run", "cancelled")
    out.append(
        _answer(
            lambda: settle_and_reserve(
                f"{p}s7", None, f"{p}run", [(f"{p}k1", {"tool_calls": 1}), (f"{p}k11", {})]
            )
        )
    )
    look("s7", "k11")
    # An account never opened.
    ledger.reserve(f"{p}other", f"{p}s8", {})
    out.append(_answer(lambda: settle_and_reserve(f"{p}s8", None, f"{p}ghost", [(f"{p}k12", {})])))
    look("s8", "k12")
    return out


def test_settle_and_reserve_answers_and_writes_as_the_separate_calls_do(ledger: Ledger) -> None:
    combined = _step_script(ledger, "one-", ledger.settle_and_reserve)
    separate = _step_script(ledger, "two-", partial(Ledger.settle_and_reserve, ledger))
    assert _plain(combined, "one-") == _plain(separate, "two-")
    # The script reached each answer it is there for.
    settled, held = combined[0]
    assert settled.status is ReservationStatus.SETTLED and settled.amounts["tokens"] == 40.0
    assert [h.existing for h in held] == [False, False]
    again, found = combined[1]
    assert again.existing and [h.existing for h in found] == [True, True]
    _, second = combined[4]
    assert not isinstance(second[0], BudgetExhausted) and isinstance(second[1], BudgetExhausted)
    assert not isinstance(second[2], BudgetExhausted)
    assert isinstance(combined[7], LedgerConflict)
    assert combined[8][0].status is ReservationStatus.SETTLED  # s3
    assert combined[8][1] is not None and combined[8][2] is None  # k6 kept, k7 never asked
    assert isinstance(combined[10], InvalidLedgerKey) and isinstance(combined[11], ValueError)
    assert combined[12][1] is not None  # k8 kept
    assert isinstance(combined[14], UnknownReservation) and isinstance(combined[15], ValueError)
    assert combined[16][0].status is ReservationStatus.RESERVED  # s6: the settle refused
    assert isinstance(combined[18], AccountClosed)
    assert combined[19][0].status is ReservationStatus.SETTLED and combined[19][1] is None
    assert isinstance(combined[21], UnknownAccount)


async def test_the_async_twin_of_settle_and_reserve_answers_as_the_sync_one(
    ledger: Ledger,
) -> None:
    sync = _step_script(ledger, "one-", ledger.settle_and_reserve)
    loop = asyncio.get_running_loop()

    def twin(*args: Any) -> tuple[Reservation, list[Reservation | BudgetExhausted]]:
        return asyncio.run_coroutine_threadsafe(ledger.asettle_and_reserve(*args), loop).result(
            timeout=60
        )

    out = await asyncio.to_thread(_step_script, ledger, "two-", twin)
    assert _plain(sync, "one-") == _plain(out, "two-")


def test_an_attempt_begun_or_finished_survives_reopening_the_ledger(backend: Backend) -> None:
    if backend.durable is None:
        pytest.skip("the in-memory ledger is not durable")
    with backend.durable() as first:
        first.open_account("run", {"tool_calls": 5})
        first.reserve("run", "call-1", {"tool_calls": 1})
        first.begin_attempt("run", "call-1:started", claim="claim-1")
        first.finish_attempt("run", "call-1", result="result-1")
    with backend.durable() as second:
        again = second.begin_attempt("run", "call-1:started", claim="claim-1")
        assert again.claimed and again.started is not None and again.started.existing
        assert second.get("claim-1") is not None and second.get("result-1") is not None
        assert second.finish_attempt("run", "call-1", result="result-1").existing


class _DiesWritingTheSecond(SqliteLedger):
    """A SQLite ledger whose process dies inside a transaction as it writes ``dies_at``."""

    dies_at = ""

    def _reserve_in(
        self, tx: Any, account: str, key: str, clean: dict[str, float], read: Any = None
    ) -> Any:
        held = super()._reserve_in(tx, account, key, clean, read)
        if key == self.dies_at:
            raise KeyboardInterrupt  # the process going away: nothing after it runs
        return held

    def _mark_in(self, tx: Any, account: str, key: str, read: Any = None) -> Any:
        # A claim or result marker: written without an answer, dies the same way.
        read = super()._mark_in(tx, account, key, read)
        if key == self.dies_at:
            raise KeyboardInterrupt
        return read


def test_a_crash_inside_begin_or_finish_attempt_leaves_none_of_its_writes(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with _DiesWritingTheSecond(path) as dying:
        dying.open_account("run", {"tool_calls": 5})
        dying.reserve("run", "call-1", {"tool_calls": 1})
        dying.dies_at = "call-1:started"
        with pytest.raises(KeyboardInterrupt):
            dying.begin_attempt("run", "call-1:started", claim="claim-1")
        dying.dies_at = "result-1"
        with pytest.raises(KeyboardInterrupt):
            dying.finish_attempt("run", "call-1", result="result-1")
    with SqliteLedger(path) as after:
        assert after.get("claim-1") is None and after.get("call-1:started") is None
        assert after.get("result-1") is None
        held = after.get("call-1")
        assert held is not None and held.status is ReservationStatus.RESERVED


# -- keys and names ----------------------------------------------------------------------------

BAD_NAMES = [
    pytest.param("", id="empty"),
    pytest.param("x" * (MAX_NAME_LENGTH + 1), id="too-long"),
    pytest.param("call\x00id", id="nul"),
    pytest.param("call\nid", id="newline"),
    pytest.param("\t", id="tab"),
    pytest.param("call\x7f", id="del"),
    pytest.param("call\x85", id="c1-control"),
    pytest.param("call\ud800", id="lone-surrogate"),
]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_a_key_or_name_no_database_can_store_raises_invalid_ledger_key(
    ledger: Ledger, bad: str
) -> None:
    ledger.open_account("run", {"cost": 5})
    ledger.reserve("run", "ok", {"cost": 1})
    attempts: list[Callable[[], object]] = [
        lambda: ledger.reserve("run", bad, {"cost": 1}),
        lambda: ledger.reserve(bad, "k", {"cost": 1}),
        lambda: ledger.reserve("run", "k", {bad: 1}),
        lambda: ledger.settle(bad),
        lambda: ledger.release(bad),
        lambda: ledger.get(bad),
        lambda: ledger.balance(bad),
        lambda: ledger.open_account(bad, {}),
        lambda: ledger.open_account("child", {}, parent=bad),
        lambda: ledger.open_account("child", {bad: 1}),
        lambda: ledger.open_account("child", {}, owner={"tenant": bad}),
        lambda: ledger.open_account("child", {}, owner={bad: "acme"}),
        lambda: ledger.close_account(bad, "cancelled"),
        lambda: ledger.close_account("run", bad),
    ]
    for attempt in attempts:
        with pytest.raises(InvalidLedgerKey):
            attempt()
    assert issubclass(InvalidLedgerKey, ValueError)
    # Nothing was written by any of them.
    assert ledger.balance("run") == ledger.open_account("run", {"cost": 5})
    assert ledger.balance("run").held == {"cost": 1.0}
    assert ledger.balance("run").closed is None
    with pytest.raises(UnknownAccount):
        ledger.balance("child")


def test_a_key_of_the_longest_allowed_length_and_any_printable_text_is_stored(
    ledger: Ledger,
) -> None:
    ledger.open_account("run", {})
    for key in ("x" * MAX_NAME_LENGTH, "  spaced  ", "ünïcødé-ключ-键", "quote'\"%?;--"):
        assert ledger.reserve("run", key, {}).key == key
        assert ledger.reserve("run", key, {}).existing
        got = ledger.get(key)
        assert got is not None and got.key == key


# -- durability --------------------------------------------------------------------------------


def test_a_reservation_survives_reopening_the_ledger(backend: Backend) -> None:
    if backend.durable is None:
        pytest.skip("the in-memory ledger is not durable")
    with backend.durable() as first:
        first.open_account("tenant", {"tool_calls": 10})
        first.open_account("run", {"tool_calls": 5}, parent="tenant")
        first.reserve("run", "call-1", {"tool_calls": 2})
        first.reserve("run", "call-2", {"tool_calls": 1})
        first.settle("call-2", {"tool_calls": 1})
    with backend.durable() as second:
        again = second.reserve("run", "call-1", {"tool_calls": 2})
        assert again.existing
        assert again.amounts == {"tool_calls": 2.0}
        assert second.get("call-2") == Reservation(
            account="run",
            key="call-2",
            amounts={"tool_calls": 1.0},
            status=ReservationStatus.SETTLED,
        )
        assert second.balance("tenant").held == {"tool_calls": 3.0}
        second.open_account("run", {"tool_calls": 5}, parent="tenant")  # same terms: fine
        with pytest.raises(LedgerConflict):
            second.open_account("run", {"tool_calls": 6}, parent="tenant")


def test_a_closed_ledger_refuses_further_calls(backend: Backend) -> None:
    if backend.durable is None:
        pytest.skip("the in-memory ledger holds no connection")
    ledger = backend.durable()
    ledger.open_account("run", {})
    ledger.close()
    ledger.close()  # closing twice is harmless
    with pytest.raises(RuntimeError, match="closed"):
        ledger.open_account("run", {})
    with pytest.raises(RuntimeError, match="closed"):
        ledger.get("anything")


# -- concurrency -------------------------------------------------------------------------------


def test_concurrent_reserves_against_a_limit_of_n_let_exactly_n_through(
    backend: Backend, ledger: Ledger
) -> None:
    limit = 10
    ledger.open_account("run", {"tool_calls": limit})
    lanes: list[list[Job]] = [
        [("reserve", "run", f"lane{lane}-call{i}", {"tool_calls": 1}) for i in range(6)]
        for lane in range(LANES)
    ]
    outcomes = [outcome for lane in backend.race(lanes) for outcome in lane]
    assert outcomes.count("reserved") == limit
    assert outcomes.count("exhausted:run:tool_calls") == len(outcomes) - limit
    assert ledger.balance("run").held == {"tool_calls": float(limit)}


def test_concurrent_children_never_overdraw_their_parent(backend: Backend, ledger: Ledger) -> None:
    ledger.open_account("tenant", {"cost": 10})
    ledger.open_account("team", {}, parent="tenant")
    children = [f"run{lane}" for lane in range(LANES)]
    for child in children:
        ledger.open_account(child, {"cost": 4}, parent="team")
    lanes: list[list[Job]] = [
        [("reserve", child, f"{child}-call{i}", {"cost": 1}) for i in range(6)]
        for child in children
    ]
    results = backend.race(lanes)
    reserved = [lane.count("reserved") for lane in results]
    assert sum(reserved) == 10  # children could take 16 between them; the tenant has 10
    assert all(count <= 4 for count in reserved)
    assert ledger.balance("tenant").held == {"cost": 10.0}
    assert ledger.balance("team").held == {"cost": 10.0}
    for child, count in zip(children, reserved, strict=True):
        assert ledger.balance(child).held.get("cost", 0.0) == float(count)
    failures = {outcome for lane in results for outcome in lane if outcome != "reserved"}
    assert failures <= {"exhausted:tenant:cost"} | {f"exhausted:{c}:cost" for c in children}


def test_concurrent_reserves_of_one_key_charge_once(backend: Backend, ledger: Ledger) -> None:
    ledger.open_account("tenant", {"tool_calls": 100})
    ledger.open_account("run", {"tool_calls": 100}, parent="tenant")
    lanes: list[list[Job]] = [
        [("reserve", "run", f"call-{i}", {"tool_calls": 1}) for i in range(8)] for _ in range(LANES)
    ]
    results = backend.race(lanes)
    for i in range(8):
        column = [lane[i] for lane in results]
        assert column.count("reserved") == 1
        assert column.count("existing") == LANES - 1
    assert ledger.balance("run").held == {"tool_calls": 8.0}
    assert ledger.balance("tenant").held == {"tool_calls": 8.0}


def test_concurrent_settles_and_releases_of_one_key_refund_once(
    backend: Backend, ledger: Ledger
) -> None:
    ledger.open_account("tenant", {"cost": 100})
    ledger.open_account("run", {"cost": 100}, parent="tenant")
    for i in range(8):
        ledger.reserve("run", f"call-{i}", {"cost": 4})
    # half the lanes settle (actual 1 of 4), half release: each key gets exactly one outcome
    lanes: list[list[Job]] = [
        [
            ("settle", "run", f"call-{i}", {"cost": 1})
            if lane % 2
            else ("release", "run", f"call-{i}", None)
            for i in range(8)
        ]
        for lane in range(LANES)
    ]
    results = backend.race(lanes)
    expected_held = 0.0
    for i in range(8):
        column = [lane[i] for lane in results]
        assert column.count("existing") == LANES - 1
        outcome = next(o for o in column if o != "existing")
        stored = ledger.get(f"call-{i}")
        assert stored is not None
        assert stored.status.value == outcome
        expected_held += 1.0 if outcome == "settled" else 0.0
    for name in ("run", "tenant"):
        assert ledger.balance(name).held == {"cost": expected_held}


def test_no_reservation_starts_after_a_close_has_returned(backend: Backend, ledger: Ledger) -> None:
    # Reservers on their own connections race one close of their shared parent: a reserve that
    # began after close_account returned is refused, and the books hold exactly what was granted.
    ledger.open_account("tenant", {"tool_calls": 10_000})
    for lane in range(LANES):
        ledger.open_account(f"run-{lane}", {}, parent="tenant")
    closed_at: list[float] = []
    granted_after: list[str] = []
    granted = [0] * LANES
    start = threading.Barrier(LANES + 1)

    def reserver(lane: int) -> None:
        own = backend.open() if backend.durable is None else backend.durable()
        try:
            start.wait()
            for i in range(400):
                began = time.monotonic()
                try:
                    own.reserve(f"run-{lane}", f"lane{lane}-{i}", {"tool_calls": 1})
                except AccountClosed:
                    return
                granted[lane] += 1
                if closed_at and began > closed_at[0]:
                    granted_after.append(f"lane{lane}-{i}")
        finally:
            if isinstance(own, SqliteLedger | PostgresLedger):
                own.close()

    threads = [threading.Thread(target=reserver, args=(lane,)) for lane in range(LANES)]
    for thread in threads:
        thread.start()
    start.wait()
    until = time.monotonic() + 30
    while sum(granted) < LANES and time.monotonic() < until:  # close mid-stream, not before
        time.sleep(0.001)
    ledger.close_account("tenant", "cancelled")
    closed_at.append(time.monotonic())
    for thread in threads:
        thread.join(timeout=60)
    assert granted_after == []
    assert sum(granted) >= LANES
    assert ledger.balance("tenant").held.get("tool_calls", 0.0) == sum(granted)
    with pytest.raises(AccountClosed):
        ledger.reserve("run-0", "after", {"tool_calls": 1})


# -- async twins -------------------------------------------------------------------------------


async def test_async_twins_follow_the_same_rules(ledger: Ledger) -> None:
    await ledger.aopen_account("tenant", {"cost": 10})
    balance = await ledger.aopen_account("run", {"cost": 5}, parent="tenant")
    assert balance.parent == "tenant"
    with pytest.raises(LedgerConflict):
        await ledger.aopen_account("run", {"cost": 6}, parent="tenant")
    first = await ledger.areserve("run", "k1", {"cost": 3})
    assert not first.existing
    assert (await ledger.areserve("run", "k1", {"cost": 3})).existing
    with pytest.raises(BudgetExhausted) as caught:
        await ledger.areserve("run", "k2", {"cost": 3})
    assert caught.value.account == "run"
    settled = await ledger.asettle("k1", {"cost": 1})
    assert settled.amounts == {"cost": 1.0}
    await ledger.areserve("run", "k2", {"cost": 3})
    released = await ledger.arelease("k2")
    assert released.status is ReservationStatus.RELEASED
    assert await ledger.aget("k1") == stored(settled)
    assert await ledger.aget("missing") is None
    with pytest.raises(UnknownReservation):
        await ledger.asettle("missing")
    with pytest.raises(UnknownReservation):
        await ledger.arelease("missing")
    with pytest.raises(UnknownAccount):
        await ledger.areserve("nobody", "k3", {})
    assert ledger.balance("tenant").held == {"cost": 1.0}
    charged = await ledger.acharge("run", "k4", {"cost": 12})
    assert charged.exceeded == ("run", "cost")
    assert (await ledger.acharge("run", "k4", {"cost": 12})).existing
    with pytest.raises(UnknownAccount):
        await ledger.acharge("nobody", "k5", {})
    assert ledger.balance("tenant").held == {"cost": 13.0}


async def test_async_reserves_gathered_against_a_limit_of_n_let_exactly_n_through(
    ledger: Ledger,
) -> None:
    await ledger.aopen_account("run", {"tool_calls": 5})
    results = await asyncio.gather(
        *(ledger.areserve("run", f"call-{i}", {"tool_calls": 1}) for i in range(12)),
        return_exceptions=True,
    )
    assert sum(isinstance(r, Reservation) for r in results) == 5
    assert sum(isinstance(r, BudgetExhausted) for r in results) == 7
    assert ledger.balance("run").held == {"tool_calls": 5.0}


# -- remembered approvals: scopes per tenant, beside the ledger ----------------------------------


def _scope(
    scope_id: str = "scope-1",
    *,
    tenant: str = "acme",
    tool: str = "send_refund",
    kind: str = "tool",
    fingerprint: str | None = None,
    until: datetime | None = None,
    at: datetime = datetime(2026, 1, 1, tzinfo=UTC),
) -> ApprovalScope:
    return ApprovalScope(
        scope_id=scope_id,
        tenant_id=tenant,
        tool_name=tool,
        kind=kind,  # type: ignore[arg-type]
        fingerprint=fingerprint,
        until=until,
        created_at=at,
        created_by="lead-1",
        answered_by="human",
        run_id="run-1",
        call_id="call-1",
    )


def test_a_remembered_scope_is_stored_once_by_id_and_listed_for_its_tenant(ledger: Ledger) -> None:
    assert isinstance(ledger, ScopeStore)
    first = ledger.remember_scope(_scope())
    again = ledger.remember_scope(_scope(tool="other_tool"))  # a replay: the first one stays
    assert again == first
    assert ledger.approval_scopes("acme") == [first]
    assert ledger.approval_scopes("acme", tool_name="send_refund") == [first]
    assert ledger.approval_scopes("acme", tool_name="other_tool") == []


def test_a_scope_is_never_seen_nor_revoked_from_another_tenant(ledger: Ledger) -> None:
    assert isinstance(ledger, ScopeStore)
    scope = ledger.remember_scope(_scope())
    assert ledger.approval_scopes("globex") == []
    assert (
        ledger.revoke_scope("globex", scope.scope_id, at=datetime(2026, 1, 2, tzinfo=UTC)) is None
    )
    assert ledger.approval_scopes("acme") == [scope]
    assert not scope.matches("globex", "send_refund", "f" * 64, datetime(2026, 1, 2, tzinfo=UTC))
    assert (
        matching_scope(
            ledger.approval_scopes("acme"), "globex", "send_refund", "f" * 64, scope.created_at
        )
        is None
    )


def test_a_revoked_scope_approves_nothing_and_keeps_its_first_revocation(ledger: Ledger) -> None:
    assert isinstance(ledger, ScopeStore)
    scope = ledger.remember_scope(_scope())
    when = datetime(2026, 1, 2, tzinfo=UTC)
    revoked = ledger.revoke_scope("acme", scope.scope_id, at=when)
    assert revoked is not None and revoked.revoked_at == when
    later = ledger.revoke_scope("acme", scope.scope_id, at=when + timedelta(days=1))
    assert later is not None and later.revoked_at == when
    assert ledger.approval_scopes("acme") == []
    assert ledger.approval_scopes("acme", include_revoked=True) == [revoked]
    assert not revoked.matches("acme", "send_refund", "f" * 64, when)


def test_a_scope_until_an_instant_stops_approving_at_it(ledger: Ledger) -> None:
    assert isinstance(ledger, ScopeStore)
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    until = clock.now() + timedelta(hours=1)
    ledger.remember_scope(_scope(until=until, at=clock.now()))
    stored_scopes = ledger.approval_scopes("acme")
    assert matching_scope(stored_scopes, "acme", "send_refund", "f" * 64, clock.now()) is not None
    clock.advance(3600)
    assert matching_scope(stored_scopes, "acme", "send_refund", "f" * 64, clock.now()) is None


def test_an_arguments_scope_matches_only_the_same_canonical_arguments(ledger: Ledger) -> None:
    assert isinstance(ledger, ScopeStore)
    same = proposal_fingerprint("send_refund", {"order_id": "A-1", "amount": 5})
    reordered = proposal_fingerprint("send_refund", {"amount": 5, "order_id": "A-1"})
    other = proposal_fingerprint("send_refund", {"order_id": "A-2", "amount": 5})
    ledger.remember_scope(_scope(kind="arguments", fingerprint=same))
    scopes = ledger.approval_scopes("acme")
    now = datetime(2026, 1, 1, 1, tzinfo=UTC)
    assert matching_scope(scopes, "acme", "send_refund", reordered, now) is not None
    assert matching_scope(scopes, "acme", "send_refund", other, now) is None


def test_scopes_survive_a_new_instance_of_a_durable_ledger(backend: Backend) -> None:
    if backend.durable is None:
        pytest.skip("an in-memory ledger is not durable")
    first = backend.durable()
    backend.opened.append(first)
    scope = first.remember_scope(_scope())
    second = backend.durable()
    backend.opened.append(second)
    assert second.approval_scopes("acme") == [scope]


def test_the_async_twins_of_the_scope_store_agree_with_the_sync_ones(ledger: Ledger) -> None:
    assert isinstance(ledger, ScopeStore)

    async def go() -> None:
        scope = await ledger.aremember_scope(_scope())
        assert await ledger.aapproval_scopes("acme") == [scope]
        revoked = await ledger.arevoke_scope("acme", scope.scope_id, at=scope.created_at)
        assert revoked is not None and revoked.revoked_at == scope.created_at
        assert await ledger.aapproval_scopes("acme") == []

    asyncio.run(go())


# -- spend windows -----------------------------------------------------------------------------

# 23:30 in Berlin (UTC+1 in winter): half an hour before its day ends, the UTC day goes on.
LATE_IN_BERLIN = datetime(2026, 1, 1, 22, 30, tzinfo=UTC)


@pytest.fixture
def clocked(backend: Backend, request: pytest.FixtureRequest) -> Iterator[tuple[Ledger, FakeClock]]:
    """The backend's ledger on a clock the test moves (what spend windows count time by)."""
    clock = FakeClock(LATE_IN_BERLIN)
    made: Ledger
    if backend.name == "memory":
        made = InMemoryLedger(clock=clock)
    elif backend.name == "sqlite":
        made = SqliteLedger(request.getfixturevalue("tmp_path") / "clocked.db", clock=clock)
    else:
        made = PostgresLedger(request.getfixturevalue("postgres_schema"), clock=clock)
    backend.opened.append(made)
    yield made, clock


def _daily(axis: str = "tokens", limit: float = 1000, tz: str = "Europe/Berlin") -> Window:
    return Window(axis=axis, limit=limit, period="day", tz=tz)


def test_a_window_refuses_what_would_cross_it_naming_account_axis_and_window(
    clocked: tuple[Ledger, FakeClock],
) -> None:
    ledger, _ = clocked
    ledger.open_account("tenant", {}, windows=[_daily()])
    ledger.open_account("run", {"tokens": 5000}, parent="tenant")
    ledger.reserve("run", "a", {"tokens": 600})
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("run", "b", {"tokens": 500})
    error = caught.value
    assert (error.account, error.axis, error.limit, error.requested) == (
        "tenant",
        BudgetAxis.TOKENS,
        1000.0,
        500.0,
    )
    assert error.reason is TerminationReason.STEP_BUDGET_EXHAUSTED
    assert error.window == "tokens per day (Europe/Berlin)"
    assert error.resets_at == datetime(2026, 1, 1, 23, 0, tzinfo=UTC)  # Berlin's midnight
    assert error.busy is True  # "a" is in flight: settling it small may make the room
    ledger.settle("a", {"tokens": 600})
    with pytest.raises(BudgetExhausted) as spent_out:
        ledger.reserve("run", "b", {"tokens": 500})
    assert spent_out.value.busy is False
    assert ledger.reserve("run", "c", {"tokens": 400}).status is ReservationStatus.RESERVED
    assert ledger.balance("run").held == {"tokens": 1000.0}


def test_a_window_that_resets_frees_its_headroom(clocked: tuple[Ledger, FakeClock]) -> None:
    ledger, clock = clocked
    ledger.open_account("tenant", {}, windows=[_daily()])
    ledger.reserve("tenant", "a", {"tokens": 1000})
    ledger.settle("a")
    with pytest.raises(BudgetExhausted):
        ledger.reserve("tenant", "b", {"tokens": 1})
    clock.advance(29 * 60)  # 23:59 in Berlin: the same day
    with pytest.raises(BudgetExhausted):
        ledger.reserve("tenant", "b", {"tokens": 1})
    clock.advance(2 * 60)  # 00:01 in Berlin, still 23:01 in UTC
    assert ledger.reserve("tenant", "b", {"tokens": 1000}).status is ReservationStatus.RESERVED
    (use,) = ledger.balance("tenant").windows
    assert use.held == 1000.0
    assert use.resets_at == datetime(2026, 1, 2, 23, 0, tzinfo=UTC)
    assert ledger.balance("tenant").held == {"tokens": 2000.0}  # the account's books run on


def test_a_month_window_resets_on_the_first_in_its_time_zone(
    clocked: tuple[Ledger, FakeClock],
) -> None:
    ledger, clock = clocked
    ledger.open_account("tenant", {}, windows=[Window(axis="cost", limit=5, period="month")])
    ledger.reserve("tenant", "a", {"cost": 5})
    clock.advance(24 * 3600)  # 2 January
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("tenant", "b", {"cost": 1})
    assert caught.value.resets_at == datetime(2026, 2, 1, tzinfo=UTC)
    clock.advance(31 * 24 * 3600)  # 2 February
    assert ledger.reserve("tenant", "b", {"cost": 5}).status is ReservationStatus.RESERVED


def test_a_rolling_window_frees_usage_once_it_has_aged_out_never_before(
    clocked: tuple[Ledger, FakeClock],
) -> None:
    ledger, clock = clocked
    hour = Window(axis="tool_calls", limit=2, period=timedelta(hours=1))
    ledger.open_account("tenant", {}, windows=[hour])
    ledger.reserve("tenant", "a", {"tool_calls": 2})
    clock.advance(3599)
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("tenant", "b", {"tool_calls": 1})
    assert caught.value.window == "tool_calls per rolling 1:00:00"
    step = 3600 / ROLLING_STEPS
    # Usage leaves in whole steps: by an hour and one step after it was made, never before.
    freed_at = None
    for second in range(3600, 3600 + int(step) + 2):
        clock.advance(1)
        try:
            ledger.reserve("tenant", f"b{second}", {"tool_calls": 2})
        except BudgetExhausted as error:
            assert error.resets_at is not None and error.resets_at > clock.now()
            continue
        freed_at = second
        break
    assert freed_at is not None and 3600 < freed_at <= 3600 + step + 1


def test_settling_after_a_reset_gives_back_in_the_window_of_the_reservation(
    clocked: tuple[Ledger, FakeClock],
) -> None:
    ledger, clock = clocked
    ledger.open_account("tenant", {}, windows=[_daily()])
    ledger.reserve("tenant", "yesterday", {"tokens": 800})
    clock.advance(3600)  # the next day in Berlin
    ledger.reserve("tenant", "today", {"tokens": 900})
    ledger.settle("yesterday", {"tokens": 100})  # 700 back, to yesterday: today gains nothing
    with pytest.raises(BudgetExhausted):
        ledger.reserve("tenant", "more", {"tokens": 101})
    ledger.release("today")
    assert ledger.balance("tenant").windows[0].held == 0.0
    assert ledger.reserve("tenant", "more", {"tokens": 1000}).status is ReservationStatus.RESERVED


def test_usage_charged_past_a_window_is_recorded_and_refuses_the_next_reservation(
    clocked: tuple[Ledger, FakeClock],
) -> None:
    ledger, _ = clocked
    ledger.open_account("tenant", {}, windows=[_daily()])
    ledger.open_account("run", {}, parent="tenant")
    ledger.reserve("run", "step-1", {"tokens": 900})
    ledger.settle("step-1")
    ledger.charge("run", "step-1-over", {"tokens": 300})
    assert ledger.balance("tenant").windows[0].held == 1200.0
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("run", "step-2", {"tokens": 1})
    assert (caught.value.account, caught.value.busy) == ("tenant", False)


def test_usage_charged_for_a_reservation_counts_in_that_reservations_window(
    clocked: tuple[Ledger, FakeClock],
) -> None:
    ledger, clock = clocked
    ledger.open_account("tenant", {}, windows=[_daily()])
    ledger.reserve("tenant", "step-1", {"tokens": 100})
    clock.advance(3600)  # the reply comes back the next day in Berlin
    ledger.settle("step-1")
    ledger.charge("tenant", "step-1-over", {"tokens": 400}, of="step-1")
    assert ledger.balance("tenant").windows[0].held == 0.0  # all of it yesterday's
    ledger.charge("tenant", "unattached", {"tokens": 300})
    assert ledger.balance("tenant").windows[0].held == 300.0  # counted when it was charged
    assert ledger.balance("tenant").held == {"tokens": 800.0}


def test_every_window_of_the_chain_is_checked_nearest_first(
    clocked: tuple[Ledger, FakeClock],
) -> None:
    ledger, _ = clocked
    ledger.open_account("tenant", {"tokens": 10_000}, windows=[_daily(limit=500)])
    ledger.open_account(
        "team",
        {},
        parent="tenant",
        windows=[_daily(limit=800, tz="UTC"), _daily(axis="steps", limit=3)],
    )
    ledger.open_account("run", {}, parent="team")
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("run", "a", {"steps": 1, "tokens": 900})
    assert (caught.value.account, caught.value.window) == ("team", "tokens per day (UTC)")
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("run", "a", {"steps": 1, "tokens": 600})
    assert (caught.value.account, caught.value.window) == (
        "tenant",
        "tokens per day (Europe/Berlin)",
    )
    ledger.reserve("run", "a", {"steps": 3, "tokens": 100})
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("run", "b", {"steps": 1})
    assert caught.value.window == "steps per day (Europe/Berlin)"
    assert ledger.get("b") is None  # nothing of a refused reservation is kept


def test_a_step_and_its_calls_written_together_check_and_count_every_window_of_the_chain(
    clocked: tuple[Ledger, FakeClock],
) -> None:
    ledger, _ = clocked
    ledger.open_account("tenant", {}, windows=[_daily(limit=500)])
    ledger.open_account("run", {"tokens": 10_000}, parent="tenant")
    ledger.reserve("run", "step-1", {"tokens": 300})
    # Settled at 100 (200 back in the tenant's window), then its calls held: the second
    # crosses the window as the settlement and the first hold left it.
    _, held = ledger.settle_and_reserve(
        "step-1", {"tokens": 100}, "run", [("call-1", {"tokens": 350}), ("call-2", {"tokens": 100})]
    )
    assert isinstance(held[0], Reservation)
    assert isinstance(held[1], BudgetExhausted)
    assert (held[1].account, held[1].window) == ("tenant", "tokens per day (Europe/Berlin)")
    assert ledger.balance("tenant").windows[0].held == 450.0
    found, begun = ledger.start_attempt(
        "run", "call-1", "call-1:started", claim="claim-1", begins=lambda _: True
    )
    assert found is not None and begun is not None and begun.claimed
    assert ledger.balance("tenant").windows[0].held == 450.0  # markers hold nothing
    ledger.finish_attempt("run", "call-1", result="result-1", actual={"tokens": 50})
    assert ledger.balance("tenant").windows[0].held == 150.0  # 300 back, in the same window


def test_an_account_reopened_with_other_windows_raises_ledger_conflict(
    clocked: tuple[Ledger, FakeClock],
) -> None:
    ledger, _ = clocked
    opened = ledger.open_account("tenant", {"tokens": 10}, windows=[_daily()])
    assert [use.window for use in opened.windows] == [_daily()]
    again = ledger.open_account("tenant", {"tokens": 10}, windows=[_daily()])
    assert [use.window for use in again.windows] == [_daily()]
    with pytest.raises(LedgerConflict):
        ledger.open_account("tenant", {"tokens": 10})
    with pytest.raises(LedgerConflict):
        ledger.open_account("tenant", {"tokens": 10}, windows=[_daily(limit=999)])


def test_a_window_left_reports_in_the_balance_and_bounds_remaining(
    clocked: tuple[Ledger, FakeClock],
) -> None:
    ledger, _ = clocked
    ledger.open_account("tenant", {"tokens": 5000}, windows=[_daily()])
    held = ledger.reserve("tenant", "a", {"tokens": 300})
    assert held.balance is not None
    assert held.balance.remaining("tokens") == 700.0
    assert ledger.balance("tenant").remaining("tokens") == 700.0


def test_concurrent_reserves_against_a_window_of_n_let_exactly_n_through(
    backend: Backend, ledger: Ledger
) -> None:
    limit = 10  # a day-long rolling window: no reset can fall inside the race
    ledger.open_account(
        "tenant", {}, windows=[Window(axis="tokens", limit=limit, period=timedelta(days=1))]
    )
    for lane in range(LANES):
        ledger.open_account(f"run{lane}", {}, parent="tenant")
    lanes: list[list[Job]] = [
        [("reserve", f"run{lane}", f"lane{lane}-call{i}", {"tokens": 1}) for i in range(6)]
        for lane in range(LANES)
    ]
    outcomes = [outcome for lane in backend.race(lanes) for outcome in lane]
    assert outcomes.count("reserved") == limit
    assert outcomes.count("exhausted:tenant:tokens") == len(outcomes) - limit
    assert ledger.balance("tenant").windows[0].held == float(limit)


@pytest.mark.parametrize(
    ("terms", "field"),
    [
        ({"period": "week"}, "period"),
        ({"period": timedelta(0)}, "period"),
        ({"tz": "Mars/Olympus"}, "tz"),
        ({"limit": -1}, "limit"),
    ],
)
def test_a_bad_window_is_refused_when_it_is_built_naming_the_field(
    terms: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        Window.model_validate({"axis": "tokens", "limit": 10, "period": "day", **terms})
    assert {str(error["loc"][0]) for error in caught.value.errors()} == {field}
