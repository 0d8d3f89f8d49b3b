"""Repair: a refused proposal given back to the model as data, within a bounded number of tries.

With ``repair_attempts=N`` (default 1), an unknown tool or a schema or semantic violation does
not end the run at once: the model is shown what was wrong — call ids, field paths and rule
names, never the values it sent — and its next step may try again. Each attempt spends a step;
when attempts run out the run ends ``invalid_proposal``. ``repair_attempts=0`` is the seed's
strict ending: the first such proposal ends the run.
"""

from __future__ import annotations

from fencepost.policy.batch import Batch
from fencepost.policy.phase import Phase
from fencepost.policy.state import AgentState
from fencepost.policy.verdict import VerdictCode

DEFAULT_REPAIR_ATTEMPTS = 1
"""Refused proposals a run gives back to the model unless told otherwise: one wrong-typed
argument costs a step, not the run."""

REPAIRABLE = frozenset(
    {VerdictCode.UNKNOWN_TOOL, VerdictCode.SCHEMA_VIOLATION, VerdictCode.SEMANTIC_VIOLATION}
)


def repair_notes(batch: Batch) -> tuple[str, ...]:
    """What the model is told about each refused call of ``batch``."""
    notes: list[str] = []
    for entry in batch:
        verdict = entry.verdict
        if verdict.code is VerdictCode.UNKNOWN_TOOL:
            notes.append(f"{entry.call_id}: unknown_tool (choose a tool from the catalog)")
        elif verdict.code in REPAIRABLE:
            problems = "; ".join(verdict.problems) or verdict.code.value
            notes.append(f"{entry.call_id}: {verdict.code.value}: {problems}")
    return tuple(notes)


def may_repair(state: AgentState, batch: Batch, *, attempts: int) -> tuple[str, ...] | None:
    """The notes to give back when this refused batch may be repaired; ``None`` when it ends
    the run (a refusal that is not repairable, or no attempts left)."""
    if state.repairs >= attempts:
        return None
    refused = [e for e in batch if not e.verdict.allowed]
    if not refused or any(
        e.verdict.code not in REPAIRABLE
        and e.verdict.code not in (VerdictCode.APPROVAL_PENDING, VerdictCode.BUDGET_EXHAUSTED)
        for e in refused
    ):
        return None
    return repair_notes(batch)


def given_back(state: AgentState, notes: tuple[str, ...]) -> AgentState:
    """``state`` (as it was before the batch was gated) once its refused batch is given back
    for repair: no batch, one more repair, the notes. The repeat counts stay as they were: none
    of the batch's calls ran, so a valid one held back with it has not been repeated."""
    return state.model_copy(
        update={
            "phase": Phase.VALIDATE,
            "batch": (),
            "repairs": state.repairs + 1,
            "repair_notes": notes,
        }
    )
