"""Work accepted is not work done (seed 002): a task is completed only by verified evidence.

The seed's example verbatim: an upload returns task-17 (accepted, pending); a status check that
finds document-42, version 3 and its access path completes it; a success sentence alone does not.
"""

from __future__ import annotations

from typing import Any

import fencepost as fp
from fencepost.policy import Completed
from tests.graph.kit import UPLOAD_DONE, context, harness, thread, upload_registry


def _call(tool: str, n: int, **arguments: Any) -> fp.ToolProposal:
    return fp.ToolProposal(call_id=f"call-{n:04d}", tool_name=tool, arguments=arguments)


def _final(inp: fp.DecisionInput) -> fp.FinalProposal:
    cited = tuple(o.call_id for o in inp.observations if o.kind == "tool_result")
    return fp.FinalProposal(answer=fp.AnswerPayload(text="Uploaded.", citations=cited))


def _ctx() -> fp.RunContext:
    return context(caps=frozenset({"docs:write"}))


def _run(status_result: Any, script: list[Any], steps: int = 6) -> tuple[fp.AgentState, Any]:
    h = harness(script, registry=upload_registry(status_result))
    out = h.graph.invoke(
        fp.start(
            "Upload the report", fp.RuntimeBudget(steps_remaining=steps, tool_calls_remaining=5)
        ),
        thread(),
        context=_ctx(),
    )
    return fp.run_output(out), h


def test_seed_upload_task_17_is_completed_by_document_42_version_3_and_its_access_path() -> None:
    script = [
        _call("upload_document", 1, name="report.pdf"),
        _call("upload_status", 2, task_id="task-17"),
        _final,
    ]
    state, _ = _run(UPLOAD_DONE, script)
    assert state.termination is fp.TerminationReason.COMPLETED
    current = {r.call_id: r for r in fp.policy.current_receipts(state.receipts)}
    assert current["call-0001"].status is fp.ReceiptStatus.COMPLETED
    assert current["call-0001"].task_id == "task-17"
    assert current["call-0001"].completed_by == "call-0002"
    # The log keeps both facts: accepted first, completed on evidence later.
    statuses = [r.status for r in state.receipts if r.call_id == "call-0001"]
    assert statuses == [fp.ReceiptStatus.ACCEPTED_PENDING, fp.ReceiptStatus.COMPLETED]


def test_a_success_sentence_alone_leaves_the_task_pending_and_the_run_cannot_complete() -> None:
    script = [
        _call("upload_document", 1, name="report.pdf"),
        _call("upload_status", 2, task_id="task-17"),
        _final,
        _final,
        _final,
    ]
    state, h = _run({"status": "Completed successfully!"}, script, steps=5)
    assert state.termination is not fp.TerminationReason.COMPLETED
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    current = {r.call_id: r for r in fp.policy.current_receipts(state.receipts)}
    assert current["call-0001"].status is fp.ReceiptStatus.ACCEPTED_PENDING
    # The model was told, as data, which task is pending.
    later = [inp for inp in h.model.inputs if inp.step >= 3]
    assert later and all(inp.pending_tasks == ("task-17",) for inp in later)


def test_evidence_missing_a_declared_field_completes_nothing() -> None:
    partial = Completed(task_id="task-17", evidence={"document_id": "document-42", "version": "3"})
    script = [
        _call("upload_document", 1, name="report.pdf"),
        _call("upload_status", 2, task_id="task-17"),
        fp.AbstainProposal(reason="insufficient_evidence"),
    ]
    state, _ = _run(partial, script)
    current = {r.call_id: r for r in fp.policy.current_receipts(state.receipts)}
    assert current["call-0001"].status is fp.ReceiptStatus.ACCEPTED_PENDING


def test_the_final_turn_refuses_tool_calls_and_a_model_that_answers_there_completes() -> None:
    read = _call("upload_status", 1, task_id="task-1")
    h = harness(
        [read, read.model_copy(update={"call_id": "call-0002"}), _final],
        registry=upload_registry({"state": "idle"}),
        repeat_limit=5,
    )
    out = h.graph.invoke(
        fp.start("q", fp.RuntimeBudget(steps_remaining=3, tool_calls_remaining=5)),
        thread(),
        context=_ctx(),
    )
    state = fp.run_output(out)
    assert [inp.final_turn for inp in h.model.inputs] == [False, False, True]
    assert state.termination is fp.TerminationReason.COMPLETED


def test_a_model_that_calls_a_tool_in_its_final_turn_ends_step_budget_exhausted() -> None:
    calls = [_call("upload_status", n, task_id=f"task-{n}") for n in range(1, 5)]
    h = harness(calls, registry=upload_registry({"state": "idle"}))
    out = h.graph.invoke(
        fp.start("q", fp.RuntimeBudget(steps_remaining=3, tool_calls_remaining=5)),
        thread(),
        context=_ctx(),
    )
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert state.last_error_code == "answer_margin"
    assert state.budget.tool_calls_used == 2
