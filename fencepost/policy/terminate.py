"""How a run ends: what its final answer comes to, and the terminal state it ends in.

Both places a run can end ask here, with the facts they gathered (the run, the stop asked
for, and what the ledger vouches for, :class:`AnswerFacts`: the accepted work still pending,
what the answer may cite), and get one frozen answer back:

- :func:`conclude`: what an ending comes to — ``completed`` with a server-verified answer, an
  abstention or any other stop as asked, or refused and why (``invalid_proposal``, never
  ``completed``). The decide phase asks it of a model's final answer or abstention
  (``decide.end_step``);
- :func:`plan_ending`: the terminal node's plan (:class:`EndingPlan`) — whether an ended run's
  ending stands, and what the ledger is asked; then (:meth:`EndingPlan.end`) the stop verified
  again, the terminal state and its stop report, and whether the run's ledger account is closed
  (:class:`Ending`; :meth:`Ending.after_close`: a cancel that closed it first wins).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from fencepost.policy.context import RunContext
from fencepost.policy.decision import InvalidProposal
from fencepost.policy.error_codes import ErrorCode
from fencepost.policy.execution import not_run
from fencepost.policy.ledger import Balance
from fencepost.policy.may_go_on import NEEDS_DECIDE, recursion_stop
from fencepost.policy.observation import AnswerPayload
from fencepost.policy.outcome import receipt_for
from fencepost.policy.ownership import check_owner
from fencepost.policy.phase import Phase, TerminationReason
from fencepost.policy.receipt import Receipt, ReceiptStatus
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.reservations import stop_for_unknown_account
from fencepost.policy.run_sources import answer_untrusted
from fencepost.policy.state import AgentState, StopRequest, stop
from fencepost.policy.stop_report import stop_report
from fencepost.policy.tasks import evidence_ids, pending_tasks, unfinished

TASKS_PENDING = "tasks_pending"
"""The code of a final answer given while accepted work is pending (work accepted is not work
done): the model is asked again; at the end, the run ends ``invalid_proposal`` with it."""


NOT_THIS_RUNS_ACCOUNT = frozenset(
    {
        "account_conflict",
        "unknown_budget_account",
        "context_mismatch",
        "missing_context",
        "invalid_context",
    }
)
"""Stop codes that mean the account on a thread is not (or not provably) the caller's: the
terminal node never closes it on one (closing it would let a stranger end somebody else's
run)."""


class TerminalStateError(RuntimeError):
    """A transition was attempted on a state that has already ended."""

    def __init__(self) -> None:
        super().__init__("state is already terminal")


class UnsupportedCitation(ValueError):
    """A final answer cites evidence that is not among the run's successful observations."""

    code = "unsupported_citation"


class MissingCitation(ValueError):
    """A final answer cites nothing although the policy requires evidence."""

    code = "missing_citation"


def terminate(
    state: AgentState,
    reason: TerminationReason,
    *,
    answer: AnswerPayload | None = None,
    error_code: str | None = None,
) -> AgentState:
    """The terminal state for ``reason``; raises :class:`TerminalStateError` if already terminal."""
    if state.is_terminal:
        raise TerminalStateError
    return state.model_copy(
        update={
            "phase": Phase.TERMINAL,
            "final_answer": answer,
            "termination": reason,
            "last_error_code": error_code,
            "batch": (),
        }
    )


@dataclass(frozen=True, slots=True)
class Conclusion:
    """What an ending comes to, judged against the run and what the ledger vouches for."""

    stop: StopRequest
    """The stop the run ends with: the one asked for when it stands (``completed`` only with a
    server-verified answer), else ``invalid_proposal`` with the code of the check it failed
    (``malformed_decision``: no answer; :data:`TASKS_PENDING`; ``missing_citation``;
    ``unsupported_citation``), or the ledger's refusal of a run it holds no account of."""

    @property
    def completed(self) -> bool:
        """Whether the run ends ``completed``."""
        return self.stop.reason is TerminationReason.COMPLETED

    @property
    def asks_again(self) -> bool:
        """Refused for now, not for good: accepted work is still pending. A model's final
        answer is refused and the model asked again (a step each); at the end it is the stop."""
        return self.stop.error_code == TASKS_PENDING


