"""The run's ledger account: opening it, reserving on it, and the budget view it gives state.

The account is named from the checkpoint thread and the run id (never from the identity in state),
and records the identity it was opened for: every reservation checks that owner against the
caller's trusted context. Its limits and owner are the ledger's alone: an account the ledger does
not hold (a ledger that never saw the run, or lost it with its process) is never opened again from
what state says, and the run is refused (``unknown_budget_account``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.config import get_config

from fencepost.graph.events import EVENTS
from fencepost.graph.node_io import NodeIO
from fencepost.policy import (
    AgentState,
    Balance,
    BudgetAxis,
    BudgetExhausted,
    LedgerConflict,
    Receipt,
    Reservation,
    StopRequest,
    TerminationReason,
    UnknownAccount,
)
from fencepost.policy.approval import Acting, acting_context
from fencepost.policy.batch import Batch
from fencepost.policy.budget import budget_view
from fencepost.policy.context import RunContext
from fencepost.policy.gating import after_reservations
from fencepost.policy.keys import (
    approver_key,
    call_key,
    claim_key,
    completed_key,
    overage_key,
    result_key,
    run_account,
    started_key,
    step_key,
    task_run_id,
)
from fencepost.policy.ledger import AccountClosed, Attempt, BatchHeld, InMemoryLedger
from fencepost.policy.outcome import CallOutcome
from fencepost.policy.ownership import check_funding, check_owner, run_owner
from fencepost.policy.pricing import to_micros
from fencepost.policy.reservations import (
    call_amounts,
    stop_for_closed,
    stop_for_conflict,
    stop_for_exhausted,
    stop_for_unknown_account,
    to_reserve,
)
from fencepost.policy.tasks import (
    accepting,
    completions,
    evidence_ids,
    recorded_done,
    unfinished,
    waited_for,
)
from fencepost.policy.terminate import AnswerFacts


def _thread() -> tuple[str, str]:
    """The node's checkpoint thread and its graph's namespace ("" at the top level): a node's
    own namespace ends with its task (``node:task-id``); a graph invoked from a parent graph's
    node runs under that node's namespace, on the parent's thread."""
    try:
        configurable = get_config().get("configurable") or {}
    except RuntimeError:
        return "", ""
    value = configurable.get("thread_id")
    # "|" joins namespace levels (LangGraph's NS_SEP, private since 1.0).
    namespace = str(configurable.get("checkpoint_ns") or "").rpartition("|")[0]
    return ("" if value is None else str(value)), namespace


def started_run_id() -> str | None:
    """The run id a start that names none gets on this node's thread (``keys.task_run_id``);
    None off a thread (no checkpointer): a generated one then."""
    try:
        configurable = get_config().get("configurable") or {}
    except RuntimeError:
        return None
    thread, namespace = configurable.get("thread_id"), configurable.get("checkpoint_ns")
    if thread is None or not namespace:
        return None
    return task_run_id(str(thread), str(namespace))


def account_of(state: AgentState) -> str:
    """The ledger account of the run in ``state`` on this node's thread (and namespace)."""
    thread, namespace = _thread()
    return run_account(thread, state.run_id, namespace, len(state.turns), state.branch)


@dataclass(frozen=True, slots=True)
class RunAccount:
    """The run's ledger account as a node names it once (:func:`run_account_of`): its ``name``
    and the run it was opened for, whose id every reservation on it checks the account's
    recorded owner against (``ownership.check_owner``). What the ledger says of the run is
    read through it, never through the run's state: a step's reservations, settlements and
    markers take the account, and state takes the budget view they give back."""

    name: str
    run_id: str


def run_account_of(state: AgentState) -> RunAccount:
    """The :class:`RunAccount` of the run in ``state`` on this node's thread."""
    return RunAccount(account_of(state), state.run_id)


