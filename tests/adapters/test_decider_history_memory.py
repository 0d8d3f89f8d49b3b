"""The decider's rendered history lives as long as the run's observations, not longer.

A decider serves many runs for the life of a process; what it rendered for one run must go when
that run's records go, and be reused (not rebuilt) while the run goes on.
"""

from __future__ import annotations

import gc
import weakref

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage

from fencepost.adapters import ChatModelDecider
from fencepost.policy.decision_model import DecisionInput
from fencepost.policy.observation import Observation
from tests.adapters.fakes import decision_input, idle_decider, tool_observation


def _decider() -> ChatModelDecider:
    return idle_decider()


def _observation(n: int) -> Observation:
    return tool_observation(n, {"n": n})


def _input(observations: tuple[Observation, ...]) -> DecisionInput:
    return decision_input(observations, {"query": "q"})


def _tool_messages(messages: list[BaseMessage]) -> list[BaseMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


def test_a_run_that_goes_on_is_shown_the_turns_already_rendered() -> None:
    decider = _decider()
    records = (_observation(0), _observation(1))
    earlier = _tool_messages(decider.messages(_input(records)))
    later = _tool_messages(decider.messages(_input((*records, _observation(2)))))
    assert later[0] is earlier[0] and later[1] is earlier[1]
    assert len(later) == 3


def test_a_finished_runs_turns_go_with_its_observations() -> None:
    decider = _decider()
    records = tuple(_observation(n) for n in range(3))
    shown = weakref.ref(_tool_messages(decider.messages(_input(records)))[0])
    del records
    gc.collect()
    # Another run's step is when the decider tidies up.
    decider.messages(_input((_observation(7),)))
    gc.collect()
    assert shown() is None


def test_a_reused_history_is_shown_with_the_question_the_run_asks_now() -> None:
    # The question message is kept beside the run's rendered turns; a state edit that changes
    # the question (same observation objects) must show the model the new one.
    decider = _decider()
    records = (_observation(0),)
    decider.messages(_input(records))
    edited = _input((*records, _observation(1))).model_copy(update={"question": "another?"})
    shown = decider.messages(edited)
    assert isinstance(shown[1], HumanMessage) and shown[1].content == "another?"


def test_a_reassigned_system_prompt_is_the_one_shown() -> None:
    decider = _decider()
    decider.messages(_input(()))
    decider.system_prompt = "new rules"
    shown = decider.messages(_input(()))
    assert isinstance(shown[0], SystemMessage) and shown[0].content == "new rules"


def test_a_decider_dropped_with_live_runs_is_freed_and_its_callbacks_harmless() -> None:
    decider = idle_decider()
    records = tuple(_observation(n) for n in range(2))
    decider.messages(_input(records))
    gone = weakref.ref(decider)
    del decider
    gc.collect()
    assert gone() is None  # the callbacks hold the list, not the decider
    del records  # its callback appends to an orphaned list: nothing raises
    gc.collect()
