"""The approve node: pause for a human on write/external calls; apply the answer on resume."""

from __future__ import annotations

from typing import Any

from langgraph.errors import GraphInterrupt
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from fencepost.adapters import telemetry
from fencepost.graph.account import reserve_batch
from fencepost.graph.gate import remember_approvals
from fencepost.graph.node_io import NodeIO
from fencepost.graph.settings import Update
from fencepost.graph.state import require_state
from fencepost.graph.trace import manifest, recorded
from fencepost.graph.writes import step_writes
from fencepost.policy import Phase, reduce_tool_events
from fencepost.policy.approval import (
    ApprovalAnswer,
    ApprovalProblem,
    answer_schema,
    apply_approvals,
    approval_request,
    read_answer,
    refused_answer,
    waiting,
)
from fencepost.policy.context import coerce_context
from fencepost.policy.manifest import verdict_outcome
from fencepost.policy.may_go_on import check_before_acting
from fencepost.policy.outcome import receipt_for


async def approve(io: NodeIO, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
    """Ask for approval of the waiting calls; an answer that is not exactly one of the accepted
    forms, or an edit its tool's schema refuses, asks again with a typed error (a call never
    runs on a guess, and a typo in an edit does not end the run).

    Only the calls the gate left waiting are asked about (``approval.waiting``): a pending entry
    written into the batch by anyone else is dropped, never asked about, never run.
    """
    cfg = io.cfg
    before = require_state(values)
    asked = waiting(before.batch, run_id=before.run_id, verdict_key=cfg.verdict_key)
    problem: ApprovalProblem | None = None
    answers: dict[str, ApprovalAnswer] = {}
    schema = answer_schema(asked, cfg.registry) if asked else None
    while asked:
        try:
            response = interrupt(
                approval_request(asked, cfg.registry, problem), response_schema=schema
            )
        except GraphInterrupt:
            if problem is not None:
                # Logged only as the run pauses again: a replayed answer was heard before.
                refused_answer(before.run_id, problem)
            raise
        read = read_answer(response, asked, cfg.registry)
        if not isinstance(read, ApprovalProblem):
            answers = read
            break
        problem = read
    # Everything below runs only on resume, with the context passed on resume.
    ctx = coerce_context(runtime.context)
    refused = check_before_acting(before, ctx, clock=cfg.clock)
    if refused is not None or ctx is None:
        return step_writes(before, before.model_copy(update={"stop": refused}))
    result = apply_approvals(
        before,
        answers,
        cfg.registry,
        ctx.principal,
        repeat_limit=cfg.repeat_limit,
        now=cfg.clock.now(),
        asked=asked,
        context=ctx,
    )
    remember = {c: a.remember for c, a in answers.items() if a.remember is not None}
    batch = result.batch
    if remember:
        # Stored before the approved calls are sealed: their verdicts name the scope.
        batch = await remember_approvals(
            io, batch, remember, before, ctx, cfg.clock.now(), answered_by="human"
        )
    state = before.model_copy(update={"batch": batch, "fingerprints": result.fingerprints})
    telemetry.approvals_answered(state.run_id, asked, result.batch, cfg.registry)
    manifests = []
    for entry in asked:
        now = next(e for e in result.batch if e.call_id == entry.call_id)
        name = now.proposal.tool_name
        spec = cfg.registry.get(name) if name in cfg.registry else None
        manifests.append(
            manifest(
                state,
                cfg,
                ctx,
                phase=Phase.VALIDATE,
                outcome=verdict_outcome(now.verdict.code),
                decision_kind="tool",
                tool_name=name if spec else None,
                effect=spec.effect if spec else None,
                verdict=now.verdict.code,
                approval="human",
            )
        )
    stopped = result.stop
    if stopped is None:
        # Reserve (and seal) only what was just approved; calls allowed at the gate were
        # reserved and sealed there, and anything else in the batch was judged by nobody.
        approved = frozenset(e.call_id for e in asked)
        state, stopped = await reserve_batch(io, state, ctx, only=approved)
    state = state.model_copy(update={"stop": stopped})
    if result.rejected:
        state = reduce_tool_events(state, tuple(o.event for o in result.rejected))
        state = state.model_copy(
            update={"receipts": state.receipts + tuple(receipt_for(o) for o in result.rejected)}
        )
    return step_writes(before, recorded(state, runtime, manifests))