async def open_run(io: NodeIO, state: AgentState, ctx: RunContext) -> StopRequest | AgentState:
    """Open a new run's ledger account under the caller's parent account, owned by the caller.

    A parent account that records an owner funds only what it owns or grants: naming another
    tenant's pool, or another principal's account or run account, spends nothing of it.
    """
    refused = await check_parent(io, ctx)
    if refused is not None:
        return refused
    try:
        balance = await io.open_account(
            account_of(state),
            state.budget.limits(),
            parent=ctx.budget_account,
            owner=run_owner(ctx, state.run_id),
        )
    except UnknownAccount:
        return stop_for_unknown_account()
    except LedgerConflict:
        again = await _opened_before(io, state, ctx)
        if again is None:
            return stop_for_conflict()
        balance = again
    except ValueError:
        return stop_for_conflict()
    return with_budget_view(state, balance)


async def _opened_before(io: NodeIO, state: AgentState, ctx: RunContext) -> Balance | None:
    """The run's account as an earlier attempt of this same first step opened it (a crash
    before its checkpoint), for the same caller and run holding other capabilities now: the
    capabilities recorded first stand. ``None``: the account is somebody else's, or was opened
    with another parent or other limits (a conflict)."""
    account = account_of(state)
    try:
        opened = await io.balance(account)
        if check_owner(opened.owner, ctx, state.run_id) is not None:
            return None
        return await io.open_account(
            account, state.budget.limits(), parent=ctx.budget_account, owner=opened.owner
        )
    except (UnknownAccount, LedgerConflict, ValueError):
        return None


async def check_parent(io: NodeIO, ctx: RunContext) -> StopRequest | None:
    """Whether the caller may open a run under the parent account its context names: one its
    principal owns or was granted (``ownership.check_funding``), never another's run account."""
    if ctx.budget_account is None:
        return None
    try:
        parent = await io.balance(ctx.budget_account)
    except UnknownAccount:
        return stop_for_unknown_account()
    except ValueError:
        return stop_for_conflict()
    return check_funding(parent.owner, ctx)


async def produced(io: NodeIO, account: str, calls: Iterable[str]) -> frozenset[str]:
    """Which of ``calls`` the ledger marks as having had their tool return a result
    (``result_key``): the only calls a citation may name or a dependency may wait on."""
    return frozenset([c for c in calls if await io.get(result_key(account, c)) is not None])


async def mark_result(
    io: NodeIO, state: AgentState, ctx: RunContext, account: str, call_id: str
) -> None:
    """Mark in the ledger that ``call_id``'s tool returned a result, before its attempt is
    settled. A refused marker (a cancel closed the account meanwhile) leaves the result
    unmarked, so never citable, and is no stop of its own: the call did run, and its outcome
    stands (the closed account refuses the run's next step)."""
    await reserve(io, RunAccount(account, state.run_id), ctx, result_key(account, call_id), {})


def node_thread() -> tuple[str, str]:
    """The node's checkpoint thread and its graph's namespace (``("", "")`` off a thread):
    read in the node, for work that runs off its context (a batch on its own event loop)."""
    return _thread()


async def begin_attempt(
    io: NodeIO, account: str, run_id: str, call_id: str, attempt: int, where: tuple[str, str]
) -> Attempt | StopRequest:
    """Claim ``call_id`` for this run on its checkpoint thread (``keys.claim_key``; its first
    attempt only, and off a thread, where there is no fork, never) and write the attempt's start
    marker (``keys.started_key``), in one ledger write (``Ledger.begin_attempt``); or the stop a
    refusal means. ``Attempt.claimed`` is False where another run of the thread holds the claim
    (the run a fork branches from, or another branch: it ran there, or may have); no marker is
    written then. ``where``: the node's thread and namespace (:func:`node_thread`). The
    account's owner was checked on the attempt's reservation just before, in the same node: an
    account's owner never changes."""
    thread, namespace = where
    claim = claim_key(thread, namespace, run_id, call_id) if attempt == 1 and thread else None
    try:
        return await io.begin_attempt(account, started_key(account, call_id, attempt), claim=claim)
    except AccountClosed as exc:
        return stop_for_closed(exc.reason)
    except UnknownAccount:
        return stop_for_unknown_account()
    except ValueError:
        return stop_for_conflict()


