"""The approve node: pause for a human on write/external calls; apply the answer on resume."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime
from langgraph.types import interrupt

from fencepost.graph.gate_step import reserve_batch
from fencepost.graph.loop import Update, manifest, recorded
from fencepost.graph.node_io import NodeIO
from fencepost.graph.state import require_state
from fencepost.graph.writes import changed
from fencepost.policy import Phase, reduce_tool_events
from fencepost.policy.approval import (
    ApprovalProblem,
    apply_approvals,
    approval_request,
    parse_approval,
    waiting,
)
from fencepost.policy.context import coerce_context
from fencepost.policy.outcome import receipt_for
from fencepost.policy.run_check import check_run


async def approve(io: NodeIO, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
    """Ask for approval of the waiting calls; an answer that is none of the accepted forms asks
    again, with a typed error naming them (a call never runs on a guess)."""
    cfg = io.cfg
    before = require_state(values)
    call_ids = [e.call_id for e in waiting(before.batch)]
    problem: ApprovalProblem | None = None
    while True:
        response = interrupt(approval_request(before.batch, cfg.registry, problem))
        answers = parse_approval(response, call_ids)
        if not isinstance(answers, ApprovalProblem):
            break
        problem = answers
    # Everything below runs only on resume, with the context passed on resume.
    ctx = coerce_context(runtime.context)
    refused = check_run(before, ctx, clock=cfg.clock)
    if refused is not None or ctx is None:
        return changed(before, before.model_copy(update={"stop": refused}))
    result = apply_approvals(
        before,
        answers,
        cfg.registry,
        ctx.principal,
        repeat_limit=cfg.repeat_limit,
        now=cfg.clock.now(),
    )
    state = before.model_copy(update={"batch": result.batch, "fingerprints": result.fingerprints})
    manifests = []
    for entry in waiting(before.batch):
        now = next(e for e in result.batch if e.call_id == entry.call_id)
        name = now.proposal.tool_name
        spec = cfg.registry.get(name) if name in cfg.registry else None
        manifests.append(
            manifest(
                state,
                cfg,
                ctx,
                phase=Phase.VALIDATE,
                outcome="allowed" if now.verdict.allowed else "denied",
                decision_kind="tool",
                tool_name=name if spec else None,
                effect=spec.effect if spec else None,
                verdict=now.verdict.code,
            )
        )
    stopped = result.stop
    if stopped is None:
        # Reserve only what was just approved; calls allowed at the gate were reserved there.
        approved = frozenset(e.call_id for e in waiting(before.batch))
        state, stopped = await reserve_batch(io, state, ctx, only=approved)
    state = state.model_copy(update={"stop": stopped})
    if result.rejected:
        state = reduce_tool_events(state, tuple(o.event for o in result.rejected))
        state = state.model_copy(
            update={"receipts": state.receipts + tuple(receipt_for(o) for o in result.rejected)}
        )
    return changed(before, recorded(state, runtime, manifests))
