"""InMemoryLedger: atomic across the parent chain, idempotent by key, refunds only what is due."""

from __future__ import annotations

import math
import sys
import threading
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencepost.policy import (
    AccountClosed,
    BudgetAxis,
    BudgetExhausted,
    InMemoryLedger,
    LedgerConflict,
    ReservationStatus,
    TerminationReason,
    UnknownAccount,
    UnknownReservation,
)
from fencepost.policy.ledger import InvalidLedgerKey


@pytest.fixture
def ledger() -> Iterator[InMemoryLedger]:
    yield InMemoryLedger()


def test_a_parent_of_100_cannot_fund_three_children_of_60(ledger: InMemoryLedger) -> None:
    ledger.open_account("tenant", {"tool_calls": 100})
    for child in ("run-a", "run-b", "run-c"):
        ledger.open_account(child, {"tool_calls": 60}, parent="tenant")
    ledger.reserve("run-a", "key-a", {"tool_calls": 40})
    ledger.reserve("run-b", "key-b", {"tool_calls": 40})

    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("run-c", "key-c", {"tool_calls": 40})

    exc = caught.value
    assert exc.axis is BudgetAxis.TOOL_CALLS
    assert exc.account == "tenant"
    assert exc.reason is TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert (exc.limit, exc.requested) == (100, 40)
    assert "tool_calls" in str(exc) and "'tenant'" in str(exc)
    # The refused reservation held nothing anywhere in the chain.
    assert ledger.get("key-c") is None
    assert ledger.balance("run-c").held.get("tool_calls", 0) == 0
    assert ledger.balance("tenant").remaining("tool_calls") == 20


def test_the_child_limit_applies_before_the_parent_is_touched(ledger: InMemoryLedger) -> None:
    ledger.open_account("tenant", {"steps": 100})
    ledger.open_account("run-a", {"steps": 5}, parent="tenant")
    with pytest.raises(BudgetExhausted) as caught:
        ledger.reserve("run-a", "k1", {"steps": 6})
    assert caught.value.account == "run-a"
    assert caught.value.axis is BudgetAxis.STEPS
    assert ledger.balance("tenant").held == {}


def test_reserve_is_idempotent_by_key(ledger: InMemoryLedger) -> None:
    ledger.open_account("run-a", {"tool_calls": 3})
    first = ledger.reserve("run-a", "call-0001", {"tool_calls": 1})
    second = ledger.reserve("run-a", "call-0001", {"tool_calls": 1})
    assert first.existing is False
    assert second.existing is True
    assert second.amounts == first.amounts
    assert ledger.balance("run-a").held == {"tool_calls": 1}


def test_a_key_cannot_be_reused_by_another_account(ledger: InMemoryLedger) -> None:
    ledger.open_account("run-a", {"tool_calls": 3})
    ledger.open_account("run-b", {"tool_calls": 3})
    ledger.reserve("run-a", "call-0001", {"tool_calls": 1})
    with pytest.raises(LedgerConflict):
        ledger.reserve("run-b", "call-0001", {"tool_calls": 1})
    assert ledger.balance("run-b").held == {}


def test_settle_refunds_only_the_excess(ledger: InMemoryLedger) -> None:
    ledger.open_account("tenant", {"tokens": 1000, "cost": 10})
    ledger.open_account("run-a", {"tokens": 500}, parent="tenant")
    ledger.reserve("run-a", "step-1", {"tokens": 400, "cost": 4})
    settled = ledger.settle("step-1", {"tokens": 150, "cost": 4})
    assert settled.status is ReservationStatus.SETTLED
    assert settled.amounts == {"tokens": 150, "cost": 4}
    assert ledger.balance("run-a").held == {"tokens": 150, "cost": 4}
    assert ledger.balance("tenant").held == {"tokens": 150, "cost": 4}
    assert ledger.balance("tenant").remaining("tokens") == 850


def test_settle_without_actuals_keeps_the_whole_charge(ledger: InMemoryLedger) -> None:
    ledger.open_account("run-a", {"tool_calls": 3})
    ledger.reserve("run-a", "call-0001", {"tool_calls": 1})
    ledger.settle("call-0001")
    assert ledger.balance("run-a").held == {"tool_calls": 1}


