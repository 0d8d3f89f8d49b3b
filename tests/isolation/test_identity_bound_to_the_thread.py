"""The identity bound to a thread at start is the only one that can end its run.

DESIGN, isolation: limits and the terminal status are enforced from the ledger; the account
records the identity (and the run) it was opened for. A cancel that names a context is a caller's
cancel: for a context that is not the run's owner it changes nothing — no account closed, no
state written, no terminal node run — and says so with a typed error.
"""

from __future__ import annotations

import pytest
from langgraph.types import Command

import fencepost as fp
from tests.graph.kit import context, paused_for_approval, state_of, thread_account


@pytest.mark.parametrize(
    "stranger",
    [context(tenant="globex", principal="u-9"), context(principal="u-2")],
    ids=["another-tenant", "another-principal"],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_cancel_by_someone_else_changes_nothing_and_says_so(
    stranger: fp.RunContext, mode: str
) -> None:
    ledger = fp.InMemoryLedger()
    h, config, owner = paused_for_approval(ledger=ledger)
    before = h.graph.get_state(config)
    with pytest.raises(fp.CancelRefused) as refused:
        if mode == "sync":
            fp.cancel(h.graph, config, context=stranger)
        else:
            await fp.acancel(h.graph, config, context=stranger)
    assert refused.value.code == "context_mismatch"
    # Nothing written: the same head checkpoint, the account open, the run still paused.
    after = h.graph.get_state(config)
    assert after.config == before.config and after.next == ("approve",)
    assert ledger.balance(thread_account(config)).closed is None
    assert state_of(h, config).stop is None
    # The owner's run goes on as if nobody had asked.
    out = h.graph.invoke(Command(resume="approve"), config, context=owner)
    assert fp.run_output(out).termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1


def test_the_owners_cancel_still_ends_the_run() -> None:
    ledger = fp.InMemoryLedger()
    h, config, owner = paused_for_approval(ledger=ledger)
    state = fp.cancel(h.graph, config, context=owner)
    assert state is not None and state.termination is fp.TerminationReason.CANCELLED
    assert ledger.balance(thread_account(config)).closed == "cancelled"
    assert h.calls.count("write_note") == 0
