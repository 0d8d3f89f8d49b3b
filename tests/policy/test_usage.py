"""What a model step holds of the token budget before the model is asked."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fencepost.policy.usage import configured_hold, step_hold


@given(estimate=st.integers(1, 10**6))
def test_a_configured_estimate_is_what_a_step_holds(estimate: int) -> None:
    assert configured_hold(estimate) == estimate


def test_without_an_estimate_a_step_holds_what_its_chain_has_left() -> None:
    assert configured_hold(0) is None
    assert step_hold(0, 120.0) == 120
