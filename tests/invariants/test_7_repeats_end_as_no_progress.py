"""Invariant 7: a proposal repeated past the limit ends as ``no_progress`` before any budget is
spent on it. A call that never ran has not been repeated: held back with a batch given back for
repair, it counts nothing. A denial the run goes on with (denied as data, rejected by the
approver) counts: the same call denied past the limit is no progress."""

from __future__ import annotations

import pytest

import fencepost as fp
from fencepost.policy.repair import given_back
from tests.graph.kit import (
    LEDGERS,
    budget,
    context,
    each_ledger,
    final_citing_last,
    harness,
    mid_run_state,
    thread,
)

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
