"""The approve phase, as plans: what a person is asked, what their answer does to the run.

The node gathers the facts (the run, the answer given on resume, the caller's context, the
owner the run's ledger account records) and asks one question before the pause and one after
the answer; each answer is a frozen plan that names the I/O the node does (pause, mark the
approver in the ledger, re-gate the answered calls with the tools' rules contained, remember
scopes, reserve what was approved) and what it writes:

- :func:`ask_approval`: which calls wait, the request and answer schema shown, how an answer
  is read (an answer that is no accepted form asks again, typed);
- :func:`plan_approval`: the stop or the refusal that keeps the run waiting, or who answered,
  with what right, in which context the answer acts, and what it approves and remembers;
- :func:`end_approval`: the run to write, its manifests' fields, and what is reserved.

The answers' forms and their reading are :mod:`fencepost.policy.approval`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fencepost.policy.approval import (
    ANSWER_REFUSALS,
    AnswerRefusal,
    ApprovalAnswer,
    ApprovalProblem,
    ApprovalResult,
    answer_schema,
    apply_approvals,
    approval_request,
    approval_right,
    as_requester,
    may_answer,
    needs_four_eyes,
    read_answer,
    waiting,
)
from fencepost.policy.batch import BatchEntry
from fencepost.policy.context import RunContext
from fencepost.policy.contract import Frozen
from fencepost.policy.deadline import Clock
from fencepost.policy.developer_log import APPROVAL
from fencepost.policy.events import reduce_tool_events
from fencepost.policy.manifest import verdict_outcome
from fencepost.policy.may_go_on import check_before_acting
from fencepost.policy.outcome import receipt_for
from fencepost.policy.ownership import recorded_capabilities
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.remembered import Remember
from fencepost.policy.rule_runner import RuleRunner
from fencepost.policy.state import AgentState, StopRequest
from fencepost.policy.tool import ToolSpec


@dataclass(frozen=True, slots=True)
class ApprovalSettings:
    """The loop's settings the approve phase reads (``LoopSettings`` names and checks each)."""

    registry: ToolRegistry
    approval_right: str | None
    """The graph's approval right (a tool's own wins; default ``approve:<capability>``)."""
    four_eyes: bool
    """The graph's four-eyes (a tool's own wins)."""
    repeat_limit: int
    verdict_key: bytes | None


class AnswerRefused(Frozen):
    """Why the last answer was not taken from whoever gave it; sent with the next approval
    request (the run kept waiting, nothing of the answer was written)."""

    code: AnswerRefusal
    rights: tuple[str, ...] = ()
    """The approval right a principal other than the requester must hold for each waiting
    call."""
    four_eyes: bool = False
    """Whether the requester's own answer is refused."""


@dataclass(frozen=True, slots=True)
class ApprovalAsk:
    """Before the pause: the calls that wait for a person (``approval.waiting``: only those the
    gate left waiting, sealed; a pending entry anyone else wrote is never asked about), what
    they are shown, and how their answer is read.

    ``refused``: why the last answer was not taken from whoever gave it (the run's
    ``last_error_code``, cleared once an answer is taken), shown with the first request of this
    pause (a refused answer is spent with its task: never read again).
    """

    asked: tuple[BatchEntry, ...]
    settings: ApprovalSettings
    refused: AnswerRefused | None
    schema: dict[str, Any] | None
    """The JSON schema of every accepted answer: the interrupt's ``response_schema``."""

    def request(self, problem: ApprovalProblem | None) -> dict[str, Any]:
        """The interrupt payload: the waiting calls and who may answer them, with the problem
        of the answer just read (asked again), or else the last answer's refusal."""
        cfg = self.settings
        payload = approval_request(
            self.asked,
            cfg.registry,
            problem,
            graph_right=cfg.approval_right,
            graph_four_eyes=cfg.four_eyes,
        )
        if problem is None and self.refused is not None:
            payload["error"] = self.refused.model_dump(mode="json")
        return payload

    def read(self, response: Any) -> dict[str, ApprovalAnswer] | ApprovalProblem:
        """An answer as each waiting call's answer, or the problem that has it asked again
        (``approval.read_answer``): a call never runs on a guess, and a typo in an edit does
        not end the run."""
        return read_answer(response, self.asked, self.settings.registry)

    def paused_again(self, run_id: str, problem: ApprovalProblem | None) -> None:
        """Log, on ``fencepost.approval`` (WARNING), that an answer was refused and the run
        asks again: the code and the forms it takes, never the value given (it may hold
        anything). Logged only as the run pauses again: a replayed answer was heard before."""
        if problem is None or not APPROVAL.isEnabledFor(logging.WARNING):
            return
        APPROVAL.warning(
            "approval answer refused (run %s): %s; the run waits again for one of: %s",
            run_id,
            problem.code,
            "; ".join(problem.accepted_forms),
            extra={"run_id": run_id, "call_id": None, "code": problem.code},
        )


