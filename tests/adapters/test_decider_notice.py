"""The chat-model adapter tells the model, as a data block, what the loop decided about its last
turn: a refused proposal's problems, accepted tasks still pending, the final turn."""

from __future__ import annotations

import json

from langchain_core.messages import HumanMessage

import fencepost as fp
from fencepost.adapters import ChatModelDecider
from tests.adapters.fakes import fake_model


def _input(**kw: object) -> fp.DecisionInput:
    return fp.DecisionInput(
        run_id="run-1",
        question="q",
        observations=(),
        catalog=(),
        budget=fp.RuntimeBudget(steps_remaining=1, tool_calls_remaining=1),
        step=1,
        **kw,  # type: ignore[arg-type]
    )


def _notice(decider: ChatModelDecider, inp: fp.DecisionInput) -> dict[str, object] | None:
    last = decider.messages(inp)[-1]
    if not isinstance(last, HumanMessage) or "fencepost_notice" not in str(last.content):
        return None
    text = str(last.content)
    return json.loads(text[text.index("{") : text.rindex("}") + 1])["fencepost_notice"]


def test_nothing_is_added_when_the_loop_has_nothing_to_say() -> None:
    decider = ChatModelDecider(fake_model([]))
    assert _notice(decider, _input()) is None


def test_refusals_pending_tasks_and_the_final_turn_are_shown_as_data() -> None:
    decider = ChatModelDecider(fake_model([]))
    notice = _notice(
        decider,
        _input(
            repair=("call-0001: schema_violation: query: missing",),
            pending_tasks=("task-17",),
            final_turn=True,
        ),
    )
    assert notice == {
        "refused_last_proposal": ["call-0001: schema_violation: query: missing"],
        "pending_tasks": ["task-17"],
        "final_turn": True,
    }
