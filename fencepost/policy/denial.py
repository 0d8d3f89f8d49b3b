"""What a denial does to a run: end it (the default), or become data the run goes on with.

Per graph (``build_agent_graph(denial=...)``):

- ``"end_run"``: a capability or semantic denial ends the run (``policy_denied``,
  ``invalid_proposal``), and nothing of its batch runs — a blocked attack also loses the task.
- ``"observe"``: the denied call gets an observation with a safe code (``permission_denied``
  for a capability or an untrusted provenance, ``invalid_argument`` for a semantic rule) and a ``denied`` receipt naming
  the rule; the rest of its batch is gated as usual and the run goes on. A denied call never
  runs and reserves nothing. Repeated denials are no progress: each one counts, as an allowed
  call does, towards the tool's repeat limit, and the same call denied past it ends the run
  ``no_progress`` (invariant 7).

Only a denial the model can act on is data: an unknown tool and a schema violation stay invalid
proposals (``repair_attempts`` gives those back), and no progress, a budget or the deadline
still end the run.

>>> observed(VerdictCode.CAPABILITY_DENIED, "observe")
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from fencepost.policy.batch import Batch, BatchEntry
from fencepost.policy.error_codes import ErrorCode
from fencepost.policy.events import ToolFailed
from fencepost.policy.outcome import CallOutcome
from fencepost.policy.receipt import ReceiptStatus
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.tool import ToolSpec
from fencepost.policy.verdict import Verdict, VerdictCode

DenialMode = Literal["end_run", "observe"]
"""``"end_run"``: a denial ends the run; ``"observe"``: it is an observation, the run goes on."""

DENIAL_MODES: tuple[DenialMode, ...] = ("end_run", "observe")

_OBSERVED: Mapping[VerdictCode, ErrorCode] = {
    VerdictCode.CAPABILITY_DENIED: ErrorCode.PERMISSION_DENIED,
    VerdictCode.SEMANTIC_VIOLATION: ErrorCode.INVALID_ARGUMENT,
    VerdictCode.UNTRUSTED_PROVENANCE: ErrorCode.PERMISSION_DENIED,
}
"""The denials that may be data, and the safe code the model is shown for each."""


def observed(code: VerdictCode, mode: DenialMode) -> bool:
    """Whether a verdict with ``code`` is an observation (the run goes on) under ``mode``."""
    return mode == "observe" and code in _OBSERVED


def shown_code(verdict: Verdict) -> ErrorCode:
    """The safe code the model is shown for a call its verdict did not allow, in either
    binding: ``invalid_argument`` for a semantic rule, else ``permission_denied`` (the rule
    itself is the receipt's, and the developer's log's)."""
    return _OBSERVED.get(verdict.code, ErrorCode.PERMISSION_DENIED)


def denial_rule(verdict: Verdict) -> str:
    """The safe code a denied call's receipt names: the semantic rule that refused it
    (``unknown_payee``), else the verdict's own code (``capability_denied``)."""
    for problem in verdict.problems:
        if problem.startswith("rule: "):
            return problem.removeprefix("rule: ")
    return verdict.code.value


def denied_outcome(entry: BatchEntry, spec: ToolSpec | None) -> CallOutcome:
    """The outcome of a call denied and settled as data (by the gate in ``"observe"`` mode, or
    rejected by the approver): never run, nothing reserved, receipted ``denied`` with the rule
    that denied it; its observation carries the safe code the model may act on."""
    verdict = entry.verdict
    return CallOutcome(
        event=ToolFailed(
            call_id=entry.call_id,
            tool_name=entry.proposal.tool_name,
            error_code=shown_code(verdict),
        ),
        status=ReceiptStatus.DENIED,
        attempts=0,
        effect=spec.effect if spec is not None else None,
        approval=verdict.approval,
        scope_id=verdict.scope_id,
        rule=denial_rule(verdict),
        missing_capability=verdict.missing_capability,
        provenance=verdict.provenance,
    )


def settled_calls(batch: Batch, registry: ToolRegistry, mode: DenialMode) -> list[CallOutcome]:
    """The calls of a gated batch that will never run and are settled as data now, in batch
    order: denied in ``"observe"`` mode, or rejected by the graph's approver (a rejection is
    always data, as a human's is)."""
    out: list[CallOutcome] = []
    for entry in batch:
        verdict = entry.verdict
        if observed(verdict.code, mode) or (
            verdict.code is VerdictCode.REJECTED and verdict.approval == "approver"
        ):
            name = entry.proposal.tool_name
            out.append(denied_outcome(entry, registry.get(name) if name in registry else None))
    return out


def gate_record(verdict: Verdict, mode: DenialMode) -> dict[str, Any]:
    """What the gate step's manifest of a call adds to its verdict code: who answered its
    approval, for a call settled as data (or left to a human by the approver) the safe code of
    why, and the provenance of its arguments when it was traced."""
    record: dict[str, Any] = {}
    if verdict.provenance is not None:
        record["provenance"] = verdict.provenance
    if verdict.approval is not None:
        record["approval"] = verdict.approval
    code = verdict.code
    if observed(code, mode) or (code is VerdictCode.REJECTED and verdict.approval is not None):
        record["code"] = denial_rule(verdict)
    elif verdict.approval == "approver" and code in _ASKED:
        record["code"] = ASKED_HUMAN
    return record


ASKED_HUMAN = "ask_human"
"""The manifest code of a call the approver left to a human."""
_ASKED = frozenset({VerdictCode.APPROVAL_PENDING, VerdictCode.APPROVAL_REQUIRED})
