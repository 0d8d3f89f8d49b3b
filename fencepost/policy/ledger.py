"""The Ledger port: atomic, idempotent reservations against accounts with parents.

One port, several backends (in-memory here; SQLite and Postgres in ``fencepost.adapters``), sync
and async pairs, in the shape of LangGraph's checkpoint savers.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from functools import partial
from types import MappingProxyType
from typing import Annotated, Generic, NamedTuple, TypeVar

from pydantic import Field, Strict

from fencepost.policy.budget import BudgetAxis, BudgetExhausted, reason_for_axis
from fencepost.policy.contract import Frozen, assemble
from fencepost.policy.deadline import Clock, SystemClock
from fencepost.policy.keys import is_claim_key
from fencepost.policy.remembered import ApprovalScope, ScopeStore, utc
from fencepost.policy.windows import Window, WindowUse, window_terms

MAX_NAME_LENGTH = 512
"""The longest key, account name, axis, owner field or close reason a ledger takes (characters)."""


class ReservationStatus(StrEnum):
    """Where a reservation stands."""

    RESERVED = "reserved"
    SETTLED = "settled"
    RELEASED = "released"


class Balance(Frozen):
    """An account's limits and what is held or spent against them, per axis."""

    account: str
    parent: str | None
    limits: Annotated[dict[str, float], Strict(False)]
    held: Annotated[dict[str, float], Strict(False)] = Field(default_factory=dict)
    """Reserved or settled amounts per axis (what counts against the limit)."""
    owner: Annotated[dict[str, str], Strict(False)] = Field(default_factory=dict)
    """Who the account belongs to (e.g. ``{"tenant": "acme", "principal": "u-1"}``), fixed at open."""
    closed: str | None = None
    """Why the account was closed (the first reason given), or ``None`` while it is open."""
    windows: Annotated[tuple[WindowUse, ...], Strict(False)] = ()
    """The account's spend windows as of the operation, in the order it was opened with."""

    def remaining(self, axis: str) -> float | None:
        """What is left on ``axis`` (the least of its limit's and its windows' room); ``None``
        if the account neither limits it nor has a window on it."""
        left: float | None = None
        if axis in self.limits:
            left = self.limits[axis] - self.held.get(axis, 0.0)
        for use in self.windows:
            if use.window.axis == axis and (left is None or use.remaining < left):
                left = use.remaining
        return left


class Reservation(Frozen):
    """Amounts held against an account under an idempotency key."""

    account: str
    key: str
    amounts: Annotated[dict[str, float], Strict(False)]
    status: Annotated[ReservationStatus, Strict(False)] = ReservationStatus.RESERVED
    existing: bool = False
    """True when this key had been reserved before: an earlier attempt already started."""
    balance: Annotated[Balance | None, Strict(False)] = None
    """The reserving account's balance right after the operation that returned this reservation
    (``reserve``, ``settle``, ``release``, ``charge``); ``None`` on what ``get`` returns."""
    exceeded: Annotated[tuple[str, str] | None, Strict(False)] = None
    """``(account, axis)``: the nearest account of the chain that a :meth:`Ledger.charge` left
    holding more than its limit on a charged axis; ``None`` when every limit still holds (and
    on what any other operation returns)."""


class Attempt(Frozen):
    """What :meth:`Ledger.begin_attempt` found and wrote for one attempt of a call."""

    claimed: bool
    """False when another account holds the claim key (the run a fork branches from): nothing
    was written. True when the claim is this account's (made now, or before), or none was asked."""
    started: Annotated[Reservation | None, Strict(False)] = None
    """The attempt's start marker (``existing``: an earlier attempt wrote it, and may have run);
    ``None`` when the claim was refused."""


class UnknownAccount(LookupError):
    """An operation named an account that was never opened."""


class UnknownReservation(LookupError):
    """``settle`` or ``release`` named a key that was never reserved."""


class LedgerConflict(ValueError):
    """An account or reservation was reopened with different terms."""


class InvalidLedgerKey(ValueError):
    """A key, account name, axis or owner field a ledger will not store.

    Empty, longer than :data:`MAX_NAME_LENGTH` characters, not a string, or containing a control
    character (NUL included) or a lone surrogate: refused before any backend sees it.
    """


class AccountClosed(Exception):
    """``reserve`` on an account whose chain (itself or an ancestor) is closed.

    ``account`` names the closed account, ``reason`` the reason it was closed with.
    """

    def __init__(self, account: str, reason: str) -> None:
        self.account = account
        self.reason = reason
        super().__init__(f"account {account!r} is closed ({reason})")

    def __reduce__(self) -> tuple[type[AccountClosed], tuple[str, str]]:
        return (type(self), (self.account, self.reason))


MARKER_REFUSALS: tuple[type[Exception], ...] = (AccountClosed, UnknownAccount, LedgerConflict)
"""What keeps :meth:`Ledger.finish_attempt` from writing its result marker without stopping the
settle: a refused marker leaves the result unmarked (never citable), and the call's outcome stands."""


def exhausted(
    account: str,
    axis: str,
    limit: float,
    requested: float,
    *,
    busy: bool = False,
    window: Window | None = None,
    now: float | None = None,
) -> BudgetExhausted:
    """The ``BudgetExhausted`` for ``account`` unable to hold ``requested`` more on ``axis``
    (``busy``: only because reservations in flight hold the room, see ``BudgetExhausted.busy``;
    ``window``: the spend window that refused, with when it next frees as of ``now``)."""
    try:
        known = BudgetAxis(axis)
    except ValueError:
        known = BudgetAxis.COST
    return BudgetExhausted(
        reason_for_axis(known),
        axis=known,
        limit=limit,
        requested=requested,
        account=account,
        busy=busy,
        window=window.label if window is not None else None,
        resets_at=window.resets_at(now) if window is not None and now is not None else None,
    )


def spent(held: Mapping[str, float], in_flight: Mapping[str, float]) -> dict[str, float]:
    """What an account has spent per axis: what it holds less what reservations in flight hold."""
    return {axis: amount - in_flight.get(axis, 0.0) for axis, amount in held.items()}


# -- the rules every backend applies --------------------------------------------------------------
# Pure functions over plain values, so the in-memory, SQLite and Postgres ledgers decide alike and
# differ only in how they read, lock and write.


