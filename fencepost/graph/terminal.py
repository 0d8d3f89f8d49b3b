"""The terminal node: the single exit, and the only place a terminal state is made."""

from __future__ import annotations

import contextlib
from typing import Any

from langgraph.runtime import Runtime

from fencepost.graph.account import account_of, acting_in, open_run, started_run_id
from fencepost.graph.endings import (
    owned,
    pending_at_end,
    produced_at_end,
    receipt_started,
    unverified_ending,
)
from fencepost.graph.node_io import NodeIO
from fencepost.graph.settings import Update
from fencepost.graph.state import load_state, new_run_state, request_from
from fencepost.graph.step_line import run_ended
from fencepost.graph.trace import manifest, recorded
from fencepost.graph.writes import step_writes
from fencepost.policy import (
    AgentState,
    LedgerConflict,
    Phase,
    StopRequest,
    TerminationReason,
    UnknownAccount,
    stop_report,
    terminate,
)
from fencepost.policy.context import coerce_context
from fencepost.policy.decide import verified_stop
from fencepost.policy.recursion_limit import NEEDS_DECIDE
from fencepost.policy.run_sources import answer_untrusted
from fencepost.policy.state import stop
from fencepost.policy.stopping import cancel_came_first, may_close_account, unasked_stop


def _cancelled(current: AgentState) -> AgentState:
    state = terminate(current, TerminationReason.CANCELLED, error_code="cancelled")
    return state.model_copy(update={"report": stop_report(state, unfinished=current.batch)})


async def terminal(io: NodeIO, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
    """End the run with the stop a node asked for, and close its ledger account: a closed
    account refuses every later reservation, so no state edit can reopen the run."""
    before = load_state(values)
    ctx = coerce_context(runtime.context)
    if before is not None:
        # An approver whose answer ended the run closes it for the requester.
        ctx = (await acting_in(io, before, ctx)).context
    current: AgentState
    if before is None:
        # The recursion limit left no room even for a first decision: the run still ends with a
        # reason, bound to whoever started it.
        request = request_from(values, required=False, run_id=started_run_id())
        if request is None:
            return {}
        current = new_run_state(request, ctx)
        if ctx is not None:
            opened = await open_run(io, current, ctx)
            if not isinstance(opened, StopRequest):
                current = opened
    elif before.is_terminal:
        unended = await unverified_ending(io, before)
        if unended is None:
            # Nothing to do; but a value mended on reading (a phase a checkpoint revived as
            # text) is written back, so the route out reads the run as ended.
            return step_writes(before, before)
        current = unended
    else:
        current = before
    asked = current.stop or unasked_stop(values.get("remaining_steps"), NEEDS_DECIDE)
    # A completed stop is judged by the ledger's completion markers, not by receipts in state.
    completed = asked.reason is TerminationReason.COMPLETED and asked.answer is not None
    account = account_of(current)
    # Ended, whoever owns it: the room kept for its next step goes to runs waiting.
    run_ended(io.ledger, account)
    mine = await owned(io, account, ctx, current.run_id)
    if mine:
        current = await receipt_started(io, current, account)
    pending = await pending_at_end(io, current, mine) if completed else None
    cited = (
        await produced_at_end(io, current, mine, asked.answer.citations)
        if completed and asked.answer is not None
        else None
    )
    ending = verified_stop(
        current,
        asked,
        require_citations=io.cfg.require_citations,
        pending=pending,
        produced=cited,
        account_known=mine is not None,
    )
    state = terminate(current, ending.reason, answer=ending.answer, error_code=ending.error_code)
    # The report needs the batch the run stopped in: terminate() clears it.
    budget = ending.budget
    if budget is not None:
        budget = budget.model_copy(update={"own": budget.account == account})
    report = stop_report(
        state,
        unfinished=current.batch,
        budget=budget,
        answer_untrusted=answer_untrusted(state, ctx, io.cfg.registry),
    )
    state = state.model_copy(update={"report": report})
    if may_close_account(ending.error_code, owned=bool(mine)):
        with contextlib.suppress(UnknownAccount, LedgerConflict, ValueError):
            closed = (await io.close_account(account, ending.reason.value)).closed
            if cancel_came_first(closed, ending.reason):
                state, ending = _cancelled(current), stop(TerminationReason.CANCELLED, "cancelled")
            if io.cfg.owns_ledger:
                # The graph's own process-local ledger would otherwise keep every ended run.
                await io.forget(account)
    m = manifest(
        state, io.cfg, ctx, phase=Phase.TERMINAL, outcome="terminal", code=ending.reason.value
    )
    return step_writes(before, recorded(state, runtime, [m]))
