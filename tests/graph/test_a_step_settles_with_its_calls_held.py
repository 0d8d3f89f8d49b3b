"""A model step whose settlement gives nothing back (no token or money estimate to refund) is
written with the holds of the calls it proposed, in one ledger write; never left in flight."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import fencepost as fp
from fencepost.policy.keys import call_key, run_account, step_key
from fencepost.policy.ledger import ReservationStatus
from tests.graph.kit import budget, call, context, final_citing_last, harness, thread


class _Recording(fp.InMemoryLedger):
    """An in-memory ledger that records its writes of settlements and holds, in order."""

    def __init__(self, fail_combined: bool = False) -> None:
        super().__init__()
        self.writes: list[tuple[str, str]] = []
        self.fail_combined = fail_combined

    def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> fp.Reservation:
        self.writes.append(("reserve", key))
        return super().reserve(account, key, amounts)

    def settle(self, key: str, actual: Mapping[str, float] | None = None) -> fp.Reservation:
        self.writes.append(("settle", key))
        return super().settle(key, actual)

    def settle_and_reserve(
        self,
        key: str,
        actual: Mapping[str, float] | None,
        account: str,
        holds: Sequence[tuple[str, Mapping[str, float]]],
    ) -> tuple[fp.Reservation, list[Any]]:
        self.writes.append(("settle_and_reserve", key))
        if self.fail_combined:
            raise RuntimeError("the ledger went away")
        with self._lock:
            settled = fp.InMemoryLedger.settle(self, key, actual)
            held: list[Any] = []
            for hold, amounts in holds:
                try:
                    held.append(fp.InMemoryLedger.reserve(self, account, hold, amounts))
                except fp.BudgetExhausted as refused:
                    held.append(refused)
            return settled, held


def test_a_step_settled_as_held_is_written_with_its_calls_holds() -> None:
    ledger = _Recording()
    h = harness([call(n=1), final_citing_last], ledger=ledger)
    config = thread()
    state = h.run(config=config)
    assert state.termination is fp.TerminationReason.COMPLETED
    account = run_account(config["configurable"]["thread_id"], state.run_id)
    first, held = step_key(account, 1), call_key(account, "c1", 1)
    assert ("settle_and_reserve", first) in ledger.writes
    assert ("settle", first) not in ledger.writes
    assert ("reserve", held) not in ledger.writes  # held with the step's settlement
    found = ledger.get(first)
    assert found is not None and found.status is ReservationStatus.SETTLED
    assert not any(ledger.in_flight(account).values())
    assert state.budget.tool_calls_used == 1


def test_a_step_whose_ending_holds_nothing_is_settled_on_its_own() -> None:
    ledger = _Recording()
    h = harness([fp.AbstainProposal(reason="insufficient_evidence")], ledger=ledger)
    config = thread()
    state = h.run(config=config)
    account = run_account(config["configurable"]["thread_id"], state.run_id)
    assert ("settle", step_key(account, 1)) in ledger.writes
    assert not [w for w in ledger.writes if w[0] == "settle_and_reserve"]


def test_a_step_whose_gate_fails_is_still_settled() -> None:
    ledger = _Recording(fail_combined=True)
    h = harness([call(n=1), final_citing_last], ledger=ledger)
    config = thread()
    with pytest.raises(RuntimeError, match="went away"):
        h.graph.invoke(
            fp.start("why is checkout failing?", budget()),
            config,
            context=context(),
        )
    account = next(
        key.rpartition(":step:")[0] for op, key in ledger.writes if op == "settle_and_reserve"
    )
    found = ledger.get(step_key(account, 1))
    assert found is not None and found.status is ReservationStatus.SETTLED
    assert not any(ledger.in_flight(account).values())