def _specs(entries: tuple[BatchEntry, ...], registry: ToolRegistry) -> list[ToolSpec]:
    return [registry.get(e.proposal.tool_name) for e in entries if e.proposal.tool_name in registry]


def ask_approval(state: AgentState, settings: ApprovalSettings) -> ApprovalAsk:
    """Before the pause: which calls of the run's batch wait, what is asked about them, and
    the refusal of the last answer, if one was refused (its code, and who may answer)."""
    asked = tuple(waiting(state.batch, run_id=state.run_id, verdict_key=settings.verdict_key))
    last = state.last_error_code
    refused = None
    if last in ANSWER_REFUSALS:
        specs = _specs(asked, settings.registry)
        refused = AnswerRefused(
            code=last,  # type: ignore[arg-type]
            rights=tuple(
                dict.fromkeys(approval_right(s, graph_right=settings.approval_right) for s in specs)
            ),
            four_eyes=any(needs_four_eyes(s, graph_four_eyes=settings.four_eyes) for s in specs),
        )
    return ApprovalAsk(
        asked=asked,
        settings=settings,
        refused=refused,
        schema=answer_schema(asked, settings.registry) if asked else None,
    )


@dataclass(frozen=True, slots=True)
class ApprovalPlan:
    """After the answer: the run's stop, the refusal that keeps it waiting (``refusal``), or
    who answered and what their answer does (``acting`` set: the run goes on).

    ``acting``: the context the answer acts in — the caller's own when the requester answered;
    for an approver, the caller's with the requester's identity (the run's identity never
    becomes the approver's), holding the capabilities the run's account recorded for the
    requester (on an account that records none, those of the waiting calls only: the gate
    found the requester held them when it asked). ``marks_approver``: the approver (not the
    requester) who answered, marked in the ledger before anything is written: the later nodes
    of the run act for the requester only for an approver the ledger marks
    (``account.acting_in``).
    """

    ask: ApprovalAsk
    stop: StopRequest | None = None
    refusal: AnswerRefusal | None = None
    answers: Mapping[str, ApprovalAnswer] | None = None
    answerer: str | None = None
    acting: RunContext | None = None
    marks_approver: str | None = None

    @property
    def remember(self) -> dict[str, Remember]:
        """The approvals to remember, per call id: stored before the approved calls are sealed
        (their verdicts name the scope)."""
        return {c: a.remember for c, a in (self.answers or {}).items() if a.remember is not None}

    def apply(self, state: AgentState, run_rule: RuleRunner, now: datetime) -> ApprovalResult:
        """The answers applied at ``now`` (``approval.apply_approvals``): a rejected call is
        receipted ``denied``; an approved or edited one passes every gate again, in ``acting``,
        with the tools' own rules run by ``run_rule``."""
        acting, cfg = self.acting, self.ask.settings
        if acting is None or self.answers is None:
            raise ValueError("only a plan that takes an answer applies it")
        return apply_approvals(
            state,
            self.answers,
            cfg.registry,
            acting.principal,
            repeat_limit=cfg.repeat_limit,
            now=now,
            asked=self.ask.asked,
            context=acting,
            approved_by=self.answerer,
            run_rule=run_rule,
        )


