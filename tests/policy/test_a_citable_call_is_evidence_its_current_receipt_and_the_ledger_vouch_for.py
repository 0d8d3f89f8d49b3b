"""What a final answer may cite (``tasks.evidence_ids``): a successful tool result of the run
whose call's current receipt (its latest) is neither ``failed`` nor ``denied``, and, where the
ledger was asked, one it marks as having had its tool return a result."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fencepost.policy import Observation, Receipt, ReceiptStatus, current_receipts
from fencepost.policy.tasks import evidence_ids

CALLS = ["call-1", "call-2", "call-3", "call-\ud800"]  # a lone surrogate is an id like any other

receipts = st.lists(
    st.builds(
        Receipt,
        call_id=st.sampled_from(CALLS),
        tool_name=st.just("search_logs"),
        status=st.sampled_from(list(ReceiptStatus)),
    ),
    max_size=8,
)
observations = st.lists(
    st.tuples(st.sampled_from(CALLS), st.sampled_from(["tool_result", "tool_error"])), max_size=6
).map(
    lambda seen: tuple(
        Observation(sequence=n, call_id=call, tool_name="search_logs", kind=kind)  # type: ignore[arg-type]
        for n, (call, kind) in enumerate(seen)
    )
)


@given(receipts=receipts, observations=observations)
def test_a_call_is_citable_only_while_its_current_receipt_is_neither_failed_nor_denied(
    receipts: list[Receipt], observations: tuple[Observation, ...]
) -> None:
    current = {r.call_id: r.status for r in current_receipts(receipts)}
    refused = (ReceiptStatus.FAILED, ReceiptStatus.DENIED)
    expected = {
        o.call_id
        for o in observations
        if o.kind == "tool_result" and current.get(o.call_id) not in refused
    }
    assert evidence_ids(receipts, observations) == expected


@given(
    receipts=receipts,
    observations=observations,
    produced=st.frozensets(st.sampled_from([*CALLS, "call-never-seen"])),
)
def test_where_the_ledger_was_asked_only_what_it_marks_produced_is_citable(
    receipts: list[Receipt], observations: tuple[Observation, ...], produced: frozenset[str]
) -> None:
    vouched = evidence_ids(receipts, observations, produced)
    assert vouched == evidence_ids(receipts, observations) & produced
    assert evidence_ids(receipts, observations, ()) == frozenset()
