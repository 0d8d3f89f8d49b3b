"""An agent whose task was an action may answer with no text: its receipts say what it did. An
empty answer claims nothing, so it cites nothing and needs no citation."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from langgraph.types import Command

import fencepost as fp
from fencepost.policy import InvalidProposal, parse_decision
from tests.graph.kit import CAPS, call, context, harness


def test_an_agent_whose_task_was_an_action_may_answer_with_no_text() -> None:
    h = harness(
        [
            call("write_note", note="restart api"),
            fp.FinalProposal(answer=fp.AnswerPayload(text="")),
        ],
        approval="interrupt",
    )
    config = {"configurable": {"thread_id": "empty-answer"}}
    h.graph.invoke(fp.start("Restart the API"), config, context=context())
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=context()))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.final_answer == fp.AnswerPayload(text="")
    assert [r.status for r in state.receipts] == [fp.ReceiptStatus.COMPLETED]


def test_an_empty_answer_needs_no_citation_even_when_citations_are_required() -> None:
    h = harness(
        [call(), fp.FinalProposal(answer=fp.AnswerPayload(text=" "))], require_citations=True
    )
    state = h.run(ctx=context(caps=CAPS))
    assert state.termination is fp.TerminationReason.COMPLETED


def test_an_answer_with_text_still_needs_a_citation_when_citations_are_required() -> None:
    h = harness(
        [call(), fp.FinalProposal(answer=fp.AnswerPayload(text="done"))], require_citations=True
    )
    state = h.run()
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "missing_citation"


@given(
    text=st.text(max_size=40) | st.sampled_from(["", " ", "\n\t", "done"]),
    citations=st.lists(st.text(min_size=1, max_size=12), max_size=3),
)
def test_a_model_answer_is_valid_exactly_when_it_cites_only_if_it_says_something(
    text: str, citations: list[str]
) -> None:
    raw: dict[str, Any] = {"kind": "final", "answer": {"text": text, "citations": citations}}
    try:
        decision = parse_decision(raw)
    except InvalidProposal:
        assert citations and not text.strip()
    else:
        assert isinstance(decision, fp.FinalProposal)
        assert decision.answer.text == text
        assert not (decision.answer.citations and decision.answer.is_empty)