@dataclass(frozen=True, slots=True)
class AnswerFacts:
    """What a final answer is judged by (:func:`conclude`), gathered before it is judged: the
    work accepted that it still waits on (``pending``: task ids, or call ids) and what it may
    cite (``citable``).

    The graph gathers them where it reads the ledger's markers (``graph.account.answer_facts``,
    with ``tasks.evidence_ids``): a receipt or an observation in state is a caller's
    ``update_state`` away from forged, the ledger's marker is not. :meth:`from_state` reads
    them from state alone, where no ledger was asked."""

    pending: tuple[str, ...]
    citable: frozenset[str]

    @classmethod
    def from_state(cls, state: AgentState) -> AnswerFacts:
        """The facts about an answer of the run in ``state`` as state alone tells them (no
        ledger was asked): its pending tasks' receipts, and its evidence."""
        return cls(
            pending=tuple(r.task_id or r.call_id for r in pending_tasks(state.receipts)),
            citable=evidence_ids(state.receipts, state.observations),
        )


def conclude(
    asked: StopRequest,
    facts: AnswerFacts,
    *,
    require_citations: bool,
    account_known: bool = True,
) -> Conclusion:
    """What the stop ``asked`` comes to, judged by ``facts``.

    Any stop but ``completed`` stands as asked (an abstention ends ``insufficient_evidence`` or
    ``needs_clarification``). ``completed`` stands only with an answer, no accepted work
    pending (``facts.pending``), and every citation server-verified (``facts.citable``); with
    ``require_citations``, at least one citation unless the answer is empty (an action's agent
    with nothing to add claims nothing to cite for).

    ``account_known=False``: the ledger holds no account of the run (it never saw it, or lost
    it with its process), so nothing can vouch for the answer and the run is refused as every
    reservation on that ledger refuses it (``unknown_budget_account``).
    """
    if asked.reason is not TerminationReason.COMPLETED:
        return Conclusion(asked)
    if not account_known:
        return Conclusion(stop_for_unknown_account())
    answer = asked.answer
    if answer is None:
        return Conclusion(stop(TerminationReason.INVALID_PROPOSAL, InvalidProposal().code))
    if facts.pending:
        return Conclusion(stop(TerminationReason.INVALID_PROPOSAL, TASKS_PENDING))
    if require_citations and not answer.citations and not answer.is_empty:
        return Conclusion(stop(TerminationReason.INVALID_PROPOSAL, MissingCitation.code))
    if any(citation not in facts.citable for citation in answer.citations):
        return Conclusion(stop(TerminationReason.INVALID_PROPOSAL, UnsupportedCitation.code))
    return Conclusion(asked)


def validate_final_answer(
    answer: AnswerPayload,
    state: AgentState,
    *,
    require_citations: bool = False,
    produced: Collection[str] | None = None,
) -> AnswerPayload:
    """The server-side citation check of :func:`conclude`, as a raise: ``answer`` when each
    citation names a successful observation (and, given ``produced``, a call the ledger marks
    as having had its tool return a result).

    Raises :class:`UnsupportedCitation` or (with ``require_citations``) :class:`MissingCitation`.
    """
    asked = StopRequest(reason=TerminationReason.COMPLETED, answer=answer)
    facts = AnswerFacts(
        pending=(), citable=evidence_ids(state.receipts, state.observations, produced)
    )
    code = conclude(asked, facts, require_citations=require_citations).stop.error_code
    if code == MissingCitation.code:
        raise MissingCitation("answer has no citations")
    if code == UnsupportedCitation.code:
        raise UnsupportedCitation("answer cites evidence that was not observed")
    return answer


