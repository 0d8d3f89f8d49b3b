"""Invariant 6: tool output is untrusted data, and no raw exception text reaches the checkpoint.

A tool's ``Accepted``/``Completed`` is a claim like any other value it returns: one built with
``model_copy(update=...)`` skips pydantic's validation and may hold anything. It must end as
that call's failure with a safe code, not as an exception out of ``invoke`` quoting the value.
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from fencepost.policy.outcome import MalformedMarker, checked_marker
from tests.graph.kit import DOCS, STATUS, context, harness, thread, upload_registry
from tests.graph.test_hostile_review import _saver_bytes

SECRET = "password=hunter2"
ACCEPTED = fp.Accepted(task_id="task-17")
DONE = fp.Completed(
    task_id="task-17",
    evidence={"document_id": "document-42", "version": "3", "access_path": "/docs/42/v3"},
)
MALFORMED = {
    "accepted, task id an int": ACCEPTED.model_copy(update={"task_id": 17}),
    "accepted, task id a list": ACCEPTED.model_copy(update={"task_id": [SECRET]}),
    "accepted, task id None": ACCEPTED.model_copy(update={"task_id": None}),
    "accepted, detail not text": ACCEPTED.model_copy(update={"detail": {SECRET: 5}}),
    "completed, task id an int": DONE.model_copy(update={"task_id": 17}),
    "completed, evidence an int": DONE.model_copy(
        update={"evidence": {**DONE.evidence, "document_id": 42, SECRET: 1}}
    ),
    "completed, evidence None": DONE.model_copy(
        update={"evidence": {**DONE.evidence, "version": None, SECRET: None}}
    ),
    "completed, no evidence dict": DONE.model_copy(update={"evidence": None}),
    "completed, evidence a list": DONE.model_copy(update={"evidence": [SECRET]}),
}


def _final(inp: fp.DecisionInput) -> fp.FinalProposal:
    return fp.FinalProposal(answer=fp.AnswerPayload(text="Checked.", citations=()))


@pytest.mark.parametrize("value", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_accepted_or_completed_is_the_calls_failure_with_a_safe_code(
    value: Any,
) -> None:
    saver = InMemorySaver()
    h = harness(
        [STATUS, fp.AbstainProposal(reason="insufficient_evidence")],
        registry=upload_registry(value),
        checkpointer=saver,
    )
    config, ctx = thread(), context(caps=DOCS)
    out = h.graph.invoke(
        fp.start("Is it done?", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=3)),
        config,
        context=ctx,
    )
    state = fp.run_output(out)
    assert [(r.status, r.error_code) for r in state.receipts] == [
        (fp.ReceiptStatus.FAILED, fp.ErrorCode.UNSERIALIZABLE_RESULT)
    ]
    assert state.observations[0].kind == "tool_error"
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    assert state.open_tasks == ()
    # The thread is finished: invoking it again runs nothing and charges nothing more.
    again = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert again.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    assert again.budget.tool_calls_used == 1
    assert SECRET.encode() not in _saver_bytes(saver)
    assert SECRET not in repr(out)


async def test_a_malformed_accepted_is_the_calls_failure_under_ainvoke_too() -> None:
    saver = InMemorySaver()
    h = harness(
        [STATUS, fp.AbstainProposal(reason="insufficient_evidence")],
        registry=upload_registry(MALFORMED["accepted, task id a list"]),
        checkpointer=saver,
    )
    out = await h.graph.ainvoke(
        fp.start("Is it done?", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=3)),
        thread(),
        context=context(caps=DOCS),
    )
    state = fp.run_output(out)
    assert [(r.status, r.error_code) for r in state.receipts] == [
        (fp.ReceiptStatus.FAILED, fp.ErrorCode.UNSERIALIZABLE_RESULT)
    ]
    assert SECRET.encode() not in _saver_bytes(saver)


def test_a_well_formed_marker_passes_the_check_and_anything_else_is_no_marker() -> None:
    assert checked_marker(DONE) == DONE
    assert checked_marker(ACCEPTED) == ACCEPTED
    assert checked_marker({"task_id": 17}) is None  # a dict claims nothing
    for value in MALFORMED.values():
        with pytest.raises(MalformedMarker) as raised:
            checked_marker(value)
        assert SECRET not in str(raised.value) and raised.value.__cause__ is None
