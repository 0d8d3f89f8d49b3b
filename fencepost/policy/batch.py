"""A batch: the proposals of one decision, each joined to its gate verdict by call id."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import model_validator

from fencepost.policy.contract import Frozen, assemble
from fencepost.policy.decision import ToolProposal
from fencepost.policy.verdict import Verdict


class BatchEntry(Frozen):
    """One proposal of a batch and the gate's verdict on it (same call id, by construction)."""

    proposal: ToolProposal
    verdict: Verdict

    @model_validator(mode="after")
    def _joined_by_call_id(self) -> BatchEntry:
        if self.proposal.call_id != self.verdict.call_id:
            raise ValueError("a batch entry joins a proposal and a verdict of the same call id")
        return self

    @property
    def call_id(self) -> str:
        """The call id both halves answer to."""
        return self.proposal.call_id

    def with_verdict(self, verdict: Verdict) -> BatchEntry:
        """This entry with a new verdict for the same call."""
        return assemble(BatchEntry, {"proposal": self.proposal, "verdict": verdict})


Batch = tuple[BatchEntry, ...]


def replace_entries(batch: Batch, changed: Iterable[BatchEntry]) -> Batch:
    """``batch`` with each entry of ``changed`` put in place of the one with its call id."""
    by_id = {e.call_id: e for e in changed}
    return tuple(by_id.get(e.call_id, e) for e in batch)