@dataclass(frozen=True, slots=True)
class Ending:
    """How the run ends: the terminal state, the stop it ends with, and whether the run's
    ledger account is closed (a closed account refuses every later reservation, so no state
    edit can reopen the run)."""

    state: AgentState
    """The terminal state, its stop report and the stop it ends with attached."""
    stop: StopRequest
    closes: bool
    current: AgentState
    """The run it ends from, with the batch it stopped in (the terminal state no longer holds
    it): a cancel that came first is reported from it (:meth:`after_close`)."""

    def after_close(self, closed: str | None) -> Ending:
        """The ending once the account is closed (``closed``: the reason the ledger holds):
        the first close stands, so a cancel that closed it first wins, and the run ends
        ``cancelled`` whatever it was about to end with."""
        reason = TerminationReason.CANCELLED
        if closed != reason.value or self.stop.reason is reason:
            return self
        state = terminate(self.current, reason, error_code="cancelled")
        report = stop_report(state, unfinished=self.current.batch)
        cancelled = stop(reason, "cancelled")
        return Ending(
            state=state.model_copy(update={"report": report, "stop": cancelled}),
            stop=cancelled,
            closes=False,
            current=self.current,
        )


def reopened(state: AgentState, balance: Balance | None) -> AgentState | None:
    """``state`` sent back to be ended by the terminal node, if it reads ``completed`` while
    the run's ledger account (``balance``) is open or closed for another reason: the terminal
    node closes the account with its reason before it writes an ending, so such a state was
    written by a caller (``update_state``). It ends with the reason the ledger closed it with,
    else ``policy_denied``, ``invalid_state``. ``None`` if the ending stands (not
    ``completed``, the account closed ``completed``, or no account to ask: one the graph's own
    ledger forgot)."""
    if state.termination is not TerminationReason.COMPLETED or balance is None:
        return None
    closed = balance.closed
    if closed == TerminationReason.COMPLETED.value:
        return None
    reason = next((r for r in TerminationReason if r.value == closed), None)
    return state.model_copy(
        update={
            "phase": Phase.OBSERVE,
            "termination": None,
            "final_answer": None,
            "report": None,
            "stop": stop(reason or TerminationReason.POLICY_DENIED, "invalid_state"),
        }
    )