def test_settle_never_charges_more_than_was_reserved(ledger: InMemoryLedger) -> None:
    ledger.open_account("run-a", {"tokens": 100})
    ledger.reserve("run-a", "step-1", {"tokens": 10})
    ledger.settle("step-1", {"tokens": 500})
    assert ledger.balance("run-a").held == {"tokens": 10}


def test_settle_twice_refunds_once(ledger: InMemoryLedger) -> None:
    ledger.open_account("run-a", {"tokens": 100})
    ledger.reserve("run-a", "step-1", {"tokens": 50})
    ledger.settle("step-1", {"tokens": 20})
    again = ledger.settle("step-1", {"tokens": 0})
    assert again.existing is True
    assert ledger.balance("run-a").held == {"tokens": 20}


def test_release_refunds_fully_through_the_chain(ledger: InMemoryLedger) -> None:
    ledger.open_account("tenant", {"tool_calls": 10})
    ledger.open_account("run-a", {"tool_calls": 5}, parent="tenant")
    ledger.reserve("run-a", "call-0001", {"tool_calls": 5})
    released = ledger.release("call-0001")
    assert released.status is ReservationStatus.RELEASED
    assert ledger.balance("run-a").remaining("tool_calls") == 5
    assert ledger.balance("tenant").remaining("tool_calls") == 10
    # Released twice, refunded once.
    assert ledger.release("call-0001").existing is True
    assert ledger.balance("tenant").remaining("tool_calls") == 10


def test_a_reservation_keyed_again_after_release_is_still_known(ledger: InMemoryLedger) -> None:
    # The key records that an attempt started: a re-run never gets a fresh, free reservation.
    ledger.open_account("run-a", {"tool_calls": 5})
    ledger.reserve("run-a", "call-0001", {"tool_calls": 1})
    ledger.release("call-0001")
    again = ledger.reserve("run-a", "call-0001", {"tool_calls": 1})
    assert again.existing is True
    assert again.status is ReservationStatus.RELEASED


def test_release_after_settle_refunds_nothing(ledger: InMemoryLedger) -> None:
    ledger.open_account("run-a", {"tool_calls": 5})
    ledger.reserve("run-a", "call-0001", {"tool_calls": 1})
    ledger.settle("call-0001")
    assert ledger.release("call-0001").status is ReservationStatus.SETTLED
    assert ledger.balance("run-a").held == {"tool_calls": 1}


def test_unknown_keys_and_accounts_are_typed_errors(ledger: InMemoryLedger) -> None:
    with pytest.raises(UnknownReservation):
        ledger.settle("nope")
    with pytest.raises(UnknownReservation):
        ledger.release("nope")
    with pytest.raises(UnknownAccount):
        ledger.reserve("nope", "k", {"tool_calls": 1})
    with pytest.raises(UnknownAccount):
        ledger.open_account("child", {"tool_calls": 1}, parent="nope")
    with pytest.raises(UnknownAccount):
        ledger.balance("nope")
    assert ledger.get("nope") is None


def test_open_account_is_idempotent_on_the_same_terms_only(ledger: InMemoryLedger) -> None:
    ledger.open_account("tenant", {"tool_calls": 10})
    ledger.open_account("tenant", {"tool_calls": 10})
    with pytest.raises(LedgerConflict):
        ledger.open_account("tenant", {"tool_calls": 11})


@pytest.mark.parametrize("amount", [-1, math.nan])
def test_negative_or_nan_amounts_are_rejected(ledger: InMemoryLedger, amount: float) -> None:
    ledger.open_account("run-a", {"tool_calls": 10})
    with pytest.raises(ValueError):
        ledger.reserve("run-a", "k", {"tool_calls": amount})
    with pytest.raises(ValueError):
        ledger.open_account("run-b", {"tool_calls": amount})


def test_an_axis_the_account_does_not_limit_is_unlimited(ledger: InMemoryLedger) -> None:
    ledger.open_account("run-a", {"tool_calls": 1})
    ledger.reserve("run-a", "k", {"tokens": 10**9})
    assert ledger.balance("run-a").remaining("tokens") is None


@pytest.fixture
def frequent_thread_switches() -> Iterator[None]:
    # Switch threads every microsecond so an unguarded check-then-add would interleave.
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