async def start_attempt(
    io: NodeIO,
    run: RunAccount,
    ctx: RunContext,
    call_id: str,
    where: tuple[str, str],
    *,
    begins: Callable[[Reservation], bool],
) -> tuple[Reservation | StopRequest | None, Attempt | StopRequest | None]:
    """:func:`reserved_before` and :func:`begin_attempt` of a call's first attempt in one
    ledger step (``Ledger.start_attempt``): the reservation the gate made (``None``: none was,
    or the stop a refusal means), and the attempt begun where the account's owner is the
    caller and ``begins`` (the claim's rule) accepts that reservation (``None``: not begun,
    nothing written; or the stop a refusal means). The owner is checked before anything is
    written on the account, as the two steps check it."""
    account = run.name
    thread, namespace = where
    claim = claim_key(thread, namespace, run.run_id, call_id) if thread else None

    def owned(held: Reservation) -> bool:
        return held.balance is None or check_owner(held.balance.owner, ctx, run.run_id) is None

    try:
        found, begun = await io.start_attempt(
            account,
            call_key(account, call_id, 1),
            started_key(account, call_id, 1),
            claim=claim,
            begins=lambda held: owned(held) and begins(held),
        )
    except (AccountClosed, UnknownAccount, ValueError) as refusal:
        return _stop_for(refusal), None
    if begun is None and found is not None and found.balance is not None:
        # Begun means the judge found the owner to be the caller; not begun may mean it did not.
        refused = check_owner(found.balance.owner, ctx, run.run_id)
        if refused is not None:
            return refused, None
    return found, begun


async def finish_attempt(
    io: NodeIO, account: str, call_id: str, attempt: int, *, produced: bool
) -> Reservation:
    """Settle an attempt of ``call_id``, first marking (``produced``: its tool returned a
    result) that result in the ledger (``keys.result_key``), in one ledger write
    (``Ledger.finish_attempt``). A refused marker (a cancel closed the account meanwhile)
    leaves the result unmarked, so never citable, and stops nothing: the call did run."""
    return await io.finish_attempt(
        account,
        call_key(account, call_id, attempt),
        result=result_key(account, call_id) if produced else None,
    )


async def marked_done(io: NodeIO, account: str, calls: Iterable[str]) -> frozenset[str]:
    """Which of the accepting ``calls`` the ledger marks as shown done (``completed_key``)."""
    return frozenset([c for c in calls if await io.get(completed_key(account, c)) is not None])


async def pending_work(io: NodeIO, account: str, receipts: tuple[Receipt, ...]) -> tuple[str, ...]:
    """The tasks (or call ids) accepted work still waits on, judged by the ledger's markers on
    the run's ``account``: a receipt in state saying ``completed`` is not enough (a caller can
    append one), and one saying ``accepted_pending`` counts only for a call the ledger shows
    started."""
    accepted = accepting(receipts)
    started = frozenset(
        [r.call_id for r in accepted if await io.get(_started(account, r)) is not None]
    )
    marked = await marked_done(io, account, started)
    return tuple(r.task_id or r.call_id for r in unfinished(receipts, marked, started))


async def answer_facts(
    io: NodeIO, account: str, state: AgentState, citations: Iterable[str]
) -> AnswerFacts:
    """The ledger's facts, on the run's ``account``, about a final answer of the run in
    ``state`` citing ``citations`` (``terminate.AnswerFacts``): the work accepted that it still
    waits on (:func:`pending_work`) and what it may cite: the run's evidence
    (``tasks.evidence_ids``) among the cited calls the ledger marks as having had their tool
    return a result (:func:`produced`)."""
    pending = await pending_work(io, account, state.receipts)
    # Citations are the model's output, unbounded: only a call the run holds a result of can
    # be evidence, so only those cost the ledger a read.
    observed = {o.call_id for o in state.observations}
    made = await produced(io, account, [c for c in citations if c in observed])
    return AnswerFacts(pending, evidence_ids(state.receipts, state.observations, made))


