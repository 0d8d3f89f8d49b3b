"""The recursion limit's stop: a node short of supersteps ends the run as data, never as a
``GraphRecursionError``."""

from __future__ import annotations

import fencepost as fp
from fencepost.policy.may_go_on import (
    NEEDS_ANOTHER_DECIDE,
    NEEDS_DECIDE,
    NEEDS_EXECUTE,
    out_of_supersteps,
    recursion_stop,
)


def test_a_node_is_out_of_supersteps_only_below_what_it_needs() -> None:
    assert out_of_supersteps(NEEDS_DECIDE - 1, NEEDS_DECIDE)
    assert not out_of_supersteps(NEEDS_DECIDE, NEEDS_DECIDE)
    # decide needs room for execute and the terminal node; execute for the terminal node.
    assert NEEDS_EXECUTE < NEEDS_DECIDE == NEEDS_ANOTHER_DECIDE


def test_a_graph_without_remaining_steps_is_never_out() -> None:
    assert not out_of_supersteps(None, NEEDS_DECIDE)
    assert recursion_stop("3", NEEDS_DECIDE) is None


def test_the_recursion_limit_stops_the_run_step_budget_exhausted() -> None:
    assert recursion_stop(NEEDS_EXECUTE, NEEDS_EXECUTE) is None
    stopped = recursion_stop(1, NEEDS_EXECUTE)
    assert stopped is not None
    assert (stopped.reason, stopped.error_code) == (
        fp.TerminationReason.STEP_BUDGET_EXHAUSTED,
        "recursion_limit",
    )