def plan_approval(
    state: AgentState,
    ask: ApprovalAsk,
    answers: Mapping[str, ApprovalAnswer],
    *,
    owner: Mapping[str, str] | None,
    ctx: RunContext | None,
    given: object,
    clock: Clock,
) -> ApprovalPlan:
    """What an answer does, given who gave it (``ctx``: the caller's context on resume,
    ``given`` as it was passed) and the owner the run's ledger account records (never state,
    which any update rewrites).

    With nothing waiting, the run goes on only for a context that may act for it. Otherwise
    who answered is judged (``approval.may_answer``): an answer from no context, another
    tenant's, a principal without the approval right of every waiting call (or the requester's
    own, under four-eyes) is not taken — the run waits again, in a fresh approval, with the
    refusal's code. A taken answer acts in the context it is judged to act in, which must still
    be allowed to act (``may_go_on.check_before_acting``).
    """
    if not ask.asked:
        refused = check_before_acting(state, ctx, clock=clock, given=given)
        if refused is not None or ctx is None:
            return ApprovalPlan(ask=ask, stop=refused)
    run_owner = owner or {"tenant": state.tenant_id or "", "principal": state.principal_id or ""}
    cfg = ask.settings
    specs = _specs(ask.asked, cfg.registry)
    refusal = may_answer(
        run_owner,
        ctx,
        [approval_right(s, graph_right=cfg.approval_right) for s in specs],
        four_eyes=any(needs_four_eyes(s, graph_four_eyes=cfg.four_eyes) for s in specs),
        given=given,
    )
    if refusal is not None and ask.asked:
        return ApprovalPlan(ask=ask, refusal=refusal)
    acting: RunContext | None = None
    own = False
    if refusal is None and ctx is not None:
        requester = run_owner.get("principal", ctx.principal.id)
        own = ctx.principal.id == requester
        held = recorded_capabilities(run_owner)
        if held is None:  # an account opened before capabilities were recorded
            held = frozenset(s.capability for s in specs)
        acting = ctx if own else as_requester(ctx, requester, held)
    refused = check_before_acting(state, acting, clock=clock, given=given)
    if refused is not None or acting is None or ctx is None:
        return ApprovalPlan(ask=ask, stop=refused)
    return ApprovalPlan(
        ask=ask,
        answers=answers,
        answerer=ctx.principal.id,
        acting=acting,
        marks_approver=None if own else ctx.principal.id,
    )


@dataclass(frozen=True, slots=True)
class ApprovalEnd:
    """After the answers were applied: the run to write (before what was approved is
    reserved), one manifest's fields per answered call, and what is reserved (``reserves``:
    the call ids just approved; ``None`` when the answers stopped the run)."""

    state: AgentState
    records: tuple[dict[str, Any], ...]
    reserves: frozenset[str] | None
    stop: StopRequest | None
    result: ApprovalResult

    def closed(self, state: AgentState, stopped: StopRequest | None) -> AgentState:
        """The run with its stop (the answers', or the reservation's) and the rejected calls'
        observations and ``denied`` receipts."""
        state = state.model_copy(update={"stop": stopped})
        rejected = self.result.rejected
        if not rejected:
            return state
        state = reduce_tool_events(state, tuple(o.event for o in rejected))
        return state.model_copy(
            update={"receipts": state.receipts + tuple(receipt_for(o) for o in rejected)}
        )


def end_approval(
    plan: ApprovalPlan, state: AgentState, result: ApprovalResult, batch: tuple[BatchEntry, ...]
) -> ApprovalEnd:
    """What the applied answers (``result``; ``batch``: its batch, with remembered scopes
    named) mean for the run: its batch and repeat counts, the refusal it waited on cleared,
    each answered call's manifest (its verdict, ``approval="human"`` and who answered), and
    the calls to reserve and seal — only what was just approved: calls allowed at the gate
    were reserved there, and anything else in the batch was judged by nobody."""
    update: dict[str, Any] = {"batch": batch, "fingerprints": result.fingerprints}
    if plan.ask.refused is not None:
        update["last_error_code"] = None
    registry = plan.ask.settings.registry
    records = []
    for entry in plan.ask.asked:
        now = next(e for e in result.batch if e.call_id == entry.call_id)
        name = now.proposal.tool_name
        spec = registry.get(name) if name in registry else None
        records.append(
            {
                "outcome": verdict_outcome(now.verdict.code),
                "decision_kind": "tool",
                "tool_name": name if spec else None,
                "effect": spec.effect if spec else None,
                "verdict": now.verdict.code,
                "approval": "human",
                "approved_by": plan.answerer,
            }
        )
    reserves = frozenset(e.call_id for e in plan.ask.asked) if result.stop is None else None
    return ApprovalEnd(
        state=state.model_copy(update=update),
        records=tuple(records),
        reserves=reserves,
        stop=result.stop,
        result=result,
    )
