"""Dependent calls wait (seed 002): independent calls of a batch run in parallel, a dependent one
waits for its dependency's verified result, and a failed dependency stops its dependents with a
receipt that says why. Results are joined by call id, never by arrival order."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict

import fencepost as fp
from tests.graph.kit import context, harness, thread


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


def _run(batch: fp.ToolBatch, log: list[str], **kw: Any) -> fp.AgentState:
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
    state = _run(batch, log)
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
    state = _run(batch, log)
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
    state = _run(batch, log, fail={"order_read"})
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
    state = _run(batch, log)
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
    state = _run(batch, log)
    assert log == []
    assert state.last_error_code == "invalid_dependency"
