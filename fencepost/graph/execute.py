"""The execute node: run what the gate allowed, each call claimed in the ledger before it starts.

The node does the I/O (each call's claim, its run and its settlement in the ledger, accepted
work certified); which calls run, what each of the ledger's answers means and what the run
writes are plans of :mod:`fencepost.policy.execution` (facts in, one frozen plan out).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from langgraph.runtime import Runtime
from pydantic import JsonValue

from fencepost.graph.account import (
    RunAccount,
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
    start_attempt,
    with_budget_view,
)
from fencepost.graph.events import EVENTS
from fencepost.graph.node_io import AsyncIO, NodeIO
from fencepost.graph.settings import LoopConfig, Update
from fencepost.graph.state import require_state
from fencepost.graph.trace import checked_manifest, recorded
from fencepost.graph.writes import step_writes
from fencepost.policy import (
    AgentState,
    Balance,
    Deadline,
    ErrorCode,
    Phase,
    Reservation,
    StopRequest,
    ToolContext,
    check_schema,
    stage_deadline,
)
from fencepost.policy.approval import allowed_capabilities
from fencepost.policy.context import RunContext, coerce_context
from fencepost.policy.execution import (
    CallClaim,
    ExecutePlan,
    ExecuteSettings,
    earlier_outputs,
    end_execute,
    plan_execute,
    ran,
)
from fencepost.policy.gating import invalid_dependencies
from fencepost.policy.keys import call_key, step_key
from fencepost.policy.ledger import Attempt
from fencepost.policy.outcome import CallOutcome

_LAST_EXECUTE: tuple[LoopConfig, ExecuteSettings] | None = None
"""The last graph's execute settings (see ``gate._LAST_GATE``): held by identity of the
graph's settings, which never change."""


def execute_settings(cfg: LoopConfig) -> ExecuteSettings:
    """The settings the execute phase reads, from the graph's."""
    global _LAST_EXECUTE
    last = _LAST_EXECUTE
    if last is not None and last[0] is cfg:
        return last[1]
    made = ExecuteSettings(
        registry=cfg.registry,
        approval=cfg.approval,
        verdict_key=cfg.verdict_key,
        approver=cfg.approver is not None,
        conditional=cfg.needs_approval is not None,
    )
    _LAST_EXECUTE = (cfg, made)
    return made


