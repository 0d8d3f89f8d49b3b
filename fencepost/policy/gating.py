"""Gating a batch: every call of a decision is gated, and its budget reserved, before any runs.

One denial stops the whole batch (nothing in it runs, nothing is reserved); in interrupt mode a
call that needs approval waits for it; calls the budget cannot cover are marked, never run.

The gate phase, as plans: the node (:mod:`fencepost.graph.gate`) gathers the facts (the batch,
the run, its context, what the ledger says) and asks one question before it judges the batch
and one after; each answer is a frozen plan that names the I/O the node does and what it
writes:

- :func:`plan_gate`: what the ledger is asked (the dependencies named outside the batch, the
  tools whose remembered scopes may approve a call), who decides per call whether it needs
  approval, and how the batch is judged, asked about and answered by the approver;
- :func:`end_gate`: the run to write, its manifests' fields, and whether the batch is reserved.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, NamedTuple

from fencepost.policy.approval import ApprovalMode
from fencepost.policy.approver import (
    ApproverDecision,
    ApproverInput,
    ApproverResult,
    apply_approver,
    approver_input,
    to_approve,
)
from fencepost.policy.batch import Batch, BatchEntry
from fencepost.policy.budget import BudgetExhausted
from fencepost.policy.conditional_approval import ApprovalQuestion, deciding
from fencepost.policy.context import RunContext
from fencepost.policy.contract import assemble
from fencepost.policy.decision import ToolProposal
from fencepost.policy.denial import DenialMode, gate_record, observed, settled_calls
from fencepost.policy.effect import Effect
from fencepost.policy.events import reduce_tool_events
from fencepost.policy.execution import budget_refusals
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.gates import gate_call, repeat_limit_of, tool_gate
from fencepost.policy.manifest import (
    ManifestBase,
    StepManifest,
    call_manifest,
    step_manifest,
    verdict_outcome,
)
from fencepost.policy.outcome import receipt_for
from fencepost.policy.phase import Phase, TerminationReason
from fencepost.policy.progress import repeat_key
from fencepost.policy.provenance import (
    UNTRUSTED_PROVENANCE,
    ObservedOutput,
    Provenance,
    ProvenanceMode,
    RunSources,
    untrusted_sensitive,
)
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.remembered import ApprovalScope, matching_scope
from fencepost.policy.repair import given_back, may_repair
from fencepost.policy.reservations import stop_for_exhausted
from fencepost.policy.revised import revised
from fencepost.policy.rule_runner import RuleRunner, run_directly
from fencepost.policy.run_sources import sources_of
from fencepost.policy.state import AgentState, StopRequest, stop
from fencepost.policy.tool import NeedsApproval, Principal, ToolSpec
from fencepost.policy.verdict import Verdict, VerdictCode, seal_verdict


class GatedBatch(NamedTuple):
    """A batch as the gate left it: entries with verdicts, repeat counts, and a stop if any.

    A named tuple (frozen, as a result is), made once per decision: a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__``."""

    batch: Batch
    fingerprints: dict[str, int]
    stop: StopRequest | None = None
    specs: tuple[ToolSpec | None, ...] = ()
    """Per entry, the registered spec of its tool (``None``: not registered)."""
    provenance: Mapping[str, Provenance] = {}
    """By call id, the provenance of each traced call's arguments
    (:func:`~fencepost.policy.provenance.traced`): what the approver is shown."""


def duplicate_call_ids(calls: Sequence[ToolProposal], answered: Collection[str]) -> bool:
    """Whether a batch reuses a call id, among itself or of a call already answered."""
    if len(calls) == 1:  # most decisions: no batch to repeat an id within
        return calls[0].call_id in answered
    ids = [c.call_id for c in calls]
    return len(set(ids)) != len(ids) or any(i in answered for i in ids)


def refused_batch(
    calls: Sequence[ToolProposal], answered: Collection[str], produced: Collection[str]
) -> StopRequest | None:
    """The stop that refuses a whole batch before any call of it is gated: a call id used
    twice, or one the run already answered (``duplicate_call_id``); a dependency the batch
    cannot have (itself, a cycle, or an id that is neither in the batch nor a call earlier in
    the run whose tool returned a result, as ``produced`` says from the ledger:
    ``invalid_dependency``). Either ends the run ``invalid_proposal``."""
    if duplicate_call_ids(calls, answered):
        return stop(TerminationReason.INVALID_PROPOSAL, "duplicate_call_id")
    if any(c.depends_on for c in calls) and invalid_dependencies(calls, produced):
        return stop(TerminationReason.INVALID_PROPOSAL, "invalid_dependency")
    return None


def invalid_dependencies(calls: Sequence[ToolProposal], completed: Collection[str]) -> bool:
    """Whether a batch names a dependency it cannot have: itself, a call id that is neither in
    the batch nor a call completed earlier in the run, or a cycle. Linear in calls and edges."""
    ids = {c.call_id for c in calls}
    dependents: dict[str, list[str]] = {cid: [] for cid in ids}
    waiting_on: dict[str, int] = {}
    for call in calls:
        inside = set()
        for dep in call.depends_on:
            if dep == call.call_id or (dep not in ids and dep not in completed):
                return True
            if dep in ids:
                inside.add(dep)
        waiting_on[call.call_id] = len(inside)
        for dep in inside:
            dependents[dep].append(call.call_id)
    # Kahn's algorithm: a cycle leaves calls that never become ready.
    ready = [cid for cid, n in waiting_on.items() if n == 0]
    seen = 0
    while ready:
        done = ready.pop()
        seen += 1
        for cid in dependents[done]:
            waiting_on[cid] -= 1
            if waiting_on[cid] == 0:
                ready.append(cid)
    return seen != len(waiting_on)


def gate_batch(
    registry: ToolRegistry,
    calls: Sequence[ToolProposal],
    state: AgentState,
    principal: Principal,
    *,
    repeat_limit: int,
    approval: ApprovalMode,
    approved: bool = False,
    now: datetime | None = None,
    context: RunContext | None = None,
    denial: DenialMode = "end_run",
    approver: bool = False,
    remembered: Mapping[str, ApprovalScope] | None = None,
    needs_approval: Mapping[str, bool] | None = None,
    provenance: ProvenanceMode = "observe",
    outputs: Sequence[ObservedOutput] | None = None,
    run_rule: RuleRunner = run_directly,
    specs: Sequence[ToolSpec | None] | None = None,
) -> GatedBatch:
    """Gate every call of a batch in order; the first denial that ends a run stops it all.

    Repeats count within the batch too: the same call twice in one batch is seen twice.
    ``denial="observe"``: a capability or semantic denial stops nothing; it counts as a repeat
    of its call (the same call denied past its repeat limit is ``no_progress``, which does
    stop). ``approver``: a call that needs approval is left ``approval_required`` for the
    graph's approver policy to answer (:mod:`fencepost.policy.approver`), stopping nothing.
    ``remembered``: by call id, the live remembered approval scope that matches the call
    (:mod:`fencepost.policy.remembered`): the call is gated as approved, and an allowed verdict
    names the scope, as answered by whoever created it.
    ``needs_approval``: per call id, whether the call needs approval, as its tool's (or the
    graph's) ``needs_approval`` callable answered (:mod:`fencepost.policy.conditional_approval`);
    a call not in it needs approval by its effect.
    ``provenance``: the built-in provenance rule's mode
    (:data:`~fencepost.policy.provenance.ProvenanceMode`): a write or external call whose
    sensitive arguments trace only to untrusted output is refused ``untrusted_provenance``
    once it passed every other check (``"refuse"``), needs approval however its tool's
    ``needs_approval`` or a remembered scope would have it (``"ask"``), or goes on as any call
    (``"observe"``). Every traced call's verdict records its provenance, whatever the mode.
    ``outputs``: the run's earlier outputs as sources (:func:`~fencepost.policy.provenance.
    observed_output`); ``None``: the state's observations, trusted as their tools declare.
    ``run_rule``: how the tools' own rules are run (:mod:`fencepost.policy.rule_runner`; the
    graph's leaves one that blocks behind at its timeout).
    ``specs``: per call, its tool's spec in ``registry`` (``None``: not registered), when the
    caller looked them up already (:attr:`GatePlan.specs`).
    """
    if specs is None:
        specs = [registry.get(c.tool_name) if c.tool_name in registry else None for c in calls]
    # Only the counts this batch raises: read through to the run's own (not copied per step).
    run_counts = state.fingerprints
    raised: dict[str, int] = {}
    counts: Mapping[str, int] = run_counts  # until a call of the batch is allowed
    entries: list[BatchEntry] = []
    found: list[ToolSpec | None] = []
    first_stop: StopRequest | None = None
    sources: RunSources | None = None
    traces: dict[str, Provenance] = {}
    for call, known in zip(calls, specs, strict=True):
        if raised and counts is run_counts:
            counts = ChainMap(raised, run_counts)  # made only for a call after an allowed one
        scope = remembered.get(call.call_id) if remembered else None
        gate = tool_gate(known) if known is not None else None
        flagged: tuple[str, ...] = ()
        trace: Provenance | None = None
        if known is not None and gate is not None and gate.traced:
            if sources is None:
                sources = sources_of(state, context, registry, outputs)
            # The tool's own argument names only: a key the model made up is never recorded.
            trace = traces[call.call_id] = sources.trace(
                call.arguments, known.args_model.model_fields
            )
            flagged = untrusted_sensitive(known, trace)
        ask = provenance == "ask" and bool(flagged)
        asked_before = needs_approval.get(call.call_id) if needs_approval else None
        verdict, spec, counted = gate_call(
            known,
            call,
            state,
            principal,
            repeat_limit=repeat_limit,
            # Asked about by the provenance rule: no remembered scope answers for a person.
            approved=approved or (scope is not None and not ask),
            counts=counts,
            now=now,
            context=context,
            needs_approval=True if ask else asked_before,
            provenance=trace,
            run_rule=run_rule,
            gate=gate,
        )
        if (
            trace is None
            and known is not None
            and verdict.code is VerdictCode.APPROVAL_REQUIRED
            and approver
        ):
            # A read that needs approval: the approver is shown its provenance too.
            sources = sources or sources_of(state, context, registry, outputs)
            trace = traces[call.call_id] = sources.trace(
                call.arguments, known.args_model.model_fields
            )
        if traces and call.call_id in traces:
            verdict = verdict.model_copy(update={"provenance": recorded(traces[call.call_id])})
        if flagged and provenance == "refuse" and verdict.code in _REACHED:
            verdict = verdict.model_copy(
                update={
                    "code": VerdictCode.UNTRUSTED_PROVENANCE,
                    "problems": (
                        f"rule: {UNTRUSTED_PROVENANCE}",
                        *(f"{name}: {UNTRUSTED_PROVENANCE}" for name in flagged),
                    ),
                }
            )
            scope = None
        if scope is not None and verdict.allowed:
            verdict = verdict.model_copy(
                update={"approval": scope.answered_by, "scope_id": scope.scope_id}
            )
        code = verdict.code
        if code is VerdictCode.APPROVAL_REQUIRED and approver:
            pass  # the approver answers it before anything of the batch is reserved
        elif code is VerdictCode.APPROVAL_REQUIRED and approval == "interrupt":
            verdict = verdict.model_copy(update={"code": VerdictCode.APPROVAL_PENDING})
        elif verdict.allowed:
            key = repeat_key(verdict.fingerprint, state) if counted is None else counted
            raised[key] = (raised[key] if key in raised else run_counts.get(key, 0)) + 1
        elif spec is not None and observed(code, denial):
            key = repeat_key(verdict.fingerprint, state) if counted is None else counted
            seen = raised[key] if key in raised else run_counts.get(key, 0)
            if seen >= repeat_limit_of(spec, repeat_limit):
                verdict = verdict.model_copy(
                    update={"code": VerdictCode.NO_PROGRESS, "missing_capability": None}
                )
                first_stop = first_stop or stop(TerminationReason.NO_PROGRESS, "no_progress")
            else:
                raised[key] = seen + 1
        elif first_stop is None and verdict.termination is not None:
            first_stop = stop(verdict.termination, verdict.code.value)
        entries.append(assemble(BatchEntry, {"proposal": call, "verdict": verdict}))
        found.append(spec)
    return GatedBatch(
        batch=tuple(entries),
        fingerprints=revised(state.fingerprints, raised),
        stop=first_stop,
        specs=tuple(found),
        provenance=traces,
    )


_REACHED = frozenset({VerdictCode.ALLOWED, VerdictCode.APPROVAL_REQUIRED})
"""Verdicts of a call that passed every check but (perhaps) approval: the provenance rule
judges only these, so a call refused for another reason keeps that reason."""


def recorded(provenance: Provenance) -> dict[str, tuple[str, ...]]:
    """A provenance as verdicts, receipts, manifests and spans record it: per argument, its
    sources' labels (``"user"``, ``"tool:call_3"``), never a value."""
    return {name: tuple(labels) for name, labels in provenance.record().items()}


def after_reservations(
    batch: Batch,
    refused: Mapping[str, BudgetExhausted],
    *,
    run_id: str,
    verdict_key: bytes | None,
    only: Collection[str] | None = None,
) -> tuple[Batch, StopRequest | None]:
    """The batch once its allowed calls were reserved in order: refused ones are marked
    ``budget_exhausted`` (receipted as not run), the rest sealed when there is a key — with the
    calls left waiting for a human, whose pending verdicts the approval checks the seal of.

    ``only``: the calls answered just now (the approval's); every other entry is left as it is,
    sealed or not: only the gate seals, and only what it gated.
    A batch none of which can run ends the run now, with the axis that ran out named.
    """
    if not refused and verdict_key is None:
        return batch, None  # nothing to mark, nothing to seal
    out: list[BatchEntry] = []
    for entry in batch:
        verdict: Verdict = entry.verdict
        if only is not None and entry.call_id not in only:
            out.append(entry)
            continue
        if entry.call_id in refused:
            axis = refused[entry.call_id].axis
            verdict = verdict.model_copy(
                update={
                    "code": VerdictCode.BUDGET_EXHAUSTED,
                    "exhausted_axis": axis.value if axis is not None else None,
                }
            )
        elif verdict_key is not None:
            verdict = seal_verdict(verdict, run_id=run_id, key=verdict_key)
        out.append(entry.with_verdict(verdict) if verdict is not entry.verdict else entry)
    result = tuple(out)
    if refused and not any(
        e.verdict.allowed or e.verdict.code is VerdictCode.APPROVAL_PENDING for e in result
    ):
        first = next(iter(refused.values()))
        return result, stop_for_exhausted(first)
    return result, None


# --- The gate phase, as plans -----------------------------------------------------------------
#
# The node gathers the facts (the batch, the run, its context, the ledger's answers: which
# dependencies produced a result, the tenant's remembered scopes), asks one question before it
# judges the batch and one after, and does the I/O each plan names: the tools' rules run
# contained, each ``needs_approval`` and approver asked contained, the batch reserved.


@dataclass(frozen=True, slots=True)
class GateSettings:
    """The loop's settings the gate phase reads (``LoopSettings`` names and checks each)."""

    registry: ToolRegistry
    repeat_limit: int
    approval: ApprovalMode
    denial: DenialMode
    provenance: ProvenanceMode
    approver: bool
    """Whether the graph has an approver: a call that needs approval is asked of it first."""
    needs_approval: NeedsApproval | None
    """The graph's ``needs_approval`` (a tool's own wins)."""
    repair_attempts: int


class GatePlan(NamedTuple):
    """Before the batch is judged: what the ledger is asked, and how the batch is judged.

    ``outside``: the dependencies named outside the batch; each must be an earlier call whose
    tool returned a result, which only the ledger says (never a receipt in state): read only
    for a batch that names dependencies. ``scoped``: the registered write or external tools of
    the batch whose remembered approval scopes the run's tenant may hold (a live scope
    approves a call before the approver or a human is asked). ``deciders``: per call id, the
    ``needs_approval`` callable that decides the call (its tool's, else the graph's).
    ``in_place``: judging the batch needs no I/O at all: no dependency to read, no scope, no
    ``needs_approval`` or approver to ask (no call of it can need approval), no rule of a tool
    to contain; the node then judges it in place (:meth:`judge`, the rules run directly).
    ``specs``: per call, its registered tool (``None``: not registered), looked up once.

    A named tuple, as :class:`GatedBatch` is: made once per decision.
    """

    calls: Sequence[ToolProposal]
    settings: GateSettings
    names: tuple[str, ...]
    outside: frozenset[str]
    scoped: tuple[str, ...]
    deciders: Mapping[str, NeedsApproval]
    in_place: bool = False
    specs: tuple[ToolSpec | None, ...] | None = None
    polls: bool = True
    """Whether a call of the batch is of a polling tool (``poll_interval_seconds``), judged by
    the time it is asked at: the only judging that reads the clock."""

    def refused(self, state: AgentState, produced: Collection[str]) -> StopRequest | None:
        """The stop that refuses the whole batch before any call of it is gated
        (:func:`refused_batch`; ``produced``: which of ``outside`` the ledger marks)."""
        calls, answered = self.calls, state.answered
        if len(calls) == 1 and not calls[0].depends_on and calls[0].call_id not in answered:
            return None  # most decisions: one call, a new id, no dependency
        return refused_batch(calls, answered, produced)

    def remembered(
        self, scopes: Mapping[str, Sequence[ApprovalScope]], tenant_id: str, now: datetime
    ) -> dict[str, ApprovalScope]:
        """By call id, the live remembered scope (of ``scopes``: the tenant's, per tool of
        ``scoped``) that approves each call, matched by tool name and the canonical fingerprint
        of its arguments (:mod:`fencepost.policy.remembered`): nothing the model or a caller
        names picks the scope."""
        found: dict[str, ApprovalScope] = {}
        for call in self.calls:
            held = scopes.get(call.tool_name) if call.tool_name in scopes else None
            if not held:
                continue
            try:
                fingerprint = proposal_fingerprint(call.tool_name, call.arguments)
            except (TypeError, ValueError):
                continue  # arguments no JSON holds: the gate refuses them, no scope approves them
            scope = matching_scope(held, tenant_id, call.tool_name, fingerprint, now)
            if scope is not None:
                found[call.call_id] = scope
        return found

    def judge(
        self,
        state: AgentState,
        ctx: RunContext,
        *,
        now: datetime | None,
        remembered: Mapping[str, ApprovalScope],
        outputs: Sequence[ObservedOutput] | None,
        run_rule: RuleRunner,
        needs_approval: Mapping[str, bool] | None = None,
    ) -> GatedBatch:
        """The batch judged (:func:`gate_batch`) in ``ctx``, at ``now`` (``None`` only where
        no call of it is judged by the time: not :attr:`polls`)."""
        cfg = self.settings
        return gate_batch(
            cfg.registry,
            self.calls,
            state,
            ctx.principal,
            repeat_limit=cfg.repeat_limit,
            approval=cfg.approval,
            now=now,
            context=ctx,
            denial=cfg.denial,
            approver=cfg.approver,
            needs_approval=needs_approval,
            remembered=remembered,
            provenance=cfg.provenance,
            outputs=outputs,
            run_rule=run_rule,
            specs=self.specs,
        )

    def questions(
        self, gated: GatedBatch, ctx: RunContext
    ) -> list[tuple[NeedsApproval, ApprovalQuestion]]:
        """What each ``needs_approval`` callable is asked: only about calls that passed every
        check before approval (their arguments are schema-valid)."""
        out = []
        for entry, spec in zip(gated.batch, gated.specs, strict=True):
            decider = self.deciders.get(entry.call_id)
            if spec is not None and decider is not None and entry.verdict.code in _ASKABLE:
                out.append(
                    (decider, ApprovalQuestion(proposal=entry.proposal, tool=spec, context=ctx))
                )
        return out

    def needs_approval(self, answers: Mapping[str, bool]) -> dict[str, bool]:
        """Per call id, whether it needs approval, for judging the batch again: as answered,
        and a call of a deciding tool that was not asked does (fail closed)."""
        return {**dict.fromkeys(self.deciders, True), **answers}

    def approver_asks(
        self, gated: GatedBatch, state: AgentState, ctx: RunContext
    ) -> tuple[list[BatchEntry], list[ApproverInput]]:
        """The calls the graph's approver is asked about (none once the batch stopped, or
        without an approver), and what it is shown of each (their provenance as traced)."""
        if gated.stop is not None or not self.settings.approver:
            return [], []
        asked = to_approve(gated.batch)
        if not asked:
            return [], []
        requests = [
            approver_input(entry, spec, state, ctx, gated.provenance.get(entry.call_id))
            for entry, spec in zip(gated.batch, gated.specs, strict=True)
            if spec is not None and entry.verdict.code is VerdictCode.APPROVAL_REQUIRED
        ]
        return asked, requests

    def apply_approver(
        self,
        state: AgentState,
        ctx: RunContext,
        gated: GatedBatch,
        decisions: Mapping[str, ApproverDecision],
        *,
        now: datetime,
        run_rule: RuleRunner,
    ) -> ApproverResult:
        """The approver's answers applied to the batch (``approver.apply_approver``)."""
        cfg = self.settings
        return apply_approver(
            state,
            gated.batch,
            decisions,
            gated.fingerprints,
            cfg.registry,
            ctx.principal,
            context=ctx,
            approval=cfg.approval,
            denial=cfg.denial,
            repeat_limit=cfg.repeat_limit,
            now=now,
            run_rule=run_rule,
        )


_ASKABLE = frozenset(
    {VerdictCode.ALLOWED, VerdictCode.APPROVAL_REQUIRED, VerdictCode.APPROVAL_PENDING}
)
"""Verdicts of a call that passed every check before approval: what ``needs_approval`` is
asked about."""


def plan_gate(calls: Sequence[ToolProposal], settings: GateSettings) -> GatePlan:
    """Before a batch is judged: what the ledger is asked about it, and who decides per call
    whether it needs approval (:func:`~fencepost.policy.conditional_approval.deciding`)."""
    registry, graph_decides = settings.registry, settings.needs_approval
    scoped: set[str] = set()
    deciders: dict[str, NeedsApproval] = {}
    specs: list[ToolSpec | None] = []
    names: list[str] = []
    depends = polls = False
    # A read no ``needs_approval`` decides never needs approval: nobody is asked about it.
    in_place = True
    for call in calls:
        name = call.tool_name
        names.append(name)
        if call.depends_on:
            depends = True
        if name not in registry:
            specs.append(None)
            continue
        spec = registry.get(name)
        specs.append(spec)
        if spec.poll_interval_seconds is not None:
            polls = True
        if spec.effect is not Effect.READ:
            in_place = False
            if type(name) is str:
                scoped.add(name)
        decider = deciding(spec, graph_decides)
        if decider is not None:
            deciders[call.call_id] = decider
            in_place = False
        elif in_place and tool_gate(spec).runs_rules:
            in_place = False
    outside: frozenset[str] = _NONE
    if depends:
        inside = {c.call_id for c in calls}
        outside = frozenset(d for c in calls for d in c.depends_on if d not in inside)
        in_place = in_place and not outside
    return GatePlan(
        calls,
        settings,
        tuple(names),
        outside,
        tuple(sorted(scoped)) if scoped else (),
        deciders,
        in_place,
        tuple(specs),
        polls,
    )


_NONE: frozenset[str] = frozenset()


class GateEnd(NamedTuple):
    """After the batch was judged (and its approver answered): the run to write, one
    manifest per call, and whether the batch is reserved (``reserves``: its allowed calls, in
    order, with ``gated``, the fields the gate sets, written into the run). A named tuple:
    made once per decision."""

    state: AgentState
    manifests: tuple[StepManifest, ...]
    reserves: bool
    gated: dict[str, Any]

    def reserved(self, state: AgentState, stopped: StopRequest | None) -> AgentState:
        """The run once its batch was reserved: when the reservation stopped it, nothing of the
        batch runs, and each call the budget could not cover is still receipted."""
        if stopped is None:
            return state
        unfunded = tuple(receipt_for(o) for o in budget_refusals(state.batch))
        return state.model_copy(update={"receipts": state.receipts + unfunded, "stop": stopped})


def end_gate(
    plan: GatePlan,
    state: AgentState,
    judged: GatedBatch | StopRequest,
    usage: Mapping[str, Any],
    base: ManifestBase,
) -> GateEnd:
    """What the judged batch (or its refusal, :meth:`GatePlan.refused`) means for the run:
    each call's manifest (from ``base``, the step's :func:`~fencepost.policy.manifest.
    manifest_base`: its verdict, who answered, the safe code of a denial settled as data;
    ``usage``, the step's reported tokens, on the first), then the batch's stop, or its
    denials settled and the rest reserved. A refused batch is one ``denied`` manifest with the
    refusal's code, and its stop.

    One denial stops the whole batch: nothing in it runs, nothing is reserved. A repairable
    one may be given back to the model instead (``repair.may_repair``); then none of its calls
    ran, so none counts as repeated (the counts it raised are not written). A batch that
    passes clears the repair notes. A call denied as data (or rejected by the approver) is
    observed and receipted now, never run; the rest of the batch goes on."""
    if isinstance(judged, StopRequest):
        fields = {"decision_kind": "tool", "code": judged.error_code, **usage}
        return GateEnd(
            state=state.model_copy(update={"phase": Phase.VALIDATE, "stop": judged}),
            manifests=(step_manifest(base, "denied", fields),),
            reserves=False,
            gated={},
        )
    gated, cfg = judged, plan.settings
    manifests = []
    extra: Mapping[str, Any] = usage
    every_allowed = True
    for entry, spec in zip(gated.batch, gated.specs, strict=True):
        verdict = entry.verdict
        code = verdict.code
        # The registered name (an exact str): the model's may be a str subclass.
        name, effect = (spec.name, spec.effect) if spec is not None else (None, None)
        if code is VerdictCode.ALLOWED and verdict.provenance is None and verdict.approval is None:
            # What ``gate_record`` adds to such a call: nothing.
            manifests.append(call_manifest(base, "allowed", name, effect, code, extra))
        else:
            every_allowed = False
            record = gate_record(verdict, cfg.denial)
            fields = {**extra, **record} if extra else record
            outcome = verdict_outcome(code)
            manifests.append(call_manifest(base, outcome, name, effect, code, fields))
        extra = _NO_FIELDS
    update: dict[str, Any] = {
        "phase": Phase.VALIDATE,
        "batch": gated.batch,
        "fingerprints": gated.fingerprints,
    }
    if gated.stop is not None:
        notes = may_repair(state, gated.batch, attempts=cfg.repair_attempts)
        ended = (
            given_back(state, notes)
            if notes is not None
            else state.model_copy(update={**update, "stop": gated.stop})
        )
        return GateEnd(state=ended, manifests=tuple(manifests), reserves=False, gated={})
    if state.repair_notes:
        update["repair_notes"] = ()
    # An allowed call is never settled as data (``settled_calls``).
    settled = () if every_allowed else settled_calls(gated.batch, cfg.registry, cfg.denial)
    if settled:
        state = reduce_tool_events(
            state.model_copy(update={"batch": gated.batch}), tuple(o.event for o in settled)
        )
        state = state.model_copy(
            update={"receipts": state.receipts + tuple(receipt_for(o) for o in settled)}
        )
    return GateEnd(state=state, manifests=tuple(manifests), reserves=True, gated=update)


_NO_FIELDS: Mapping[str, Any] = MappingProxyType({})
