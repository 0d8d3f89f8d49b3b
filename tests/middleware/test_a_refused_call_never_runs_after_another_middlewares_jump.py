"""Invariant 2 in the middleware binding: denial is enforced where the tool runs, so a call the
gate refused never runs, even when another middleware jumps to the tools node."""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents.middleware import AgentMiddleware, hook_config

import fencepost as fp
from tests.middleware.kit import (
    Ran,
    agent,
    ask,
    budget,
    call,
    chat,
    ctx,
    lc_tools,
    specs,
    then_answer,
    thread,
)


class JumpToTools(AgentMiddleware):  # type: ignore[type-arg]
    """Another team's middleware that sends every tool call to the tools node."""

    @hook_config(can_jump_to=["tools"])
    def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        last = state["messages"][-1]
        return {"jump_to": "tools"} if getattr(last, "tool_calls", None) else None


@pytest.mark.parametrize("fencepost_last", [True, False])
def test_a_call_the_gate_refuses_never_runs_when_another_middleware_jumps_to_tools(
    fencepost_last: bool,
) -> None:
    ran = Ran()
    tools = lc_tools(ran)
    mw = fp.FencepostMiddleware(specs(tools), budget=budget())
    order = [JumpToTools(), mw] if fencepost_last else [mw, JumpToTools()]
    # The principal may read logs only: the write is refused (capability_denied).
    model = chat(then_answer(call("write_note", {"note": "rollback"}, 1)))
    out = agent(model, tools, order).invoke(ask(), thread(), context=ctx("logs:read"))
    assert ran.bodies == []
    tool_messages = [m.content for m in out["messages"] if m.type == "tool"]
    if fencepost_last:
        # fencepost's after_model runs first (after_model hooks run in reverse list order):
        # the gate refuses the write and ends the run before the jump is asked for.
        assert out["termination"] == fp.TerminationReason.POLICY_DENIED.value
        assert tool_messages == ['{"error_code": "capability_denied"}']
    else:
        # The jump skips fencepost's gate: no verdict allows the call, so the executor's
        # check refuses it; the model is told, and answers.
        assert tool_messages == ['{"error_code": "permission_denied"}']
        assert out["termination"] == fp.TerminationReason.COMPLETED.value
