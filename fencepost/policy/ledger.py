"""The Ledger port: atomic, idempotent reservations against accounts with parents.

One port, several backends (in-memory here; SQLite and Postgres in ``fencepost.adapters``), sync
and async pairs, in the shape of LangGraph's checkpoint savers.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Annotated

from pydantic import Field, Strict

from fencepost.policy._model import Frozen
from fencepost.policy.budget import BudgetAxis, BudgetExhausted, reason_for_axis


class ReservationStatus(StrEnum):
    """Where a reservation stands."""

    RESERVED = "reserved"
    SETTLED = "settled"
    RELEASED = "released"


class Reservation(Frozen):
    """Amounts held against an account under an idempotency key."""

    account: str
    key: str
    amounts: Annotated[dict[str, float], Strict(False)]
    status: Annotated[ReservationStatus, Strict(False)] = ReservationStatus.RESERVED
    existing: bool = False
    """True when this key had been reserved before: an earlier attempt already started."""


class Balance(Frozen):
    """An account's limits and what is held or spent against them, per axis."""

    account: str
    parent: str | None
    limits: Annotated[dict[str, float], Strict(False)]
    held: Annotated[dict[str, float], Strict(False)] = Field(default_factory=dict)
    """Reserved or settled amounts per axis (what counts against the limit)."""

    def remaining(self, axis: str) -> float | None:
        """What is left on ``axis``; ``None`` if the account does not limit it."""
        if axis not in self.limits:
            return None
        return self.limits[axis] - self.held.get(axis, 0.0)


class UnknownAccount(LookupError):
    """An operation named an account that was never opened."""


class UnknownReservation(LookupError):
    """``settle`` or ``release`` named a key that was never reserved."""


class LedgerConflict(ValueError):
    """An account or reservation was reopened with different terms."""


def _exhausted(account: str, axis: str, limit: float, requested: float) -> BudgetExhausted:
    try:
        known = BudgetAxis(axis)
    except ValueError:
        known = BudgetAxis.COST
    return BudgetExhausted(
        reason_for_axis(known), axis=known, limit=limit, requested=requested, account=account
    )


# -- the rules every backend applies --------------------------------------------------------------
# Pure functions over plain values, so the in-memory, SQLite and Postgres ledgers decide alike and
# differ only in how they read, lock and write.


def validate_amounts(amounts: Mapping[str, float]) -> dict[str, float]:
    """``amounts`` as floats; ``ValueError`` for a negative or NaN amount (limits alike)."""
    out: dict[str, float] = {}
    for axis, value in amounts.items():
        number = float(value)
        if number < 0 or number != number:
            raise ValueError(f"amount for {axis!r} must be a non-negative number")
        out[axis] = number
    return out


def check_same_terms(
    account: str,
    opened: tuple[str | None, Mapping[str, float]],
    requested: tuple[str | None, Mapping[str, float]],
) -> None:
    """Reopening ``account`` is idempotent only with the (parent, limits) it was opened with."""
    if opened != requested:
        raise LedgerConflict(f"account {account!r} already open with other terms")


def walk_chain(account: str, parents: Mapping[str, str | None]) -> list[str]:
    """``account`` and its ancestors, nearest first, following ``parents`` (name -> parent).

    Raises ``UnknownAccount`` for a name ``parents`` does not know, ``LedgerConflict`` on a cycle.
    """
    chain: list[str] = []
    current: str | None = account
    while current is not None:
        if current not in parents:
            raise UnknownAccount(current)
        if current in chain:
            raise LedgerConflict("account parent chain has a cycle")
        chain.append(current)
        current = parents[current]
    return chain


def check_room(
    chain: Iterable[tuple[str, Mapping[str, float], Mapping[str, float]]],
    amounts: Mapping[str, float],
) -> None:
    """Raise ``BudgetExhausted`` unless every ``(account, limits, held)`` can also hold ``amounts``.

    Accounts are checked nearest first, so the error names the first one that cannot pay; an axis
    an account does not limit never exhausts it.
    """
    for account, limits, held in chain:
        for axis, amount in amounts.items():
            limit = limits.get(axis)
            if limit is not None and held.get(axis, 0.0) + amount > limit:
                raise _exhausted(account, axis, limit, amount)


def existing_reservation(prior: Reservation, account: str) -> Reservation:
    """A repeated ``reserve`` of ``prior.key``: the first reservation, marked ``existing``.

    Raises ``LedgerConflict`` when the key is held by another account.
    """
    if prior.account != account:
        raise LedgerConflict(f"key {prior.key!r} is held by another account")
    return prior.model_copy(update={"existing": True})


def existing_outcome(reservation: Reservation) -> Reservation | None:
    """A ``settle`` or ``release`` of a key that already has an outcome: that outcome, marked
    ``existing`` (an attempted call is never refunded twice); ``None`` while it is still reserved.
    """
    if reservation.status is ReservationStatus.RESERVED:
        return None
    return reservation.model_copy(update={"existing": True})


def settlement(
    reserved: Mapping[str, float], actual: Mapping[str, float] | None
) -> tuple[dict[str, float], dict[str, float]]:
    """``(refund, final)`` for settling a reservation of ``reserved`` at ``actual``.

    Only what was held beyond ``actual`` is refunded: an axis missing from ``actual`` (or no
    ``actual`` at all) keeps its full amount, and an actual above the reservation charges no more
    than was reserved. ``actual`` is validated like any amounts.
    """
    final = dict(reserved)
    if actual is None:
        return {}, final
    clean = validate_amounts(actual)
    refund = {
        axis: final[axis] - clean.get(axis, final[axis])
        for axis in final
        if clean.get(axis, final[axis]) < final[axis]
    }
    return refund, {axis: final[axis] - refund.get(axis, 0.0) for axis in final}


