"""The line model steps wait in for room in a shared budget, and the wait itself.

Busy is not exhausted: a model step whose hold the ledger refuses only because other steps in
flight hold the room (``BudgetExhausted.busy``) waits for them to settle, then reserves
(``reservations.after_step_refused`` decides; this module does the waiting). Waiting steps
take their turns first come, first served, runs already under way before new ones, so work
under way finishes before new work takes the pool: while a step waits, another step of this
process sharing its ledger reserves only if no step ahead of it waits. The line is per process
and per ledger object, or per the books a ledger names (``Ledger.books``: a SQLite file, a
Postgres database), so graphs built per request on one saver share it; steps of other
processes are not in it, and take the room when they find
it (a waiting step asks the ledger again after each pause).

Runs under way: a run that has taken a model step is under way on its ledger's line until it
ends (the terminal node calls :func:`run_ended`), and a new run's first step asks the ledger
only when ``reservations.first_step_admitted`` says its hold leaves room for one step estimate
of each run under way under the accounts it shares with them; else it waits in the line, new
runs in the order they came. So room a settling step frees goes to the next step of the work
under way, not to a newcomer's first. A run still getting its first hold is counted by the
newcomers after it (its hold and its next step), so newcomers that look at once do not all
take the same room. What a run keeps is bounded: it lapses at the run's deadline, and
:data:`~fencepost.policy.reservations.MAX_STEP_WAIT_SECONDS` after the model timeout past its
latest step, so a crashed, abandoned or long-paused run (an approval) cannot pin the pool;
its next step keeps it again. Runs under way in other processes are not counted.

A sync graph pauses its thread (``time.sleep``), an async one its task (``asyncio.sleep``):
neither spins.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Awaitable, Callable

from fencepost.graph.account import RunAccount, chain_pools, reserve_or_exhausted
from fencepost.graph.node_io import NodeIO
from fencepost.policy import BudgetAxis, BudgetExhausted, Reservation, StopRequest
from fencepost.policy.context import RunContext
from fencepost.policy.ledger import Ledger, exhausted
from fencepost.policy.reservations import (
    MAX_STEP_WAIT_SECONDS,
    PoolShare,
    after_step_refused,
    first_step_admitted,
    others_hold_the_room,
    refused_step_stop,
    step_amounts,
    step_wait,
)

__all__ = ["hold_step", "run_ended"]

_AXES = (BudgetAxis.TOKENS.value, BudgetAxis.MONEY.value)
"""The axes a step holds an estimate on (its hold's tokens, then money)."""


class _Run:
    """A run under way (or, ``first``, getting its first hold) on a line."""

    __slots__ = ("chain", "first", "hold", "order", "until")

    def __init__(
        self, order: int, chain: frozenset[str], hold: tuple[int, int], until: float, first: bool
    ) -> None:
        self.order = order
        self.chain = chain
        self.hold = hold
        self.until = until
        self.first = first


class _Line:
    """The model steps of one process waiting on one ledger, in their turn's order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._order = itertools.count()
        self._waiting: dict[int, tuple[tuple[int, int], frozenset[str]]] = {}
        """ticket -> its place (0 for a run under way, 1 for a new one; when it joined) and
        the pool accounts its step waits on."""
        self._runs = {}

    def join(self, under_way: bool, account: str, pools: frozenset[str] | None) -> int:
        """A ticket in the line for a step waiting on ``pools`` (the accounts of its chain that
        limit what it holds). A new run already counted as getting its first hold keeps the
        place it was counted in: were its turn later than that place, a newcomer counted after
        it but in the line before it would wait for its hold while it waits for the newcomer's
        turn, both until their deadlines."""
        with self._lock:
            counted = self._runs.get(account)
            ticket = counted.order if counted is not None and counted.first else next(self._order)
            self._waiting[ticket] = ((0 if under_way else 1, ticket), pools or frozenset())
            return ticket

    def leave(self, ticket: int) -> None:
        with self._lock:
            self._waiting.pop(ticket, None)

    def first(self, ticket: int) -> bool:
        """Whether no step waiting on a pool ``ticket``'s step waits on goes before it."""
        with self._lock:
            mine, pools = self._waiting[ticket]
            return all(place >= mine for place, theirs in self._waiting.values() if theirs & pools)

    def ahead(self, under_way: bool, pools: frozenset[str] | None) -> bool:
        """Whether a step waiting on one of ``pools`` goes before a step not yet in the line
        (one of a run under way goes before a new run's; among equals, the one waiting
        already). Steps waiting on other pools are not ahead: nothing they wait for is this
        step's."""
        if not pools:
            return False
        kind = 0 if under_way else 1
        with self._lock:
            return any(
                place[0] <= kind for place, theirs in self._waiting.values() if theirs & pools
            )

    def chain_of(self, account: str) -> frozenset[str] | None:
        """The pool accounts of ``account``'s run under way, if the line knows it."""
        with self._lock:
            run = self._runs.get(account)
            return run.chain if run is not None else None

    # Runs under way, by their ledger account's name: the ledger's own identity for the run.
    _runs: dict[str, _Run]

    def counted(
        self,
        account: str,
        chain: frozenset[str],
        hold: tuple[int, int],
        until: float,
        ticket: int | None,
    ) -> dict[str, tuple[float, float]]:
        """Count ``account``'s run as getting its first hold (once: its place stays; the place
        of its ``ticket`` when it waits in the line, so the two orders agree), and the room
        kept, per account of ``chain``, for the runs under way and those getting their first
        hold before it (tokens, money)."""
        now = time.monotonic()
        with self._lock:
            mine = self._runs.get(account)
            if mine is None:
                order = ticket if ticket is not None else next(self._order)
                mine = self._runs[account] = _Run(order, chain, hold, until, True)
            else:
                mine.hold, mine.until = hold, until
            kept: dict[str, tuple[float, float]] = {}
            for name, run in list(self._runs.items()):
                if run.until <= now:
                    del self._runs[name]
                    continue
                if run is mine or (run.first and run.order > mine.order):
                    continue
                times = 2 if run.first else 1
                for shared in run.chain & chain:
                    tokens, money = kept.get(shared, (0.0, 0.0))
                    kept[shared] = (tokens + times * run.hold[0], money + times * run.hold[1])
            return kept

    def under_way(
        self, account: str, chain: frozenset[str] | None, hold: tuple[int, int], until: float
    ) -> None:
        """``account``'s run took a step holding ``hold``: under way until ``until``
        (``chain``: the accounts above it, ``None`` when it is known already)."""
        with self._lock:
            run = self._runs.get(account)
            if run is None:
                if not chain:
                    return  # it shares no pool: nothing to keep for it
                now = time.monotonic()
                for name in [name for name, other in self._runs.items() if other.until <= now]:
                    del self._runs[name]  # lapsed: a crashed or abandoned run's
                run = self._runs[account] = _Run(next(self._order), chain, hold, until, False)
            run.hold, run.until, run.first = hold, until, False

    def gone(self, account: str, *, only_first: bool = False) -> None:
        with self._lock:
            run = self._runs.get(account)
            if run is not None and (run.first or not only_first):
                del self._runs[account]


# Per ledger object (never per name a caller chooses); gone with the ledger.
_LINES: weakref.WeakKeyDictionary[Ledger, _Line] = weakref.WeakKeyDictionary()
# Per books a ledger names (a file, a database): one line for every ledger object on them, so
# graphs built per request on one saver keep their runs' turns. Few, and kept for the process.
_NAMED_LINES: dict[str, _Line] = {}
_LINES_LOCK = threading.Lock()


def _line(ledger: Ledger) -> _Line:
    books = ledger.books
    with _LINES_LOCK:
        line = _LINES.get(ledger) if books is None else _NAMED_LINES.get(books)
        if line is None:
            line = _Line()
            if books is None:
                _LINES[ledger] = line
            else:
                _NAMED_LINES[books] = line
        return line


def run_ended(ledger: Ledger, account: str) -> None:
    """The run of ``account`` ended: it is no longer under way on ``ledger``'s line."""
    books = ledger.books
    with _LINES_LOCK:
        line = _LINES.get(ledger) if books is None else _NAMED_LINES.get(books)
    if line is not None:
        line.gone(account)


async def _busy_for_others(io: NodeIO, account: str, refused: BudgetExhausted) -> BudgetExhausted:
    """``refused`` as it stands once the run's own reservations in flight (an attempt a crash
    left unsettled) are counted as spent: busy only if other runs' steps in flight hold the
    room (``reservations.others_hold_the_room``), else a refusal the spending makes. Waiting
    for an attempt nothing will settle would last until the run's deadline."""
    above, limit, asked = refused.account, refused.limit, refused.requested
    if refused.axis is None or above is None or limit is None or asked is None:
        return refused
    axis = refused.axis.value
    own = (await io.in_flight(account)).get(axis, 0.0)
    if own <= 0:
        return refused
    balance = await io.balance(above)
    flying = (await io.in_flight(above)).get(axis, 0.0)
    if others_hold_the_room(refused, held=balance.held.get(axis, 0.0), flying=flying, own=own):
        return refused
    return exhausted(above, axis, limit, asked)


def _kept_until(io: NodeIO, deadline_left: float | None) -> float:
    """When what a run under way keeps lapses, read on ``time.monotonic``: its deadline, or
    the longest its step may take and then the longest a step may wait, from now."""
    lasts = io.cfg.model_timeout_seconds + MAX_STEP_WAIT_SECONDS
    if deadline_left is not None:
        lasts = min(lasts, deadline_left)
    return time.monotonic() + lasts


async def hold_step(
    io: NodeIO,
    run: RunAccount,
    ctx: RunContext,
    key: str,
    hold: Callable[[], Awaitable[tuple[int, int]]],
    *,
    under_way: bool,
) -> tuple[Reservation | StopRequest, tuple[int, int]]:
    """Reserve a model step of the run on account ``run`` under ``key``, holding what ``hold``
    says (tokens, by ``reservations.step_hold``, and money's micro-units, by
    ``decide.StepPlan.hold``, of the facts it gathers, read again after every refusal), waiting
    its turn and for steps in flight while the ledger says it is busy, and, for a new run's
    first step (not ``under_way``: the run has taken no step yet), for runs under way to take
    theirs (``reservations.first_step_admitted``); the reservation, or the stop its refusal
    means, and the tokens and money held."""
    line = _line(io.ledger)
    account = run.name
    ticket: int | None = None
    chain: frozenset[str] | None = None
    held_step = False
    waited, attempt = 0.0, 0
    clock = io.cfg.clock
    try:
        while True:
            estimate = await hold()
            deadline_left = (
                ctx.deadline.remaining_seconds(clock=clock) if ctx.deadline is not None else None
            )
            if any(estimate) and chain is None:
                # The pools this step waits on: steps waiting on others are never ahead of it.
                chain = (line.chain_of(account) if under_way else None) or frozenset(
                    name for name, _ in await chain_pools(io, ctx, _AXES)
                )
            if ticket is None and line.ahead(under_way, chain):
                ticket = line.join(under_way, account, chain)
            if ticket is not None and not line.first(ticket):
                pause = step_wait(waited=waited, attempt=attempt, deadline_left=deadline_left)
                if pause is not None:
                    await io.pause(pause)
                    waited, attempt = waited + pause, attempt + 1
                    continue
                # waited as long as it may: it asks the ledger, out of turn, once
            if not under_way and any(estimate) and chain:
                kept = line.counted(
                    account, chain, estimate, _kept_until(io, deadline_left), ticket
                )
                # Read after counting: a run counted as under way took its hold before, so the
                # hold is in what is read; one still getting it is counted with it.
                pools = await chain_pools(io, ctx, _AXES)
                shares = [
                    PoolShare(name, axis, unspent, flying, kept.get(name, (0.0, 0.0))[n])
                    for name, facts in pools
                    for n, axis in enumerate(_AXES)
                    if axis in facts
                    for unspent, flying in (facts[axis],)
                ]
                if not first_step_admitted(step_amounts(*estimate), shares):
                    pause = step_wait(waited=waited, attempt=attempt, deadline_left=deadline_left)
                    if pause is not None:
                        if ticket is None:
                            ticket = line.join(under_way, account, chain)
                        await io.pause(pause)
                        waited, attempt = waited + pause, attempt + 1
                        continue
                    # waited as long as it may: it asks the ledger, out of turn, once
            held = await reserve_or_exhausted(io, run, ctx, key, step_amounts(*estimate))
            if not isinstance(held, BudgetExhausted):
                if any(estimate):
                    line.under_way(account, chain, estimate, _kept_until(io, deadline_left))
                    held_step = True
                return held, estimate
            if held.busy and held.account != account and held.window is None:
                held = await _busy_for_others(io, account, held)
            on = 1 if held.axis is BudgetAxis.MONEY else 0
            pause = after_step_refused(
                held,
                account=account,
                asked=estimate[on],
                hold_now=(await hold())[on] if not held.busy else estimate[on],
                waited=waited,
                attempt=attempt,
                deadline_left=deadline_left,
            )
            if pause is None:
                left = (
                    ctx.deadline.remaining_seconds(clock=clock)
                    if ctx.deadline is not None
                    else None
                )
                return refused_step_stop(held, deadline_left=left), estimate
            if pause > 0:
                if ticket is None:
                    ticket = line.join(under_way, account, chain)
                await io.pause(pause)
                waited, attempt = waited + pause, attempt + 1
    finally:
        if ticket is not None:
            line.leave(ticket)
        if not held_step:
            # A new run that got no step is not under way: the room counted for it is free.
            line.gone(account, only_first=True)
