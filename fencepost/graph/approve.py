"""The approve node: pause for a human on write/external calls; apply the answer on resume."""

from __future__ import annotations

from typing import Any

from langgraph.errors import GraphInterrupt
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from fencepost.graph.account import account_of, account_owner, reserve, reserve_batch
from fencepost.graph.events import EVENTS
from fencepost.graph.gate import remember_approvals
from fencepost.graph.node_io import NodeIO
from fencepost.graph.rules import ContainedRules, judged_with_rules
from fencepost.graph.settings import Update
from fencepost.graph.state import require_state
from fencepost.graph.trace import manifest, recorded
from fencepost.graph.writes import step_writes
from fencepost.policy import Phase, StopRequest, reduce_tool_events
from fencepost.policy.approval import (
    ANSWER_REFUSALS,
    ApprovalAnswer,
    ApprovalProblem,
    answer_refused,
    answer_schema,
    apply_approvals,
    approval_request,
    judge_answerer,
    read_answer,
    refused_answer,
    waiting,
)
from fencepost.policy.context import coerce_context
from fencepost.policy.keys import approver_key
from fencepost.policy.manifest import verdict_outcome
from fencepost.policy.may_go_on import check_before_acting
from fencepost.policy.outcome import receipt_for


async def approve(io: NodeIO, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
    """Ask for approval of the waiting calls; an answer that is not exactly one of the accepted
    forms, or an edit its tool's schema refuses, asks again with a typed error (a call never
    runs on a guess, and a typo in an edit does not end the run).

    Only the calls the gate left waiting are asked about (``approval.waiting``): a pending entry
    written into the batch by anyone else is dropped, never asked about, never run.

    Who answered is judged by policy (``approval.judge_answerer``) against the owner the run's
    ledger account records: an answer from no context, another tenant's, a principal without
    the approval right (or the requester's own, under four-eyes) is not taken. The node then
    ends without a change but the refusal's code, so the run waits again in a fresh approval
    (the refused answer is spent with this task: it is never read again for the next one).
    """
    cfg = io.cfg
    before = require_state(values)
    asked = waiting(before.batch, run_id=before.run_id, verdict_key=cfg.verdict_key)
    last = before.last_error_code
    refusal = (
        answer_refused(
            last,  # type: ignore[arg-type]
            asked,
            cfg.registry,
            graph_right=cfg.approval_right,
            graph_four_eyes=cfg.four_eyes,
        )
        if last in ANSWER_REFUSALS
        else None
    )
    problem: ApprovalProblem | None = None
    answers: dict[str, ApprovalAnswer] = {}
    schema = answer_schema(asked, cfg.registry) if asked else None
    while asked:
        request = approval_request(
            asked,
            cfg.registry,
            problem,
            graph_right=cfg.approval_right,
            graph_four_eyes=cfg.four_eyes,
        )
        if problem is None and refusal is not None:
            request["error"] = refusal.model_dump(mode="json")
        try:
            response = interrupt(request, response_schema=schema)
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
    given = coerce_context(runtime.context)
    if not asked:
        refused = check_before_acting(before, given, clock=cfg.clock, given=runtime.context)
        if refused is not None or given is None:
            return step_writes(before, before.model_copy(update={"stop": refused}))
    owner = await account_owner(io, account_of(before))
    judged = judge_answerer(
        owner or {"tenant": before.tenant_id or "", "principal": before.principal_id or ""},
        given,
        asked,
        cfg.registry,
        graph_right=cfg.approval_right,
        graph_four_eyes=cfg.four_eyes,
        given=runtime.context,
    )
    if judged.refusal is not None and asked:
        EVENTS.answer_refused(before.run_id, asked, judged.refusal)
        return step_writes(before, before.model_copy(update={"last_error_code": judged.refusal}))
    ctx = judged.acting
    refused = check_before_acting(before, ctx, clock=cfg.clock, given=runtime.context)
    if refused is not None or ctx is None or judged.answerer is None:
        return step_writes(before, before.model_copy(update={"stop": refused}))
    answerer = judged.answerer.principal_id
    if not judged.answerer.requester:
        # Marked in the ledger before anything is written: the later nodes of the run act for
        # the requester only for an approver the ledger marks (``account.acting_in``).
        marked = await reserve(io, before, ctx, approver_key(account_of(before), answerer), {})
        if isinstance(marked, StopRequest):
            return step_writes(before, before.model_copy(update={"stop": marked}))
    acting = ctx
    answered_at = cfg.clock.now()
    result = await judged_with_rules(
        io,
        cfg.registry,
        [e.proposal.tool_name for e in asked],
        lambda: apply_approvals(
            before,
            answers,
            cfg.registry,
            acting.principal,
            repeat_limit=cfg.repeat_limit,
            now=answered_at,
            asked=asked,
            context=acting,
            approved_by=answerer,
            run_rule=ContainedRules(acting, cfg.clock),
        ),
    )
    remember = {c: a.remember for c, a in answers.items() if a.remember is not None}
    batch = result.batch
    if remember:
        # Stored before the approved calls are sealed: their verdicts name the scope. Its
        # creator is whoever answered (a lead, say), under the run's tenant (judged above).
        batch = await remember_approvals(
            io, batch, remember, before, given or ctx, cfg.clock.now(), answered_by="human"
        )
    state = before.model_copy(update={"batch": batch, "fingerprints": result.fingerprints})
    if last in ANSWER_REFUSALS:
        state = state.model_copy(update={"last_error_code": None})
    EVENTS.approvals_answered(state.run_id, asked, result.batch, cfg.registry, by=answerer)
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
                approved_by=answerer,
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
