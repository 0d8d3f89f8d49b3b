"""A revised per-call record writes exactly the entries that changed, as a full comparison would."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fencepost.policy.revised import changes_since, revised

records = st.dictionaries(st.text(max_size=4), st.integers(0, 5), max_size=12)


def _compared(old: dict[str, int], new: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in new.items() if old.get(k) != v}


@given(old=records, changes=records)
def test_the_changes_a_revised_record_carries_are_the_ones_a_comparison_finds(
    old: dict[str, int], changes: dict[str, int]
) -> None:
    new = revised(old, changes)
    assert new == {**old, **changes}
    assert changes_since(old, new) == _compared(old, new)


@given(old=records, other=records, changes=records)
def test_a_record_revised_from_another_base_is_compared_in_full(
    old: dict[str, int], other: dict[str, int], changes: dict[str, int]
) -> None:
    new = revised(other, changes)
    assert changes_since(old, new) == _compared(old, new)


def test_revising_leaves_the_base_alone_and_writes_a_plain_dict() -> None:
    base = {"a": 1}
    new = revised(base, {"a": 2, "b": 1})
    assert base == {"a": 1}
    assert type(changes_since(base, new)) is dict
