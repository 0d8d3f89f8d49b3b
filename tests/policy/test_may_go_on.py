"""Whether a run may go on: the caller's trusted context, the identity it names, and time left."""

from __future__ import annotations

from typing import Any

import pytest

import fencepost as fp
from fencepost.policy import FakeClock
from fencepost.policy.may_go_on import check_before_acting, context_refusal
from tests.policy.factories import make_state

CTX = fp.RunContext(tenant_id="tenant-a", principal=fp.Principal(id="user-1"))


@pytest.mark.parametrize(("given", "code"), [(None, "missing_context"), ({}, "missing_context")])
def test_a_run_given_no_context_is_refused_as_missing(given: Any, code: str) -> None:
    assert context_refusal(given) == code


@pytest.mark.parametrize("given", ["acme", {"tenant_id": "acme", "principal": "u-1"}, 7])
def test_a_context_that_is_no_run_context_is_refused_as_invalid(given: Any) -> None:
    assert context_refusal(given) == "invalid_context"


def test_an_acting_node_goes_on_only_with_the_runs_own_identity_and_time_left() -> None:
    clock = FakeClock()
    state = make_state()
    assert check_before_acting(state, CTX, clock=clock) is None

    missing = check_before_acting(state, None, clock=clock)
    assert missing is not None
    assert (missing.reason, missing.error_code) == (
        fp.TerminationReason.POLICY_DENIED,
        "missing_context",
    )
    invalid = check_before_acting(state, None, clock=clock, given="acme")
    assert invalid is not None and invalid.error_code == "invalid_context"

    other = fp.RunContext(tenant_id="tenant-a", principal=fp.Principal(id="user-2"))
    mismatch = check_before_acting(state, other, clock=clock)
    assert mismatch is not None and mismatch.error_code == "context_mismatch"

    late = CTX.model_copy(update={"deadline": fp.Deadline.after(5, clock=clock)})
    assert check_before_acting(state, late, clock=clock) is None
    clock.advance(6)
    expired = check_before_acting(state, late, clock=clock)
    assert expired is not None
    assert (expired.reason, expired.error_code) == (
        fp.TerminationReason.DEADLINE_EXCEEDED,
        "deadline_exceeded",
    )
