"""Invariant 2 in the middleware binding: a tool the registry does not hold never runs, even
when LangChain's agent has it."""

from __future__ import annotations

import logging

import pytest

import fencepost as fp
from tests.middleware.kit import Ran, agent, ask, budget, call, chat, ctx, lc_tools, specs, thread


def test_a_tool_missing_from_the_registry_never_runs_and_the_run_ends_invalid_proposal() -> None:
    ran = Ran()
    tools = lc_tools(ran)
    # The agent has both tools; fencepost's registry only the read one.
    mw = fp.FencepostMiddleware(specs(tools[:1]), budget=budget())
    model = chat(iter([call("write_note", {"note": "rollback"}, 1)]))
    out = agent(model, tools, [mw]).invoke(ask(), thread(), context=ctx())
    assert ran.bodies == []
    assert out["termination"] == fp.TerminationReason.INVALID_PROPOSAL.value
    assert out["last_error_code"] == "unknown_tool"
    assert '"error_code": "unknown_tool"' in out["messages"][-1].content


def test_the_refusal_is_logged_on_the_gate_logger_with_its_call_id_and_code(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran = Ran()
    tools = lc_tools(ran)
    mw = fp.FencepostMiddleware(specs(tools[:1]), budget=budget())
    model = chat(iter([call("write_note", {"note": "rollback"}, 1)]))
    with caplog.at_level(logging.INFO, logger="fencepost.gate"):
        agent(model, tools, [mw]).invoke(ask(), thread(), context=ctx())
    [record] = [r for r in caplog.records if r.name == "fencepost.gate"]
    assert (record.call_id, record.code) == ("call-0001", "unknown_tool")  # type: ignore[attr-defined]
