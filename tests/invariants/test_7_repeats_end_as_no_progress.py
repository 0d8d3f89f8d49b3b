"""Invariant 7: a proposal repeated past the limit ends as ``no_progress`` before any budget is
spent on it. A call that never ran has not been repeated: held back with a batch given back for
repair, it counts nothing. A denial the run goes on with (denied as data, rejected by the
approver) counts: the same call denied past the limit is no progress.

A caller who overwrites the repeat counts in state does not reset them; one who rewrites the
evidence epochs still never spends past the tool budget (that it resets the count is a known
limit: ``tests/test_known_limits.py``). A tool whose results keep changing is progress, bounded
by the step budget. An approved write counts once; an edit at approval is gated again.

Over both bindings (the ``binding`` parameter, ``tests/invariants/bindings.py``: fencepost's graph,
and ``create_agent`` with ``fp.FencepostMiddleware``), at the end of this file: the same call past
the limit, the same call denied as data past it. The other tests drive the graph's own state, nodes
or settings (``update_state``, ``Command(update=...)``, channels, ``interrupt_before``, repair, the
approver, token estimates, savers and ledgers by URL), which the middleware binding does not have:
they stay graph-only.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from langgraph.types import Command

import fencepost as fp
from fencepost.policy import TerminationReason
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.repair import given_back
from tests.graph.kit import (
    ABSTAIN,
    LEDGERS,
    budget,
    call,
    context,
    drive_editing,
    each_ledger,
    final_citing_last,
    harness,
    mid_run_state,
    state_of,
    thread,
)
from tests.invariants import bindings as bd
from tests.middleware import kit as mw

ledger = pytest.fixture(params=LEDGERS, name="ledger")(each_ledger)


def _valid(n: int) -> fp.ToolProposal:
    return fp.ToolProposal(
        call_id=f"call-{n:04d}-ok", tool_name="search_logs", arguments={"query": "checkout 500"}
    )


def _bad(n: int) -> fp.ToolProposal:
    return fp.ToolProposal(call_id=f"call-{n:04d}-bad", tool_name="search_logs", arguments={})


@pytest.mark.parametrize("held_back", [2, 3])
def test_a_valid_call_held_back_by_repairs_of_its_batch_still_runs_once_repaired(
    held_back: int, ledger: fp.Ledger
) -> None:
    # The same valid call beside a schema violation, batch after batch: each batch is given
    # back for repair, so the valid call never runs, and is then sent alone.
    script: list[object] = [
        fp.ToolBatch(calls=(_valid(n), _bad(n))) for n in range(1, held_back + 1)
    ]
    script += [_valid(held_back + 1), final_citing_last]
    h = harness(script, repair_attempts=held_back, ledger=ledger)
    out = h.graph.invoke(fp.start("q", budget(steps=8, tools=4)), thread(), context=context())
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("search_logs") == 1
    assert state.budget.tool_calls_used == 1


def test_a_repaired_batch_leaves_the_repeat_counts_as_they_were() -> None:
    h = harness(
        [
            fp.ToolBatch(calls=(_valid(1), _bad(1))),
            fp.AbstainProposal(reason="needs_clarification"),
        ],
        repair_attempts=1,
    )
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context(), interrupt_after=["decide"])
    state = fp.run_output(h.graph.get_state(config).values)
    assert state.repairs == 1 and state.batch == ()
    assert state.fingerprints == {}


def test_a_batch_given_back_for_repair_keeps_the_counts_it_was_gated_against() -> None:
    state = mid_run_state().model_copy(update={"fingerprints": {"k": 1}, "repairs": 1})
    back = given_back(state, ("call-0001-bad: schema_violation: query: missing",))
    assert back.fingerprints == {"k": 1}
    assert (back.batch, back.repairs) == ((), 2)
    assert back.repair_notes == ("call-0001-bad: schema_violation: query: missing",)


def test_a_call_denied_as_data_repeated_past_the_limit_ends_no_progress(ledger: fp.Ledger) -> None:
    denied = [
        fp.ToolProposal(call_id=f"call-{n:04d}-x", tool_name="admin_reset", arguments={})
        for n in range(1, 5)
    ]
    h = harness(denied, denial="observe", repeat_limit=2, ledger=ledger)
    state = fp.run_output(
        h.graph.invoke(fp.start("q", budget(steps=8, tools=4)), thread(), context=context())
    )
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    assert [r.status for r in state.receipts] == [fp.ReceiptStatus.DENIED] * 2
    assert state.budget.tool_calls_used == 0


def test_a_write_the_approver_rejects_repeated_past_the_limit_ends_no_progress() -> None:
    writes = [
        fp.ToolProposal(call_id=f"call-{n:04d}-w", tool_name="write_note", arguments={"note": "x"})
        for n in range(1, 5)
    ]
    h = harness(
        writes, approver=lambda request: fp.ApproverDecision.reject("no_notes"), repeat_limit=2
    )
    state = fp.run_output(
        h.graph.invoke(fp.start("q", budget(steps=8, tools=4)), thread(), context=context())
    )
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    assert h.calls.log == []


# -- a caller's state edits and a flapping tool ------------------------------------------------


def test_overwriting_the_fingerprints_in_state_does_not_reset_the_no_progress_count() -> None:
    # fingerprints' reducer only raises counts ("a state edit cannot reset the no-progress
    # check"); an Overwrite, which would skip the reducer, is dropped.
    baseline = harness([*(call(n=i, query="same") for i in range(1, 12)), ABSTAIN])
    assert baseline.run(steps=12, tools=10).termination is TerminationReason.NO_PROGRESS
    limit = baseline.calls.count("search_logs")

    h = harness([*(call(n=i, query="same") for i in range(1, 12)), ABSTAIN])
    config, ctx = thread(), context()
    h.graph.invoke(
        fp.start("q", budget(steps=12, tools=10)), config, context=ctx, interrupt_after=["execute"]
    )
    for _ in range(15):
        if state_of(h, config).is_terminal:
            break
        h.graph.update_state(
            config, {"run": {"fingerprints": {"__overwrite__": {}}}}, as_node="execute"
        )
        h.graph.invoke(None, config, context=ctx, interrupt_after=["execute"])
    state = state_of(h, config)
    assert state.termination is TerminationReason.NO_PROGRESS
    assert h.calls.count("search_logs") == limit


def same_search(n: int) -> list[fp.ToolProposal]:
    """``n`` proposals of the same search, each with its own call id."""
    return [call(n=i, query="same") for i in range(1, n + 1)]


def bump_evidence(state: fp.AgentState) -> dict[str, Any] | None:
    """A caller's update moving the repeated search's evidence to a fresh epoch."""
    key = proposal_fingerprint("search_logs", {"query": "same"})
    seen = state.evidence.get(key)
    if seen is None:
        return None
    epoch = int(seen.split(":", 1)[0])
    return {"run": {"evidence": {key: f"{epoch + 1}:forged@2000-01-01T00:00:00+00:00"}}}


def test_rewriting_evidence_in_state_never_spends_past_the_tool_budget() -> None:
    h = harness([*same_search(10), ABSTAIN])
    config, ctx = thread(), context()
    h.graph.invoke(
        fp.start("q", budget(steps=12, tools=3)), config, context=ctx, interrupt_after=["execute"]
    )
    state = drive_editing(h, config, ctx, bump_evidence)
    assert h.calls.count("search_logs") <= 3
    assert state.is_terminal
    assert state.budget.tool_calls_used <= 3


def test_a_tool_whose_results_alternate_is_still_bounded_by_the_step_budget() -> None:
    flip = iter(range(100))

    @fp.tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=5)
    def flapping(ctx: fp.ToolContext) -> Any:
        """A status that flaps between two values."""
        return {"state": "up" if next(flip) % 2 else "down"}

    h = harness(
        [
            fp.ToolProposal(call_id=f"call-{i:04d}", tool_name="flapping", arguments={})
            for i in range(1, 40)
        ],
        registry=fp.ToolRegistry([flapping]),
    )
    state = h.run(steps=7, tools=30)
    assert state.is_terminal
    assert state.budget.steps_used <= 7
    assert len(state.observations) <= 7


# -- approvals ---------------------------------------------------------------------------------


def test_an_approved_write_counts_once_toward_the_repeat_limit() -> None:
    # repeat_limit=2: the same write, approved twice, runs twice; the third identical proposal
    # is no_progress before anyone is asked to approve it.
    same = {"note": "restart checkout"}
    script = [call("write_note", n, **same) for n in (1, 2, 3)]
    h = harness(script, approval="interrupt", repeat_limit=2)
    config, ctx = thread(), context()
    out = h.graph.invoke(fp.start("q", budget(steps=6, tools=6)), config, context=ctx)
    approvals = 0
    while "__interrupt__" in out:
        approvals += 1
        out = h.graph.invoke(Command(resume="approve"), config, context=ctx)
    state = fp.run_output(out)
    assert approvals == 2
    assert h.calls.count("write_note") == 2
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    assert state.budget.tool_calls_used == 2


def test_edited_arguments_pass_the_no_progress_gate_again_at_approval() -> None:
    # Two identical writes were approved and ran; a third proposal with other arguments is
    # edited back to the same ones. The edit is gated again, repeat limit included.
    same = {"note": "restart checkout"}
    script = [call("write_note", 1, **same), call("write_note", 2, **same)]
    script.append(call("write_note", 3, note="something else"))
    h = harness(script, approval="interrupt", repeat_limit=2)
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget(steps=6, tools=6)), config, context=ctx)
    h.graph.invoke(Command(resume="approve"), config, context=ctx)
    h.graph.invoke(Command(resume="approve"), config, context=ctx)
    edit = {"decision": "edit", "arguments": same}
    state = fp.run_output(h.graph.invoke(Command(resume=edit), config, context=ctx))
    assert h.calls.count("write_note") == 2
    assert state.termination is fp.TerminationReason.NO_PROGRESS


# -- over both bindings: fencepost's graph, and create_agent + FencepostMiddleware -------------


def test_the_same_call_repeated_past_the_limit_ends_no_progress(binding: type[bd.Binding]) -> None:
    same = (bd.call("search_logs", {"query": "checkout"}, n) for n in itertools.count(1))
    b = binding(same, steps=50, tools=50, repeat_limit=2)
    out = b.start(mw.ctx())
    assert len(out.bodies) == 2
    assert out.termination == fp.TerminationReason.NO_PROGRESS.value


def test_a_call_denied_as_data_repeated_past_the_limit_ends_no_progress_in_either_binding(
    binding: type[bd.Binding],
) -> None:
    same = (bd.call("write_note", {"note": "x"}, n) for n in itertools.count(1))
    b = binding(same, steps=50, tools=50, repeat_limit=2, denial="observe")
    out = b.start(mw.ctx("logs:read"))
    assert out.bodies == []
    assert out.termination == fp.TerminationReason.NO_PROGRESS.value


def test_an_approved_write_counts_once_toward_the_repeat_limit_in_either_binding(
    binding: type[bd.Binding],
) -> None:
    same = (bd.call("write_note", {"note": "restart checkout"}, n) for n in itertools.count(1))
    b = binding(same, steps=6, tools=6, approval="interrupt", repeat_limit=2)
    out = b.start(mw.ctx())
    approvals = 0
    while out.paused and approvals < 5:
        approvals += 1
        out = b.resume("approve", mw.ctx())
    assert approvals == 2
    assert out.bodies == ["write_note:restart checkout"] * 2
    assert out.termination == fp.TerminationReason.NO_PROGRESS.value
