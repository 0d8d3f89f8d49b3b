"""What a call returned is kept as evidence under the fingerprint of the proposal that ran: the
executor's verified fingerprint is reused only for the very entry it checked, never for another
entry a caller wrote with the same call id."""

from __future__ import annotations

from datetime import UTC, datetime

from fencepost.policy.batch import BatchEntry
from fencepost.policy.execution import ran
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.progress import recorded_evidence
from fencepost.policy.verdict import Verdict, VerdictCode
from tests.policy.factories import make_proposal, make_spec, make_state

NOW = datetime(2025, 1, 1, tzinfo=UTC)
SPEC = make_spec()


def _entry(arguments: dict[str, object], *, fingerprint: str | None = None) -> BatchEntry:
    proposal = make_proposal(arguments, call_id="call-0001")
    real = proposal_fingerprint(proposal.tool_name, proposal.arguments)
    return BatchEntry(
        proposal=proposal,
        verdict=Verdict(
            call_id="call-0001",
            tool_name=proposal.tool_name,
            fingerprint=fingerprint or real,
            code=VerdictCode.ALLOWED,
        ),
    )


def test_a_verified_entry_is_keyed_as_its_proposal_fingerprints() -> None:
    entry = _entry({"query": "q"})
    state = make_state(batch=(entry,))
    assert state.batch[0] is entry
    done = [ran(entry, SPEC, 1, value={"hits": [1]})]
    reused = recorded_evidence(state, done, now=NOW, verified=[entry])
    computed = recorded_evidence(state, done, now=NOW)
    assert reused == computed
    assert list(reused) == [proposal_fingerprint(entry.proposal.tool_name, {"query": "q"})]


def test_an_entry_the_executor_did_not_check_is_fingerprinted_from_its_proposal() -> None:
    # Same call id, a verdict naming another call's fingerprint: only the entry object the
    # executor checked lends its verdict's fingerprint; this one is computed from what it holds.
    checked = _entry({"query": "q"})
    forged = _entry({"query": "other"}, fingerprint=checked.verdict.fingerprint)
    state = make_state(batch=(forged,))
    assert state.batch[0] is forged
    done = [ran(forged, SPEC, 1, value={"hits": []})]
    evidence = recorded_evidence(state, done, now=NOW, verified=[checked])
    assert list(evidence) == [proposal_fingerprint(forged.proposal.tool_name, {"query": "other"})]
    # An equal entry that is another object is not the one checked either.
    twin = _entry({"query": "other"}, fingerprint=checked.verdict.fingerprint)
    assert twin == forged and twin is not forged
    evidence = recorded_evidence(state, done, now=NOW, verified=[twin])
    assert list(evidence) == [proposal_fingerprint(forged.proposal.tool_name, {"query": "other"})]
