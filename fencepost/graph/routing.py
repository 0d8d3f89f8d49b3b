"""Where the loop goes next. Routers read state only; every road out passes the terminal node."""

from __future__ import annotations

from typing import Literal

from langgraph.managed import RemainingSteps

# pydantic builds the published JSON schemas from TypedDicts, and on Python < 3.12 it accepts only
# typing_extensions' TypedDict.
from typing_extensions import TypedDict

from fencepost.policy import Phase, StopRequest, VerdictCode
from fencepost.policy.batch import BatchEntry
from fencepost.policy.run_check import NEEDS_DECIDE, out_of_supersteps

Next = Literal["decide", "approve", "execute", "terminal"]
Exit = Literal["terminal", "__end__"]


class RouteView(TypedDict, total=False):
    """The channels a router reads. LangGraph reads a conditional edge's input from the type of
    its first parameter: typed as the whole state, each route re-read every channel (the
    conversation and the records re-applied) at every superstep, for the five fields used."""

    run_id: str
    phase: Phase
    stop: StopRequest | None
    batch: tuple[BatchEntry, ...]
    remaining_steps: RemainingSteps


def _after_gate(values: RouteView) -> Next:
    verdicts = [e.verdict for e in values.get("batch") or ()]
    if any(v.code is VerdictCode.APPROVAL_PENDING for v in verdicts):
        return "approve"
    if any(v.code is VerdictCode.ALLOWED for v in verdicts):
        return "execute"
    return "decide"


def route_start(values: RouteView) -> Next:
    """Entry: a new run decides; a resumed one continues where its state says it is."""
    # No room even for a first decision: the terminal node still ends the run as data.
    if out_of_supersteps(values.get("remaining_steps"), NEEDS_DECIDE):
        return "terminal"
    if "run_id" not in values:
        # No run yet: a stop or a phase a caller wrote to the thread first is not the run's
        # (its first step writes over them), so the run still decides.
        return "decide"
    if values.get("phase") is Phase.TERMINAL or values.get("stop") is not None:
        return "terminal"
    if not values.get("batch"):
        return "decide"
    return _after_gate(values)


def route_after_decide(values: RouteView) -> Next:
    """After a decision was gated: pause for approval, execute, or end."""
    if values.get("stop") is not None:
        return "terminal"
    if not values.get("batch"):
        # No decision and no stop: a retryable model error, asked again at the next step.
        return "decide"
    return _after_gate(values)


def route_after_approve(values: RouteView) -> Next:
    """After a human answered: run what was approved, or ask the model again."""
    if values.get("stop") is not None:
        return "terminal"
    return _after_gate(values)


def route_after_execute(values: RouteView) -> Next:
    """After tools ran: back to the model, or end."""
    if values.get("stop") is not None:
        return "terminal"
    return "decide"


def route_after_terminal(values: RouteView) -> Exit:
    """After the terminal node: out of the graph once the run has ended (or none began).

    The node always ends a run; only a state update made as the terminal node (which LangGraph
    takes as its output) arrives here with a run still going, and is sent through it.
    """
    if "run_id" not in values or values.get("phase") is Phase.TERMINAL:
        return "__end__"
    return "terminal"
