"""How a run's ending is checked against the ledger: the terminal node closes the run's account
before it writes an ending, and judges a completed stop by the account's completion markers,
only when the account is the caller's."""

from __future__ import annotations

from fencepost.graph.account import account_of, pending_work, produced
from fencepost.graph.node_io import NodeIO
from fencepost.policy import AgentState, Phase, TerminationReason, UnknownAccount
from fencepost.policy.context import RunContext
from fencepost.policy.keys import started_key
from fencepost.policy.outcome import receipt_for
from fencepost.policy.ownership import check_owner
from fencepost.policy.state import stop
from fencepost.policy.stopping import started_unreported
from fencepost.policy.tasks import unfinished


async def owned(
    io: NodeIO, account: str, ctx: RunContext | None, run_id: str | None = None
) -> bool | None:
    """Whether the ledger's ``account`` was opened for the caller in ``ctx`` (and the run
    ``run_id``; None: the ledger has no such account). The terminal node closes, and judges by,
    only an account that is the caller's: a stop's error code is a state edit away from saying
    anything."""
    try:
        balance = await io.balance(account)
    except UnknownAccount:
        return None
    return ctx is not None and check_owner(balance.owner, ctx, run_id) is None


async def unverified_ending(io: NodeIO, state: AgentState) -> AgentState | None:
    """``state`` sent back to be ended by the terminal node, if it reads ``completed`` while
    the run's ledger account is open or closed for another reason: the terminal node closes the
    account with its reason before it writes an ending, so such a state was written by a caller
    (``update_state``). It ends with the reason the ledger closed it with, else
    ``policy_denied``, ``invalid_state``. None if the ending stands (not ``completed``, the
    account closed ``completed``, or no account to ask: one the graph's own ledger forgot)."""
    if state.termination is not TerminationReason.COMPLETED:
        return None
    try:
        closed = (await io.balance(account_of(state))).closed
    except UnknownAccount:
        return None
    if closed == TerminationReason.COMPLETED.value:
        return None
    reason = _REASONS.get(closed, TerminationReason.POLICY_DENIED)
    return state.model_copy(update={**_UNENDED, "stop": stop(reason, "invalid_state")})


_REASONS: dict[str | None, TerminationReason] = {r.value: r for r in TerminationReason}


_UNENDED = {"phase": Phase.OBSERVE, "termination": None, "final_answer": None, "report": None}


async def pending_at_end(io: NodeIO, state: AgentState, mine: bool | None) -> tuple[str, ...]:
    """:func:`pending_work` for judging a stop at the end. Every accepted task is pending when
    the account is not provably the caller's (its markers are another run's, or the ledger
    holds no such account: a receipt in state is no marker). ``mine``: what :func:`owned` says
    of the run's account."""
    if not mine:
        return tuple(r.task_id or r.call_id for r in unfinished(state.receipts, ()))
    return await pending_work(io, state)


async def receipt_started(io: NodeIO, state: AgentState, account: str) -> AgentState:
    """``state`` with an ``uncertain`` receipt for each call of its batch the ledger shows
    started and no receipt reports: a run ending while such a call still runs (a cancel's record
    made beside it) or after its worker died keeps the call's id and effect, instead of
    reporting a call that never started (see ``stopping.started_unreported``)."""
    if not state.batch:
        return state
    receipted = {r.call_id for r in state.receipts[-len(state.batch) :]}
    unreported = [e.call_id for e in state.batch if e.call_id not in receipted]
    if not unreported:
        return state
    started = [c for c in unreported if await io.get(started_key(account, c, 1)) is not None]
    if not started:
        return state
    outcomes = started_unreported(state.batch, receipted, started, io.cfg.registry)
    return state.model_copy(
        update={"receipts": state.receipts + tuple(receipt_for(o) for o in outcomes)}
    )


async def produced_at_end(
    io: NodeIO, state: AgentState, mine: bool | None, citations: tuple[str, ...]
) -> frozenset[str]:
    """Which of a completed stop's ``citations`` the ledger marks as produced by a tool of the
    run (``keys.result_key``), judged as :func:`pending_at_end` judges tasks: none when the
    account is not provably the caller's (or the ledger holds no such account)."""
    if not mine:
        return frozenset()
    return await produced(io, account_of(state), citations)
