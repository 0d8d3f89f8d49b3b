"""An answer's citations cost the ledger no more reads than the run has evidence.

What a final answer cites is the model's output (untrusted: a tool result can steer it), and
``AnswerPayload.citations`` has no bound on its length: the ledger is asked about a citation
(one ``get`` of its result marker) only when the run holds a result of that call, so N made-up
citations cost no N round trips on Postgres or SQLite before the answer is refused.
"""

from __future__ import annotations

from typing import Any

import fencepost as fp
from fencepost.policy.ledger import InMemoryLedger
from tests.graph.kit import call, harness


class _CountingLedger(InMemoryLedger):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get(self, key: str) -> Any:
        self.reads += 1
        return super().get(key)

    async def aget(self, key: str) -> Any:
        self.reads += 1
        return await super().aget(key)


def test_made_up_citations_cost_no_ledger_read_each() -> None:
    made_up = tuple(f"call-{i:06d}" for i in range(5000))
    ledger = _CountingLedger()
    answer = fp.FinalProposal(
        answer=fp.AnswerPayload(text="it was the database", citations=made_up)
    )
    h = harness([call("search_logs", 1), answer], ledger=ledger)
    state = h.run()
    assert state.last_error_code == "unsupported_citation"
    # One observation in the run: nothing else is worth asking the ledger about.
    assert ledger.reads <= 10, ledger.reads
