"""The run's state: a frozen, strict model that LangGraph checkpoints and re-validates on load."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict

from fencepost.policy.batch import BatchEntry
from fencepost.policy.budget import BudgetStop, RuntimeBudget
from fencepost.policy.contract import Frozen
from fencepost.policy.decision import ToolProposal
from fencepost.policy.manifest import StepManifest
from fencepost.policy.observation import AnswerPayload, Observation
from fencepost.policy.phase import Phase, TerminationReason
from fencepost.policy.receipt import Receipt
from fencepost.policy.stop_report import StopReport
from fencepost.policy.tasks import evidence_ids
from fencepost.policy.turns import Turn


class StopRequest(Frozen):
    """A node's request to end the run; the terminal node alone turns it into a terminal state."""

    reason: Annotated[TerminationReason, Strict(False)]
    answer: AnswerPayload | None = None
    error_code: str | None = None
    budget: BudgetStop | None = None
    """For a budget stop the ledger refused: which account, axis and window."""


def stop(reason: TerminationReason, code: str | None = None) -> StopRequest:
    """A request to end the run with ``reason`` and a safe ``code``."""
    return StopRequest(reason=reason, error_code=code)


class AgentState(Frozen):
    """Everything the loop knows about a run, and nothing it should not (no chain of thought).

    Terminal states are absorbing: only :func:`~fencepost.policy.terminate.terminate` makes one,
    and it refuses to make one twice.
    """

    run_id: Annotated[str, Field(min_length=1, max_length=128)]
    tenant_id: str | None = None
    """Bound from the trusted context when the run starts; never from the model."""
    principal_id: str | None = None
    """Bound from the trusted context when the run starts; resumes must present the same one."""
    question: str
    phase: Annotated[Phase, Strict(False)] = Phase.OBSERVE
    budget: RuntimeBudget
    step: Annotated[int, Field(ge=0)] = 0
    """Model steps started so far (each one reserved before the model was called)."""
    observations: Annotated[tuple[Observation, ...], Strict(False)] = ()
    proposals: Annotated[tuple[ToolProposal, ...], Strict(False)] = ()
    """The tool proposals that have an observation, as they were run (after any edit)."""
    batch: Annotated[tuple[BatchEntry, ...], Strict(False)] = ()
    """The decision being carried out: each proposal joined to its gate verdict by call id."""
    receipts: Annotated[tuple[Receipt, ...], Strict(False)] = ()
    fingerprints: dict[str, int] = Field(default_factory=dict)
    """How often each repeat key (a call and the result its last run had) has been allowed."""
    answered: dict[str, int] = Field(default_factory=dict)
    """Call ids that have an observation, and the step that proposed them: a reused call id is
    refused in O(1), without scanning the observations."""
    evidence: dict[str, str] = Field(default_factory=dict)
    """Per call fingerprint, what its last run returned — a hash of the result or error code,
    never its text — how often it changed, and when: ``"<epoch>:<hash>@<ISO instant>"``.
    Progress is judged by it."""
    final_answer: AnswerPayload | None = None
    termination: Annotated[TerminationReason | None, Strict(False)] = None
    last_error_code: str | None = None
    manifests: Annotated[tuple[StepManifest, ...], Strict(False)] = ()
    open_tasks: Annotated[tuple[str, ...], Strict(False)] = ()
    """Task ids the run's tools accepted that no later call has shown done (kept so each step
    knows them without scanning every receipt)."""
    repairs: Annotated[int, Field(ge=0)] = 0
    """Refused proposals the model was given back to repair (``repair_attempts``)."""
    repair_notes: Annotated[tuple[str, ...], Strict(False)] = ()
    """Why the last proposal was refused, shown to the model as data: call ids, field paths and
    rule names, never values. Cleared once a proposal passes the gate."""
    model_failures: Annotated[int, Field(ge=0)] = 0
    """Retryable model errors in a row; reset by the next decision that arrives."""
    stop: StopRequest | None = None
    """Set by a node that decided the run must end; consumed by the terminal node."""
    report: StopReport | None = None
    """How the run ended, from its receipts and reason: written by the terminal node."""
    turns: Annotated[tuple[Turn, ...], Strict(False)] = ()
    """The thread's earlier runs, oldest first (see :mod:`fencepost.policy.turns`): set when
    the run starts, from the run it follows."""
    forked_from: str | None = None
    """The checkpoint this run was forked from (time travel), or None for a run that was not:
    a fork is a new run, on a ledger account of its own."""
    branch: str | None = None
    """The latest fork in this run's history on the thread (its own, or one an earlier run of
    its branch was forked from): it names the run's ledger account with the thread and the
    run's place, so no branch's run shares another's account. Set by fencepost only."""
    origin_thread: str | None = None
    """The checkpoint thread the run's conversation began on, where its call ids are claimed
    (``keys.claim_key``): a copy of the thread, and any fork of the copy, claims on the same
    one, so a call the original ran never runs on a copy. Set by fencepost only (None in a
    record written before it was kept: the node's thread)."""

    @property
    def pending(self) -> tuple[ToolProposal, ...]:
        """The batch's proposals, in the order the model made them."""
        return tuple(e.proposal for e in self.batch)

    @property
    def is_terminal(self) -> bool:
        """True once the run has ended; a terminal state refuses further transitions."""
        return self.phase is Phase.TERMINAL

    def evidence_ids(self) -> frozenset[str]:
        """Ids a final answer may cite: call ids of successful tool results whose work was done
        (a result receipted ``failed``, a child run that did not complete, or ``denied``, one
        that never started, is not evidence)."""
        return evidence_ids(self.receipts, self.observations)


def as_turn(state: AgentState) -> Turn:
    """What the conversation keeps of the run in ``state`` once a later run starts."""
    return Turn(
        run_id=state.run_id,
        question=state.question,
        tenant_id=state.tenant_id,
        principal_id=state.principal_id,
        budget=state.budget,
        step=state.step,
        final_answer=state.final_answer,
        termination=state.termination,
        last_error_code=state.last_error_code,
        receipts=state.receipts,
        report=state.report,
        forked_from=state.forked_from,
        branch=state.branch,
    )


def earlier_run(turn: Turn) -> AgentState:
    """An earlier run of the thread as AgentState: what its :class:`Turn` keeps, ended (its
    observations, proposals and manifests are not kept: empty)."""
    return AgentState(
        run_id=turn.run_id,
        question=turn.question,
        tenant_id=turn.tenant_id,
        principal_id=turn.principal_id,
        budget=turn.budget,
        step=turn.step,
        phase=Phase.TERMINAL,
        final_answer=turn.final_answer,
        termination=turn.termination,
        last_error_code=turn.last_error_code,
        receipts=turn.receipts,
        report=turn.report,
        forked_from=turn.forked_from,
        branch=turn.branch,
    )