def _started(account: str, receipt: Receipt) -> str:
    return started_key(account, receipt.call_id, max(1, receipt.attempts))


async def certify(
    io: NodeIO,
    state: AgentState,
    ctx: RunContext,
    receipts: tuple[Receipt, ...],
    outcomes: Sequence[CallOutcome],
) -> tuple[tuple[Receipt, ...], StopRequest | None]:
    """The completion receipts ``outcomes`` show (see ``tasks.completions``), each certified by
    its ``completed_key`` marker in the ledger first: a zero-amount reservation, idempotent by
    key, durable before the receipt reaches state (a crash in between re-derives it on the
    re-run, or leaves the marker merely early: it is written only on verified evidence).

    A refused marker (a closed account, another owner) records no completion and is the stop.
    """
    if not any(o.completes is not None for o in outcomes):
        return (), None
    run = run_account_of(state)
    account = run.name
    done = completions(
        receipts,
        outcomes,
        await marked_done(io, account, recorded_done(receipts)),
        waited=waited_for(state.pending),
    )
    for receipt in done:
        key = completed_key(account, receipt.call_id)
        held = await reserve(io, run, ctx, key, {})
        if isinstance(held, StopRequest):
            return (), held
    return done, None


async def reserve(
    io: NodeIO, run: RunAccount, ctx: RunContext, key: str, amounts: Mapping[str, float]
) -> Reservation | StopRequest:
    """Reserve ``amounts`` under ``key`` on the run's account, or the stop the refusal means."""
    held = await reserve_or_exhausted(io, run, ctx, key, amounts)
    return stop_for_exhausted(held) if isinstance(held, BudgetExhausted) else held


async def reserve_or_exhausted(
    io: NodeIO, run: RunAccount, ctx: RunContext, key: str, amounts: Mapping[str, float]
) -> Reservation | StopRequest | BudgetExhausted:
    """As :func:`reserve`, but a budget that cannot cover ``amounts`` comes back as data (a batch
    reserves call by call and marks the ones that do not fit).

    Checks the account's recorded owner against the caller and ``run``'s id: a state update
    that rewrote the run's identity lands here, on an account opened for somebody else, and is
    refused. An account the ledger does not hold is never opened here (its limits and owner
    would be read from state): the run is refused.
    """
    try:
        held = await io.reserve(run.name, key, amounts)
    except BudgetExhausted as exc:
        return exc
    except AccountClosed as exc:
        return stop_for_closed(exc.reason)
    except UnknownAccount:
        return stop_for_unknown_account()
    except (LedgerConflict, ValueError):
        return stop_for_conflict()
    if held.balance is not None:
        refused = check_owner(held.balance.owner, ctx, run.run_id)
        if refused is not None:
            if not held.existing:
                # Made on somebody else's account for a caller it refuses: given back, so
                # the owner is charged nothing for it.
                with contextlib.suppress(LookupError, ValueError):
                    await io.release(key)
            return refused
    return held


async def release_reserved(io: NodeIO, key: str) -> Balance | None:
    """Give back the reservation under ``key`` (a call that never started); the account's
    balance after it, or ``None`` where the ledger holds no such reservation to give back."""
    try:
        freed = await io.release(key)
    except (LookupError, ValueError):
        return None
    return freed.balance


