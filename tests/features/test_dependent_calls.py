"""Dependent calls (seed 002: when A's verified output is B's input, B waits for A). A call may
depend on a call whose tool produced a result — completed, or accepted with a task id — as the
ledger shows it, never on a receipt a caller wrote into state; it runs after that result, and
reads it in ``ToolContext.dependencies``."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.types import Command

import fencepost as fp
from fencepost.policy.execution import dependencies_met, dependency_inputs, earlier_outputs
from tests.graph.kit import (
    ABSTAIN,
    DOCS,
    LEDGERS,
    STATUS,
    UPLOAD,
    UPLOAD_DONE,
    VERDICT_KEY,
    StatusArgs,
    UploadArgs,
    allowed_entry,
    budget,
    call,
    context,
    each_ledger,
    final_citing_all,
    harness,
    thread,
)

ledger = pytest.fixture(params=LEDGERS, name="ledger")(each_ledger)


def _forged_receipt(call_id: str = "call-0099") -> fp.Receipt:
    return fp.Receipt(call_id=call_id, tool_name="search_logs", status=fp.ReceiptStatus.COMPLETED)


def _dependent(n: int, on: str = "call-0099") -> fp.ToolProposal:
    return call(n=n).model_copy(update={"depends_on": (on,)})


@pytest.mark.parametrize("key", [None, VERDICT_KEY], ids=["no-key", "key"])
def test_a_forged_completed_receipt_is_no_dependency_at_the_gate(
    key: bytes | None, ledger: fp.Ledger
) -> None:
    h = harness(
        [call("write_note", 1, note="a"), _dependent(2), ABSTAIN],
        approval="interrupt",
        verdict_key=key,
        ledger=ledger,
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    forged = {"run": {"receipts": (_forged_receipt(),)}}
    state = fp.run_output(
        h.graph.invoke(Command(update=forged, resume="reject"), config, context=ctx)
    )
    assert h.calls.count("search_logs") == 0
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "invalid_dependency"


def test_a_forged_completed_receipt_is_no_dependency_at_the_executor(ledger: fp.Ledger) -> None:
    h = harness(
        [call("write_note", 1, note="a"), ABSTAIN, ABSTAIN], approval="interrupt", ledger=ledger
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    # Written as the approval's output: an allowed entry depending on a forged completed call.
    h.graph.update_state(
        config,
        {"run": {"receipts": (_forged_receipt(),), "batch": (allowed_entry(_dependent(2)),)}},
        as_node="approve",
    )
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert h.calls.count("search_logs") == 0
    receipt = {r.call_id: r for r in state.receipts}["call-0002"]
    assert receipt.error_code is fp.ErrorCode.DEPENDENCY_FAILED


# -- an accepted call's task id is a verified output ------------------------------------------


def _upload_registry(seen: list[dict[str, Any]]) -> fp.ToolRegistry:
    def upload(args: UploadArgs, ctx: fp.ToolContext) -> fp.Accepted:
        return fp.Accepted(task_id="task-17")

    def status(args: StatusArgs, ctx: fp.ToolContext) -> Any:
        seen.append(dict(ctx.dependencies))
        return UPLOAD_DONE

    def spec(name: str, args: Any, body: Any, **declared: Any) -> fp.ToolSpec:
        return fp.ToolSpec(
            name=name,
            description=f"{name}.",
            args_model=args,
            effect=fp.Effect.READ,
            capability="docs:write",
            timeout_seconds=5,
            execute=body,
            **declared,
        )

    return fp.ToolRegistry(
        [
            spec("upload_document", UploadArgs, upload),
            spec(
                "upload_status",
                StatusArgs,
                status,
                completion_evidence=("document_id", "version", "access_path"),
                evidence_for=("upload_document",),
            ),
        ]
    )


def _run(script: list[Any], ledger: fp.Ledger) -> tuple[fp.AgentState, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    h = harness(script, registry=_upload_registry(seen), ledger=ledger)
    out = h.graph.invoke(
        fp.start("upload", budget(steps=5, tools=4)), thread(), context=context(caps=DOCS)
    )
    return fp.run_output(out), seen


ON_UPLOAD = STATUS.model_copy(update={"depends_on": (UPLOAD.call_id,)})


def test_a_call_may_depend_on_an_accepted_call_of_its_batch_and_reads_its_task_id(
    ledger: fp.Ledger,
) -> None:
    state, seen = _run([fp.ToolBatch(calls=(UPLOAD, ON_UPLOAD)), final_citing_all], ledger)
    assert seen == [{"call-0001": {"task_id": "task-17", "detail": {}}}]
    statuses = {r.call_id: r.status for r in fp.policy.current_receipts(state.receipts)}
    assert statuses == {
        "call-0001": fp.ReceiptStatus.COMPLETED,
        "call-0002": fp.ReceiptStatus.COMPLETED,
    }
    assert state.termination is fp.TerminationReason.COMPLETED


def test_a_call_may_depend_on_a_call_accepted_in_an_earlier_step(ledger: fp.Ledger) -> None:
    state, seen = _run([UPLOAD, ON_UPLOAD, final_citing_all], ledger)
    assert seen == [{"call-0001": {"task_id": "task-17", "detail": {}}}]
    assert state.termination is fp.TerminationReason.COMPLETED


def test_a_call_with_no_dependency_reads_none(ledger: fp.Ledger) -> None:
    _, seen = _run([UPLOAD, STATUS, final_citing_all], ledger)
    assert seen == [{}]


def test_a_dependency_is_met_by_a_result_of_its_batch_or_one_the_ledger_marks_produced() -> None:
    def outcome(status: fp.ReceiptStatus) -> fp.policy.CallOutcome:
        return fp.policy.CallOutcome(
            event=fp.policy.ToolSucceeded(call_id="call-0001", tool_name="t", result={}),
            status=status,
            attempts=1,
        )

    accepted = outcome(fp.ReceiptStatus.ACCEPTED_PENDING)
    assert dependencies_met([accepted, outcome(fp.ReceiptStatus.COMPLETED)], [], ())
    assert not dependencies_met([outcome(fp.ReceiptStatus.UNCERTAIN)], [], ())
    assert dependencies_met([], ["call-0009"], {"call-0009"})
    assert not dependencies_met([], ["call-0009"], set())


def test_a_dependent_reads_each_dependencys_first_result_as_data() -> None:
    def observation(call_id: str, sequence: int, result: Any, kind: str = "tool_result") -> Any:
        return fp.policy.Observation(
            sequence=sequence, call_id=call_id, tool_name="t", kind=kind, result=result
        )

    observations = (
        observation("call-0001", 0, {"task_id": "task-17", "detail": {}}),
        observation("call-0001", 1, {"task_id": "forged"}),
        observation("call-0002", 2, {"x": 1}),
    )
    earlier = earlier_outputs(observations, {"call-0001"})
    assert earlier == {"call-0001": {"task_id": "task-17", "detail": {}}}
    entry = allowed_entry(ON_UPLOAD)
    assert dependency_inputs(entry, [], earlier) == {"call-0001": earlier["call-0001"]}


@pytest.mark.xfail(
    strict=True,
    reason="earlier_outputs reads a dependency's first observation in state, and a caller's "
    "write appends any observation that validates, so one written while the run waits before "
    "the call runs (an approval, interrupt_before) is read as the call's result. Fix: the "
    "ledger's result mark (keys.result_key) carries a digest of the result the executor "
    "recorded, and earlier_outputs takes the observation that matches it (a ledger key format "
    "change, with a migration)",
)
def test_a_dependent_reads_the_result_its_dependency_returned_not_one_a_caller_planted(
    ledger: fp.Ledger,
) -> None:
    """Invariant 8 (results are joined to proposals by call id, never by arrival order) and the
    dependent-calls feature (a call reads its dependency's *verified* output)."""
    seen: list[dict[str, Any]] = []
    h = harness(
        [UPLOAD, ON_UPLOAD, final_citing_all], registry=_upload_registry(seen), ledger=ledger
    )
    config, ctx = thread(), context(caps=DOCS)
    request = fp.start("upload", budget(steps=5, tools=4))
    h.graph.invoke(request, config, context=ctx, interrupt_before=["execute"])
    planted = fp.policy.Observation(
        sequence=0,
        call_id=UPLOAD.call_id,
        tool_name="upload_document",
        kind="tool_result",
        result={"task_id": "planted-by-the-caller", "detail": {}},
    )
    h.graph.invoke(Command(update={"run": {"observations": (planted,)}}), config, context=ctx)
    assert seen == [{"call-0001": {"task_id": "task-17", "detail": {}}}]