class Ledger(ABC):
    """Accounts with limits and a parent chain; reservations by idempotency key.

    ``reserve`` is atomic across the whole parent chain (a parent of 100 cannot fund three
    children of 60) and idempotent by key (a second reserve of the same key returns the first,
    marked ``existing``). ``settle`` records the actual amounts and refunds any excess.
    ``release`` refunds in full and is only for a call that never started.

    Example::

        ledger = InMemoryLedger()
        ledger.open_account("tenant", {"tool_calls": 100})
        ledger.open_account("run-1", {"tool_calls": 60}, parent="tenant")
        ledger.reserve("run-1", "call-0001", {"tool_calls": 1})
    """

    @abstractmethod
    def open_account(
        self, account: str, limits: Mapping[str, float], *, parent: str | None = None
    ) -> Balance:
        """Create ``account`` (idempotent when the terms are the same)."""

    @abstractmethod
    def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        """Hold ``amounts`` on ``account`` and every ancestor, or raise ``BudgetExhausted``."""

    @abstractmethod
    def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        """Record the outcome; refund what was held beyond ``actual`` (default: keep it all)."""

    @abstractmethod
    def release(self, key: str) -> Reservation:
        """Refund a reservation whose call never started."""

    @abstractmethod
    def get(self, key: str) -> Reservation | None:
        """The reservation under ``key``, if any."""

    @abstractmethod
    def balance(self, account: str) -> Balance:
        """Limits and holdings of ``account``."""

    async def aopen_account(
        self, account: str, limits: Mapping[str, float], *, parent: str | None = None
    ) -> Balance:
        """Async twin of :meth:`open_account`."""
        return self.open_account(account, limits, parent=parent)

    async def areserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        """Async twin of :meth:`reserve`."""
        return self.reserve(account, key, amounts)

    async def asettle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        """Async twin of :meth:`settle`."""
        return self.settle(key, actual)

    async def arelease(self, key: str) -> Reservation:
        """Async twin of :meth:`release`."""
        return self.release(key)

    async def aget(self, key: str) -> Reservation | None:
        """Async twin of :meth:`get`."""
        return self.get(key)


class InMemoryLedger(Ledger):
    """A process-local ledger for tests and notebooks. Atomic under a lock; not durable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parents: dict[str, str | None] = {}
        self._limits: dict[str, dict[str, float]] = {}
        self._held: dict[str, dict[str, float]] = {}
        self._reservations: dict[str, Reservation] = {}

    def open_account(
        self, account: str, limits: Mapping[str, float], *, parent: str | None = None
    ) -> Balance:
        clean = validate_amounts(limits)
        with self._lock:
            if parent is not None and parent not in self._parents:
                raise UnknownAccount(parent)
            if account in self._parents:
                opened = (self._parents[account], self._limits[account])
                check_same_terms(account, opened, (parent, clean))
            else:
                self._parents[account] = parent
                self._limits[account] = clean
                self._held[account] = {}
            return self._balance(account)

    def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        clean = validate_amounts(amounts)
        with self._lock:
            prior = self._reservations.get(key)
            if prior is not None:
                return existing_reservation(prior, account)
            chain = walk_chain(account, self._parents)
            check_room(((name, self._limits[name], self._held[name]) for name in chain), clean)
            self._add_held(chain, clean)
            reservation = Reservation(account=account, key=key, amounts=clean)
            self._reservations[key] = reservation
            return reservation

    def _add_held(self, chain: list[str], delta: Mapping[str, float]) -> None:
        for name in chain:
            held = self._held[name]
            for axis, amount in delta.items():
                held[axis] = held.get(axis, 0.0) + amount

    def _refund(self, reservation: Reservation, refund: Mapping[str, float]) -> None:
        chain = walk_chain(reservation.account, self._parents)
        self._add_held(chain, {axis: -amount for axis, amount in refund.items()})

    def _stored(self, key: str) -> Reservation:
        reservation = self._reservations.get(key)
        if reservation is None:
            raise UnknownReservation(key)
        return reservation

    def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        with self._lock:
            reservation = self._stored(key)
            if (outcome := existing_outcome(reservation)) is not None:
                return outcome
            refund, final = settlement(reservation.amounts, actual)
            self._refund(reservation, refund)
            settled = reservation.model_copy(
                update={"amounts": final, "status": ReservationStatus.SETTLED}
            )
            self._reservations[key] = settled
            return settled

    def release(self, key: str) -> Reservation:
        with self._lock:
            reservation = self._stored(key)
            if (outcome := existing_outcome(reservation)) is not None:
                return outcome
            self._refund(reservation, reservation.amounts)
            released = reservation.model_copy(update={"status": ReservationStatus.RELEASED})
            self._reservations[key] = released
            return released

    def get(self, key: str) -> Reservation | None:
        with self._lock:
            return self._reservations.get(key)

    def _balance(self, account: str) -> Balance:
        return Balance(
            account=account,
            parent=self._parents[account],
            limits=dict(self._limits[account]),
            held=dict(self._held[account]),
        )

    def balance(self, account: str) -> Balance:
        with self._lock:
            if account not in self._parents:
                raise UnknownAccount(account)
            return self._balance(account)