async def charge(
    io: NodeIO,
    key: str,
    amounts: Mapping[str, float],
    *,
    account: str,
    of: str | None = None,
) -> Reservation | StopRequest:
    """Charge usage already spent on the run's ``account`` (``Ledger.charge``: past any limit,
    even closed; counted in the spend windows of reservation ``of``), or the stop a refusal
    means. Called after a reservation on the same account checked its owner in the same node."""
    try:
        return await io.charge(account, key, amounts, of=of)
    except UnknownAccount:
        return stop_for_unknown_account()
    except (LedgerConflict, ValueError):
        return stop_for_conflict()


_MAX_CHAIN = 1000
"""How far up a parent chain :func:`tokens_left` reads, as the ledgers walk it."""


@dataclass(frozen=True, slots=True)
class ChainLeft:
    """What the run's chain (its account and up its parents) has not spent, as a model step's
    hold reads it: ``None`` on an axis nothing limits (or that was not read)."""

    tokens: float | None = None
    money: float | None = None
    """In the ledger's micro-units."""


async def chain_left(
    io: NodeIO, state: AgentState, ctx: RunContext, axes: Collection[BudgetAxis]
) -> ChainLeft:
    """The fewest units any account of the run's chain has not spent on each of ``axes``
    (tokens, money), in one walk of the chain. What other runs' steps hold in flight counts as
    left: it comes back, less what they spend, when they settle (a step it crowds out waits,
    see ``reservations.after_step_refused``). The run's own from its budget view (the
    ledger's, as last written: between its steps nothing of its own is in flight), its
    parents' read from the ledger. Only sizes a step's hold: the reservation is what the
    ledger checks, so a parent that cannot be read is left to it to refuse."""
    least: dict[BudgetAxis, float | None] = {}
    for axis in axes:
        least[axis] = (
            float(to_micros(state.budget.money_remaining))
            if axis is BudgetAxis.MONEY and state.budget.money_remaining is not None
            else state.budget.remaining(axis)
        )
    name = ctx.budget_account if axes else None
    for _ in range(_MAX_CHAIN):
        if name is None:
            break
        try:
            balance = await io.balance(name)
            limited = {a: balance.remaining(a.value) for a in axes}
            if any(left is not None for left in limited.values()):
                flying = await io.in_flight(name)
                limited = {
                    a: left + flying.get(a.value, 0.0) if left is not None else None
                    for a, left in limited.items()
                }
        except (UnknownAccount, ValueError):
            break
        for axis, left in limited.items():
            if left is not None:
                now = least[axis]
                least[axis] = left if now is None else min(now, left)
        name = balance.parent
    return ChainLeft(tokens=least.get(BudgetAxis.TOKENS), money=least.get(BudgetAxis.MONEY))


async def tokens_left(io: NodeIO, state: AgentState, ctx: RunContext) -> float | None:
    """The fewest tokens any account of the run's chain has not spent (:func:`chain_left`);
    ``None`` when none limits tokens."""
    return (await chain_left(io, state, ctx, (BudgetAxis.TOKENS,))).tokens


async def chain_pools(
    io: NodeIO, ctx: RunContext, axes: Sequence[str]
) -> list[tuple[str, dict[str, tuple[float, float]]]]:
    """The accounts a run's account is funded by (``ctx.budget_account`` and up its parents),
    nearest first, each with what it has not spent and what is in flight on each of ``axes``
    it limits: the pool runs share. An account that cannot be read ends the walk (the
    reservation is what the ledger checks)."""
    pools: list[tuple[str, dict[str, tuple[float, float]]]] = []
    name = ctx.budget_account
    for _ in range(_MAX_CHAIN):
        if name is None:
            break
        try:
            balance = await io.balance(name)
            limited = [axis for axis in axes if axis in balance.limits]
            flying = await io.in_flight(name) if limited else {}
        except (UnknownAccount, ValueError):
            break
        facts: dict[str, tuple[float, float]] = {}
        for axis in limited:
            held = flying.get(axis, 0.0)
            facts[axis] = (balance.limits[axis] - balance.held.get(axis, 0.0) + held, held)
        pools.append((name, facts))
        name = balance.parent
    return pools


