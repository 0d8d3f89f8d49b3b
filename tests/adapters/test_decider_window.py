"""``ChatModelDecider(history_window=k)``: a long run shows the model its latest ``k`` tool turns,
whole, after a data notice counting the results left out; the run's record keeps them all. A
step costs the window, not the run; a window that is no usable positive integer is a config error
naming the field; a record a caller rewrote is still shown as whole turns with an honest count."""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
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


# -- the cost of a long run, and configuration -------------------------------------------------


def _input(observations: tuple[Observation, ...], proposals: tuple[Any, ...]) -> fp.DecisionInput:
    """The next step's input with records as a caller may have rewritten them."""
    return decision_input(observations, {"query": "q"}).model_copy(update={"proposals": proposals})


def test_a_windowed_decider_holds_its_window_not_the_run() -> None:
    # A window of k needs only the latest k turns: a cache keeping every turn ever rendered
    # (about 2 KB an observation: 200 MB at 100k observations, per run) and copying them at
    # every step would make a step cost O(run), where the window promises O(k).
    run = _turns([1] * 4000)
    inputs = [_cut(run, end) for end in (3000, 3500, 4000)]
    decider = _windowed(4)
    gc.collect()
    tracemalloc.start()
    try:
        for inp in inputs:  # the run goes on in this process
            shown = decider.messages(inp)
        del shown
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 200_000, f"{held} bytes held for a window of 4 turns"
    # ...and what it shows is still the window, with the right count of the rest.
    shown = decider.messages(inputs[-1])
    assert _shown_turns(shown) == _expected_turns([1] * 4000, 4)
    assert _left_out(shown) == 3996


def test_a_window_widened_after_use_shows_what_a_fresh_decider_shows() -> None:
    # The decider's fields are reassignable (the system prompt is); a kept window's turns
    # must not stand in for a wider one.
    batches = [1, 2, 1, 3, 1, 2, 1]
    run = _turns(batches)
    decider = _windowed(2)
    decider.messages(_cut(run, len(run.observations) - 1))
    decider.history_window = 5
    warm = decider.messages(run)
    fresh = _windowed(5).messages(run)
    assert _shown_turns(warm) == _shown_turns(fresh) == _expected_turns(batches, 5)
    assert _left_out(warm) == _left_out(fresh)
    decider.history_window = None
    whole = decider.messages(run)
    assert _shown_turns(whole) == _expected_turns(batches, None)
    assert _left_out(whole) is None


class _LoudStr(str):
    def __repr__(self) -> str:
        raise RuntimeError("a repr that raises")


@pytest.mark.parametrize(
    "window",
    [-(10**5000), _LoudStr("4")],
    ids=["int-too-long-to-print", "str-subclass-whose-repr-raises"],
)
def test_any_unusable_window_is_a_config_error_naming_the_field(window: Any) -> None:
    # The error never prints the value: an int past Python's 4,300-digit limit cannot be
    # printed, and a str subclass's repr may raise an error of its own.
    with pytest.raises(DeciderConfigError, match="history_window"):
        ChatModelDecider(idle_decider().chat_model, history_window=window)


def test_an_absurdly_large_window_shows_the_whole_run_without_a_notice() -> None:
    run = _turns([1, 2, 3])
    for window in (2**63, 10**5000):
        shown = _windowed(window).messages(run)
        assert _left_out(shown) is None
        assert _shown_turns(shown) == _expected_turns([1, 2, 3], None)


# -- a caller rewriting the record -------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    steps=st.lists(st.integers(min_value=0, max_value=6), min_size=0, max_size=30),
    ids=st.lists(st.integers(min_value=0, max_value=5), min_size=30, max_size=30),
    drop=st.integers(min_value=0, max_value=30),
    window=st.integers(min_value=1, max_value=6),
    grown_by=st.integers(min_value=1, max_value=7),
)
def test_a_rewritten_record_is_still_shown_as_whole_turns_with_an_honest_count(
    steps: list[int], ids: list[int], drop: int, window: int, grown_by: int
) -> None:
    # Steps out of order and interleaved, call ids repeated, proposals missing or misaligned:
    # every tool message still follows the call it answers, no more than `window` turns are
    # shown, and the notice counts exactly the results not shown (never negative, never more).
    observations = tuple(
        Observation(
            sequence=n,
            step=step,
            call_id=f"call_{ids[n]:010d}",
            tool_name="search_logs",
            kind="tool_result" if n % 3 else "tool_error",
            result={"n": n} if n % 3 else None,
            error_code=None if n % 3 else "internal_error",
        )
        for n, step in enumerate(steps)
    )
    proposals = tuple(
        fp.ToolProposal(call_id=o.call_id, tool_name=o.tool_name, arguments={"query": "q"})
        for o in observations
    )[drop:]
    decider = _windowed(window)
    for end in range(0, len(observations), grown_by):
        decider.messages(_input(observations[:end], proposals[: max(0, end - drop)]))
    for shown in (
        decider.messages(_input(observations, proposals)),
        _windowed(window).messages(_input(observations, proposals)),
    ):
        turns = _shown_turns(shown)
        assert len(turns) <= window
        left_out = _left_out(shown)
        assert left_out is None or 0 < left_out <= len(observations)
        assert (left_out or 0) + sum(len(t) for t in turns) == len(observations)
