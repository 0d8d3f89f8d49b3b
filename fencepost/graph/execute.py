"""The execute node: run what the gate allowed, each call claimed in the ledger before it starts."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from langgraph.runtime import Runtime
from pydantic import JsonValue

from fencepost.graph.account import (
    account_of,
    acting_in,
    balance_of,
    begin_attempt,
    certify,
    finish_attempt,
    node_thread,
    produced,
    release_reserved,
    reserve_or_exhausted,
    reserved_before,
    with_budget_view,
)
from fencepost.graph.events import EVENTS
from fencepost.graph.node_io import AsyncIO, NodeIO
from fencepost.graph.settings import LoopConfig, Update
from fencepost.graph.state import require_state
from fencepost.graph.trace import manifest, recorded
from fencepost.graph.writes import step_writes
from fencepost.policy import (
    AgentState,
    Balance,
    BudgetExhausted,
    Deadline,
    ErrorCode,
    Phase,
    ReceiptStatus,
    StopRequest,
    ToolContext,
    ToolSpec,
    VerdictCode,
    check_schema,
    reduce_tool_events,
    stage_deadline,
)
from fencepost.policy.approval import allowed_capabilities
from fencepost.policy.batch import BatchEntry
from fencepost.policy.context import RunContext, coerce_context
from fencepost.policy.execution import (
    admit_batch,
    batch_stop,
    budget_refusals,
    dependency_failed,
    dependency_inputs,
    earlier_outputs,
    executed_record,
    finished_before,
    may_start,
    ordered,
    out_of_budget,
    ran,
    refunded_when_not_started,
    refused_at_claim,
    uncertain,
)
from fencepost.policy.gating import invalid_dependencies
from fencepost.policy.keys import call_key, step_key
from fencepost.policy.ledger import ReservationStatus
from fencepost.policy.may_go_on import check_before_acting
from fencepost.policy.outcome import CallOutcome, receipt_for, with_approvers
from fencepost.policy.progress import recorded_evidence
from fencepost.policy.recursion_limit import NEEDS_ANOTHER_DECIDE, NEEDS_EXECUTE, recursion_stop
from fencepost.policy.reservations import Claim, answered_before, call_amounts, claim
from fencepost.policy.tasks import open_tasks_after


async def run_call(
    io: NodeIO,
    state: AgentState,
    ctx: RunContext,
    account: str,
    entry: BatchEntry,
    spec: ToolSpec,
    seen: list[Balance],
    dependencies: dict[str, JsonValue] | None = None,
    where: tuple[str, str] = ("", ""),
) -> CallOutcome | StopRequest:
    """Claim an attempt of one call in the ledger, run it, settle it.

    The start marker is durable before the tool starts: finding it on a re-run means an earlier
    attempt started and never reported (a crash), which is retried only when that is safe and
    otherwise reported ``uncertain``. An attempt the ledger shows given back, or settled while
    the run went on past this step, means the call id was answered already: it never runs
    again, whatever the batch says (``execution.answered_before``). A closed
    account (a cancel from anywhere) refuses the claim, so a cancelled run starts no further
    tool. A result the tool returned is marked in the ledger (``keys.result_key``) before the
    attempt is settled: that mark, not the observation in state, is what a citation may name.
    ``seen`` collects the run account's balance as each settlement leaves it (the last one is
    the state's new budget view). ``dependencies``: what the call may read of the calls it
    depends on (``ToolContext.dependencies``). ``where``: the node's thread and namespace,
    where the call id is claimed for the thread before its first attempt (``keys.claim_key``):
    one another run of the thread claimed (a fork's origin) is ``uncertain``, never run here.
    """
    cfg = io.cfg
    attempt = 1
    while True:
        # Attempt 1 was reserved at the gate: read back, not reserved again (no write). A call
        # whose budget the gate never reserved (a forged batch entry), and every retry, is
        # reserved here, checked against the limits before it can run.
        key = call_key(account, entry.call_id, attempt)
        found = (
            await reserved_before(io, state, ctx, key, account=account) if attempt == 1 else None
        )
        more = (
            found
            if found is not None
            else await reserve_or_exhausted(
                io, state, ctx, key, call_amounts(spec), account=account
            )
        )
        if isinstance(more, StopRequest):
            return more
        if isinstance(more, BudgetExhausted):
            return out_of_budget(entry, spec, attempt)
        if more.existing and more.status is not ReservationStatus.RESERVED:
            went_on = await io.get(step_key(account, state.step + 1)) is not None
            if answered_before(more.status, run_went_on=went_on):
                return finished_before(
                    entry, spec, attempt, started=more.status is ReservationStatus.SETTLED
                )
        # The thread's claim of the call id (first attempt) and the start marker: one write.
        begun = await begin_attempt(io, account, state.run_id, entry.call_id, attempt, where)
        if isinstance(begun, StopRequest):
            return begun
        if not begun.claimed or begun.started is None:
            # Another run of the thread (a fork's origin, another branch) claimed this call
            # id: it ran there, or may have. Nothing of it runs here, and nothing is spent.
            freed = await release_reserved(io, key)
            if freed is not None:
                seen.append(freed)
            return uncertain(entry, spec, 0)
        step = claim(spec, started_before=begun.started.existing)
        if step is Claim.UNCERTAIN:
            return uncertain(entry, spec, attempt)
        if step is Claim.RUN:
            break
        EVENTS.retrying(state.run_id, entry, spec, attempt)
        attempt += 1
    run_deadline = ctx.deadline or Deadline.after(spec.timeout_seconds, clock=cfg.clock)
    deadline = stage_deadline(run_deadline, max_stage_seconds=spec.timeout_seconds, clock=cfg.clock)
    tool_ctx = ToolContext.model_construct(
        run_id=state.run_id,
        tenant_id=ctx.tenant_id,
        principal_id=ctx.principal.id,
        deadline=deadline,
        idempotency_key=entry.call_id,
        dependencies=dependencies or {},
        attempt=attempt,
        budget_account=account,
        injected=ctx.injected,
    )
    # The call's execute_tool span is current while it runs: what the tool does is traced
    # under it (a child run's span too).
    with EVENTS.tool_call(entry, spec, attempt) as traced:
        try:
            args = check_schema(spec, entry.proposal, run_id=state.run_id)
        except Exception:
            outcome = ran(entry, spec, attempt, error=ErrorCode.INVALID_ARGUMENT)
        else:
            timeout = max(0.0, deadline.remaining_seconds(clock=cfg.clock))
            result = await io.run_tool(spec, args, tool_ctx, timeout_seconds=timeout)
            outcome = ran(
                entry,
                spec,
                attempt,
                value=result.value,
                error=result.error,
                cut_off=result.cut_off,
                started=not result.never_started,
            )
        traced.ended(outcome)
    # A result saying its run never began (a child unfunded) is no output to depend on. The
    # result is marked before the attempt settles, in the same write.
    made = outcome.succeeded and outcome.status is not ReceiptStatus.DENIED
    settled = await finish_attempt(io, account, entry.call_id, attempt, produced=made)
    if settled.balance is not None:
        seen.append(settled.balance)
    return outcome


async def run_batch(
    cfg: LoopConfig,
    state: AgentState,
    ctx: RunContext,
    account: str,
    runnable: tuple[tuple[BatchEntry, ToolSpec], ...],
    seen: list[Balance],
    earlier: dict[str, JsonValue],
    where: tuple[str, str] = ("", ""),
) -> list[CallOutcome | StopRequest]:
    """Run a batch's calls concurrently, at most ``max_concurrent_tools`` in flight.

    A call that depends on others of the batch waits for their outcomes (holding no slot while
    it waits) and runs only if each produced a verified result; otherwise it never starts and
    its receipt says ``dependency_failed``. ``earlier``: the results of the earlier calls this
    batch depends on that the ledger marks as produced (the only ones it may depend on).
    """
    io = AsyncIO(cfg)
    gate = asyncio.Semaphore(cfg.max_concurrent_tools)
    loop = asyncio.get_running_loop()
    # The gate refused impossible dependencies; a batch edited since then is checked again, so a
    # forged cycle can never leave a call waiting on itself.
    broken = any(e.proposal.depends_on for e, _ in runnable) and invalid_dependencies(
        [e.proposal for e, _ in runnable], earlier
    )
    results: dict[str, asyncio.Future[CallOutcome | StopRequest]] = {
        e.call_id: loop.create_future() for e, _ in runnable
    }

    async def bounded(entry: BatchEntry, spec: ToolSpec) -> CallOutcome | StopRequest:
        try:
            needs = (
                [] if broken else [results[d] for d in entry.proposal.depends_on if d in results]
            )
            known = set(results)
            missing = [d for d in entry.proposal.depends_on if d not in known]
            outcomes = [await f for f in needs]
            if not may_start(entry, outcomes, missing, earlier, dependencies_broken=broken):
                failed = dependency_failed(entry, spec)
                result: CallOutcome | StopRequest = failed
                if refunded_when_not_started(failed):
                    freed = await release_reserved(io, call_key(account, entry.call_id, 1))
                    if freed is not None:
                        seen.append(freed)
            else:
                inputs = dependency_inputs(entry, outcomes, earlier)
                async with gate:
                    result = await run_call(
                        io, state, ctx, account, entry, spec, seen, inputs, where
                    )
        except BaseException:
            results[entry.call_id].cancel()
            raise
        results[entry.call_id].set_result(result)
        return result

    tasks = [asyncio.ensure_future(bounded(e, s)) for e, s in runnable]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        # One call's failure (the ledger's, say) fails the batch, and gather leaves the other
        # calls running: on the sync graph's per-thread loop a call still queued for a slot
        # would start the next time that loop runs, after this run has ended. They are
        # cancelled, and waited for, before the failure goes on.
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait(tasks)
        raise


async def execute(io: NodeIO, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
    """Run only calls whose recorded verdict allows them; receipt every call of the batch."""
    cfg = io.cfg
    before = require_state(values)
    # An approver whose answer let these calls run acts for the requester, never as itself.
    given = coerce_context(runtime.context)
    fallback = allowed_capabilities(before.batch, cfg.registry)
    ctx = (await acting_in(io, before, given, fallback)).context
    refused = check_before_acting(before, ctx, clock=cfg.clock, given=runtime.context)
    refused = refused or recursion_stop(values.get("remaining_steps"), NEEDS_EXECUTE)
    if refused is not None or ctx is None:
        return step_writes(before, before.model_copy(update={"stop": refused}))
    state = before.model_copy(update={"phase": Phase.EXECUTE})
    started = cfg.clock.now()  # a poll's interval runs from when the call started
    admission = admit_batch(
        state.batch,
        cfg.registry,
        ctx.principal,
        # A call already answered (rejected at approval, or run in an earlier step and written
        # back into the batch) is skipped; answered only grows, so a forged entry can only skip
        # a call. One whose earlier run state does not show is stopped by the ledger (run_call).
        state.answered,
        approval=cfg.approval,
        verdict_key=cfg.verdict_key,
        run_id=state.run_id,
        approver=cfg.approver is not None,
        conditional=cfg.needs_approval is not None,
    )
    outcomes: list[CallOutcome] = list(admission.refused)
    claim_stop: StopRequest | None = None
    if admission.runnable:
        account = account_of(state)
        # Read here (a batch runs off the node's context); call ids are claimed on the thread
        # the conversation began on, which a copy of the thread shares.
        where = node_thread()
        where = (state.origin_thread or where[0], where[1])
        runnable = admission.runnable
        seen: list[Balance] = []
        if len(runnable) == 1 and not runnable[0][0].proposal.depends_on:
            # One call needs no event loop of its own: the sync graph runs it on its thread.
            entry, spec = runnable[0]
            results = [await run_call(io, state, ctx, account, entry, spec, seen, where=where)]
        else:
            inside = {e.call_id for e, _ in runnable}
            outside = {d for e, _ in runnable for d in e.proposal.depends_on if d not in inside}
            made = await produced(io, account, outside) if outside else frozenset()
            earlier = earlier_outputs(state.observations, made)
            results = await io.call(
                lambda: run_batch(cfg, state, ctx, account, runnable, seen, earlier, where)
            )
        for (entry, spec), result in zip(admission.runnable, results, strict=True):
            if isinstance(result, StopRequest):
                claim_stop = claim_stop or result
                result = refused_at_claim(entry, spec, result)
            outcomes.append(result)
        state = with_budget_view(state, seen[-1] if seen else await balance_of(io, account))
    done = with_approvers(ordered(state.batch, outcomes), state.batch)
    EVENTS.calls_ended(state.run_id, state.batch, done)
    # What each call returned, as a hash, for the no-progress gate (before the batch is cleared).
    state = state.model_copy(update={"evidence": recorded_evidence(state, done, now=started)})
    state = reduce_tool_events(state, tuple(o.event for o in done))
    receipts = tuple(receipt_for(o) for o in [*done, *budget_refusals(state.batch)])
    # Accepted work becomes done only on verified evidence from a later call, marked in the ledger.
    completed, mark_stop = await certify(io, state, ctx, state.receipts + receipts, done)
    receipts, claim_stop = receipts + completed, claim_stop or mark_stop
    open_tasks = open_tasks_after(state.open_tasks, done, completed)
    if open_tasks != state.open_tasks:
        state = state.model_copy(update={"open_tasks": open_tasks})
    manifests = []
    for o in done:
        word, code = executed_record(o)
        manifests.append(
            manifest(
                state,
                cfg,
                ctx,
                phase=Phase.EXECUTE,
                outcome=word,
                decision_kind="tool",
                tool_name=o.event.tool_name if o.effect is not None else None,
                effect=o.effect,
                verdict=VerdictCode.ALLOWED,
                code=code,
            )
        )
    deadline_passed = ctx.deadline is not None and ctx.deadline.expired(clock=cfg.clock)
    stopped = claim_stop or batch_stop(
        state.batch,
        done,
        deadline_passed=deadline_passed,
        last_superstep=recursion_stop(values.get("remaining_steps"), NEEDS_ANOTHER_DECIDE)
        is not None,
    )
    state = state.model_copy(
        update={"receipts": state.receipts + receipts, "batch": (), "stop": stopped}
    )
    return step_writes(before, recorded(state, runtime, manifests))
