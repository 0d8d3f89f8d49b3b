"""The only way a run ends, and the check a final answer must pass first."""

from __future__ import annotations

from collections.abc import Collection

from fencepost.policy.observation import AnswerPayload
from fencepost.policy.phase import Phase, TerminationReason
from fencepost.policy.state import AgentState


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


def validate_final_answer(
    answer: AnswerPayload,
    state: AgentState,
    *,
    require_citations: bool = False,
    produced: Collection[str] | None = None,
) -> AnswerPayload:
    """Server-side citation check: each citation must name a successful observation, and (given
    ``produced``: the calls the ledger marks as having had their tool return a result) one a
    tool of this run produced — an observation in state is a caller's ``update_state`` away
    from forged, the ledger's mark is not.

    Raises :class:`UnsupportedCitation` or (with ``require_citations``) :class:`MissingCitation`.
    """
    # An empty answer (an action's agent with nothing to add) claims nothing to cite for.
    if require_citations and not answer.citations and not answer.is_empty:
        raise MissingCitation("answer has no citations")
    known = state.evidence_ids()
    if any(
        citation not in known or (produced is not None and citation not in produced)
        for citation in answer.citations
    ):
        raise UnsupportedCitation("answer cites evidence that was not observed")
    return answer
