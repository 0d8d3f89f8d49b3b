"""Where the loop goes next. Routers read state only; every road out passes the terminal node."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from langgraph.managed import RemainingSteps

# pydantic builds the published JSON schemas from TypedDicts, and on Python < 3.12 it accepts only
# typing_extensions' TypedDict.
from typing_extensions import TypedDict

from fencepost.graph.record import record_of
from fencepost.policy import Phase, TerminationReason, VerdictCode
from fencepost.policy.may_go_on import NEEDS_DECIDE, out_of_supersteps

Next = Literal["decide", "approve", "execute", "terminal"]
Exit = Literal["terminal", "__end__"]


class RouteView(TypedDict, total=False):
    """The channels the entry route reads: LangGraph reads a conditional edge's input from the
    type of its first parameter (typed as the whole state, each route would read every
    channel)."""

    run: dict[str, Any]
    run_id: str
    turn: str
    remaining_steps: RemainingSteps


class RunView(TypedDict, total=False):
    """The one channel a route after a node reads: the run record. A conditional edge reads
    its channels afresh (a copy of each, with the node's writes applied) after every node,
    so a route reads no channel it does not look at (``remaining_steps`` is computed for each
    read)."""

    run: dict[str, Any]


_PENDING = VerdictCode.APPROVAL_PENDING.value
_ALLOWED = VerdictCode.ALLOWED.value
_TERMINAL = Phase.TERMINAL.value
_REASONS = frozenset(r.value for r in TerminationReason)


def _codes(record: Mapping[str, Any]) -> list[Any]:
    """The verdict codes of the record's batch, as plain values. A router never judges: what a
    caller wrote that is no batch reads as no verdicts, and the node it routes to refuses it."""
    view = getattr(record, "view", None)
    if view is not None:
        return [e.verdict.code.value for e in view.batch]
    batch = record.get("batch")
    if not isinstance(batch, Sequence) or isinstance(batch, str):
        return []
    codes = []
    for entry in batch:
        verdict = entry.get("verdict") if isinstance(entry, Mapping) else None
        codes.append(verdict.get("code") if isinstance(verdict, Mapping) else None)
    return codes


def _after_gate(record: Mapping[str, Any]) -> Next:
    codes = _codes(record)
    if _PENDING in codes:
        return "approve"
    if _ALLOWED in codes:
        return "execute"
    return "decide"


def _stopped(record: Mapping[str, Any]) -> bool:
    return record.get("stop") is not None


def route_start(values: RouteView) -> Next:
    """Entry: a new run decides; a resumed one continues where its record says it is."""
    # No room even for a first decision: the terminal node still ends the run as data.
    if out_of_supersteps(values.get("remaining_steps"), NEEDS_DECIDE):
        return "terminal"
    record = record_of(values)
    if "run_id" not in record:
        # A checkpoint of another layout goes to the terminal node, which refuses it.
        if "run_id" in values:
            return "terminal"
        # No run yet: a stop or a phase a caller wrote to the thread first is not the run's
        # (its first step writes over them), so the run still decides.
        return "decide"
    if record.get("phase") == _TERMINAL:
        # New input on a thread whose run ended (the turn names it) starts the next run.
        return "decide" if values.get("turn") == record.get("run_id") else "terminal"
    if _stopped(record):
        return "terminal"
    if not record.get("batch"):
        return "decide"
    return _after_gate(record)


def route_after_decide(values: RunView) -> Next:
    """After a decision was gated: pause for approval, execute, or end."""
    record = record_of(values)
    if _stopped(record):
        return "terminal"
    if not record.get("batch"):
        # No decision and no stop: a retryable model error, asked again at the next step.
        return "decide"
    return _after_gate(record)


def route_after_approve(values: RunView) -> Next:
    """After a human answered: run what was approved, or ask the model again."""
    record = record_of(values)
    if _stopped(record):
        return "terminal"
    return _after_gate(record)


def route_after_execute(values: RunView) -> Next:
    """After tools ran: back to the model, or end."""
    if _stopped(record_of(values)):
        return "terminal"
    return "decide"


def route_after_terminal(values: RunView) -> Exit:
    """After the terminal node: out of the graph once the run has ended (or none began).

    The node always ends a run; only a state update made as the terminal node (which LangGraph
    takes as its output) arrives here with a run still going, and is sent through it: so is one
    that wrote the terminal phase without a reason (``{"phase": "terminal"}`` alone), which
    would otherwise leave the thread with nothing to run and a run that never ended.
    """
    record = record_of(values)
    if "run_id" not in record:
        return "__end__"
    reason = record.get("termination")
    if record.get("phase") == _TERMINAL and isinstance(reason, str) and reason in _REASONS:
        return "__end__"
    return "terminal"
