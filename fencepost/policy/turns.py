"""A thread's earlier runs: what a conversation keeps of each run once a later one starts.

A thread is a conversation of runs. When new input starts a run on a thread whose run ended, the
ended run is kept in the new run's state as a :class:`Turn`: its question, final answer, ending,
stop report, receipts, final budget view and the identity it ran for. What it observed, proposed
and the step manifests are not kept in state (they are in the thread's checkpoint history and the
run's traces): a later run's evidence is what its own tools returned.

The decision model is shown the latest :data:`TURN_WINDOW` turns as :class:`EarlierTurn` data
(question and answer text, never an earlier run's tool output), and how many were left out
(``decide.StepPlan.decision_input``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Strict

from fencepost.policy.budget import RuntimeBudget
from fencepost.policy.contract import Frozen
from fencepost.policy.observation import AnswerPayload
from fencepost.policy.phase import TerminationReason
from fencepost.policy.receipt import Receipt
from fencepost.policy.stop_report import StopReport

TURN_WINDOW = 20
"""How many earlier turns a decision model is shown, latest first kept (an older one is left
out, and the input says how many were)."""


class Turn(Frozen):
    """An earlier run of the thread, as the conversation keeps it."""

    run_id: str
    question: str
    tenant_id: str | None = None
    principal_id: str | None = None
    budget: RuntimeBudget
    """The run's budget view when it ended."""
    step: int = 0
    final_answer: AnswerPayload | None = None
    termination: Annotated[TerminationReason | None, Strict(False)] = None
    last_error_code: str | None = None
    receipts: Annotated[tuple[Receipt, ...], Strict(False)] = ()
    report: StopReport | None = None
    forked_from: str | None = None
    """The checkpoint the run was forked from, if it was a fork."""
    branch: str | None = None
    """The latest fork in the run's history on the thread (see ``AgentState.branch``)."""


class EarlierTurn(Frozen):
    """An earlier turn as a decision model is shown it: data, never instructions."""

    run_id: str
    question: str
    answer: str | None = None
    """The run's final answer text, or None where it ended without one."""
    termination: str | None = None


__all__ = ["TURN_WINDOW", "EarlierTurn", "Turn"]
