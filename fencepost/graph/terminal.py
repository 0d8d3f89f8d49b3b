"""The terminal node: the single exit, and the only place a terminal state is made.

The node loads the run and its ledger account, asks policy how the run ends
(:func:`fencepost.policy.terminate.plan_ending`), reads what the plan names of the ledger (the
batch's calls that started unreported; for a final answer, the work still pending and the
cited calls its tools produced), closes the account the plan's ending says to close, and
writes the ending.
"""

from __future__ import annotations

import contextlib
from typing import Any

from langgraph.runtime import Runtime

from fencepost.graph.account import (
    account_of,
    acting_in,
    answer_facts,
    balance_of,
    open_run,
    started_run_id,
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
    UnknownAccount,
)
from fencepost.policy.context import coerce_context
from fencepost.policy.keys import started_key
from fencepost.policy.terminate import plan_ending


async def terminal(io: NodeIO, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
    """End the run with the stop a node asked for, and close its ledger account: a closed
    account refuses every later reservation, so no state edit can reopen the run."""
    before = load_state(values)
    ctx = coerce_context(runtime.context)
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
    else:
        current = before
    account = account_of(current)
    if before is not None:
        # An approver whose answer ended the run closes it for the requester.
        ctx = (await acting_in(io, before, ctx, account=account)).context
    cfg = io.cfg
    plan = plan_ending(
        current,
        ctx,
        await balance_of(io, account),
        account=account,
        remaining_steps=values.get("remaining_steps"),
        require_citations=cfg.require_citations,
        registry=cfg.registry,
    )
    if plan.stands:
        # Nothing to do; but a value mended on reading (a phase a checkpoint revived as text)
        # is written back, so the route out reads the run as ended.
        return step_writes(before, plan.current)
    # Ended, whoever owns it: the room kept for its next step goes to runs waiting.
    run_ended(io.ledger, account)
    started = [c for c in plan.unreported if await io.get(started_key(account, c, 1)) is not None]
    cited = plan.citations
    # A completed stop is judged by the ledger's markers, not by receipts in state.
    facts = await answer_facts(io, account, plan.current, cited) if cited is not None else None
    end = plan.end(started, facts)
    if end.closes:
        with contextlib.suppress(UnknownAccount, LedgerConflict, ValueError):
            end = end.after_close((await io.close_account(account, end.stop.reason.value)).closed)
            if cfg.owns_ledger:
                # The graph's own process-local ledger would otherwise keep every ended run.
                await io.forget(account)
    m = manifest(
        end.state, cfg, ctx, phase=Phase.TERMINAL, outcome="terminal", code=end.stop.reason.value
    )
    return step_writes(before, recorded(end.state, runtime, [m]))
