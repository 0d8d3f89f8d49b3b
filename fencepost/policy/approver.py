"""The approver policy: the graph's own answer to a call that needs approval, before any human.

A write or external call passes every gate but approval. With ``build_agent_graph(approver=...)``
the approver is asked first, once per call, with the proposal, its verdict, the trusted
:class:`~fencepost.policy.context.RunContext` (its ``app_data``: known payees, allowed domains)
the run's evidence so far and the provenance of the call's arguments (``request.provenance``:
where each value was seen — the request, the app data, which earlier output, or nowhere). It
answers with an :class:`ApproverDecision`:

- ``approve``: the call passes every gate again as approved (as a human's approval does), and
  is reserved with its batch;
- ``reject`` with a safe code (``unknown_payee``): the call never runs; its observation says
  ``permission_denied`` and its receipt names the code. Rejections count as repeats of the call:
  the same call rejected past its repeat limit ends the run ``no_progress``;
- ``ask``: a human decides, by the existing path (``approval="interrupt"`` pauses the run; with
  ``"terminate"`` it ends ``approval_required``).

Every answer is recorded: the verdict, the receipt and the step's manifest name ``approver``
(and a human's answer ``human``). The approver may be a plain function or a policy object (any
callable), sync or ``async``; it is given at most :data:`APPROVER_TIMEOUT_SECONDS` (or the run's
deadline, if sooner), and one still running then is left behind, as a tool body is (a sync
one runs on a thread of its own, so one that blocks never holds the run; an ``async`` one is
cancelled). Fail closed: an approver that raises (its own ``CancelledError`` or
``SystemExit`` included), answers after its timeout, or returns anything but an
:class:`ApproverDecision` has rejected the call, with the code ``approver_failed``,
``approver_timeout`` or ``approver_invalid_decision`` — never its exception text.

Example::

    def payees_only(request: ApproverInput) -> ApproverDecision:
        if request.proposal.tool_name != "send_money":
            return ApproverDecision.ask()
        known = request.context.app_data.get("known_payees", [])
        if request.proposal.arguments.get("recipient") in known:
            return ApproverDecision.approve()
        return ApproverDecision.reject("unknown_payee")
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from fencepost.policy.approval import ApprovalMode
from fencepost.policy.batch import Batch, BatchEntry, replace_entries
from fencepost.policy.context import RunContext
from fencepost.policy.contract import Frozen
from fencepost.policy.decision import ToolProposal
from fencepost.policy.denial import DenialMode, observed
from fencepost.policy.gates import gate_proposal, repeat_limit_of
from fencepost.policy.observation import Observation
from fencepost.policy.phase import TerminationReason
from fencepost.policy.progress import repeat_key
from fencepost.policy.provenance import Provenance
from fencepost.policy.receipt import Receipt
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.remembered import Remember, ScopeKind
from fencepost.policy.rule_runner import RuleRunner, run_directly
from fencepost.policy.state import AgentState, StopRequest, stop
from fencepost.policy.stop_report import SAFE_CODE
from fencepost.policy.tool import Principal, ToolSpec
from fencepost.policy.verdict import Verdict, VerdictCode

APPROVER_TIMEOUT_SECONDS = 30.0
"""The longest an approver is given for one call (the run's deadline may cut it)."""

APPROVER_FAILED = "approver_failed"
"""The approver raised: the call is rejected (fail closed); the exception is logged, never kept."""
APPROVER_TIMEOUT = "approver_timeout"
"""The approver did not answer in time: the call is rejected (fail closed), whatever it answers
later."""
APPROVER_INVALID_DECISION = "approver_invalid_decision"
"""The approver returned something that is not an :class:`ApproverDecision`: rejected."""
APPROVER_REJECTED = "approver_rejected"
"""The code of a rejection that gives none of its own."""

_SAFE = re.compile(SAFE_CODE)


class ApproverDecision(Frozen):
    """An approver's answer for one call: approve, reject (with a safe code), or ask a human.

    Made with the three constructors:

    >>> ApproverDecision.reject("unknown_payee").code
    'unknown_payee'
    >>> ApproverDecision.approve().action
    'approve'
    """

    action: Literal["approve", "reject", "ask"]
    code: Annotated[str | None, Field(pattern=SAFE_CODE)] = None
    """With ``reject``: why, as a safe code (``^[a-z][a-z0-9_]{0,63}$``: no free text, nothing
    of the arguments). The receipt and the manifest record it; the model is shown
    ``permission_denied``."""
    remember: Remember | None = None
    """With ``approve``: "approve always" — remember the approval for this scope, for the run's
    tenant (:mod:`fencepost.policy.remembered`). Later calls it matches are approved by the
    scope before the approver is asked; their receipts name it."""

    @classmethod
    def approve(cls, *, remember: Remember | None = None) -> ApproverDecision:
        """Let the call run (it passes every gate again, as approved); with ``remember``, also
        approve every later call of the scope it names, for this tenant."""
        return _APPROVE if remember is None else cls(action="approve", remember=remember)

    @classmethod
    def approve_always(
        cls, scope: ScopeKind = "tool", *, until: datetime | None = None
    ) -> ApproverDecision:
        """``approve(remember=Remember(scope=scope, until=until))``: this tool for this tenant
        (``"tool"``), or this tool with these very arguments (``"arguments"``), until revoked
        or until ``until`` (a timezone-aware instant)."""
        return cls.approve(remember=Remember(scope=scope, until=until))

    @classmethod
    def reject(cls, code: str = APPROVER_REJECTED) -> ApproverDecision:
        """Refuse the call: it never runs; ``code`` (a safe code) says why."""
        return cls(action="reject", code=code)

    @classmethod
    def ask(cls) -> ApproverDecision:
        """Leave the call to a human (``approval="interrupt"`` pauses the run for one)."""
        return _ASK


_APPROVE = ApproverDecision(action="approve")
_ASK = ApproverDecision(action="ask")


@dataclass(frozen=True, slots=True)
class ApproverInput:
    """What the approver is given for one call. Everything but ``observations`` is trusted."""

    proposal: ToolProposal
    """The call as the model proposed it: tool name, call id, arguments (untrusted values)."""
    verdict: Verdict
    """The gate's verdict: every check passed but approval (``approval_required``)."""
    tool: ToolSpec
    """The registered tool: its effect and capability (trusted configuration)."""
    context: RunContext
    """The run's trusted context: tenant, principal, deadline and the caller's ``app_data``."""
    observations: tuple[Observation, ...]
    """The run's evidence so far: tool results and errors. Untrusted data, as the model's input
    is: an approver that reads them must not take instructions from them."""
    receipts: tuple[Receipt, ...]
    """What happened to each earlier call (completed, denied, who approved it)."""
    step: int
    """The model step that proposed the call."""
    run_id: str
    """The run the call belongs to."""
    provenance: Provenance = field(default_factory=Provenance)
    """Where each of the call's argument values was seen before it was proposed: the user's
    request, the app data, which earlier call's output (trusted or not), or nowhere
    (:mod:`fencepost.policy.provenance`). ``provenance.only_untrusted("recipient")``: the
    payee came only from content others wrote. Trusted: fencepost computed it."""


Approver = Callable[[ApproverInput], "ApproverDecision | Awaitable[ApproverDecision]"]
"""``approver(request) -> ApproverDecision``, sync or ``async``: a function or a policy object."""


def approver_input(
    entry: BatchEntry,
    spec: ToolSpec,
    state: AgentState,
    context: RunContext,
    provenance: Provenance | None = None,
) -> ApproverInput:
    """What the approver is asked about ``entry``; ``provenance``: its arguments', as the gate
    traced them (``GatedBatch.provenance``)."""
    return ApproverInput(
        proposal=entry.proposal,
        verdict=entry.verdict,
        tool=spec,
        context=context,
        observations=state.observations,
        receipts=state.receipts,
        step=state.step,
        run_id=state.run_id,
        provenance=provenance if provenance is not None else Provenance(),
    )


def read_decision(value: object) -> ApproverDecision:
    """An approver's return value as a decision: an :class:`ApproverDecision` (checked again, as
    one made with ``model_construct`` skipped validation), else a rejection
    (``approver_invalid_decision``). Nothing else is guessed at: ``True`` is no approval."""
    if not isinstance(value, ApproverDecision):
        return ApproverDecision.reject(APPROVER_INVALID_DECISION)
    fields = vars(value)
    action, code = fields.get("action"), fields.get("code")
    if action not in ("approve", "reject", "ask") or not (
        code is None or (type(code) is str and _SAFE.fullmatch(code))
    ):
        return ApproverDecision.reject(APPROVER_INVALID_DECISION)
    if action == "reject":
        return ApproverDecision.reject(code or APPROVER_REJECTED)
    if action == "ask":
        return _ASK
    remember = fields.get("remember")
    if remember is None:
        return _APPROVE
    try:
        # Checked again, as the decision itself: a copy made with model_copy may hold anything.
        checked = Remember.model_validate(dict(vars(remember)))
    except Exception:
        return ApproverDecision.reject(APPROVER_INVALID_DECISION)
    return ApproverDecision.approve(remember=checked)


def to_approve(batch: Batch) -> list[BatchEntry]:
    """The calls of a gated batch the approver is asked about: those that need approval."""
    return [e for e in batch if e.verdict.code is VerdictCode.APPROVAL_REQUIRED]


@dataclass(frozen=True, slots=True)
class ApproverResult:
    """What the approver's answers did to a batch."""

    batch: Batch
    """The batch with the approver's answers in its verdicts (``approval="approver"``); the
    calls it rejected are settled as data by :func:`~fencepost.policy.denial.settled_calls`."""
    fingerprints: dict[str, int]
    stop: StopRequest | None


def apply_approver(
    state: AgentState,
    batch: Batch,
    decisions: Mapping[str, ApproverDecision],
    fingerprints: Mapping[str, int],
    registry: ToolRegistry,
    principal: Principal,
    *,
    context: RunContext,
    approval: ApprovalMode,
    denial: DenialMode,
    repeat_limit: int,
    now: datetime | None = None,
    run_rule: RuleRunner = run_directly,
) -> ApproverResult:
    """Apply the approver's ``decisions`` to the calls of ``batch`` that need approval.

    ``fingerprints``: the repeat counts with the batch's allowed calls counted. An approved call
    passes every gate again, approved (the counts of the calls before it included), and is
    allowed, or denied as any call is; a rejected one is ``rejected`` (counted as a repeat: past
    its limit, ``no_progress``); one left to a human waits (``approval_pending``) in interrupt
    mode, and ends the run ``approval_required`` in terminate mode. ``run_rule``: how the tools'
    own rules are run when a call is gated again (:mod:`fencepost.policy.rule_runner`).
    """
    counts = dict(fingerprints)
    changed: list[BatchEntry] = []
    first_stop: StopRequest | None = None
    for entry in to_approve(batch):
        decision = decisions.get(entry.call_id, _ASK)
        name = entry.proposal.tool_name
        spec = registry.get(name) if name in registry else None
        if spec is None:  # never: the gate registered it; refused all the same
            decision = ApproverDecision.reject(APPROVER_INVALID_DECISION)
        verdict: Verdict = entry.verdict
        if decision.action == "ask":
            # Recorded as the approver's answer ("ask"); a human's answer replaces the verdict.
            verdict = verdict.model_copy(update={"approval": "approver"})
            if approval == "interrupt":
                verdict = verdict.model_copy(update={"code": VerdictCode.APPROVAL_PENDING})
            else:
                first_stop = first_stop or stop(
                    TerminationReason.APPROVAL_REQUIRED, VerdictCode.APPROVAL_REQUIRED.value
                )
            changed.append(entry.with_verdict(verdict))
            continue
        if decision.action == "approve" and spec is not None:
            verdict = gate_proposal(
                registry,
                entry.proposal,
                state,
                principal,
                repeat_limit=repeat_limit,
                approved=True,
                counts=counts,
                now=now,
                context=context,
                run_rule=run_rule,
            ).model_copy(update={"approval": "approver", "provenance": verdict.provenance})
            key = repeat_key(verdict.fingerprint, state)
            if verdict.allowed or observed(verdict.code, denial):
                counts[key] = counts.get(key, 0) + 1
            elif verdict.termination is not None:
                first_stop = first_stop or stop(verdict.termination, verdict.code.value)
            changed.append(entry.with_verdict(verdict))
            continue
        # Rejected: a repeat of the call, as an allowed one would be.
        code = decision.code or APPROVER_REJECTED
        key = repeat_key(verdict.fingerprint, state)
        seen = counts.get(key, 0)
        if spec is not None and seen >= repeat_limit_of(spec, repeat_limit):
            verdict = verdict.model_copy(
                update={"code": VerdictCode.NO_PROGRESS, "approval": "approver"}
            )
            first_stop = first_stop or stop(TerminationReason.NO_PROGRESS, "no_progress")
        else:
            counts[key] = seen + 1
            verdict = verdict.model_copy(
                update={
                    "code": VerdictCode.REJECTED,
                    "approval": "approver",
                    "problems": (f"rule: {code}",),
                }
            )
        changed.append(entry.with_verdict(verdict))
    return ApproverResult(
        batch=replace_entries(batch, changed),
        fingerprints=counts,
        stop=first_stop,
    )


__all__ = [
    "APPROVER_FAILED",
    "APPROVER_INVALID_DECISION",
    "APPROVER_REJECTED",
    "APPROVER_TIMEOUT",
    "APPROVER_TIMEOUT_SECONDS",
    "Approver",
    "ApproverDecision",
    "ApproverInput",
    "ApproverResult",
    "apply_approver",
    "approver_input",
    "read_decision",
    "to_approve",
]
