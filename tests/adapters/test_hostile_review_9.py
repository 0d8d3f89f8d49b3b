"""Hostile review of e0f752d and 4224b3a: ``ChatModelDecider(history_window=k)``.

Seats: a caller rewriting the record, another tenant sharing the decider, and the process
itself (a run of 100k observations, absurd configuration values). What each test pins is the
rule in its name; the module docstring of ``test_decider_window`` states the feature.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage

import fencepost as fp
from fencepost.policy.observation import Observation
from tests.adapters.fakes import (
    ToolLog,
    ai_call,
    arun,
    build,
    decider,
    decision_input,
    final_citing_all,
    langchain_registry,
)


def _input(observations: tuple[Observation, ...], proposals: tuple[Any, ...]) -> fp.DecisionInput:
    """The next step's input with records as a caller may have rewritten them."""
    return decision_input(observations, {"query": "q"}).model_copy(update={"proposals": proposals})


# -- the process: what a long windowed run costs ---------------------------------------------


# -- the process: configuration --------------------------------------------------------------


class _LoudStr(str):
    def __repr__(self) -> str:
        raise RuntimeError("a repr that raises")


# -- a caller rewriting the record -----------------------------------------------------------


# -- another tenant's integration editing messages in place ----------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="pre-existing (911f3d6, a4c7b6b): the rendered-turn cache hands the chat model the "
    "same message objects at every step of a run; copying them each step costs O(shown) "
    "per step, a trade-off for the maintainers, not a review fix",
)
@pytest.mark.parametrize("window", [None, 3])
def test_an_in_place_edit_of_a_shown_message_does_not_reach_the_runs_next_step(
    window: int | None,
) -> None:
    # An integration or callback that marks the last message it is handed (a prompt-caching
    # breakpoint, as Anthropic-style caching does) in place: the next step is shown that mark
    # again on a message that is no longer last, and the marks pile up step after step
    # (Anthropic refuses more than 4). A run resumed in a fresh process is shown none.
    marked: list[int] = []

    def step(n: int) -> Any:
        def reply(messages: list[BaseMessage]) -> AIMessage:
            marked.append(sum("cache_control" in m.additional_kwargs for m in messages))
            messages[-1].additional_kwargs["cache_control"] = {"type": "ephemeral"}
            if n < 6:
                return ai_call("search_logs", {"query": f"q{n}"}, f"call_{n:04d}")
            return final_citing_all(messages)

        return reply

    model, _ = decider([step(n) for n in range(7)], history_window=window)
    state = asyncio.run(arun(build(langchain_registry(ToolLog()), model), steps=8, tools=6))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert marked == [0] * 7