def with_budget_view(state: AgentState, balance: Balance | None) -> AgentState:
    """``state`` with its budget view rewritten from the ledger's balance of the run account."""
    if balance is None:
        return state
    return state.model_copy(update={"budget": budget_view(balance.limits, balance.held)})


StepSettlement = tuple[str, Mapping[str, float] | None]
"""A model step's settlement not written yet: its reservation's key and the actual amounts."""


@dataclass(frozen=True, slots=True)
class StepFacts:
    """What the ledger says before a model step is planned: the context the step acts in
    (:func:`acting_in`) and, where asked, what the run's chain has left of money
    (:func:`chain_left`; ``None``: nothing limits it, or it was not read)."""

    acting: Acting
    money_left: float | None = None


async def step_facts(
    io: NodeIO, run: RunAccount, state: AgentState, ctx: RunContext | None, *, money: bool
) -> StepFacts:
    """The ledger's facts a model step of the run on account ``run`` is planned on
    (:class:`StepFacts`), read together before the plan; the chain's money only when ``money``
    (``decide.reads_money_limit``) and the step acts in a context of its own (one waiting for
    its requester acts in none yet)."""
    acting = await acting_in(io, state, ctx, account=run.name)
    if not money or acting.context is None or acting.waits_for_requester:
        return StepFacts(acting)
    left = await chain_left(io, state, acting.context, (BudgetAxis.MONEY,))
    return StepFacts(acting, left.money)


@dataclass(frozen=True, slots=True)
class StepWritten:
    """A model step's settlement as written: the run with the budget view the ledger gave it,
    the charge of what it spent past its hold (``None``: nothing past it), and the
    settlement that waits to be written with the calls' holds (``later``)."""

    state: AgentState
    charged: Reservation | StopRequest | None
    later: StepSettlement | None


async def write_step(
    io: NodeIO,
    account: str,
    state: AgentState,
    actual: Mapping[str, float],
    overage: Mapping[str, float],
    *,
    now: bool,
) -> StepWritten:
    """Settle the run's model step (``state.step``) on its ``account`` at ``actual`` (``now``;
    else it waits: :class:`StepWritten` ``later``), and charge ``overage`` (spent already:
    charged whatever the limits say, in the window the step was held in), as the step's
    settlement plan says."""
    key = step_key(account, state.step)
    if not now:
        return StepWritten(state, None, (key, actual))
    state = with_budget_view(state, (await io.settle(key, actual)).balance)
    if not overage:
        return StepWritten(state, None, None)
    charged = await charge(io, overage_key(account, state.step), overage, account=account, of=key)
    if isinstance(charged, Reservation):
        state = with_budget_view(state, charged.balance)
    return StepWritten(state, charged, None)


async def settle_pending(io: NodeIO, settle: StepSettlement | None) -> None:
    """Write a step's settlement that waited (:func:`settles_as_held`) where no call of its
    came to be held with it: idempotent by key, so once however often it is asked."""
    if settle is not None:
        await io.settle(*settle)


async def _settled_and_held(
    io: NodeIO,
    run: RunAccount,
    ctx: RunContext,
    settle: StepSettlement,
    holds: Sequence[tuple[str, Mapping[str, float]]],
) -> list[Reservation | BudgetExhausted] | StopRequest:
    """Settle the step and hold the calls in one ledger write; each call's reservation, or the
    ``BudgetExhausted`` that refused it, or the stop a refusal of the run means. The owner is
    checked as :func:`reserve_or_exhausted` checks it (what was held for a caller it refuses
    is given back)."""
    try:
        _, held = await io.settle_and_reserve(*settle, run.name, holds)
    except AccountClosed as exc:
        return stop_for_closed(exc.reason)
    except UnknownAccount:
        return stop_for_unknown_account()
    except (LedgerConflict, ValueError):
        return stop_for_conflict()
    made = [h for h in held if isinstance(h, Reservation)]
    if made and made[0].balance is not None:
        refused = check_owner(made[0].balance.owner, ctx, run.run_id)
        if refused is not None:
            for reservation in made:
                if not reservation.existing:
                    with contextlib.suppress(LookupError, ValueError):
                        await io.release(reservation.key)
            return refused
    return held