async def execute(io: NodeIO, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
    """Plan the calls (a stop, or which of the batch run); claim, run and settle each in the
    ledger; certify the accepted work the outcomes show done; write what the plan's end says:
    every call of the batch receipted."""
    cfg = io.cfg
    before = require_state(values)
    # An approver whose answer let these calls run acts for the requester, never as itself.
    given = coerce_context(runtime.context)
    fallback = allowed_capabilities(before.batch, cfg.registry)
    ctx = (await acting_in(io, before, given, fallback)).context
    plan = plan_execute(
        before,
        ctx,
        execute_settings(cfg),
        given=runtime.context,
        remaining_steps=values.get("remaining_steps"),
        clock=cfg.clock,
    )
    if plan.stop is not None or ctx is None:
        return step_writes(before, before.model_copy(update={"stop": plan.stop}))
    state = before
    results: list[CallOutcome | StopRequest] = []
    if plan.runnable:
        account = account_of(state)
        # Read here (a batch runs off the node's context); call ids are claimed on the thread
        # the conversation began on, which a copy of the thread shares.
        where = node_thread()
        where = (state.origin_thread or where[0], where[1])
        seen: list[Balance] = []
        if plan.alone:
            # One call needs no event loop of its own: the sync graph runs it on its thread.
            call = plan.runnable[0]
            results = [await run_call(io, state, ctx, account, call, seen, where=where)]
        else:
            outside = plan.outside
            made = await produced(io, account, outside) if outside else frozenset()
            earlier = earlier_outputs(state.observations, made)
            results = await io.call(
                lambda: run_batch(cfg, plan, state, ctx, account, seen, earlier, where)
            )
        state = with_budget_view(state, seen[-1] if seen else await balance_of(io, account))
    end = end_execute(plan, state, results)
    EVENTS.calls_ended(state.run_id, state.batch, end.done)
    # Accepted work becomes done only on verified evidence from a later call, marked in the ledger.
    completed, refused = await certify(io, end.state, ctx, end.certified_against, end.done)
    # The records' values are fencepost's own (a registered tool's name and effect, a receipt
    # status or safe code): assembled as validation would make them.
    manifests = [
        checked_manifest(end.state, cfg, ctx, phase=Phase.EXECUTE, **r) for r in end.records
    ]
    return step_writes(before, recorded(end.closed(completed, refused), runtime, manifests))


async def run_call(
    io: NodeIO,
    state: AgentState,
    ctx: RunContext,
    account: str,
    call: CallClaim,
    seen: list[Balance],
    dependencies: dict[str, JsonValue] | None = None,
    where: tuple[str, str] = ("", ""),
) -> CallOutcome | StopRequest:
    """Claim an attempt of one call in the ledger, run it, settle it; what each of the
    ledger's answers means is ``call``'s (:class:`~fencepost.policy.execution.CallClaim`).

    The start marker is durable before the tool starts. A closed account (a cancel from
    anywhere) refuses the claim, so a cancelled run starts no further tool. A result the tool
    returned is marked in the ledger (``keys.result_key``) before the attempt is settled, in
    the same write: that mark, not the observation in state, is what a citation may name.
    ``seen`` collects the run account's balance as each settlement leaves it (the last one is
    the state's new budget view). ``dependencies``: what the call may read of the calls it
    depends on (``ToolContext.dependencies``). ``where``: the node's thread and namespace,
    where the call id is claimed for the thread before its first attempt (``keys.claim_key``).
    """
    cfg = io.cfg
    entry, spec = call.entry, call.spec
    run = RunAccount(account, state.run_id)
    attempt = 1
    while True:
        # Attempt 1 was reserved at the gate: read back, not reserved again, and its start
        # claimed in the same ledger step where the claim's rule needs nothing more read
        # (``CallClaim.begins_on``). A call whose budget the gate never reserved (a forged
        # batch entry), and every retry, is reserved here, checked against the limits before
        # it can run.
        key = call_key(account, entry.call_id, attempt)
        found: Reservation | StopRequest | None = None
        begun: Attempt | StopRequest | None = None
        if attempt == 1:
            found, begun = await start_attempt(
                io, run, ctx, entry.call_id, where, begins=call.begins_on
            )
        held = (
            found
            if found is not None
            else await reserve_or_exhausted(io, run, ctx, key, call.amounts)
        )
        if isinstance(held, StopRequest):
            return held
        if begun is None:
            went_on = (
                call.asks_if_run_went_on(held)
                and await io.get(step_key(account, state.step + 1)) is not None
            )
            ended = call.reserved(attempt, held, run_went_on=went_on)
            if ended is not None:
                return ended
            # The thread's claim of the call id (first attempt) and the start marker: one write.
            begun = await begin_attempt(io, account, state.run_id, entry.call_id, attempt, where)
        if isinstance(begun, StopRequest):
            return begun
        step = call.begun(attempt, begun)
        if step.releases:
            freed = await release_reserved(io, key)
            if freed is not None:
                seen.append(freed)
        if step.outcome is not None:
            return step.outcome
        if step.runs:
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
    made = call.produced(outcome)
    settled = await finish_attempt(io, account, entry.call_id, attempt, produced=made)
    if settled.balance is not None:
        seen.append(settled.balance)
    return outcome


async def run_batch(
    cfg: LoopConfig,
    plan: ExecutePlan,
    state: AgentState,
    ctx: RunContext,
    account: str,
    seen: list[Balance],
    earlier: dict[str, JsonValue],
    where: tuple[str, str] = ("", ""),
) -> list[CallOutcome | StopRequest]:
    """Run the plan's calls concurrently, at most ``max_concurrent_tools`` in flight.

    A call that depends on others of the batch waits for their outcomes (holding no slot while
    it waits) and runs only if the plan says so once they ended
    (:meth:`~fencepost.policy.execution.ExecutePlan.start`); otherwise it never starts, and the
    budget reserved for it is given back. ``earlier``: the results of the earlier calls this
    batch depends on that the ledger marks as produced (the only ones it may depend on).
    """
    io = AsyncIO(cfg)
    gate = asyncio.Semaphore(cfg.max_concurrent_tools)
    loop = asyncio.get_running_loop()
    runnable = plan.runnable
    # The gate refused impossible dependencies; a batch edited since then is checked again, so a
    # forged cycle can never leave a call waiting on itself.
    calls = [c.entry.proposal for c in runnable]
    broken = any(c.depends_on for c in calls) and invalid_dependencies(calls, earlier)
    results: dict[str, asyncio.Future[CallOutcome | StopRequest]] = {
        c.entry.call_id: loop.create_future() for c in runnable
    }

    async def bounded(call: CallClaim) -> CallOutcome | StopRequest:
        entry = call.entry
        try:
            outcomes = [await results[d] for d in plan.awaits(call, broken=broken)]
            start = plan.start(call, outcomes, earlier, broken=broken)
            result: CallOutcome | StopRequest
            if isinstance(start, CallOutcome):
                result = start
                freed = await release_reserved(io, call_key(account, entry.call_id, 1))
                if freed is not None:
                    seen.append(freed)
            else:
                async with gate:
                    result = await run_call(io, state, ctx, account, call, seen, start, where)
        except BaseException:
            results[entry.call_id].cancel()
            raise
        results[entry.call_id].set_result(result)
        return result

    tasks = [asyncio.ensure_future(bounded(c)) for c in runnable]
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
