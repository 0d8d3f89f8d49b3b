"""``ChatModelDecider(history_window=k)``: a long run shows the model its latest ``k`` tool turns,
whole, after a data notice counting the results left out; the run's record keeps them all."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

import fencepost as fp
from fencepost.adapters import ChatModelDecider
from fencepost.adapters.chat_model import DeciderConfigError
from fencepost.policy.observation import Observation
from tests.adapters.fakes import (
    ToolLog,
    ai_call,
    arun,
    build,
    decider,
    decision_input,
    final_citing_all,
    idle_decider,
    langchain_registry,
    tool_observation,
)


def _turns(batches: list[int]) -> fp.DecisionInput:
    """The next step's input in a run whose step ``s`` made ``batches[s]`` calls."""
    observations: list[Observation] = []
    for step, size in enumerate(batches, start=1):
        for _ in range(size):
            n = len(observations)
            observations.append(tool_observation(n, {"n": n}).model_copy(update={"step": step}))
    return decision_input(tuple(observations), {"query": "q"})


def _cut(full: fp.DecisionInput, count: int) -> fp.DecisionInput:
    """``full`` as it was when the run had recorded ``count`` observations."""
    return full.model_copy(
        update={"observations": full.observations[:count], "proposals": full.proposals[:count]}
    )


def _windowed(window: int | None) -> ChatModelDecider:
    return idle_decider(history_window=window)


def _left_out(messages: list[BaseMessage]) -> int | None:
    """The count the window notice gives, or None when the model is not told of one."""
    for message in messages:
        text = str(message.content)
        if isinstance(message, HumanMessage) and "earlier_tool_results_not_shown" in text:
            notice = json.loads(text[text.index("{") : text.rindex("}") + 1])
            return int(notice["fencepost_notice"]["earlier_tool_results_not_shown"])
    return None


def _shown_turns(messages: list[BaseMessage]) -> list[list[str]]:
    """The call ids of each assistant turn shown, checking each is followed by its results."""
    turns: list[list[str]] = []
    pending: list[str] = []
    for message in messages:
        if isinstance(message, AIMessage):
            assert not pending, "a turn was cut: its results do not follow it"
            turns.append([c["id"] for c in message.tool_calls if c["id"] is not None])
            pending = list(turns[-1])
        elif isinstance(message, ToolMessage):
            assert pending and message.tool_call_id == pending.pop(0)
    assert not pending
    return turns


def _expected_turns(batches: list[int], window: int | None) -> list[list[str]]:
    ids, turns = iter(range(sum(batches))), []
    for size in batches:
        turns.append([f"call_{next(ids):010d}" for _ in range(size)])
    turns = [t for t in turns if t]
    return turns if window is None else turns[-window:]


def test_a_long_run_is_shown_its_latest_turns_whole_after_a_notice_counting_the_rest() -> None:
    run = _turns([1, 2, 1, 3, 1])
    messages = _windowed(2).messages(run)
    assert isinstance(messages[0], SystemMessage) and messages[1].content == "q"
    assert _left_out(messages) == 4  # steps 1-3 made 4 calls
    assert _shown_turns(messages) == [
        ["call_0000000004", "call_0000000005", "call_0000000006"],
        ["call_0000000007"],
    ]


def test_a_run_within_its_window_is_shown_whole_and_told_of_nothing_left_out() -> None:
    run = _turns([1, 2])
    messages = _windowed(2).messages(run)
    assert _left_out(messages) is None
    assert _shown_turns(messages) == _expected_turns([1, 2], None)


def test_without_a_window_the_whole_conversation_is_shown() -> None:
    run = _turns([1] * 40)
    messages = _windowed(None).messages(run)
    assert _left_out(messages) is None
    assert len(_shown_turns(messages)) == 40


@pytest.mark.parametrize("window", [0, -3, True, 2.0, "4"])
def test_a_window_that_is_not_a_positive_integer_is_refused_when_the_decider_is_built(
    window: Any,
) -> None:
    with pytest.raises(DeciderConfigError, match="history_window"):
        ChatModelDecider(idle_decider().chat_model, history_window=window)


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=25),
    window=st.integers(min_value=1, max_value=8),
    grown_by=st.integers(min_value=1, max_value=4),
)
def test_the_window_shows_the_same_latest_turns_whether_the_run_grew_here_or_not(
    batches: list[int], window: int, grown_by: int
) -> None:
    run = _turns(batches)
    warm = _windowed(window)
    # The same run seen step by step in this process (its rendered turns reused)...
    for end in range(0, len(batches), grown_by):
        warm.messages(_cut(run, sum(batches[:end])))
    seen_here = warm.messages(run)
    # ...and resumed in a fresh process: the model is shown the same conversation.
    fresh = _windowed(window).messages(run)
    for messages in (seen_here, fresh):
        assert _shown_turns(messages) == _expected_turns(batches, window)
        shown = sum(len(t) for t in _shown_turns(messages))
        assert (_left_out(messages) or 0) + shown == len(run.observations)
        assert (_left_out(messages) is None) == (len(batches) <= window)
    assert [m.content for m in seen_here] == [m.content for m in fresh]


def test_a_windowed_run_completes_and_its_record_keeps_every_observation() -> None:
    log = ToolLog()
    calls = [ai_call("search_logs", {"query": f"q{n}"}, f"call_{n:04d}") for n in range(6)]
    model, chat = decider([*calls, final_citing_all], history_window=2)
    state = asyncio.run(arun(build(langchain_registry(log), model), steps=8, tools=6))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert len(state.observations) == 6 and len(log.calls) == 6
    last = chat.received[-1]
    assert _left_out(last) == 4
    assert _shown_turns(last) == [["call_0004"], ["call_0005"]]
    # The answer cites what the model was shown; every result stays in the record.
    assert state.final_answer is not None
    assert set(state.final_answer.citations) == {"call_0004", "call_0005"}


@pytest.mark.parametrize("window", [0, True, 2.5, "4"])
def test_a_window_set_after_the_decider_was_built_is_checked_as_at_build_time(
    window: Any,
) -> None:
    decider = _windowed(3)
    with pytest.raises(DeciderConfigError, match="history_window"):
        decider.history_window = window
    assert decider.history_window == 3
    decider.history_window = None
    assert _left_out(decider.messages(_turns([1] * 5))) is None