def _race(ledger: InMemoryLedger, threads_n: int, keys_per_thread: int) -> list[str]:
    """Start ``threads_n`` threads at once, each reserving one tool call per key; the grants."""
    granted: list[str] = []
    barrier = threading.Barrier(threads_n)

    def worker(n: int) -> None:
        barrier.wait()
        for i in range(keys_per_thread):
            try:
                ledger.reserve("run-a" if n % 2 else "run-b", f"w{n}-{i}", {"tool_calls": 1})
            except BudgetExhausted:
                continue
            granted.append(f"w{n}-{i}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return granted


@pytest.mark.usefixtures("frequent_thread_switches")
def test_concurrent_reserves_never_exceed_the_limit() -> None:
    # Many small races at the boundary, where a check-then-add without the lock would overdraw.
    for limit in [1, 2, 3, 5, 8] * 30:
        ledger = InMemoryLedger()
        ledger.open_account("tenant", {"tool_calls": limit})
        ledger.open_account("run-a", {"tool_calls": 1000}, parent="tenant")
        ledger.open_account("run-b", {"tool_calls": 1000}, parent="tenant")
        granted = _race(ledger, threads_n=8, keys_per_thread=2)
        assert len(granted) == limit
        assert ledger.balance("tenant").held == {"tool_calls": limit}
        children = (ledger.balance(name).held.get("tool_calls", 0) for name in ("run-a", "run-b"))
        assert sum(children) == limit


def _reserve_same_key(
    ledger: InMemoryLedger, barrier: threading.Barrier, fresh: list[bool]
) -> None:
    barrier.wait()
    fresh.append(not ledger.reserve("run-a", "call-0001", {"tool_calls": 1}).existing)


@pytest.mark.usefixtures("frequent_thread_switches")
def test_concurrent_reserves_of_one_key_charge_once() -> None:
    for _ in range(50):
        ledger = InMemoryLedger()
        ledger.open_account("run-a", {"tool_calls": 100})
        barrier = threading.Barrier(8)
        fresh: list[bool] = []
        threads = [
            threading.Thread(target=_reserve_same_key, args=(ledger, barrier, fresh))
            for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert fresh.count(True) == 1
        assert ledger.balance("run-a").held == {"tool_calls": 1}


async def test_async_twins_share_the_same_books(ledger: InMemoryLedger) -> None:
    await ledger.aopen_account("run-a", {"tool_calls": 1})
    await ledger.areserve("run-a", "k1", {"tool_calls": 1})
    assert (await ledger.aget("k1")) is not None
    with pytest.raises(BudgetExhausted):
        await ledger.areserve("run-a", "k2", {"tool_calls": 1})
    await ledger.arelease("k1")
    await ledger.areserve("run-a", "k2", {"tool_calls": 1})
    settled = await ledger.asettle("k2")
    assert settled.status is ReservationStatus.SETTLED
    assert (await ledger.abalance("run-a")).held == {"tool_calls": 1}
    assert (await ledger.aclose_account("run-a", "completed")).closed == "completed"
    with pytest.raises(AccountClosed):
        await ledger.areserve("run-a", "k3", {})


# Property: any sequence of operations keeps within every limit; closed accounts take nothing new

ACCOUNTS = ("tenant", "run-a", "run-b", "run-c")
PARENT = {"tenant": None, "run-a": "tenant", "run-b": "tenant", "run-c": "run-a"}
AXES = ("tool_calls", "cost")
# Quarters are exact in binary floating point, so sums are compared without slack.
quarters = st.integers(min_value=0, max_value=40).map(lambda q: q / 4)
op = st.one_of(
    st.tuples(
        st.just("reserve"),
        st.sampled_from(ACCOUNTS[1:]),
        st.integers(min_value=0, max_value=11),
        st.dictionaries(st.sampled_from(AXES), quarters),  # {} is an attempt marker
    ),
    st.tuples(
        st.just("settle"),
        st.just(""),
        st.integers(min_value=0, max_value=11),
        st.none() | st.dictionaries(st.sampled_from(AXES), quarters),
    ),
    st.tuples(st.just("release"), st.just(""), st.integers(min_value=0, max_value=11), st.none()),
    st.tuples(
        st.just("close"),
        st.sampled_from(ACCOUNTS),
        st.just(0),
        st.sampled_from(["cancelled", "completed"]),
    ),
)


def _chain(account: str) -> list[str]:
    out = []
    current: str | None = account
    while current is not None:
        out.append(current)
        current = PARENT[current]
    return out


@settings(max_examples=150, deadline=None)
@given(
    limits=st.fixed_dictionaries(
        {account: st.dictionaries(st.sampled_from(AXES), quarters) for account in ACCOUNTS}
    ),
    ops=st.lists(op, max_size=40),
)
def test_books_never_exceed_a_limit_and_closed_accounts_take_nothing_new_over_any_sequence(
    limits: dict[str, dict[str, float]], ops: list[tuple[str, str, int, Any]]
) -> None:
    ledger = InMemoryLedger()
    for account in ACCOUNTS:
        ledger.open_account(account, limits[account], parent=PARENT[account])
    # Reference model: key -> (account, amounts still charged, status); account -> close reason.
    books: dict[str, tuple[str, dict[str, float], ReservationStatus]] = {}
    closed: dict[str, str] = {}

    for kind, account, n, amounts in ops:
        key = f"key-{n}"
        entry = books.get(key)
        if kind == "close":
            assert ledger.close_account(account, amounts).closed == closed.setdefault(
                account, amounts
            )
            continue
        if kind == "reserve":
            nearest_closed = next((name for name in _chain(account) if name in closed), None)
            try:
                reservation = ledger.reserve(account, key, amounts)
            except BudgetExhausted as exc:
                assert entry is None and nearest_closed is None
                assert exc.account in _chain(account)
            except AccountClosed as exc:
                assert entry is None
                assert (exc.account, exc.reason) == (nearest_closed, closed.get(exc.account))
            except LedgerConflict:
                assert entry is not None and entry[0] != account
            else:
                assert reservation.existing is (entry is not None)
                assert reservation.balance == ledger.balance(account)
                if entry is None:
                    assert nearest_closed is None
                    books[key] = (account, dict(amounts), ReservationStatus.RESERVED)
        elif entry is None:
            with pytest.raises(UnknownReservation):
                (ledger.settle if kind == "settle" else ledger.release)(key)
        elif entry[2] is not ReservationStatus.RESERVED:
            again = (ledger.settle if kind == "settle" else ledger.release)(key)
            assert again.existing and again.status is entry[2]
        elif kind == "settle":
            owner, held, _ = entry
            kept = {a: min(v, (amounts or {}).get(a, v)) for a, v in held.items()}
            assert ledger.settle(key, amounts).amounts == kept
            books[key] = (owner, kept, ReservationStatus.SETTLED)
        else:
            ledger.release(key)
            books[key] = (entry[0], {}, ReservationStatus.RELEASED)

        for name in ACCOUNTS:
            balance = ledger.balance(name)
            for axis in AXES:
                expected = sum(
                    amts.get(axis, 0.0)
                    for owner, amts, _ in books.values()
                    if name in _chain(owner)
                )
                assert balance.held.get(axis, 0.0) == expected
                left = balance.remaining(axis)
                if axis in limits[name]:
                    assert left is not None and left >= 0
                    assert expected <= limits[name][axis]


def test_forgetting_a_closed_account_drops_its_finished_reservations_and_keeps_its_books() -> None:
    ledger = InMemoryLedger()
    ledger.open_account("tenant", {"tool_calls": 10})
    ledger.open_account("run-a", {"tool_calls": 5}, parent="tenant")
    ledger.reserve("run-a", "done", {"tool_calls": 1})
    ledger.settle("done")
    ledger.reserve("run-a", "marker", {})
    ledger.reserve("run-a", "in-flight", {"tool_calls": 1})
    assert ledger.forget("run-a") == 0  # still open: nothing is forgotten
    ledger.close_account("run-a", "cancelled")
    before = (ledger.balance("run-a"), ledger.balance("tenant"))
    assert ledger.forget("run-a") == 2
    assert ledger.get("done") is None and ledger.get("marker") is None
    assert (ledger.balance("run-a"), ledger.balance("tenant")) == before
    # The call in flight when the account closed can still be settled.
    assert ledger.settle("in-flight").status is ReservationStatus.SETTLED


def test_every_reservation_handed_out_is_a_copy_the_books_never_share(
    ledger: InMemoryLedger,
) -> None:
    ledger.open_account("run", {"tool_calls": 3})
    first = ledger.reserve("run", "k1", {"tool_calls": 1})
    first.amounts["tool_calls"] = 0.0  # a caller scribbling on what it was given
    again = ledger.reserve("run", "k1", {"tool_calls": 1})
    assert again.existing and again.amounts == {"tool_calls": 1.0}
    settled = ledger.settle("k1")
    settled.amounts["tool_calls"] = 99.0
    stored = ledger.get("k1")
    assert stored is not None and stored.amounts == {"tool_calls": 1.0}
    assert stored.status is ReservationStatus.SETTLED
    assert ledger.balance("run").held == {"tool_calls": 1.0}
    assert ledger.release("k1").existing  # settled stays settled: nothing refunded twice
    assert ledger.balance("run").held == {"tool_calls": 1.0}


class _LooksLikeAnAccount:
    """Not a string, yet equal to (and hashing as) the name of an account that is open."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return other == self.name

    def __hash__(self) -> int:
        return hash(self.name)


def test_a_reservation_names_an_account_the_ledger_takes_even_once_one_is_open() -> None:
    # An open account's name is not validated again; anything else still is, before the books.
    from fencepost.policy.ledger import InvalidLedgerKey

    ledger = InMemoryLedger()
    ledger.open_account("run-1", {"tool_calls": 2})
    assert ledger.reserve("run-1", "k-1", {"tool_calls": 1}).balance is not None
    for bad in (_LooksLikeAnAccount("run-1"), "run-\x00", "", "r" * 513):
        with pytest.raises(InvalidLedgerKey):
            ledger.reserve(bad, "k-2", {"tool_calls": 1})  # type: ignore[arg-type]
    with pytest.raises(UnknownAccount):
        ledger.reserve("run-2", "k-2", {"tool_calls": 1})
    assert ledger.balance("run-1").held == {"tool_calls": 1.0}


# -- the name of an account that is open ---------------------------------------------------------


class _Str(str):
    def __str__(self) -> str:
        return "lie"


_INVALID = "run-\x00evil"


class _ClaimsEveryName(str):
    """A str that hashes as ``_INVALID`` and says it equals anything."""

    def __hash__(self) -> int:
        return hash(_INVALID)

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False


def test_an_invalid_account_name_is_refused_even_when_an_open_account_claims_to_equal_it() -> None:
    # An open account's name is not checked again, but "open" is never judged by a lookup a
    # str subclass some tenant opened can answer for another text: a name with a control
    # character is refused, never booked as a reservation's account.
    ledger = InMemoryLedger()
    ledger.open_account(_ClaimsEveryName("run-1"), {"tool_calls": 5})
    with pytest.raises(InvalidLedgerKey):
        ledger.reserve(_INVALID, "k-1", {"tool_calls": 1})


def test_an_open_accounts_name_still_reserves_and_a_str_subclass_of_it_is_checked() -> None:
    ledger = InMemoryLedger()
    ledger.open_account("run-1", {"tool_calls": 3})
    assert ledger.reserve("run-1", "k-1", {"tool_calls": 1}).account == "run-1"
    assert ledger.reserve(_Str("run-1"), "k-2", {"tool_calls": 1}).account == "run-1"
    assert ledger.balance("run-1").held == {"tool_calls": 2.0}


def test_reservations_on_open_accounts_from_many_threads_are_each_booked_once() -> None:
    ledger = InMemoryLedger()
    for n in range(4):
        ledger.open_account(f"run-{n}", {"tool_calls": 10_000})
    barrier = threading.Barrier(8)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(500):
            ledger.reserve(f"run-{i % 4}", f"k-{i}", {"tool_calls": 1})  # same keys: idempotent
            ledger.reserve(f"run-{i % 4}", f"t{t}-{i}", {"tool_calls": 1})

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    held = sum(ledger.balance(f"run-{n}").held["tool_calls"] for n in range(4))
    assert held == 500 + 8 * 500


# -- the key of a stored reservation --------------------------------------------------------------


def test_an_invalid_key_is_refused_even_when_a_stored_key_claims_to_equal_it() -> None:
    # A stored key is not checked again when settled, released or read; "stored" is never judged
    # by a lookup a str subclass some tenant reserved under can answer for another text.
    ledger = InMemoryLedger()
    ledger.open_account("run-1", {"tool_calls": 5})
    ledger.reserve("run-1", _ClaimsEveryName("k-1"), {"tool_calls": 1})
    for read in (ledger.settle, ledger.release, ledger.get):
        with pytest.raises(InvalidLedgerKey):
            read(_INVALID)
    with pytest.raises(InvalidLedgerKey):
        ledger.reserve("run-1", _INVALID, {"tool_calls": 1})
    with pytest.raises(InvalidLedgerKey):
        ledger.reserved("run-1", _INVALID)


def test_a_stored_key_settles_by_its_text_and_a_forgotten_one_is_checked_again() -> None:
    ledger = InMemoryLedger()
    ledger.open_account("run-1", {"tool_calls": 5})
    ledger.reserve("run-1", "k-1", {"tool_calls": 1})
    assert ledger.settle("k-1").status is ReservationStatus.SETTLED
    assert ledger.get(_Str("k-1")) is not None
    ledger.close_account("run-1", "completed")
    assert ledger.forget("run-1") == 1
    with pytest.raises(UnknownReservation):
        ledger.settle("k-1")


def test_an_attempts_claim_and_result_marker_are_booked_as_reserve_books_them() -> None:
    # begin_attempt and finish_attempt write their markers without assembling the answers they
    # drop: what they book, refuse and leave alone is what reserve does.
    ledger = InMemoryLedger()
    ledger.open_account("run-1", {"tool_calls": 5})
    ledger.open_account("run-2", {"tool_calls": 5})
    attempt = ledger.begin_attempt("run-1", "m-1", claim="c-1")
    assert attempt.claimed and attempt.started is not None and not attempt.started.existing
    assert ledger.begin_attempt("run-1", "m-1", claim="c-1").started.existing  # type: ignore[union-attr]
    assert ledger.begin_attempt("run-2", "m-2", claim="c-1").claimed is False
    assert ledger.get("m-2") is None
    with pytest.raises(InvalidLedgerKey):
        ledger.begin_attempt("run-1", "m-3", claim="c-\x00")
    ledger.reserve("run-1", "k-1", {"tool_calls": 1})
    settled = ledger.finish_attempt("run-1", "k-1", result="r-1")
    assert settled.status is ReservationStatus.SETTLED
    got = ledger.get("r-1")
    assert got is not None and got.account == "run-1" and got.amounts == {}
    ledger.reserve("run-2", "r-2", {})
    ledger.reserve("run-1", "k-2", {"tool_calls": 1})
    # A result marker another account holds is not written and stops nothing.
    assert ledger.finish_attempt("run-1", "k-2", result="r-2").status is ReservationStatus.SETTLED
    assert ledger.get("r-2").account == "run-2"  # type: ignore[union-attr]


def test_a_batch_held_at_once_refuses_only_the_holds_its_budget_cannot_cover(
    ledger: InMemoryLedger,
) -> None:
    ledger.open_account("run", {"tool_calls": 2})
    holds = [(f"call-{n}", {"tool_calls": 1.0}) for n in range(3)]
    held = ledger.reserve_batch("run", [holds[0], holds[1]])
    again = ledger.reserve_batch("run", holds)
    assert held.outcomes == (None, None)
    assert again.outcomes[:2] == (None, None)  # held before: idempotent by key
    assert isinstance(again.outcomes[2], BudgetExhausted)
    assert again.limits == {"tool_calls": 2.0} and again.held == {"tool_calls": 2.0}
    assert ledger.get("call-2") is None
    again.held["tool_calls"] = 0.0  # a copy: the books are not changed through it
    assert ledger.balance("run").held == {"tool_calls": 2.0}


def test_a_batch_its_owner_refuses_gives_back_what_it_held_and_holds_no_more(
    ledger: InMemoryLedger,
) -> None:
    ledger.open_account("run", {"tool_calls": 5}, owner={"tenant": "acme"})
    holds = [(f"call-{n}", {"tool_calls": 1.0}) for n in range(3)]
    seen: list[dict[str, str]] = []

    def refuses(owner: Any) -> str | None:
        seen.append(dict(owner))
        return "not yours"

    held = ledger.reserve_batch("run", holds, refuses=refuses)
    assert held.refused == "not yours" and held.limits is None
    assert seen == [{"tenant": "acme"}]  # asked once, with the owner the account records
    assert ledger.get("call-0").status is ReservationStatus.RELEASED  # given back
    assert ledger.get("call-1") is None and ledger.get("call-2") is None
    assert ledger.balance("run").held == {"tool_calls": 0.0}


def test_a_batch_stops_at_the_ledgers_refusal_and_keeps_what_it_held(
    ledger: InMemoryLedger,
) -> None:
    ledger.open_account("run", {"tool_calls": 5})
    ledger.open_account("other", {"tool_calls": 5})
    ledger.reserve("other", "taken", {"tool_calls": 1.0})
    held = ledger.reserve_batch(
        "run", [("mine", {"tool_calls": 1.0}), ("taken", {"tool_calls": 1.0})]
    )
    assert held.outcomes == (None,)
    assert isinstance(held.stopped_by, LedgerConflict)
    assert held.held == {"tool_calls": 1.0}
    ledger.close_account("run", "completed")
    closed = ledger.reserve_batch("run", [("late", {"tool_calls": 1.0})])
    assert isinstance(closed.stopped_by, AccountClosed) and closed.limits is None


def test_batches_from_many_threads_on_children_of_one_parent_hold_exactly_what_the_parent_has(
    ledger: InMemoryLedger,
) -> None:
    # Invariant 3 (with N calls left exactly N run) for batches held at once: threads of two
    # tenants' runs, each batch racing the others and the other child's, one parent's budget.
    ledger.open_account("tenant", {"tool_calls": 7})
    for child in ("run-a", "run-b"):
        ledger.open_account(child, {"tool_calls": 100}, parent="tenant")
    start = threading.Barrier(8)
    outcomes: list[BudgetExhausted | None] = []
    lock = threading.Lock()

    def batches(worker: int) -> None:
        child = "run-a" if worker % 2 else "run-b"
        start.wait()
        for n in range(3):
            holds = [(f"w{worker}-b{n}-c{c}", {"tool_calls": 1.0}) for c in range(2)]
            held = ledger.reserve_batch(child, holds, refuses=lambda owner: None)
            with lock:
                outcomes.extend(held.outcomes)

    threads = [threading.Thread(target=batches, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == 8 * 3 * 2
    assert outcomes.count(None) == 7
    assert ledger.balance("tenant").held == {"tool_calls": 7.0}
    held = [ledger.balance(child).held.get("tool_calls", 0.0) for child in ("run-a", "run-b")]
    assert sum(held) == 7.0


def test_a_paused_runs_settled_reservations_hold_no_copy_of_equal_amounts() -> None:
    # A run in flight keeps every record of its steps and calls, most holding one step or one
    # call: equal amounts are held once, and a settle that refunds nothing copies none.
    ledger = InMemoryLedger()
    ledger.open_account("run", {"steps": 5000, "tool_calls": 5000})
    for i in range(100):  # warm: the dict and any shared amounts exist before counting
        ledger.reserve("run", f"warm:{i:05d}", {"steps": 1.0})
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(1000):
            ledger.reserve("run", f"step:{i:05d}", {"steps": 1.0})
            ledger.settle(f"step:{i:05d}")
            ledger.reserve("run", f"call:{i:05d}", {"tool_calls": 1.0})
            ledger.settle(f"call:{i:05d}", {"tool_calls": 1.0})
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A key (59 bytes), its record (72), its share of the dict and of the account's key list:
    # about 175 bytes. A copy of the amounts per record makes it about 290.
    per_record = (held - before) / 2000
    assert per_record < 230, per_record
    assert ledger.balance("run").held == {"steps": 1100.0, "tool_calls": 1000.0}
    assert ledger.get("call:00999") == ledger.get("call:00000").model_copy(
        update={"key": "call:00999"}
    )


@pytest.mark.parametrize("first", [0.0, -0.0])
def test_a_reservation_keeps_the_amounts_it_was_given_whatever_an_equal_one_holds(
    ledger: InMemoryLedger, first: float
) -> None:
    ledger.open_account("run", {"steps": 5})
    second = -first
    ledger.reserve("run", "a", {"steps": first})
    ledger.reserve("run", "b", {"steps": second})
    got = ledger.get("b")
    assert got is not None and math.copysign(1.0, got.amounts["steps"]) == math.copysign(
        1.0, second
    )