async def reserve_batch(
    io: NodeIO,
    state: AgentState,
    ctx: RunContext,
    only: frozenset[str] | None = None,
    *,
    gated: dict[str, Any] | None = None,
    settle: StepSettlement | None = None,
    run: RunAccount | None = None,
) -> tuple[AgentState, StopRequest | None]:
    """Reserve the batch's allowed calls in order (attempt 1 of each; ``only`` these call ids
    when given); those the budget cannot cover are marked and receipted as never run, so with
    N calls left exactly N run.

    ``gated``: fields the gate step sets (its batch, phase and repeat counts), written into the
    state returned. Reserving reads only state's run id (the run's account, its owner), which
    the gate step does not set. ``settle``: the step's settlement that waited for these holds,
    written with them in one ledger write (``Ledger.settle_and_reserve``). ``run``: the run's
    account, where the node named it already (:func:`run_account_of` of ``state``)."""
    cfg = io.cfg
    if run is None:
        run = run_account_of(state)
    account = run.name
    update: dict[str, Any] = dict(gated) if gated else {}
    current: Batch = update.get("batch", state.batch)
    entries = to_reserve(current)
    if only is not None:
        entries = [e for e in entries if e.call_id in only]
    registry = cfg.registry
    holds = [
        (call_key(account, e.call_id, 1), call_amounts(registry.get(e.proposal.tool_name)))
        for e in entries
    ]
    ledger = io.ledger
    # The in-memory ledger never waits: its batch is held in one call, its books read once and
    # its owner checked once, with no Reservation or Balance made per hold. Only the exact type:
    # a subclass may change what reserve or settle does.
    if type(ledger) is InMemoryLedger:
        run_id = run.run_id
        try:
            held = ledger.reserve_batch(
                account,
                holds,
                settle=settle,
                refuses=lambda owner: check_owner(owner, ctx, run_id),
            )
        except (AccountClosed, UnknownAccount, LedgerConflict, ValueError) as refusal:
            # Only the settlement raises: each hold's refusal comes back as data.
            return (state.model_copy(update=update) if update else state), _stop_for(refusal)
    else:
        held = await _held_one_by_one(io, run, ctx, holds, settle)
    # The books after the last hold, viewed into state once, with the batch at the end.
    if held.limits is not None and held.held is not None:
        update["budget"] = budget_view(held.limits, held.held)
    stopped = held.refused
    if stopped is None and held.stopped_by is not None:
        stopped = _stop_for(held.stopped_by)
    if stopped is not None:
        return (state.model_copy(update=update) if update else state), stopped
    refused = {
        entry.call_id: short
        for entry, short in zip(entries, held.outcomes, strict=True)
        if short is not None
    }
    if refused or cfg.verdict_key is not None:
        batch, stopped = after_reservations(
            current, refused, run_id=state.run_id, verdict_key=cfg.verdict_key, only=only
        )
        if refused:
            EVENTS.budget_refused(state.run_id, current, refused, cfg.registry)
        if batch is not state.batch:
            update["batch"] = batch
    elif current is not state.batch:
        update["batch"] = current
    return (state.model_copy(update=update) if update else state), stopped


def _stop_for(refusal: Exception) -> StopRequest:
    """The stop a ledger's refusal of a hold means (as :func:`reserve_or_exhausted` reads it)."""
    if isinstance(refusal, AccountClosed):
        return stop_for_closed(refusal.reason)
    if isinstance(refusal, UnknownAccount):
        return stop_for_unknown_account()
    return stop_for_conflict()


