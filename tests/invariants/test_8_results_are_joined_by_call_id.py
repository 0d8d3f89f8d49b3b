"""Invariant 8: results are joined to proposals by call id, never by arrival order.

A batch whose first call finishes last, and a batch whose calls end differently (one run, one
rejected at approval), each leave every observation beside the proposal with its call id.

Over both bindings (the ``binding`` parameter, ``tests/invariants/bindings.py``: fencepost's graph,
and ``create_agent`` with ``fp.FencepostMiddleware``), at the end of this file: a batch whose first
call finishes last. The other tests drive the graph's own state, nodes or settings
(``update_state``, ``Command(update=...)``, channels, ``interrupt_before``, repair, the approver,
token estimates, savers and ledgers by URL), which the middleware binding does not have: they stay
graph-only.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import tool as lc_tool
from langgraph.types import Command

import fencepost as fp
from tests.graph.kit import (
    ABSTAIN,
    Calls,
    SearchArgs,
    budget,
    call,
    context,
    harness,
    make_registry,
    thread,
)
from tests.invariants import bindings as bd
from tests.middleware import kit as mw


def _slow_first_registry(calls: Calls) -> fp.ToolRegistry:
    async def lookup(args: SearchArgs, ctx: fp.ToolContext) -> dict[str, Any]:
        # The first call finishes last: arrival order is the reverse of proposal order.
        await asyncio.sleep(0.2 if args.query == "order" else 0.0)
        calls.log.append(("lookup", args.model_dump(), ctx.idempotency_key))
        return {"answer_for": args.query}

    spec = fp.ToolSpec(
        name="lookup",
        description="l",
        args_model=SearchArgs,
        effect="read",
        capability="logs:read",
        timeout_seconds=5,
        execute=lookup,
    )
    return make_registry(calls, extra=[spec])


def test_batch_results_are_joined_by_call_id_not_arrival_order() -> None:
    calls = Calls()
    batch = fp.ToolBatch(
        calls=(call("lookup", 1, query="order"), call("lookup", 2, query="inventory"))
    )
    h = harness(
        [batch, fp.AbstainProposal(reason="insufficient_evidence")],
        registry=_slow_first_registry(calls),
        calls=calls,
    )
    state = h.run()
    assert [c[1]["query"] for c in calls.log] == ["inventory", "order"]
    by_call = {o.call_id: o.result for o in state.observations}
    assert by_call == {
        "call-0001": {"answer_for": "order"},
        "call-0002": {"answer_for": "inventory"},
    }
    assert [o.sequence for o in state.observations] == [0, 1]
    assert [o.step for o in state.observations] == [1, 1]  # one batch, one step
    assert [p.call_id for p in state.proposals] == ["call-0001", "call-0002"]


def test_each_recorded_proposal_is_the_one_its_observation_answers_in_a_mixed_batch() -> None:
    # A read and a write in one batch; the write (second) is rejected, the read (first) runs.
    # Observations arrive rejected-first; each must sit beside the proposal with its call id.
    batch = fp.ToolBatch(calls=(call(n=1), call("write_note", 2, note="x")))
    h = harness([batch, ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    state = fp.run_output(h.graph.invoke(Command(resume="reject"), config, context=ctx))
    assert {o.call_id for o in state.observations} == {"call-0001", "call-0002"}
    assert [p.call_id for p in state.proposals] == [o.call_id for o in state.observations]
    assert h.calls.count("search_logs") == 1 and h.calls.count("write_note") == 0


# -- over both bindings: fencepost's graph, and create_agent + FencepostMiddleware -------------


def test_each_result_is_shown_beside_its_own_call_id_in_either_binding(
    binding: type[bd.Binding],
) -> None:
    second_done = threading.Event()

    @lc_tool
    def lookup(query: str) -> str:
        """Look a record up."""
        if query == "first":
            # The first call finishes last, where the calls run side by side.
            second_done.wait(2)
        else:
            second_done.set()
        return f"record of {query}"

    script = bd.then_answer(
        bd.batch(("lookup", {"query": "first"}, 1), ("lookup", {"query": "second"}, 2))
    )
    b = binding(script, steps=4, tools=4, extra_tools=[(lookup, bd.READ)])
    out = b.start(mw.ctx())
    assert out.termination == fp.TerminationReason.COMPLETED.value
    shown = {m.tool_call_id: str(m.content) for m in out.received[-1] if isinstance(m, ToolMessage)}
    assert "record of first" in shown["call-0001"] and "record of second" in shown["call-0002"]


def test_a_batch_run_in_part_shows_each_call_its_own_ending_in_either_binding(
    binding: type[bd.Binding],
) -> None:
    script = bd.then_answer(
        bd.batch(("write_note", {"note": "x"}, 1), ("search_logs", {"query": "checkout"}, 2))
    )
    b = binding(script, steps=4, tools=4, approval="interrupt")
    assert b.start(mw.ctx()).paused
    out = b.resume("reject", mw.ctx())
    assert out.bodies == ["search_logs:checkout"]
    assert out.termination == fp.TerminationReason.COMPLETED.value
    shown = {m.tool_call_id: str(m.content) for m in out.received[-1] if isinstance(m, ToolMessage)}
    assert "permission_denied" in shown["call-0001"] and "500 /checkout" in shown["call-0002"]
