"""The line model steps wait in for room in a shared budget, and the wait itself.

Busy is not exhausted: a model step whose hold the ledger refuses only because other steps in
flight hold the room (``BudgetExhausted.busy``) waits for them to settle, then reserves
(``reservations.after_step_refused`` decides; this module does the waiting). Waiting steps
take their turns first come, first served, runs already under way before new ones, so work
under way finishes before new work takes the pool: while a step waits, another step of this
process sharing its ledger reserves only if no step ahead of it waits. The line is per ledger
object and process; steps of other processes are not in it, and take the room when they find
it (a waiting step asks the ledger again after each pause).

A sync graph pauses its thread (``time.sleep``), an async one its task (``asyncio.sleep``):
neither spins.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Awaitable, Callable

from fencepost.graph.account import account_of, reserve_or_exhausted
from fencepost.graph.node_io import NodeIO
from fencepost.policy import AgentState, BudgetAxis, BudgetExhausted, Reservation, StopRequest
from fencepost.policy.context import RunContext
from fencepost.policy.ledger import Ledger
from fencepost.policy.reservations import (
    after_step_refused,
    step_amounts,
    step_wait,
    stop_for_exhausted,
)

__all__ = ["hold_step"]


class _Line:
    """The model steps of one process waiting on one ledger, in their turn's order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._order = itertools.count()
        self._waiting: dict[int, tuple[int, int]] = {}
        """ticket -> (0 for a run under way, 1 for a new one; when it joined)."""

    def join(self, under_way: bool) -> int:
        with self._lock:
            ticket = next(self._order)
            self._waiting[ticket] = (0 if under_way else 1, ticket)
            return ticket

    def leave(self, ticket: int) -> None:
        with self._lock:
            self._waiting.pop(ticket, None)

    def first(self, ticket: int) -> bool:
        """Whether no step waiting goes before ``ticket``'s."""
        with self._lock:
            mine = self._waiting[ticket]
            return all(place >= mine for place in self._waiting.values())

    def ahead(self, under_way: bool) -> bool:
        """Whether a step waits that goes before a step not yet in the line (one of a run
        under way goes before a new run's; among equals, the one waiting already)."""
        kind = 0 if under_way else 1
        with self._lock:
            return any(place[0] <= kind for place in self._waiting.values())


# Per ledger object (never per name a caller chooses); gone with the ledger.
_LINES: weakref.WeakKeyDictionary[Ledger, _Line] = weakref.WeakKeyDictionary()
_LINES_LOCK = threading.Lock()


def _line(ledger: Ledger) -> _Line:
    with _LINES_LOCK:
        line = _LINES.get(ledger)
        if line is None:
            line = _LINES[ledger] = _Line()
        return line


async def hold_step(
    io: NodeIO,
    state: AgentState,
    ctx: RunContext,
    key: str,
    hold: Callable[[AgentState], Awaitable[tuple[int, int]]],
) -> tuple[Reservation | StopRequest, tuple[int, int]]:
    """Reserve a model step under ``key``, holding what ``hold`` says (tokens, by
    ``reservations.step_hold``, and money's micro-units, by ``pricing.step_money_hold``, of the
    facts it gathers, read again after every refusal), waiting its turn and for steps in flight
    while the ledger says it is busy; the reservation, or the stop its refusal means, and the
    tokens and money held."""
    line = _line(io.ledger)
    account = account_of(state)
    under_way = state.step > 0
    ticket: int | None = None
    waited, attempt = 0.0, 0
    clock = io.cfg.clock
    try:
        while True:
            estimate = await hold(state)
            deadline_left = (
                ctx.deadline.remaining_seconds(clock=clock) if ctx.deadline is not None else None
            )
            if ticket is None and line.ahead(under_way):
                ticket = line.join(under_way)
            if ticket is not None and not line.first(ticket):
                pause = step_wait(waited=waited, attempt=attempt, deadline_left=deadline_left)
                if pause is not None:
                    await io.pause(pause)
                    waited, attempt = waited + pause, attempt + 1
                    continue
                # waited as long as it may: it asks the ledger, out of turn, once
            held = await reserve_or_exhausted(io, state, ctx, key, step_amounts(*estimate))
            if not isinstance(held, BudgetExhausted):
                return held, estimate
            on = 1 if held.axis is BudgetAxis.MONEY else 0
            pause = after_step_refused(
                held,
                account=account,
                asked=estimate[on],
                hold_now=(await hold(state))[on] if not held.busy else estimate[on],
                waited=waited,
                attempt=attempt,
                deadline_left=deadline_left,
            )
            if pause is None:
                return stop_for_exhausted(held), estimate
            if pause > 0:
                if ticket is None:
                    ticket = line.join(under_way)
                await io.pause(pause)
                waited, attempt = waited + pause, attempt + 1
    finally:
        if ticket is not None:
            line.leave(ticket)
