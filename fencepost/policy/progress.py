"""Progress judged by evidence, not only by arguments.

The same tool with the same arguments and the same result (or the same error code) is no
progress; the same arguments with a new result (a status that changed) is. A polling tool
declares its interval: polling sooner is no progress, on time is. Every check is O(1): results
are kept as hashes in ``AgentState.evidence``, never as text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import datetime

from fencepost.policy.batch import BatchEntry
from fencepost.policy.events import ToolFailed, ToolSucceeded
from fencepost.policy.fingerprint import canonical_json, proposal_fingerprint
from fencepost.policy.outcome import CallOutcome
from fencepost.policy.revised import revised
from fencepost.policy.state import AgentState


def result_hash(outcome: CallOutcome) -> str:
    """A short hash of what a call returned: its JSON result, or its error code."""
    event = outcome.event
    if isinstance(event, ToolSucceeded):
        text = "ok:" + canonical_json(event.result)
    else:
        assert isinstance(event, ToolFailed)
        text = "error:" + event.error_code.value
    # surrogatepass: hashing must not raise on text with no UTF-8 form (see ``fingerprint_of``).
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def _parse(seen: str) -> tuple[int, str, str]:
    """``(epoch, result hash, instant)`` of an evidence entry ``"<epoch>:<hash>@<instant>"``."""
    head, _, instant = seen.partition("@")
    epoch, _, digest = head.rpartition(":")
    try:
        return int(epoch or 0), digest, instant
    except ValueError:
        return 0, digest, instant


def repeat_key(fingerprint: str, state: AgentState) -> str:
    """What repeats are counted under: the call, in the current epoch of its results.

    The epoch moves on each time the call's result differs from the one before (new evidence),
    so the same call repeated with the same result keeps counting, and a changed result starts
    a fresh count.
    """
    seen = state.evidence.get(fingerprint)
    epoch = _parse(seen)[0] if seen is not None else 0
    if epoch == 0:
        return fingerprint
    return hashlib.sha256(f"{fingerprint}:{epoch}".encode()).hexdigest()


def last_run_at(fingerprint: str, state: AgentState) -> datetime | None:
    """When the call with this fingerprint last ran, if it did."""
    seen = state.evidence.get(fingerprint)
    if seen is None:
        return None
    try:
        return datetime.fromisoformat(_parse(seen)[2])
    except ValueError:
        return None


def recorded_evidence(
    state: AgentState,
    outcomes: list[CallOutcome],
    *,
    now: datetime,
    verified: Iterable[BatchEntry] = (),
) -> dict[str, str]:
    """``state.evidence`` with what ``outcomes`` returned recorded for their calls.

    ``verified``: entries of ``state.batch`` whose verdict's fingerprint the executor has just
    checked against their proposal (``execution.admits``); theirs is used as it is rather than
    computed again. Matched by identity, never by call id: an entry that is not one of these
    very objects (a batch a caller wrote since) is fingerprinted from its proposal.
    """
    # Holding the entries keeps their ids from being reused while the map is read.
    checked = {id(entry): entry for entry in verified}
    calls = {entry.call_id: entry for entry in state.batch}
    evidence: dict[str, str] = {}
    stamp = now.isoformat()
    for outcome in outcomes:
        entry = calls.get(outcome.call_id)
        if entry is None or outcome.attempts == 0:
            continue
        if checked.get(id(entry)) is entry:
            fingerprint = entry.verdict.fingerprint
        else:
            fingerprint = proposal_fingerprint(entry.proposal.tool_name, entry.proposal.arguments)
        digest = result_hash(outcome)
        epoch = 0
        seen = evidence.get(fingerprint) or state.evidence.get(fingerprint)
        if seen is not None:
            last_epoch, last_digest, _ = _parse(seen)
            epoch = last_epoch if last_digest == digest else last_epoch + 1
        evidence[fingerprint] = f"{epoch}:{digest}@{stamp}"
    return revised(state.evidence, evidence)