def validate_name(value: object, what: str = "key") -> str:
    """``value`` if a ledger can store it as a key or name; ``InvalidLedgerKey`` otherwise."""
    if not isinstance(value, str):
        raise InvalidLedgerKey(f"{what} must be a string")
    if not value:
        raise InvalidLedgerKey(f"{what} must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidLedgerKey(f"{what} is longer than {MAX_NAME_LENGTH} characters")
    if not value.isprintable() and any(unicodedata.category(c) in ("Cc", "Cs") for c in value):
        raise InvalidLedgerKey(f"{what} contains a control character")
    return value


def validate_owner(owner: Mapping[str, str] | None) -> dict[str, str]:
    """``owner`` as a plain dict of validated names (``{}`` for ``None``)."""
    if owner is None:
        return {}
    return {
        validate_name(field, "owner field"): validate_name(value, "owner value")
        for field, value in owner.items()
    }


def validate_amounts(amounts: Mapping[str, float]) -> dict[str, float]:
    """``amounts`` as floats; ``ValueError`` for a negative or NaN amount (limits alike).

    Axis names must be valid names (``InvalidLedgerKey``, a ``ValueError``).
    """
    out: dict[str, float] = {}
    for axis, value in amounts.items():
        validate_name(axis, "axis")
        number = float(value)
        if number < 0 or number != number:
            raise ValueError(f"amount for {axis!r} must be a non-negative number")
        out[axis] = number
    return out


Terms = tuple[str | None, Mapping[str, float], Mapping[str, str]]
"""What an account is opened with: ``(parent, limits, owner)``."""


def check_same_terms(
    account: str,
    opened: Terms,
    requested: Terms,
    opened_windows: Iterable[Window] = (),
    requested_windows: Iterable[Window] = (),
) -> None:
    """Reopening ``account`` is idempotent only with the (parent, limits, owner, windows) it was
    opened with."""
    if (opened[0], dict(opened[1]), dict(opened[2]), tuple(opened_windows)) != (
        requested[0],
        dict(requested[1]),
        dict(requested[2]),
        tuple(requested_windows),
    ):
        raise LedgerConflict(f"account {account!r} already open with other terms")


def validate_windows(windows: Iterable[Window] | None) -> tuple[Window, ...]:
    """``windows`` as a tuple, each a :class:`Window` on a valid axis name (``TypeError``,
    ``InvalidLedgerKey``)."""
    out = window_terms(windows)
    for window in out:
        validate_name(window.axis, "window axis")
    return out


WindowHeld = tuple[Window, float]
"""One window of an account and what it holds at the instant of the check."""


def check_windows(
    chain: Iterable[tuple[str, Iterable[WindowHeld]]],
    amounts: Mapping[str, float],
    now: float,
    in_flight: Mapping[str, Mapping[str, float]] | None = None,
) -> None:
    """Raise ``BudgetExhausted`` (naming the window) unless every window of every account of the
    chain, nearest first, can also hold ``amounts``.

    Busy when what the account's reservations in flight hold on the axis would make the room:
    reservations in flight were made moments ago, so they are counted in the current window.
    """
    for account, windows in chain:
        for window, held in windows:
            amount = amounts.get(window.axis)
            if amount is None or held + amount <= window.limit:
                continue
            flying = (in_flight or {}).get(account, {}).get(window.axis, 0.0)
            busy = flying > 0 and held - flying + amount <= window.limit
            raise exhausted(
                account, window.axis, window.limit, amount, busy=busy, window=window, now=now
            )


def window_uses(windows: Iterable[WindowHeld], now: float) -> tuple[WindowUse, ...]:
    """The :attr:`Balance.windows` of ``(window, held)`` pairs at ``now``."""
    return tuple(
        assemble(WindowUse, {"window": w, "held": held, "resets_at": w.resets_at(now)})
        for w, held in windows
    )


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


def check_open(chain: Iterable[tuple[str, str | None]]) -> None:
    """Raise ``AccountClosed`` for the nearest ``(account, closed)`` of the chain that is closed."""
    for account, closed in chain:
        if closed is not None:
            raise AccountClosed(account, closed)


def _short(
    chain: Iterable[tuple[str, Mapping[str, float], Mapping[str, float]]],
    amounts: Mapping[str, float],
) -> tuple[str, str, float, float] | None:
    """The first ``(account, axis, limit, amount)`` of ``chain`` that cannot hold ``amounts``."""
    for account, limits, held in chain:
        for axis, amount in amounts.items():
            limit = limits.get(axis)
            if limit is not None and held.get(axis, 0.0) + amount > limit:
                return account, axis, limit, amount
    return None


def check_room(
    chain: Iterable[tuple[str, Mapping[str, float], Mapping[str, float]]],
    amounts: Mapping[str, float],
    in_flight: Mapping[str, Mapping[str, float]] | None = None,
) -> None:
    """Raise ``BudgetExhausted`` unless every ``(account, limits, held)`` can also hold ``amounts``.

    Accounts are checked nearest first, so the error names the first one that cannot pay; an axis
    an account does not limit never exhausts it. ``in_flight`` (account -> what its reservations
    in flight hold) says whether the refusal is ``busy``: no account of the chain would refuse
    were only what it spent counted.
    """
    links = list(chain)
    short = _short(links, amounts)
    if short is None:
        return
    busy = False
    if in_flight is not None:
        unspent = [(a, limits, spent(held, in_flight.get(a, {}))) for a, limits, held in links]
        busy = _short(unspent, amounts) is None
    raise exhausted(*short, busy=busy)


def over_limit(
    chain: Iterable[tuple[str, Mapping[str, float], Mapping[str, float]]],
    axes: Iterable[str],
) -> tuple[str, str] | None:
    """The first ``(account, axis)`` of ``chain`` (``(account, limits, held)``, nearest first)
    holding more than its limit on one of ``axes``, in their order; ``None`` if none does.

    What a charge reports: such an account refuses every later reservation of that axis on it
    and its descendants (:func:`check_room`), until refunds bring it back within its limit.
    """
    names = list(axes)
    for account, limits, held in chain:
        for axis in names:
            limit = limits.get(axis)
            if limit is not None and held.get(axis, 0.0) > limit:
                return account, axis
    return None


def existing_reservation(
    prior: Reservation, account: str, balance: Balance | None = None
) -> Reservation:
    """A repeated ``reserve`` of ``prior.key``: the first reservation, marked ``existing``.

    Raises ``LedgerConflict`` when the key is held by another account.
    """
    if prior.account != account:
        raise LedgerConflict(f"key {prior.key!r} is held by another account")
    return prior.model_copy(update={"existing": True, "balance": balance})


def existing_outcome(
    reservation: Reservation, balance: Balance | None = None
) -> Reservation | None:
    """A ``settle`` or ``release`` of a key that already has an outcome: that outcome, marked
    ``existing`` (an attempted call is never refunded twice); ``None`` while it is still reserved.
    """
    if reservation.status is ReservationStatus.RESERVED:
        return None
    return reservation.model_copy(update={"existing": True, "balance": balance})


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
    ``release`` refunds in full and is only for a call that never started. ``charge`` records
    usage already spent (a model step's tokens beyond its reservation) whatever the limits say:
    an account it leaves past a limit refuses that axis to every later reservation on it and its
    descendants. ``close_account`` stops new reservations on an account and everything under it;
    reservations already made can still be settled or released, and usage still charged. Every
    reservation that ``reserve``, ``settle``, ``release`` or ``charge`` returns carries the
    reserving account's :class:`Balance` right after the operation.

    Held is not spent: ``in_flight`` says what reservations not yet settled or released hold on
    an account, and a refusal says whether it is ``busy`` (``BudgetExhausted.busy``: only
    reservations in flight take the room, so waiting for them may let it through) or caused by
    what was spent. Every backend gives the same answer.

    Keys, account names, axes and owner fields are checked by :func:`validate_name`
    (``InvalidLedgerKey``) before a backend sees them. A reservation of ``{}`` is legal: a durable
    "attempt started" marker, idempotent by key like any other.

    Every method has an async twin (``a`` + name) that never blocks the event loop: the default
    runs the sync method in a worker thread; backends override it with native async I/O.

    Example::

        ledger = InMemoryLedger()
        ledger.open_account("tenant", {"tool_calls": 100}, owner={"tenant": "acme"})
        ledger.open_account("run-1", {"tool_calls": 60}, parent="tenant")
        ledger.reserve("run-1", "call-0001", {"tool_calls": 1})
        ledger.close_account("run-1", "completed")
    """

    @property
    def books(self) -> str | None:
        """Where this ledger keeps its books when other ledger objects may keep the same ones
        (a file, a database), as a name for this process: model steps of graphs whose ledgers
        name the same books wait for room in one line, whichever object each graph holds (an
        app that builds its graph per request on one saver). ``None``: this object's own."""
        return None

    @abstractmethod
    def open_account(
        self,
        account: str,
        limits: Mapping[str, float],
        *,
        parent: str | None = None,
        owner: Mapping[str, str] | None = None,
        windows: Iterable[Window] | None = None,
    ) -> Balance:
        """Create ``account`` (idempotent when parent, limits, owner and windows are the same).

        ``windows`` are spend windows (:class:`~fencepost.policy.windows.Window`): limits per
        day, per month or over a rolling duration, checked by every reservation on the account
        or a descendant atomically with the limits. Reopening with other terms raises
        ``LedgerConflict``; an unknown parent ``UnknownAccount``.
        """

    @abstractmethod
    def close_account(self, account: str, reason: str) -> Balance:
        """Refuse further reservations on ``account`` and its descendants (``AccountClosed``).

        Idempotent: the first reason wins. ``UnknownAccount`` if it was never opened.
        """

    @abstractmethod
    def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        """Hold ``amounts`` on ``account`` and every ancestor, or raise ``BudgetExhausted``.

        A key reserved before returns that reservation marked ``existing`` (even on a closed
        account); otherwise a closed account in the chain raises ``AccountClosed``.
        """

    @abstractmethod
    def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        """Record the outcome; refund what was held beyond ``actual`` (default: keep it all)."""

    @abstractmethod
    def charge(
        self, account: str, key: str, amounts: Mapping[str, float], *, of: str | None = None
    ) -> Reservation:
        """Record ``amounts`` already spent on ``account`` and every ancestor, past any limit and
        on a closed account alike: usage that happened is never charged nowhere.

        ``of`` names the reservation (of the same account) the usage belongs to (a model step's
        tokens beyond its hold): spend windows count it at the instant that reservation was made,
        in its window even after a reset; without it (or for a key it does not know), now.

        Returns the charge as a settled reservation (idempotent by key like ``reserve``: a key
        reserved or charged before returns that one, marked ``existing``; ``LedgerConflict`` if
        another account holds it), with ``exceeded`` naming the nearest account of the chain now
        holding more than its limit on a charged axis. ``UnknownAccount`` for an account never
        opened.
        """

    @abstractmethod
    def release(self, key: str) -> Reservation:
        """Refund a reservation whose call never started."""

    @abstractmethod
    def get(self, key: str) -> Reservation | None:
        """The reservation under ``key``, if any (without a ``balance``)."""

    @abstractmethod
    def balance(self, account: str) -> Balance:
        """Limits and holdings of ``account``."""

    def reserved(self, account: str, key: str) -> Reservation | None:
        """What :meth:`reserve` of ``key`` on ``account`` returns for a key reserved before (that
        reservation, marked ``existing``, with the account's balance now), without reserving:
        ``None`` for a key never reserved. ``LedgerConflict`` if another account holds it.

        A read: a caller that expects the key reserved already (a call the gate reserved) asks
        this first and reserves only what it does not find. The default composes :meth:`get`
        and :meth:`balance`; backends read both at once.
        """
        validate_name(account, "account")
        prior = self.get(key)
        if prior is None:
            return None
        return existing_reservation(prior, account, self.balance(account))

    def begin_attempt(self, account: str, marker: str, *, claim: str | None = None) -> Attempt:
        """Claim a call for ``account`` and write the start marker of its attempt, in one step:
        a zero-amount reservation of ``claim`` (when given), then one of ``marker``, each
        idempotent by key as :meth:`reserve` is.

        A ``claim`` another account holds (``LedgerConflict`` from :meth:`reserve`) is no error:
        the answer says so (``claimed`` False) and no marker is written. Any other refusal
        raises as :meth:`reserve` would, and what was written before it stays written. A durable
        backend writes both in one transaction: a crash leaves both or neither.

        The default composes :meth:`reserve`; backends override it to write once.
        """
        if claim is not None:
            try:
                self.reserve(account, claim, {})
            except LedgerConflict:
                return Attempt(claimed=False)
        return Attempt(claimed=True, started=self.reserve(account, marker, {}))

    def start_attempt(
        self,
        account: str,
        key: str,
        marker: str,
        *,
        claim: str | None = None,
        begins: Callable[[Reservation], bool],
    ) -> tuple[Reservation | None, Attempt | None]:
        """:meth:`reserved` of ``key`` on ``account`` (an attempt's reservation made before it:
        a call the gate reserved) and, where one is found that ``begins`` accepts,
        :meth:`begin_attempt` of ``marker`` (and ``claim``), in one step: what ``reserved``
        found (``None``: the key was never reserved), and the attempt begun (``None`` where
        none was: nothing is written then).

        ``begins`` judges the reservation as ``reserved`` returns it (its account's balance,
        owner included) between the read and the writes, so a caller whose rules refuse it
        (an account opened for someone else, an attempt already settled) writes nothing on
        the account. It must not call the ledger. Refusals raise as the separate calls would.

        The default composes :meth:`reserved` and :meth:`begin_attempt` (two steps: a
        reservation settled or an account closed between them is still caught, by the marker
        already written or by :class:`AccountClosed`). The in-memory ledger holds its lock
        across both and the SQLite ledger runs both in one transaction; the Postgres ledger
        uses the default.
        """
        found = self.reserved(account, key)
        if found is None or not begins(found):
            return found, None
        return found, self.begin_attempt(account, marker, claim=claim)

    def finish_attempt(
        self,
        account: str,
        key: str,
        *,
        result: str | None = None,
        actual: Mapping[str, float] | None = None,
    ) -> Reservation:
        """Mark that the attempt's tool returned a result (a zero-amount reservation of
        ``result`` on ``account``, when given), then :meth:`settle` the attempt's reservation
        ``key`` at ``actual``; what ``settle`` returns.

        A marker the ledger refuses (a closed account: a cancel meanwhile; an unknown account;
        a key another account holds) is not written and stops nothing: the attempt is settled
        all the same. A durable backend writes both in one transaction.

        The default composes :meth:`reserve` and :meth:`settle`; backends override it.
        """
        if result is not None:
            with contextlib.suppress(*MARKER_REFUSALS):
                self.reserve(account, result, {})
        return self.settle(key, actual)

    def settle_and_reserve(
        self,
        key: str,
        actual: Mapping[str, float] | None,
        account: str,
        holds: Sequence[tuple[str, Mapping[str, float]]],
    ) -> tuple[Reservation, list[Reservation | BudgetExhausted]]:
        """:meth:`settle` ``key`` at ``actual`` (a model step, its usage known), then
        :meth:`reserve` each ``(key, amounts)`` of ``holds`` on ``account``, in order (the calls
        its decision proposed, gated): what ``settle`` returned, and per hold its reservation,
        or the ``BudgetExhausted`` that refused it (a hold refused does not stop the next).

        Any other refusal raises as the separate call would, and what was written before it
        stays written. A durable backend writes all in one transaction.

        The default composes :meth:`settle` and :meth:`reserve`; backends override it.
        """
        settled = self.settle(key, actual)
        held: list[Reservation | BudgetExhausted] = []
        for hold, amounts in holds:
            try:
                held.append(self.reserve(account, hold, amounts))
            except BudgetExhausted as refused:
                held.append(refused)
        return settled, held

    async def asettle_and_reserve(
        self,
        key: str,
        actual: Mapping[str, float] | None,
        account: str,
        holds: Sequence[tuple[str, Mapping[str, float]]],
    ) -> tuple[Reservation, list[Reservation | BudgetExhausted]]:
        """Async twin of :meth:`settle_and_reserve`."""
        return await asyncio.to_thread(self.settle_and_reserve, key, actual, account, holds)

    def in_flight(self, account: str) -> dict[str, float]:
        """What reservations still in flight (reserved, not yet settled or released) hold on
        ``account``, per axis, its descendants' included: the part of ``Balance.held`` that is
        held but not spent. ``UnknownAccount`` if it was never opened.

        The default, for a backend that does not track it, is nothing: all it holds counts as
        spent (a refusal is then never ``busy``).
        """
        self.balance(account)
        return {}

    async def ain_flight(self, account: str) -> dict[str, float]:
        """Async twin of :meth:`in_flight`."""
        return await asyncio.to_thread(self.in_flight, account)

    async def areserved(self, account: str, key: str) -> Reservation | None:
        """Async twin of :meth:`reserved`."""
        return await asyncio.to_thread(self.reserved, account, key)

    async def abegin_attempt(
        self, account: str, marker: str, *, claim: str | None = None
    ) -> Attempt:
        """Async twin of :meth:`begin_attempt`."""
        return await asyncio.to_thread(partial(self.begin_attempt, account, marker, claim=claim))

    async def astart_attempt(
        self,
        account: str,
        key: str,
        marker: str,
        *,
        claim: str | None = None,
        begins: Callable[[Reservation], bool],
    ) -> tuple[Reservation | None, Attempt | None]:
        """Async twin of :meth:`start_attempt`; the default composes the async twins of
        :meth:`reserved` and :meth:`begin_attempt`."""
        found = await self.areserved(account, key)
        if found is None or not begins(found):
            return found, None
        return found, await self.abegin_attempt(account, marker, claim=claim)

    async def afinish_attempt(
        self,
        account: str,
        key: str,
        *,
        result: str | None = None,
        actual: Mapping[str, float] | None = None,
    ) -> Reservation:
        """Async twin of :meth:`finish_attempt`."""
        return await asyncio.to_thread(
            partial(self.finish_attempt, account, key, result=result, actual=actual)
        )

    async def aopen_account(
        self,
        account: str,
        limits: Mapping[str, float],
        *,
        parent: str | None = None,
        owner: Mapping[str, str] | None = None,
        windows: Iterable[Window] | None = None,
    ) -> Balance:
        """Async twin of :meth:`open_account`."""
        return await asyncio.to_thread(
            self.open_account, account, limits, parent=parent, owner=owner, windows=windows
        )

    async def aclose_account(self, account: str, reason: str) -> Balance:
        """Async twin of :meth:`close_account`."""
        return await asyncio.to_thread(self.close_account, account, reason)

    async def areserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        """Async twin of :meth:`reserve`."""
        return await asyncio.to_thread(self.reserve, account, key, amounts)

    async def asettle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        """Async twin of :meth:`settle`."""
        return await asyncio.to_thread(self.settle, key, actual)

    async def arelease(self, key: str) -> Reservation:
        """Async twin of :meth:`release`."""
        return await asyncio.to_thread(self.release, key)

    async def acharge(
        self, account: str, key: str, amounts: Mapping[str, float], *, of: str | None = None
    ) -> Reservation:
        """Async twin of :meth:`charge`."""
        return await asyncio.to_thread(partial(self.charge, account, key, amounts, of=of))

    async def aget(self, key: str) -> Reservation | None:
        """Async twin of :meth:`get`."""
        return await asyncio.to_thread(self.get, key)

    async def abalance(self, account: str) -> Balance:
        """Async twin of :meth:`balance`."""
        return await asyncio.to_thread(self.balance, account)


def _reservation(
    account: str,
    key: str,
    amounts: Iterable[tuple[str, float]],
    status: ReservationStatus,
    *,
    existing: bool = False,
    balance: Balance | None = None,
    exceeded: tuple[str, str] | None = None,
) -> Reservation:
    """A fresh Reservation (its own ``amounts`` dict, from a record's (axis, amount) pairs) of
    checked values: names validated, amounts cleaned by :func:`validate_amounts`, so it is
    assembled without validating again."""
    return assemble(
        Reservation,
        {
            "account": account,
            "key": key,
            "amounts": dict(amounts),
            "status": status,
            "existing": existing,
            "balance": balance,
            "exceeded": exceeded,
        },
    )


class _Record(NamedTuple):
    """What the in-memory ledger keeps of a reservation (its key is the dict's key): a tuple,
    not a :class:`Reservation`, as a paused run's records stay in memory until it ends."""

    account: str
    amounts: tuple[tuple[str, float], ...]
    """(axis, amount) pairs, not a dict: a run holds some 26 records while it is in flight, most
    of one axis or of none (markers), and a dict of one axis takes 184 bytes and of none 64,
    where the pairs take 104 and the empty tuple (shared) nothing. Never handed out: every
    Reservation made from it gets a dict of its own."""
    status: ReservationStatus
    at: float
    """When it was made (epoch seconds): the instant its spend windows count it at."""


# A record made from its three fields without the NamedTuple's Python-level __new__.
_new_record = tuple.__new__

Pairs = tuple[tuple[str, float], ...]

_PAIRS: dict[Pairs, Pairs] = {}
"""One tuple per distinct amounts: most reservations of every run hold the same few (one step,
one tool call), and a paused run keeps its records for as long as it is in flight, so a copy per
record (104 bytes each) would be held ten times a five-step run. Keyed by the amounts
themselves, so what is found is exactly what was asked: no name or text of a run's."""
_PAIRS_MOST = 256


def _pairs(amounts: Mapping[str, float]) -> Pairs:
    """``amounts`` as a record holds them: its (axis, amount) pairs, shared with every record
    of equal amounts (see :data:`_PAIRS`)."""
    made = tuple(amounts.items())
    if not made:
        return ()
    for axis, amount in made:
        # Only exact strs and positive floats: a str subclass may claim to equal any axis,
        # and -0.0 equals 0.0 (a record keeps what it was given).
        if type(axis) is not str or type(amount) is not float or not amount > 0.0:
            return made
    shared = _PAIRS.get(made)
    if shared is None:
        if len(_PAIRS) >= _PAIRS_MOST:
            _PAIRS.clear()  # token estimates vary: the common amounts come back at once
        _PAIRS[made] = shared = made
    return shared


R = TypeVar("R")


class BatchHeld(NamedTuple, Generic[R]):
    """What :meth:`InMemoryLedger.reserve_batch` did with a batch's holds."""

    outcomes: tuple[BudgetExhausted | None, ...]
    """Per hold tried, in order: ``None`` where it is held (made now, or before), else the
    ``BudgetExhausted`` that refused it. Holds after the one that ended the batch are missing."""
    limits: dict[str, float] | None
    """The account's limits (a copy); ``None`` when no hold was made."""
    held: dict[str, float] | None
    """What the account holds per axis once the batch is held (a copy); ``None`` when no
    hold was made."""
    stopped_by: Exception | None = None
    """The ledger's refusal that ended the batch (``AccountClosed``, ``UnknownAccount``,
    ``LedgerConflict``, an invalid key), if one did."""
    refused: R | None = None
    """What ``refuses`` answered for the account's owner, if it refused."""


class InMemoryLedger(Ledger, ScopeStore):
    """A process-local ledger for tests and notebooks. Atomic under a lock; not durable.

    It keeps remembered approvals (:class:`~fencepost.policy.remembered.ScopeStore`) in memory too.

    Its async twins run inline: the lock is only ever held for the microseconds a dict update
    takes, and nothing waits on I/O. Every value it returns is a fresh copy: changing a returned
    dict never changes the books.
    """

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or SystemClock()
        """Where the instant a reservation is counted at in spend windows comes from."""
        self._windows: dict[str, tuple[Window, ...]] = {}
        self._window_held: dict[str, list[dict[float, float]]] = {}
        """Per account, per window (in order), what each bucket holds."""
        self._lock = threading.RLock()
        self._parents: dict[str, str | None] = {}
        self._chains: dict[str, tuple[str, ...]] = {}
        """Each open account and its ancestors, nearest first: fixed when it is opened (its
        parent then, never changed), so a reservation does not walk the parents again."""
        self._windowed: dict[str, bool] = {}
        """Per account, whether an account of its chain has spend windows (fixed at open too):
        most have none, and a reservation then reads no clock and counts no window."""
        self._limits: dict[str, dict[str, float]] = {}
        self._owners: dict[str, dict[str, str]] = {}
        self._closed: dict[str, str] = {}
        self._held: dict[str, dict[str, float]] = {}
        self._in_flight: dict[str, dict[str, float]] = {}
        """Per account, what reservations in flight (reserved, not settled or released) hold."""
        self._reservations: dict[str, _Record] = {}
        self._keys: dict[str, list[str]] = {}
        """Each account's reservation keys, so a closed account's can be forgotten in O(its own)."""
        self._valid_names: set[str] = set()
        """The names of open accounts that were opened as exact strs (validated then)."""
        self._valid_axes: set[str] = set()
        """Axis names reserved before as exact strs (validated then)."""
        self._odd_keys = False
        """Whether a key that is not an exact str (a str subclass) was ever stored. Until one
        is, every key of ``_reservations`` is an exact str validated when it was stored, and a
        key is settled, released or read again by the same text: whether a text is a valid
        key depends on the text alone, so an exact str found there needs no validation (no set
        of valid keys beside the records: 26 keys a run, held while it is in flight)."""
        self._scopes: dict[str, ApprovalScope] = {}

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
        with self._lock:
            if parent is not None and parent not in self._parents:
                raise UnknownAccount(parent)
            if account in self._parents:
                opened = (self._parents[account], self._limits[account], self._owners[account])
                check_same_terms(
                    account, opened, (parent, clean, who), self._windows[account], spans
                )
            else:
                self._parents[account] = parent
                chain = (account, *self._chains[parent]) if parent is not None else (account,)
                self._chains[account] = chain
                self._windowed[account] = bool(spans) or (
                    parent is not None and self._windowed[parent]
                )
                self._limits[account] = clean
                self._owners[account] = who
                self._windows[account] = spans
                self._window_held[account] = [{} for _ in spans]
                self._held[account] = {}
                self._in_flight[account] = {}
                if type(account) is str:
                    self._valid_names.add(account)
            return self._balance(account)

    def close_account(self, account: str, reason: str) -> Balance:
        validate_name(account, "account")
        validate_name(reason, "reason")
        with self._lock:
            if account not in self._parents:
                raise UnknownAccount(account)
            self._closed.setdefault(account, reason)
            return self._balance(account)

    def forget(self, account: str) -> int:
        """Drop a closed account's finished reservations and attempt markers (not its thread's
        claims of call ids: ``keys.claim_key``); return how many.

        A process-local ledger otherwise keeps every reservation for its lifetime. What the
        account holds (its balance, and so its parents') is unchanged; a reservation still
        outstanding (a call in flight when the account closed) is kept so it can be settled.
        A graph calls this for the ledger it made itself when none was passed, as a run ends.
        """
        with self._lock:
            if account not in self._closed:
                return 0
            kept: list[str] = []
            dropped = 0
            for key in self._keys.pop(account, []):
                stored = self._reservations.get(key)
                if stored is None:
                    continue
                if (
                    stored.status is ReservationStatus.RESERVED
                    and any(amount for _, amount in stored.amounts)
                ) or is_claim_key(key):
                    # An outstanding call, or the thread's claim of a call id: a fork of the
                    # thread asks for that one after the run has ended.
                    kept.append(key)
                    continue
                del self._reservations[key]
                dropped += 1
            if kept:
                self._keys[account] = kept
            return dropped

    def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        # An account this ledger opened as an exact str was validated then (and accounts are
        # never dropped): the same text is the same valid name. Looked up among exact strs
        # only: a str subclass opened as a name may claim to equal any text.
        if type(account) is not str or account not in self._valid_names:
            validate_name(account, "account")
        self._check_key(key)
        clean = self._clean_amounts(amounts)
        with self._lock:
            return self._reserve(account, key, clean)

    def _clean_amounts(self, amounts: Mapping[str, float]) -> dict[str, float]:
        """:func:`validate_amounts`, for amounts of exact floats on axes this ledger validated
        before (exact strs: a str subclass may claim to equal any text) without validating
        their names again: whether a text is a valid name depends on the text alone."""
        valid = self._valid_axes
        if type(amounts) is dict:
            for axis, value in amounts.items():
                if not (
                    type(axis) is str and axis in valid and type(value) is float and value >= 0
                ):
                    break
            else:
                return amounts.copy()
        clean = validate_amounts(amounts)
        valid.update(axis for axis in clean if type(axis) is str)
        return clean

    def _check_key(self, key: str) -> None:
        """``InvalidLedgerKey`` unless ``key`` is a valid key. A key this ledger stored as an
        exact str was validated then: looked up only while every stored key is an exact str,
        since a str subclass may claim to equal any text."""
        # Read without the lock, so the flag is read again after the lookup: it is set before a
        # str subclass is stored, so a lookup that could have matched one sees it set.
        if (
            type(key) is not str
            or self._odd_keys
            or key not in self._reservations
            or self._odd_keys
        ):
            validate_name(key)

    def _reserve(self, account: str, key: str, clean: dict[str, float]) -> Reservation:
        """:meth:`reserve` of checked values, under the lock."""
        stored, existing = self._put(account, key, clean)
        return self._out(key, stored, existing=existing)

    def _hold(self, account: str, key: str, amounts: Mapping[str, float]) -> None:
        """:meth:`reserve`, its refusals and all, for a caller that drops the answer (a claim
        or a result marker): no Reservation or Balance is assembled only to be thrown away."""
        if type(account) is not str or account not in self._valid_names:
            validate_name(account, "account")
        self._check_key(key)
        clean = self._clean_amounts(amounts)
        with self._lock:
            self._put(account, key, clean)

    def _put(self, account: str, key: str, clean: dict[str, float]) -> tuple[_Record, bool]:
        """The stored reservation of ``key`` after reserving ``clean`` on ``account`` (checked
        values, under the lock), and whether it was there before."""
        prior = self._reservations.get(key)
        if prior is not None:
            if prior.account != account:
                # The shared rule raises LedgerConflict; never hand back another account's.
                existing_reservation(self._model(key, prior), account)
                raise LedgerConflict(f"key {key!r} is held by another account")
            return prior, True
        chain = self._chains.get(account)
        if chain is None:
            raise UnknownAccount(account)
        closed = self._closed
        if not closed.keys().isdisjoint(chain):
            check_open((name, closed.get(name)) for name in chain)
        limits, held = self._limits, self._held
        links = [(name, limits[name], held[name]) for name in chain]
        if _short(links, clean) is not None:  # check_room's own test, first: it raises
            check_room(links, clean, self._in_flight)
        if self._windowed[account]:
            now = self._now()
            check_windows(
                ((name, self._windows_held(name, now)) for name in chain if self._windows[name]),
                clean,
                now,
                self._in_flight,
            )
            self._add_windows(chain, clean, now)
        else:
            now = 0.0  # never read: no account of the chain counts windows
        # _add_held and _add_in_flight, in one pass over the chain.
        flying = self._in_flight
        for name in chain:
            holds, flies = held[name], flying[name]
            for axis, amount in clean.items():
                holds[axis] = holds.get(axis, 0.0) + amount
                flies[axis] = flies.get(axis, 0.0) + amount
        stored = _new_record(_Record, (account, _pairs(clean), ReservationStatus.RESERVED, now))
        if type(key) is not str:
            self._odd_keys = True  # before it is stored: _check_key reads outside the lock
        self._reservations[key] = stored
        keys = self._keys.get(account)
        if keys is None:
            self._keys[account] = [key]
        else:
            keys.append(key)
        return stored, False

    def charge(
        self, account: str, key: str, amounts: Mapping[str, float], *, of: str | None = None
    ) -> Reservation:
        validate_name(account, "account")
        validate_name(key)
        if of is not None:
            validate_name(of)
        clean = validate_amounts(amounts)
        with self._lock:
            chain = walk_chain(account, self._parents)
            prior = self._reservations.get(key)
            if prior is None:
                # Neither closed accounts nor limits refuse it: the usage already happened.
                self._add_held(chain, clean)
                now = self._chain_now(chain)
                belongs = self._reservations.get(of) if of is not None else None
                if belongs is not None and belongs.account == account:
                    now = belongs.at
                self._add_windows(chain, clean, now)
                prior = _new_record(
                    _Record, (account, _pairs(clean), ReservationStatus.SETTLED, now)
                )
                if type(key) is not str:
                    self._odd_keys = True  # before it is stored: _check_key reads unlocked
                self._reservations[key] = prior
                self._keys.setdefault(account, []).append(key)
                existing = False
            elif prior.account != account:
                return existing_reservation(self._model(key, prior), account)  # LedgerConflict
            else:
                existing = True
            over = over_limit(
                ((name, self._limits[name], self._held[name]) for name in chain), clean
            )
            return self._out(key, prior, existing=existing, exceeded=over)

    def _out(
        self,
        key: str,
        stored: _Record,
        *,
        existing: bool = False,
        exceeded: tuple[str, str] | None = None,
    ) -> Reservation:
        """A copy of ``stored`` to hand out, with its account's balance now."""
        return _reservation(
            stored.account,
            key,
            stored.amounts,
            stored.status,
            existing=existing,
            balance=self._balance(stored.account),
            exceeded=exceeded,
        )

    @staticmethod
    def _model(key: str, stored: _Record) -> Reservation:
        return _reservation(stored.account, key, stored.amounts, stored.status)

    def _add_held(self, chain: Sequence[str], delta: Mapping[str, float]) -> None:
        for name in chain:
            held = self._held[name]
            for axis, amount in delta.items():
                held[axis] = held.get(axis, 0.0) + amount

    def _now(self) -> float:
        return self._clock.now().timestamp()

    def _window_uses(self, account: str) -> tuple[WindowUse, ...]:
        if not self._windows[account]:
            return ()
        now = self._now()
        return window_uses(self._windows_held(account, now), now)

    def _chain_now(self, chain: list[str]) -> float:
        """Now, for a chain with windows; 0 (never read) for one without: no clock read."""
        return self._now() if any(self._windows[name] for name in chain) else 0.0

    def _windows_held(self, account: str, now: float) -> list[tuple[Window, float]]:
        """Each window of ``account`` with what it holds at ``now`` (older buckets dropped)."""
        out: list[tuple[Window, float]] = []
        for window, buckets in zip(self._windows[account], self._window_held[account], strict=True):
            since = window.since(now)
            for old in [b for b in buckets if b < since]:
                del buckets[old]
            out.append((window, sum(buckets.values())))
        return out

    def _add_windows(self, chain: Sequence[str], delta: Mapping[str, float], at: float) -> None:
        """Count ``delta`` in the windows of the chain, in the buckets of instant ``at``."""
        for name in chain:
            for window, buckets in zip(self._windows[name], self._window_held[name], strict=True):
                amount = delta.get(window.axis)
                if amount:
                    bucket = window.bucket(at)
                    buckets[bucket] = buckets.get(bucket, 0.0) + amount

    def _add_in_flight(self, chain: Sequence[str], delta: Mapping[str, float]) -> None:
        for name in chain:
            flying = self._in_flight[name]
            for axis, amount in delta.items():
                flying[axis] = flying.get(axis, 0.0) + amount

    def _refund(self, reservation: _Record, refund: Mapping[str, float]) -> None:
        """Give back ``refund`` of a reservation in flight, which lands (settled or released)."""
        chain = walk_chain(reservation.account, self._parents)
        self._add_held(chain, {axis: -amount for axis, amount in refund.items()})
        self._add_windows(chain, {axis: -amount for axis, amount in refund.items()}, reservation.at)
        self._add_in_flight(chain, {axis: -amount for axis, amount in reservation.amounts})

    def _stored(self, key: str) -> _Record:
        reservation = self._reservations.get(key)
        if reservation is None:
            raise UnknownReservation(key)
        return reservation

    def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        self._check_key(key)
        with self._lock:
            return self._settle(key, actual)

    def _settle(self, key: str, actual: Mapping[str, float] | None) -> Reservation:
        """:meth:`settle` under the lock."""
        reservation = self._stored(key)
        if reservation.status is not ReservationStatus.RESERVED:
            return self._out(key, reservation, existing=True)  # see existing_outcome
        refund, final = settlement(dict(reservation.amounts), actual)
        self._refund(reservation, refund)
        # Nothing refunded: the record keeps the amounts it holds (no copy of equal pairs).
        amounts = reservation.amounts if not refund else _pairs(final)
        settled = _Record(reservation.account, amounts, ReservationStatus.SETTLED, reservation.at)
        self._reservations[key] = settled
        return self._out(key, settled)

    def reserved(self, account: str, key: str) -> Reservation | None:
        if type(account) is not str or account not in self._valid_names:
            validate_name(account, "account")
        self._check_key(key)
        with self._lock:
            prior = self._reservations.get(key)
            if prior is None:
                return None
            if prior.account != account:
                return existing_reservation(self._model(key, prior), account)  # LedgerConflict
            return self._out(key, prior, existing=True)

    # The port's compositions, under one hold of the (re-entrant) lock: no other thread sees
    # the claim without the marker, the result marker without the settlement, or a step
    # settled without its calls held.
    def begin_attempt(self, account: str, marker: str, *, claim: str | None = None) -> Attempt:
        # The port's default, the claim held without assembling the answer it drops. The
        # marker's key is checked first: an invalid one writes no claim, as a durable backend
        # checks every argument before its one transaction.
        self._check_key(marker)
        with self._lock:
            if claim is not None:
                try:
                    self._hold(account, claim, {})
                except LedgerConflict:
                    return Attempt(claimed=False)
            return Attempt(claimed=True, started=self.reserve(account, marker, {}))

    def start_attempt(
        self,
        account: str,
        key: str,
        marker: str,
        *,
        claim: str | None = None,
        begins: Callable[[Reservation], bool],
    ) -> tuple[Reservation | None, Attempt | None]:
        # The port's default, read and begun under one hold of the lock.
        with self._lock:
            found = self.reserved(account, key)
            if found is None or not begins(found):
                return found, None
            return found, self.begin_attempt(account, marker, claim=claim)

    def finish_attempt(
        self,
        account: str,
        key: str,
        *,
        result: str | None = None,
        actual: Mapping[str, float] | None = None,
    ) -> Reservation:
        # The port's default, the result marker held without assembling the answer it drops.
        with self._lock:
            if result is not None:
                with contextlib.suppress(*MARKER_REFUSALS):
                    self._hold(account, result, {})
            return self.settle(key, actual)

    def settle_and_reserve(
        self,
        key: str,
        actual: Mapping[str, float] | None,
        account: str,
        holds: Sequence[tuple[str, Mapping[str, float]]],
    ) -> tuple[Reservation, list[Reservation | BudgetExhausted]]:
        with self._lock:
            return super().settle_and_reserve(key, actual, account, holds)

    def reserve_batch(
        self,
        account: str,
        holds: Sequence[tuple[str, Mapping[str, float]]],
        *,
        settle: tuple[str, Mapping[str, float] | None] | None = None,
        refuses: Callable[[Mapping[str, str]], R | None] | None = None,
    ) -> BatchHeld[R]:
        """Reserve each ``(key, amounts)`` of ``holds`` on ``account`` in order, under one hold
        of the lock, as :meth:`reserve` would one by one (a hold the budget cannot cover is
        refused and the next still tried), after settling ``settle`` (``(key, actual)``: a
        model step whose calls these are) when given; and the account's limits and what it
        holds once, not a :class:`Balance` and a :class:`Reservation` per hold.

        ``refuses``: asked once, with the account's owner, as soon as a hold is made (or found
        made before); what it answers other than ``None`` gives that hold back (unless it was
        held before), ends the batch, and is :attr:`BatchHeld.refused`. Any other refusal of
        the ledger (a closed or unknown account, a key held by another account, an invalid
        key) ends the batch too, as :attr:`BatchHeld.stopped_by`; what was held before it
        stays held, as separate calls would leave it.
        """
        with self._lock:
            if settle is not None:
                self._check_key(settle[0])
                self._settle(*settle)
            outcomes: list[BudgetExhausted | None] = []
            made = False
            for key, amounts in holds:
                try:
                    if type(account) is not str or account not in self._valid_names:
                        validate_name(account, "account")
                    self._check_key(key)
                    _, existing = self._put(account, key, self._clean_amounts(amounts))
                except BudgetExhausted as short:
                    outcomes.append(short)
                    continue
                except (AccountClosed, UnknownAccount, LedgerConflict, ValueError) as refusal:
                    return self._batch_held(account, outcomes, made, stopped_by=refusal)
                if not made and refuses is not None:
                    refused = refuses(MappingProxyType(self._owners[account]))
                    if refused is not None:
                        if not existing:
                            self.release(key)
                        return self._batch_held(account, outcomes, made, refused=refused)
                made = True
                outcomes.append(None)
            return self._batch_held(account, outcomes, made)

    def _batch_held(
        self,
        account: str,
        outcomes: list[BudgetExhausted | None],
        made: bool,
        *,
        stopped_by: Exception | None = None,
        refused: R | None = None,
    ) -> BatchHeld[R]:
        """What :meth:`reserve_batch` did, with the account's books copied once a hold was made."""
        return BatchHeld(
            outcomes=tuple(outcomes),
            limits=dict(self._limits[account]) if made else None,
            held=dict(self._held[account]) if made else None,
            stopped_by=stopped_by,
            refused=refused,
        )

    def release(self, key: str) -> Reservation:
        self._check_key(key)
        with self._lock:
            reservation = self._stored(key)
            if reservation.status is not ReservationStatus.RESERVED:
                return self._out(key, reservation, existing=True)  # see existing_outcome
            self._refund(reservation, dict(reservation.amounts))
            released = reservation._replace(status=ReservationStatus.RELEASED)
            self._reservations[key] = released
            return self._out(key, released)

    def get(self, key: str) -> Reservation | None:
        self._check_key(key)
        with self._lock:
            stored = self._reservations.get(key)
            if stored is None:
                return None
            return self._model(key, stored)

    def _balance(self, account: str) -> Balance:
        # Every value was checked when the account was opened or the amounts reserved.
        return assemble(
            Balance,
            {
                "account": account,
                "parent": self._parents[account],
                "limits": dict(self._limits[account]),
                "held": dict(self._held[account]),
                "owner": dict(self._owners[account]),
                "closed": self._closed.get(account),
                "windows": self._window_uses(account) if self._windows[account] else (),
            },
        )

    def balance(self, account: str) -> Balance:
        validate_name(account, "account")
        with self._lock:
            if account not in self._parents:
                raise UnknownAccount(account)
            return self._balance(account)

    # -- remembered approvals ---------------------------------------------------------------------

    def remember_scope(self, scope: ApprovalScope) -> ApprovalScope:
        with self._lock:
            return self._scopes.setdefault(scope.scope_id, scope)

    def approval_scopes(
        self, tenant_id: str, *, tool_name: str | None = None, include_revoked: bool = False
    ) -> list[ApprovalScope]:
        with self._lock:
            found = [
                s
                for s in self._scopes.values()
                if s.tenant_id == tenant_id
                and (tool_name is None or s.tool_name == tool_name)
                and (include_revoked or s.revoked_at is None)
            ]
        return sorted(found, key=lambda s: (s.created_at, s.scope_id))

    def revoke_scope(self, tenant_id: str, scope_id: str, *, at: datetime) -> ApprovalScope | None:
        with self._lock:
            scope = self._scopes.get(scope_id)
            if scope is None or scope.tenant_id != tenant_id:
                return None
            if scope.revoked_at is None:
                scope = scope.model_copy(update={"revoked_at": utc(at)})
                self._scopes[scope_id] = scope
            return scope

    def in_flight(self, account: str) -> dict[str, float]:
        validate_name(account, "account")
        with self._lock:
            if account not in self._parents:
                raise UnknownAccount(account)
            return dict(self._in_flight[account])

    # -- async twins: inline, the lock is held for microseconds and nothing waits on I/O ---------

    async def aremember_scope(self, scope: ApprovalScope) -> ApprovalScope:
        return self.remember_scope(scope)

    async def aapproval_scopes(
        self, tenant_id: str, *, tool_name: str | None = None, include_revoked: bool = False
    ) -> list[ApprovalScope]:
        return self.approval_scopes(tenant_id, tool_name=tool_name, include_revoked=include_revoked)

    async def arevoke_scope(
        self, tenant_id: str, scope_id: str, *, at: datetime
    ) -> ApprovalScope | None:
        return self.revoke_scope(tenant_id, scope_id, at=at)

    async def aopen_account(
        self,
        account: str,
        limits: Mapping[str, float],
        *,
        parent: str | None = None,
        owner: Mapping[str, str] | None = None,
        windows: Iterable[Window] | None = None,
    ) -> Balance:
        return self.open_account(account, limits, parent=parent, owner=owner, windows=windows)

    async def aclose_account(self, account: str, reason: str) -> Balance:
        return self.close_account(account, reason)

    async def areserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        return self.reserve(account, key, amounts)

    async def areserved(self, account: str, key: str) -> Reservation | None:
        return self.reserved(account, key)

    async def abegin_attempt(
        self, account: str, marker: str, *, claim: str | None = None
    ) -> Attempt:
        return self.begin_attempt(account, marker, claim=claim)

    async def astart_attempt(
        self,
        account: str,
        key: str,
        marker: str,
        *,
        claim: str | None = None,
        begins: Callable[[Reservation], bool],
    ) -> tuple[Reservation | None, Attempt | None]:
        return self.start_attempt(account, key, marker, claim=claim, begins=begins)

    async def afinish_attempt(
        self,
        account: str,
        key: str,
        *,
        result: str | None = None,
        actual: Mapping[str, float] | None = None,
    ) -> Reservation:
        return self.finish_attempt(account, key, result=result, actual=actual)

    async def asettle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        return self.settle(key, actual)

    async def asettle_and_reserve(
        self,
        key: str,
        actual: Mapping[str, float] | None,
        account: str,
        holds: Sequence[tuple[str, Mapping[str, float]]],
    ) -> tuple[Reservation, list[Reservation | BudgetExhausted]]:
        return self.settle_and_reserve(key, actual, account, holds)

    async def arelease(self, key: str) -> Reservation:
        return self.release(key)

    async def acharge(
        self, account: str, key: str, amounts: Mapping[str, float], *, of: str | None = None
    ) -> Reservation:
        return self.charge(account, key, amounts, of=of)

    async def aget(self, key: str) -> Reservation | None:
        return self.get(key)

    async def abalance(self, account: str) -> Balance:
        return self.balance(account)

    async def ain_flight(self, account: str) -> dict[str, float]:
        return self.in_flight(account)