async def _held_one_by_one(
    io: NodeIO,
    run: RunAccount,
    ctx: RunContext,
    holds: Sequence[tuple[str, Mapping[str, float]]],
    settle: StepSettlement | None,
) -> BatchHeld[StopRequest]:
    """:meth:`InMemoryLedger.reserve_batch`'s answer from any ledger, through its port: each
    hold reserved and its owner checked (:func:`reserve_or_exhausted`), or all held with the
    step's settlement in one write (``settle``: :func:`_settled_and_held`); a stop, as
    ``refused``, with the books of the last hold made before it."""
    answers: list[Reservation | BudgetExhausted] | None = None
    if settle is not None:
        settled = await _settled_and_held(io, run, ctx, settle, holds)
        if isinstance(settled, StopRequest):
            return BatchHeld((), None, None, refused=settled)
        answers = settled
    outcomes: list[BudgetExhausted | None] = []
    latest: Balance | None = None
    for n, (key, amounts) in enumerate(holds):
        held = (
            answers[n]
            if answers is not None
            else await reserve_or_exhausted(io, run, ctx, key, amounts)
        )
        if isinstance(held, StopRequest):
            limits, books = _books(latest)
            return BatchHeld(tuple(outcomes), limits, books, refused=held)
        if isinstance(held, BudgetExhausted):
            outcomes.append(held)
            continue
        latest = held.balance
        outcomes.append(None)
    limits, books = _books(latest)
    return BatchHeld(tuple(outcomes), limits, books)


def _books(balance: Balance | None) -> tuple[dict[str, float] | None, dict[str, float] | None]:
    return (balance.limits, balance.held) if balance is not None else (None, None)


async def balance_of(io: NodeIO, account: str) -> Balance | None:
    """The run account's balance; ``None`` if the ledger holds no such account (the run is then
    refused by its next reservation, typed)."""
    try:
        return await io.balance(account)
    except (UnknownAccount, ValueError):
        return None


async def account_owner(io: NodeIO, account: str) -> Mapping[str, str] | None:
    """Who the run's account was opened for; ``None`` if the ledger holds no such account."""
    try:
        return (await io.balance(account)).owner
    except (UnknownAccount, ValueError):
        return None


async def acting_in(
    io: NodeIO,
    state: AgentState,
    ctx: RunContext | None,
    fallback: Iterable[str] = (),
    *,
    account: str | None = None,
) -> Acting:
    """The context a node of the run acts in (``approval.acting_context``): the caller's, or,
    for an approver the run's ledger marks as having answered one of its approvals, the
    requester's identity holding the capabilities its account recorded.

    The ledger is read only for a caller other than the one state names: the requester's
    context acts as itself (and every reservation checks it against the account's owner).
    ``account``: the run's ledger account, where the node named it already."""
    if ctx is None or (ctx.tenant_id, ctx.principal.id) == (state.tenant_id, state.principal_id):
        return Acting(ctx)
    if account is None:
        account = account_of(state)
    owner = await account_owner(io, account)
    marked = owner is not None and await io.get(approver_key(account, ctx.principal.id)) is not None
    return acting_context(owner, ctx, approver=marked, fallback=fallback)


async def account_open(io: NodeIO, account: str) -> bool:
    """Whether the ledger holds the run's account, not closed: a run whose state reads ended
    while its account is open was not ended by the terminal node (it closes the account it
    owns before it writes an ending), but written so by a caller."""
    try:
        return (await io.balance(account)).closed is None
    except (UnknownAccount, ValueError):
        return False


async def close_cancelled(io: NodeIO, account: str) -> None:
    """Close the run's account as cancelled (the first close's reason stands)."""
    with contextlib.suppress(UnknownAccount, LedgerConflict, ValueError):
        await io.close_account(account, TerminationReason.CANCELLED.value)
