"""Execute's first attempt of a call reads the gate's reservation and begins the attempt in one
ledger step (``Ledger.start_attempt``): the account's owner is judged inside that step, before
the claim or the start marker is written. A run whose identity a caller rewrote lands on an
account opened for another tenant, principal or run, and writes nothing there."""

from __future__ import annotations

import pytest

from fencepost.graph.account import RunAccount, start_attempt
from fencepost.graph.node_io import SyncIO, drive
from fencepost.policy import StopRequest
from fencepost.policy.keys import call_key, claim_key, started_key
from fencepost.policy.ledger import Attempt, Reservation, ReservationStatus
from fencepost.policy.ownership import run_owner
from tests.graph.kit import context, loop_settings

WHERE = ("thread-1", "")


def _in_flight(held: Reservation) -> bool:
    return held.status is ReservationStatus.RESERVED


@pytest.mark.parametrize(
    ("opened_for", "code"),
    [
        ({"tenant": "globex"}, "context_mismatch"),
        ({"principal": "u-2"}, "context_mismatch"),
        ({"run": "run-other"}, "account_conflict"),
    ],
    ids=["tenant", "principal", "run"],
)
def test_a_call_on_an_account_opened_for_someone_else_is_never_claimed_or_started(
    opened_for: dict[str, str], code: str
) -> None:
    cfg = loop_settings()
    io, ledger = SyncIO(cfg), cfg.ledger
    ctx = context()
    owner_ctx = context(
        tenant=opened_for.get("tenant", "acme"), principal=opened_for.get("principal", "u-1")
    )
    ledger.open_account(
        "acct", {"tool_calls": 5}, owner=run_owner(owner_ctx, opened_for.get("run", "run-1"))
    )
    held = ledger.reserve("acct", call_key("acct", "call-1", 1), {"tool_calls": 1})
    judged: list[Reservation] = []

    def begins(found: Reservation) -> bool:
        judged.append(found)
        return _in_flight(found)

    found, begun = drive(
        start_attempt(io, RunAccount("acct", "run-1"), ctx, "call-1", WHERE, begins=begins)
    )
    assert isinstance(found, StopRequest) and found.error_code == code and begun is None
    # The claim's own rule is never asked once the owner refuses, and nothing is written.
    assert judged == []
    assert ledger.get(started_key("acct", "call-1", 1)) is None
    assert ledger.get(claim_key(*WHERE, "run-1", "call-1")) is None
    assert ledger.get(held.key) == held.model_copy(update={"balance": None})


def test_a_call_on_the_callers_own_account_is_claimed_and_started_once() -> None:
    cfg = loop_settings()
    io, ledger = SyncIO(cfg), cfg.ledger
    ctx = context()
    ledger.open_account("acct", {"tool_calls": 5}, owner=run_owner(ctx, "run-1"))
    ledger.reserve("acct", call_key("acct", "call-1", 1), {"tool_calls": 1})
    run = RunAccount("acct", "run-1")
    for fresh in (True, False):
        found, begun = drive(start_attempt(io, run, ctx, "call-1", WHERE, begins=_in_flight))
        assert isinstance(found, Reservation) and isinstance(begun, Attempt) and begun.claimed
        assert begun.started is not None and begun.started.existing is not fresh
    assert ledger.get(claim_key(*WHERE, "run-1", "call-1")) is not None
