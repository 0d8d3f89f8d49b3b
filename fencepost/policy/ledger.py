"""The Ledger port: atomic, idempotent reservations against accounts with parents.

One port, several backends (in-memory here; SQLite and Postgres in ``fencepost.adapters``), sync
and async pairs, in the shape of LangGraph's checkpoint savers.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
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


def _validate_amounts(amounts: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for axis, value in amounts.items():
        number = float(value)
        if number < 0 or number != number:
            raise ValueError(f"amount for {axis!r} must be a non-negative number")
        out[axis] = number
    return out


class InMemoryLedger(Ledger):
    """A process-local ledger for tests and notebooks. Atomic under a lock; not durable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._accounts: dict[str, tuple[str | None, dict[str, float]]] = {}
        self._held: dict[str, dict[str, float]] = {}
        self._reservations: dict[str, Reservation] = {}

    def open_account(
        self, account: str, limits: Mapping[str, float], *, parent: str | None = None
    ) -> Balance:
        clean = _validate_amounts(limits)
        with self._lock:
            if parent is not None and parent not in self._accounts:
                raise UnknownAccount(parent)
            existing = self._accounts.get(account)
            if existing is not None:
                if existing != (parent, clean):
                    raise LedgerConflict(f"account {account!r} already open with other terms")
            else:
                self._accounts[account] = (parent, clean)
                self._held[account] = {}
            return self._balance(account)

    def _chain(self, account: str) -> list[str]:
        chain: list[str] = []
        current: str | None = account
        while current is not None:
            if current not in self._accounts:
                raise UnknownAccount(current)
            if current in chain:
                raise LedgerConflict("account parent chain has a cycle")
            chain.append(current)
            current = self._accounts[current][0]
        return chain

    def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        clean = _validate_amounts(amounts)
        with self._lock:
            prior = self._reservations.get(key)
            if prior is not None:
                if prior.account != account:
                    raise LedgerConflict(f"key {key!r} is held by another account")
                return prior.model_copy(update={"existing": True})
            chain = self._chain(account)
            for name in chain:
                limits = self._accounts[name][1]
                held = self._held[name]
                for axis, amount in clean.items():
                    if axis in limits and held.get(axis, 0.0) + amount > limits[axis]:
                        raise _exhausted(name, axis, limits[axis], amount)
            for name in chain:
                held = self._held[name]
                for axis, amount in clean.items():
                    held[axis] = held.get(axis, 0.0) + amount
            reservation = Reservation(account=account, key=key, amounts=clean)
            self._reservations[key] = reservation
            return reservation

    def _refund(self, reservation: Reservation, refund: Mapping[str, float]) -> None:
        for name in self._chain(reservation.account):
            held = self._held[name]
            for axis, amount in refund.items():
                held[axis] = held.get(axis, 0.0) - amount

    def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        with self._lock:
            reservation = self._reservations.get(key)
            if reservation is None:
                raise UnknownReservation(key)
            if reservation.status is not ReservationStatus.RESERVED:
                return reservation.model_copy(update={"existing": True})
            final = dict(reservation.amounts)
            if actual is not None:
                clean = _validate_amounts(actual)
                refund = {
                    axis: final[axis] - clean.get(axis, final[axis])
                    for axis in final
                    if clean.get(axis, final[axis]) < final[axis]
                }
                self._refund(reservation, refund)
                final = {axis: final[axis] - refund.get(axis, 0.0) for axis in final}
            settled = reservation.model_copy(
                update={"amounts": final, "status": ReservationStatus.SETTLED}
            )
            self._reservations[key] = settled
            return settled

    def release(self, key: str) -> Reservation:
        with self._lock:
            reservation = self._reservations.get(key)
            if reservation is None:
                raise UnknownReservation(key)
            if reservation.status is not ReservationStatus.RESERVED:
                return reservation.model_copy(update={"existing": True})
            self._refund(reservation, reservation.amounts)
            released = reservation.model_copy(update={"status": ReservationStatus.RELEASED})
            self._reservations[key] = released
            return released

    def get(self, key: str) -> Reservation | None:
        with self._lock:
            return self._reservations.get(key)

    def _balance(self, account: str) -> Balance:
        parent, limits = self._accounts[account]
        return Balance(
            account=account, parent=parent, limits=dict(limits), held=dict(self._held[account])
        )

    def balance(self, account: str) -> Balance:
        with self._lock:
            if account not in self._accounts:
                raise UnknownAccount(account)
            return self._balance(account)