@dataclass(frozen=True, slots=True)
class EndingPlan:
    """The terminal node's plan, before the ledger is read: the stop the run is asked to end
    with (``None``: it ended already, by the terminal node, and the ending stands), and what
    the node reads of the ledger to end it (:attr:`unreported`, :attr:`citations`)."""

    current: AgentState
    asked: StopRequest | None
    ctx: RunContext | None
    owned: bool | None
    """Whether the run's ledger account was opened for the caller and this run (``None``: the
    ledger holds no such account). The node judges by, and closes, only an account that is
    the caller's: a stop's error code is a state edit away from saying anything."""
    account: str
    require_citations: bool
    registry: ToolRegistry

    @property
    def stands(self) -> bool:
        """Whether the run ended already, by the terminal node: its ending stands, and the
        node writes nothing new (:meth:`end` refuses it)."""
        return self.asked is None

    @property
    def unreported(self) -> tuple[str, ...]:
        """The calls of the run's batch no receipt reports, whose start marker the ledger is
        asked about (none when the account is not the caller's)."""
        state = self.current
        if not self.owned or not state.batch:
            return ()
        receipted = {r.call_id for r in state.receipts[-len(state.batch) :]}
        return tuple(e.call_id for e in state.batch if e.call_id not in receipted)

    @property
    def citations(self) -> tuple[str, ...] | None:
        """The citations of the ``completed`` answer the ledger is asked about, with the work
        still pending (``None``: no answer to judge, or an account that is not the caller's,
        whose markers vouch for nothing)."""
        asked = self.asked
        if asked is None or asked.reason is not TerminationReason.COMPLETED or not self.owned:
            return None
        return asked.answer.citations if asked.answer is not None else None

    def end(self, started: Collection[str] = (), facts: AnswerFacts | None = None) -> Ending:
        """How the run ends, given what the ledger said: ``started``, the :attr:`unreported`
        calls it shows started (each receipted ``uncertain``: a run ending while such a call
        still runs, or after its worker died, keeps the call's id and effect, instead of
        reporting a call that never started); ``facts``, its facts about the answer's
        :attr:`citations` (``None``: not read, state alone tells them).

        The stop is verified again (:func:`conclude`): a ``completed`` stop that reached the
        end by another road than a final answer (written into state by a caller) must pass the
        same checks. On an account that is not the caller's every accepted task is pending and
        no citation is vouched for (a receipt or an observation in state is no marker). The
        stop report names a budget stop's account as the run's own or another's, and the
        untrusted outputs the answer repeats. The account is closed only when it is the
        caller's and the stop does not say it is not (:data:`NOT_THIS_RUNS_ACCOUNT`).
        """
        asked, current = self.asked, self.current
        if asked is None:
            # The run ended already, and its ending stands: there is nothing to end.
            raise TerminalStateError
        if started:
            # Stopping is not undoing: a call the run started keeps its id and effect on
            # record, ``uncertain``, never reported as a call that never started.
            fresh = set(started).intersection(self.unreported)
            cut_short: dict[str, Receipt] = {}
            for entry in current.batch:
                name = entry.proposal.tool_name
                if entry.call_id in fresh and entry.call_id not in cut_short:
                    spec = self.registry.get(name) if name in self.registry else None
                    code, status = ErrorCode.EXECUTION_UNCERTAIN, ReceiptStatus.UNCERTAIN
                    uncertain = not_run(entry, spec, code, status, attempts=1)
                    cut_short[entry.call_id] = receipt_for(uncertain)
            current = current.model_copy(
                update={"receipts": current.receipts + tuple(cut_short.values())}
            )
        if not self.owned:
            pending = tuple(r.task_id or r.call_id for r in unfinished(current.receipts, ()))
            facts = AnswerFacts(pending=pending, citable=frozenset())
        elif facts is None:
            facts = AnswerFacts.from_state(current)
        ending = conclude(
            asked,
            facts,
            require_citations=self.require_citations,
            account_known=self.owned is not None,
        ).stop
        state = terminate(
            current, ending.reason, answer=ending.answer, error_code=ending.error_code
        )
        budget = ending.budget
        if budget is not None:
            budget = budget.model_copy(update={"own": budget.account == self.account})
        report = stop_report(
            state,
            unfinished=current.batch,
            budget=budget,
            answer_untrusted=answer_untrusted(state, self.ctx, self.registry),
        )
        # The terminal state holds the stop it ended with: an answer refused here (its
        # citations) is not kept in it.
        return Ending(
            state=state.model_copy(update={"report": report, "stop": ending}),
            stop=ending,
            closes=bool(self.owned) and ending.error_code not in NOT_THIS_RUNS_ACCOUNT,
            current=current,
        )


def plan_ending(
    current: AgentState,
    ctx: RunContext | None,
    balance: Balance | None,
    *,
    account: str,
    remaining_steps: object,
    require_citations: bool,
    registry: ToolRegistry,
) -> EndingPlan:
    """The terminal node's plan for the run in ``current`` (``balance``: its ledger account,
    ``None`` when the ledger holds none), acting for ``ctx``.

    An ended run's ending stands unless a caller wrote it (:func:`reopened`). Every node that
    ends a run asks with a stop, so a run with none ends at the recursion limit (the entry had
    no room to decide), or else it is a caller's state update made as the terminal node, which
    is no ending (``invalid_state``).
    """
    if current.is_terminal:
        current = reopened(current, balance) or current
    asked = None
    if not current.is_terminal:
        asked = (
            current.stop
            or recursion_stop(remaining_steps, NEEDS_DECIDE)
            or stop(TerminationReason.POLICY_DENIED, "invalid_state")
        )
    owned = None
    if balance is not None:
        owned = ctx is not None and check_owner(balance.owner, ctx, current.run_id) is None
    return EndingPlan(
        current=current,
        asked=asked,
        ctx=ctx,
        owned=owned,
        account=account,
        require_citations=require_citations,
        registry=registry,
    )
