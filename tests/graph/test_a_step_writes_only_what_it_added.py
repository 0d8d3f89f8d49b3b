"""A node's write holds only what its step added to a record, which only grows; the record it
makes is the same whichever copy of the channel it is folded onto first."""

from __future__ import annotations

import pytest

from fencepost.graph.record import RunRecord, fold
from fencepost.graph.writes import step_writes
from fencepost.policy import AgentState, Observation, RuntimeBudget


def _obs(n: int) -> Observation:
    return Observation(
        sequence=n, step=1, call_id=f"call-{n}", tool_name="t", kind="tool_result", result=n
    )


def _state(observations: tuple[Observation, ...]) -> AgentState:
    return AgentState(
        run_id="run-1",
        question="q",
        budget=RuntimeBudget(steps_remaining=9, tool_calls_remaining=9),
        observations=observations,
    )


KEPT = tuple(_obs(n) for n in range(4))


def test_a_step_writes_the_items_it_added_and_nothing_before_them() -> None:
    before = _state(KEPT)
    after = before.model_copy(update={"observations": (*KEPT, _obs(4))})
    write = step_writes(before, after)["run"]
    assert [o["sequence"] for o in write["observations"]] == [4]


@pytest.mark.parametrize(
    "rewritten",
    [
        KEPT[:3],  # cut short
        tuple(_obs(n) for n in range(5)),  # rebuilt: every item a new object
        (_obs(0), *KEPT[1:], _obs(4)),  # the first item replaced
        (*KEPT[:3], _obs(3), _obs(4)),  # the last kept item replaced
        [*KEPT, _obs(4)],  # no tuple
    ],
)
def test_a_step_that_takes_back_a_record_item_is_refused(rewritten: object) -> None:
    before = _state(KEPT)
    after = before.model_copy(update={"observations": rewritten})
    with pytest.raises(ValueError, match="append-only"):
        step_writes(before, after)


def test_a_write_folded_twice_onto_one_record_makes_one_record_and_onto_another_its_own() -> None:
    before = _state(KEPT)
    after = before.model_copy(update={"observations": (*KEPT, _obs(4)), "step": 2})
    base = fold(RunRecord(), [step_writes(None, before)["run"]])
    write = step_writes(before, after)["run"]
    routed = fold(base, [write])
    assert fold(base, [write]) is routed  # the channel's own fold, after the routing copy's
    assert routed["step"] == 2 and len(routed["observations"]) == 5
    other = RunRecord(base)
    other["step"] = 7
    again = fold(other, [write])
    assert again is not routed and again["step"] == 2
    assert len(again["observations"]) == 5
    # Read once: a third fold onto the first record makes a new, equal one.
    third = fold(base, [write])
    assert third == routed
    assert base["step"] == 0 and len(base["observations"]) == 4
