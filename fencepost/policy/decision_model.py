"""The port the loop asks for decisions, and what it hands over: data, never instructions."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Annotated, Any, Protocol, runtime_checkable

from pydantic import Field, Strict

from fencepost.policy.budget import RuntimeBudget
from fencepost.policy.contract import Frozen
from fencepost.policy.deadline import Deadline
from fencepost.policy.decision import Decision, ToolProposal
from fencepost.policy.observation import Observation
from fencepost.policy.turns import EarlierTurn


class DecisionInput(Frozen):
    """What a decision model sees: the question, observations as data, the catalog, the budget."""

    run_id: str
    question: str
    observations: Annotated[tuple[Observation, ...], Strict(False)]
    proposals: Annotated[tuple[ToolProposal, ...], Strict(False)] = ()
    """The model's earlier tool proposals that have an observation, joined by call id."""
    catalog: Annotated[tuple[dict[str, Any], ...], Strict(False)]
    budget: RuntimeBudget
    step: int
    pending_tasks: Annotated[tuple[str, ...], Strict(False)] = ()
    """Task ids the run's tools accepted and no later call has shown done: a final answer now
    cannot end the run ``completed`` (check the tasks' status, or abstain)."""
    repair: Annotated[tuple[str, ...], Strict(False)] = ()
    """Why the previous proposal was refused (field paths and rule names): fix it and try again."""
    final_turn: bool = False
    """The step kept for answering: tool calls are refused; answer or abstain with what is known."""
    answered: dict[str, int] = Field(default_factory=dict)
    """The call ids that have an observation (and the step that proposed each): a model's call id
    found here is a reuse, checked in O(1) however long the run (see ``AgentState.answered``)."""
    turns: Annotated[tuple[EarlierTurn, ...], Strict(False)] = ()
    """The conversation so far: the thread's earlier runs (question and final answer), oldest
    first, as data. Evidence for this run is only what its own calls returned."""
    turns_left_out: int = 0
    """Earlier turns older than those in ``turns``, not shown."""


class Decided(Frozen):
    """A decision plus what it cost; adapters return this to report token usage."""

    decision: Decision
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    """Of ``input_tokens``, those the provider read from its prompt cache (priced at a model's
    cached price, :mod:`fencepost.policy.pricing`), when it says."""
    generated_call_ids: Annotated[tuple[str, ...], Strict(False)] = ()
    """Call ids the adapter had to make up because the model's were missing or too short."""


@runtime_checkable
class DecisionModel(Protocol):
    """Anything that turns a :class:`DecisionInput` into a decision before ``deadline``.

    Raise :class:`~fencepost.policy.decision.InvalidProposal` for output that is not a decision;
    any other exception is treated as a model failure and mapped to a safe code.

    ``decide`` is an ``async def`` (a model client's call: awaited on the caller's loop under
    ``ainvoke``, on the process's one model loop under ``invoke``) or a plain ``def`` (work
    done where it is called, a local model or a script: run on a thread of the run's tenant's
    share, as a sync tool body is, under either). Either is held to its deadline the same way.
    """

    def decide(
        self, input: DecisionInput, *, deadline: Deadline
    ) -> Awaitable[Decision | Decided] | Decision | Decided:
        """Return the next decision (or an awaitable of it)."""
        ...
