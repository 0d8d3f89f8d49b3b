"""Dependent calls (seed 002: when A's verified output is B's input, B waits for A).

Independent calls of a batch run in parallel (the seed's order read and inventory read start
together and are joined by call id); a dependent one waits for its dependency's verified result.
A call may depend on a call whose tool produced a result — completed, or accepted with a task id
— as the ledger shows it, never on a receipt a caller wrote into state; it runs after that
result, and reads it in ``ToolContext.dependencies``. A dependency that is unknown or part of a
cycle is an invalid proposal; a call whose dependency failed or was rejected never runs, gets a
receipt that says why, and its reserved call is given back, even when a human edited the waiting
call or a caller wrote the batch with a call depending on itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict

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
    state_of,
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


def upload_registry(seen: list[dict[str, Any]]) -> fp.ToolRegistry:
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
    h = harness(script, registry=upload_registry(seen), ledger=ledger)
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


# -- what a caller or the model writes about dependencies --------------------------------------


def _proposal(
    tool: str, n: int, depends_on: tuple[str, ...] = (), **arguments: Any
) -> fp.ToolProposal:
    return fp.ToolProposal(
        call_id=f"call-{n:04d}", tool_name=tool, arguments=arguments, depends_on=depends_on
    )


def test_editing_a_waiting_write_keeps_its_dependency_on_a_failed_call() -> None:
    batch = fp.ToolBatch(
        calls=(
            _proposal("explode", 1),
            _proposal("write_note", 2, depends_on=("call-0001",), note="hi"),
        )
    )
    h = harness([batch, ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    edit = {"decision": "edit", "arguments": {"note": "edited"}}
    fp.run_output(h.graph.invoke(Command(resume=edit), config, context=ctx))
    assert h.calls.count("explode") == 1
    assert h.calls.count("write_note") == 0


def test_a_call_depending_on_a_rejected_write_never_runs_and_its_budget_is_given_back() -> None:
    batch = fp.ToolBatch(
        calls=(
            _proposal("write_note", 1, note="hi"),
            _proposal("search_logs", 2, ("call-0001",), query="x"),
        )
    )
    h = harness([batch, ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    state = fp.run_output(h.graph.invoke(Command(resume="reject"), config, context=ctx))
    assert h.calls.count("write_note") == 0
    assert h.calls.count("search_logs") == 0
    current = {r.call_id: r for r in fp.policy.current_receipts(state.receipts)}
    assert current["call-0002"].error_code is fp.ErrorCode.DEPENDENCY_FAILED
    assert state.budget.tool_calls_used == 0


def test_a_forged_self_dependency_cannot_hang_the_executor() -> None:
    batch = fp.ToolBatch(
        calls=(_proposal("write_note", 1, note="hi"), _proposal("search_logs", 2, query="x"))
    )
    h = harness([batch, ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()

    async def scenario() -> None:
        await h.graph.ainvoke(fp.start("q", budget()), config, context=ctx)
        current = state_of(h, config).batch
        forged = tuple(
            e.model_copy(
                update={"proposal": e.proposal.model_copy(update={"depends_on": (e.call_id,)})}
            )
            if e.call_id == "call-0002"
            else e
            for e in current
        )
        await asyncio.wait_for(
            h.graph.ainvoke(
                Command(update={"run": {"batch": forged}}, resume="approve"), config, context=ctx
            ),
            timeout=60,
        )

    asyncio.run(scenario())
    assert state_of(h, config).is_terminal


def test_a_cycle_across_a_batch_is_an_invalid_proposal_and_nothing_runs() -> None:
    batch = fp.ToolBatch(
        calls=(
            _proposal("search_logs", 1, ("call-0003",), query="a"),
            _proposal("search_logs", 2, ("call-0001",), query="b"),
            _proposal("search_logs", 3, ("call-0002",), query="c"),
        )
    )
    h = harness([batch, ABSTAIN])
    state = h.run()
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "invalid_dependency"
    assert h.calls.count("search_logs") == 0
    assert state.budget.tool_calls_used == 0


# -- the seed's example: an order read and an inventory read -----------------------------------


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    id: str


def _registry(log: list[str], *, fail: set[str] = frozenset()) -> fp.ToolRegistry:  # type: ignore[assignment]
    def make(name: str, delay: float) -> fp.ToolSpec:
        async def body(args: Args, ctx: fp.ToolContext) -> dict[str, str]:
            log.append(f"start:{name}")
            await asyncio.sleep(delay)
            if name in fail:
                raise fp.ToolError(fp.ErrorCode.NOT_FOUND)
            log.append(f"end:{name}")
            return {"tool": name, "id": args.id}

        return fp.ToolSpec(
            name=name,
            description=f"{name} lookup",
            args_model=Args,
            effect=fp.Effect.READ,
            capability="orders:read",
            timeout_seconds=5,
            execute=body,
        )

    return fp.ToolRegistry(
        [make("order_read", 0.15), make("inventory_read", 0.0), make("refund_quote", 0.0)]
    )


def _call(tool: str, call_id: str, *, depends_on: tuple[str, ...] = ()) -> fp.ToolProposal:
    return fp.ToolProposal(
        call_id=call_id, tool_name=tool, arguments={"id": "o-1"}, depends_on=depends_on
    )


def _run_batch(batch: fp.ToolBatch, log: list[str], **kw: Any) -> fp.AgentState:
    h = harness(
        [batch, fp.AbstainProposal(reason="insufficient_evidence")],
        registry=_registry(log, **kw),
    )
    out = h.graph.invoke(
        fp.start("q", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=5)),
        thread(),
        context=context(caps=frozenset({"orders:read"})),
    )
    return fp.run_output(out)


def test_seed_order_read_and_inventory_read_start_together_and_join_by_call_id() -> None:
    log: list[str] = []
    batch = fp.ToolBatch(
        calls=(_call("order_read", "call-a-order"), _call("inventory_read", "call-b-stock"))
    )
    state = _run_batch(batch, log)
    # Both started before either ended, and inventory-read returned first.
    assert log.index("start:inventory_read") < log.index("end:order_read")
    assert log.index("end:inventory_read") < log.index("end:order_read")
    by_id = {o.call_id: o for o in state.observations}
    assert by_id["call-a-order"].result == {"tool": "order_read", "id": "o-1"}
    assert by_id["call-b-stock"].result == {"tool": "inventory_read", "id": "o-1"}


def test_a_dependent_call_waits_for_its_dependencys_verified_result() -> None:
    log: list[str] = []
    batch = fp.ToolBatch(
        calls=(
            _call("refund_quote", "call-c-quote", depends_on=("call-a-order",)),
            _call("order_read", "call-a-order"),
            _call("inventory_read", "call-b-stock"),
        )
    )
    state = _run_batch(batch, log)
    assert log.index("end:order_read") < log.index("start:refund_quote")
    assert log.index("start:inventory_read") < log.index("end:order_read")
    statuses = {r.call_id: r.status for r in state.receipts}
    assert set(statuses.values()) == {fp.ReceiptStatus.COMPLETED}


def test_a_failed_dependency_stops_its_dependents_with_a_receipt_that_says_why() -> None:
    log: list[str] = []
    batch = fp.ToolBatch(
        calls=(
            _call("order_read", "call-a-order"),
            _call("refund_quote", "call-c-quote", depends_on=("call-a-order",)),
        )
    )
    state = _run_batch(batch, log, fail={"order_read"})
    assert "start:refund_quote" not in log
    receipt = {r.call_id: r for r in state.receipts}["call-c-quote"]
    assert receipt.status is fp.ReceiptStatus.DENIED
    assert receipt.error_code is fp.ErrorCode.DEPENDENCY_FAILED
    assert receipt.attempts == 0
    # The dependent never started: its reserved tool call was given back.
    assert state.budget.tool_calls_used == 1


def test_a_dependency_that_is_not_in_the_batch_or_completed_is_an_invalid_proposal() -> None:
    log: list[str] = []
    batch = fp.ToolBatch(calls=(_call("refund_quote", "call-c-quote", depends_on=("call-zzzz",)),))
    state = _run_batch(batch, log)
    assert log == []
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "invalid_dependency"


def test_a_dependency_cycle_is_an_invalid_proposal() -> None:
    log: list[str] = []
    batch = fp.ToolBatch(
        calls=(
            _call("order_read", "call-a-order", depends_on=("call-b-stock",)),
            _call("inventory_read", "call-b-stock", depends_on=("call-a-order",)),
        )
    )
    state = _run_batch(batch, log)
    assert log == []
    assert state.last_error_code == "invalid_dependency"
