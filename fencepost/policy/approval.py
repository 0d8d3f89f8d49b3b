"""Human approval of write and external effects: what is asked, what answers mean.

A call that needs approval waits (``approval="interrupt"``) until the caller resumes with an
answer. Accepted answers, for every waiting call at once or per call id:

- ``"approve"`` / ``"reject"``
- ``{"decision": "approve" | "reject"}`` (``"type"`` is accepted for ``"decision"``)
- ``{"decision": "edit", "arguments": {...}}``: run with these arguments instead, which pass
  every gate again
- ``{"<call id>": <one of the above>, ...}``: per call; a waiting call left out is rejected

Anything else is not guessed at: the run asks again, with a typed error naming these forms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import JsonValue, ValidationError

from fencepost.policy._model import Frozen, assemble
from fencepost.policy.batch import Batch, BatchEntry, replace_entries
from fencepost.policy.decision import ToolProposal
from fencepost.policy.effect import Effect
from fencepost.policy.error_codes import ErrorCode
from fencepost.policy.events import ToolFailed
from fencepost.policy.gates import gate_proposal
from fencepost.policy.outcome import CallOutcome
from fencepost.policy.progress import repeat_key
from fencepost.policy.receipt import ReceiptStatus
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.run_check import stop
from fencepost.policy.state import AgentState, StopRequest
from fencepost.policy.tool import Principal
from fencepost.policy.verdict import VerdictCode

ApprovalMode = Literal["terminate", "interrupt"]
"""``"terminate"`` ends a run that proposes a write as ``approval_required``; ``"interrupt"``
pauses it for a human."""

ACCEPTED_FORMS = (
    '"approve"',
    '"reject"',
    '{"decision": "approve"}',
    '{"decision": "reject"}',
    '{"decision": "edit", "arguments": {...}}',
    '{"<call_id>": <any of the above>, ...} (a call left out is rejected)',
)


class ApprovalAnswer(Frozen):
    """One waiting call's answer."""

    decision: Literal["approve", "reject", "edit"]
    arguments: dict[str, JsonValue] | None = None


class ApprovalProblem(Frozen):
    """An answer fencepost does not recognise; sent back with the next approval request."""

    code: Literal["unrecognized_answer"] = "unrecognized_answer"
    accepted_forms: tuple[str, ...] = ACCEPTED_FORMS


def _one(value: Any) -> ApprovalAnswer | None:
    if value in ("approve", "reject"):
        return ApprovalAnswer(decision=value)
    if isinstance(value, Mapping):
        decision = value.get("decision", value.get("type"))
        if decision in ("approve", "reject"):
            return ApprovalAnswer(decision=decision)
        if decision == "edit" and isinstance(value.get("arguments"), Mapping):
            try:
                return ApprovalAnswer(decision="edit", arguments=dict(value["arguments"]))
            except ValidationError:
                return ApprovalAnswer(decision="edit", arguments={"__invalid__": True})
    return None


def parse_approval(
    response: Any, call_ids: Sequence[str]
) -> dict[str, ApprovalAnswer] | ApprovalProblem:
    """Each waiting call's answer, or the problem with an answer that is not one of the forms."""
    if isinstance(response, Mapping) and response and all(k in call_ids for k in response):
        # A call the answer leaves out is rejected: it never runs by default.
        answers = {cid: _one(response.get(cid, "reject")) for cid in call_ids}
    else:
        answer = _one(response)
        answers = {cid: answer for cid in call_ids}
    if any(a is None for a in answers.values()):
        return ApprovalProblem()
    return {cid: a for cid, a in answers.items() if a is not None}


def waiting(batch: Batch) -> list[BatchEntry]:
    """The calls of ``batch`` that wait for a human."""
    return [e for e in batch if e.verdict.code is VerdictCode.APPROVAL_PENDING]


def approval_request(
    batch: Batch, registry: ToolRegistry, problem: ApprovalProblem | None = None
) -> dict[str, Any]:
    """The interrupt payload a human sees: each waiting call's tool, arguments and effect."""
    calls = []
    for entry in waiting(batch):
        name = entry.proposal.tool_name
        spec = registry.get(name) if name in registry else None
        calls.append(
            {
                "call_id": entry.call_id,
                "tool_name": name,
                "arguments": entry.proposal.arguments,
                "effect": spec.effect.value if spec else None,
                "capability": spec.capability if spec else None,
            }
        )
    payload: dict[str, Any] = {"fencepost": "approval", "calls": calls}
    if problem is not None:
        payload["error"] = problem.model_dump(mode="json")
    return payload


@dataclass(frozen=True, slots=True)
class ApprovalResult:
    """What the answers did: the batch re-gated, the rejected calls' outcomes, any stop."""

    batch: Batch
    fingerprints: dict[str, int]
    rejected: tuple[CallOutcome, ...]
    stop: StopRequest | None


def apply_approvals(
    state: AgentState,
    answers: Mapping[str, ApprovalAnswer],
    registry: ToolRegistry,
    principal: Principal,
    *,
    repeat_limit: int,
    now: datetime | None = None,
) -> ApprovalResult:
    """Apply the answers to the waiting calls: a rejected call is receipted ``denied`` and never
    runs; an approved or edited one passes every gate again (capability included, with the
    principal that answered)."""
    counts = dict(state.fingerprints)
    changed: list[BatchEntry] = []
    rejected: list[CallOutcome] = []
    first_stop: StopRequest | None = None
    for entry in waiting(state.batch):
        answer = answers[entry.call_id]
        name = entry.proposal.tool_name
        if answer.decision == "reject":
            verdict = entry.verdict.model_copy(update={"code": VerdictCode.REJECTED})
            changed.append(entry.with_verdict(verdict))
            effect = registry.get(name).effect if name in registry else None
            rejected.append(_rejection(entry, effect))
            continue
        proposal = entry.proposal
        if answer.decision == "edit":
            try:
                proposal = ToolProposal(
                    call_id=proposal.call_id,
                    tool_name=proposal.tool_name,
                    arguments=answer.arguments or {},
                    depends_on=proposal.depends_on,
                )
            except ValidationError:
                proposal = proposal.model_copy(update={"arguments": {"__invalid__": True}})
        verdict = gate_proposal(
            registry,
            proposal,
            state,
            principal,
            repeat_limit=repeat_limit,
            approved=True,
            counts=counts,
            now=now,
        )
        if verdict.allowed:
            key = repeat_key(verdict.fingerprint, state)
            counts[key] = counts.get(key, 0) + 1
        elif first_stop is None and verdict.termination is not None:
            first_stop = stop(verdict.termination, verdict.code.value)
        changed.append(assemble(BatchEntry, {"proposal": proposal, "verdict": verdict}))
    return ApprovalResult(
        batch=replace_entries(state.batch, changed),
        fingerprints=counts,
        rejected=tuple(rejected),
        stop=first_stop,
    )


def _rejection(entry: BatchEntry, effect: Effect | None) -> CallOutcome:
    return CallOutcome(
        event=ToolFailed(
            call_id=entry.call_id,
            tool_name=entry.proposal.tool_name,
            error_code=ErrorCode.PERMISSION_DENIED,
        ),
        status=ReceiptStatus.DENIED,
        attempts=0,
        effect=effect,
    )
