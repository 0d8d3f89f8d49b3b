"""The approve node: pause for a human on write/external calls; apply the answer on resume.

The node does the I/O; which calls wait, who may answer, what an answer does and what the run
writes are plans of :mod:`fencepost.policy.approve` (facts in, one frozen plan out).
"""

from __future__ import annotations

from typing import Any

from langgraph.errors import GraphInterrupt
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from fencepost.graph.account import (
    RunAccount,
    account_of,
    account_owner,
    reserve,
    reserve_batch,
)
from fencepost.graph.events import EVENTS
from fencepost.graph.gate import remember_approvals
from fencepost.graph.node_io import NodeIO
from fencepost.graph.rules import ContainedRules, judged_with_rules
from fencepost.graph.settings import LoopConfig, Update
from fencepost.graph.state import require_state
from fencepost.graph.trace import manifest, recorded
from fencepost.graph.writes import step_writes
from fencepost.policy import Phase, StopRequest
from fencepost.policy.approval import ApprovalAnswer, ApprovalProblem
from fencepost.policy.approve import ApprovalSettings, ask_approval, end_approval, plan_approval
from fencepost.policy.context import coerce_context
from fencepost.policy.keys import approver_key


def approval_settings(cfg: LoopConfig) -> ApprovalSettings:
    """The settings the approve phase reads, from the graph's."""
    return ApprovalSettings(
        registry=cfg.registry,
        approval_right=cfg.approval_right,
        four_eyes=cfg.four_eyes,
        repeat_limit=cfg.repeat_limit,
        verdict_key=cfg.verdict_key,
    )


async def approve(io: NodeIO, values: dict[str, Any], runtime: Runtime[Any]) -> Update:
    """Ask for approval of the waiting calls; apply the answer on resume.

    An answer that is not exactly one of the accepted forms, or an edit its tool's schema
    refuses, asks again with a typed error (a call never runs on a guess, and a typo in an
    edit does not end the run). An answer from someone who may not give it changes nothing but
    the refusal's code, so the run waits again in a fresh approval (``plan_approval``).
    """
    cfg = io.cfg
    before = require_state(values)
    ask = ask_approval(before, approval_settings(cfg))
    problem: ApprovalProblem | None = None
    answers: dict[str, ApprovalAnswer] = {}
    while ask.asked:
        try:
            response = interrupt(ask.request(problem), response_schema=ask.schema)
        except GraphInterrupt:
            ask.paused_again(before.run_id, problem)
            raise
        read = ask.read(response)
        if not isinstance(read, ApprovalProblem):
            answers = read
            break
        problem = read
    # Everything below runs only on resume, with the context passed on resume.
    given = coerce_context(runtime.context)
    account = account_of(before)
    plan = plan_approval(
        before,
        ask,
        answers,
        owner=await account_owner(io, account),
        ctx=given,
        given=runtime.context,
        clock=cfg.clock,
    )
    if plan.refusal is not None:
        EVENTS.answer_refused(before.run_id, ask.asked, plan.refusal)
        return step_writes(before, before.model_copy(update={"last_error_code": plan.refusal}))
    acting, answerer = plan.acting, plan.answerer
    if plan.stop is not None or acting is None:
        return step_writes(before, before.model_copy(update={"stop": plan.stop}))
    if plan.marks_approver is not None:
        marked = await reserve(
            io,
            RunAccount(account, before.run_id),
            acting,
            approver_key(account, plan.marks_approver),
            {},
        )
        if isinstance(marked, StopRequest):
            return step_writes(before, before.model_copy(update={"stop": marked}))
    answered_at = cfg.clock.now()
    rules = ContainedRules(acting, cfg.clock)
    result = await judged_with_rules(
        io,
        cfg.registry,
        [e.proposal.tool_name for e in ask.asked],
        lambda: plan.apply(before, rules, answered_at),
        rules,
    )
    batch = result.batch
    if plan.remember:
        # Its creator is whoever answered (a lead, say), under the run's tenant (judged above).
        batch = await remember_approvals(
            io, batch, plan.remember, before, given or acting, cfg.clock.now(), answered_by="human"
        )
    end = end_approval(plan, before, result, batch)
    EVENTS.approvals_answered(before.run_id, ask.asked, result.batch, cfg.registry, by=answerer)
    manifests = [manifest(end.state, cfg, acting, phase=Phase.VALIDATE, **r) for r in end.records]
    state, stopped = end.state, end.stop
    if end.reserves is not None:
        state, stopped = await reserve_batch(io, state, acting, only=end.reserves)
    return step_writes(before, recorded(end.closed(state, stopped), runtime, manifests))
