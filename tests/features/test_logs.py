"""Logs for developers: what raised, with its traceback, once, on the ``fencepost`` loggers.

A tool, a decision model, a semantic validator, an arguments validator or a progress predicate
that raises is logged once at WARNING with ``exc_info``, the run id, the call id and the safe
code its failure became; refusals, approvals, retries and how a run ended at INFO. Silent until
the application configures logging. (That the text reaches nothing else is invariant 6's:
``tests/invariants/test_6_tool_output_is_untrusted_data.py``.)
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool as lc_tool
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict, field_validator

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from tests.adapters.fakes import FakeToolChatModel, RateLimitError, ai_call
from tests.graph.kit import (
    ABSTAIN,
    budget,
    call,
    context,
    final_citing_last,
    harness,
    thread,
)
from tests.telemetry_kit import assert_only_in_one_traceback, traceback_of

ROOT = Path(__file__).resolve().parents[2]
CANARY = "canary-3f9c1e hunter2"

ORDERS = {"A-1001": {"status": "shipped"}}


@fp.tool(effect="read", capability="logs:read")
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"status": ORDERS[order_id]["satus"]}  # the typo a new user makes


def _graph(tools: list[fp.ToolSpec], script: list[Any], **build: Any) -> Any:
    from langgraph.checkpoint.memory import InMemorySaver

    registry = fp.ToolRegistry(tools)
    return fp.build_agent_graph(registry, ScriptedDecisionModel(script), **build).compile(
        checkpointer=InMemorySaver()
    )


def _run(graph: Any) -> fp.AgentState:
    return fp.run_output(graph.invoke(fp.start("q", budget()), thread(), context=context()))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.fixture(autouse=True)
def _everything(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="fencepost")


# -- what raised: once, at WARNING, with its traceback and where it happened ---------------------


def test_a_tool_with_a_typo_is_logged_once_with_its_traceback_run_id_call_id_and_code(
    caplog: pytest.LogCaptureFixture,
) -> None:
    order = fp.ToolProposal(
        call_id="call-0001", tool_name="lookup_order", arguments={"order_id": "A-1001"}
    )
    state = _run(_graph([lookup_order], [order, ABSTAIN]))
    assert state.receipts[0].error_code is fp.ErrorCode.NOT_FOUND

    (record,) = _warnings(caplog)
    assert record.name == "fencepost.tools"
    assert record.exc_info is not None and record.exc_info[0] is KeyError
    assert "'satus'" in traceback_of(record) and 'ORDERS[order_id]["satus"]' in traceback_of(record)
    assert (record.run_id, record.call_id, record.code) == (  # type: ignore[attr-defined]
        state.run_id,
        "call-0001",
        "not_found",
    )
    assert record.getMessage() == (
        f"tool 'lookup_order' raised KeyError (run {state.run_id}, call call-0001): "
        "recorded as not_found"
    )


@fp.tool(effect="read", capability="logs:read")
async def async_lookup(order_id: str) -> dict[str, Any]:
    """Look an order up, asynchronously."""
    raise ConnectionError(CANARY)


@lc_tool
def lc_lookup(order_id: str) -> str:
    """Look an order up (a LangChain tool)."""
    raise ValueError(CANARY)


@pytest.mark.parametrize("kind", ["async def", "LangChain tool"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_an_async_or_langchain_tool_that_raises_is_logged_once_under_its_run_and_call(
    caplog: pytest.LogCaptureFixture, kind: str, mode: str
) -> None:
    import asyncio

    tool = (
        async_lookup
        if kind == "async def"
        else fp.tool(lc_lookup, effect="read", capability="logs:read", name="lc_lookup")
    )
    proposal = fp.ToolProposal(
        call_id="call-0001", tool_name=tool.name, arguments={"order_id": "A-1001"}
    )
    graph = _graph([tool], [proposal, ABSTAIN])
    inp, config = fp.start("q", budget()), thread()
    out = (
        graph.invoke(inp, config, context=context())
        if mode == "invoke"
        else asyncio.run(graph.ainvoke(inp, config, context=context()))
    )
    state = fp.run_output(out)
    record = assert_only_in_one_traceback(caplog.records, CANARY, "fencepost.tools")
    assert (record.run_id, record.call_id) == (state.run_id, "call-0001")  # type: ignore[attr-defined]
    assert record.code == state.receipts[0].error_code.value  # type: ignore[attr-defined, union-attr]
    assert len(_warnings(caplog)) == 1


def test_a_tool_error_is_the_tools_own_report_and_no_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @fp.tool(effect="read", capability="logs:read")
    def gone(order_id: str) -> dict[str, Any]:
        """Look an order up."""
        raise fp.ToolError(fp.ErrorCode.NOT_FOUND)

    proposal = fp.ToolProposal(call_id="call-0001", tool_name="gone", arguments={"order_id": "x"})
    state = _run(_graph([gone], [proposal, ABSTAIN]))
    assert state.receipts[0].error_code is fp.ErrorCode.NOT_FOUND
    assert _warnings(caplog) == []
    reported = [r for r in caplog.records if r.name == "fencepost.tools"]
    assert [(r.levelname, r.code) for r in reported] == [  # type: ignore[attr-defined]
        ("DEBUG", "not_found"),  # raised by the body
        ("INFO", "not_found"),  # how the call ended
    ]


def test_a_decision_model_that_raises_is_logged_once_per_step_on_fencepost_model(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def provider_down(inp: fp.DecisionInput) -> Any:
        raise RuntimeError(CANARY)

    state = _run(_graph([lookup_order], [provider_down], model_retries=0))
    assert state.termination is fp.TerminationReason.FAILED
    record = assert_only_in_one_traceback(caplog.records, CANARY, "fencepost.model")
    assert (record.run_id, record.call_id, record.code) == (  # type: ignore[attr-defined]
        state.run_id,
        None,
        "internal_error",
    )


class StrictOrder(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    order_id: str

    @field_validator("order_id")
    @classmethod
    def known(cls, value: str) -> str:
        return {"A-1001": value}[value + CANARY]  # a KeyError pydantic does not wrap


class OrderArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    order_id: str


def _order_tool(args_model: type[BaseModel] = OrderArgs, **hooks: Any) -> fp.ToolSpec:
    return fp.ToolSpec(
        name="order",
        description="Look an order up.",
        args_model=args_model,
        effect=fp.Effect.READ,
        capability="logs:read",
        execute=lambda args, ctx: {"status": "shipped"},
        **hooks,
    )


def _broken(*_: Any) -> Any:
    raise RuntimeError(CANARY)


@pytest.mark.parametrize(
    ("hook", "code"),
    [
        ("args validator", "args_validator_failed"),
        ("semantic validator", "validator_failed"),
        ("progress predicate", "no_progress"),
    ],
)
def test_a_validator_or_predicate_that_raises_is_logged_once_on_fencepost_gate(
    caplog: pytest.LogCaptureFixture, hook: str, code: str
) -> None:
    spec = {
        "args validator": lambda: _order_tool(StrictOrder),
        "semantic validator": lambda: _order_tool(semantic_validator=_broken),
        "progress predicate": lambda: _order_tool(progress_predicate=_broken),
    }[hook]()
    same = {"order_id": "A-1001"}
    script = [
        fp.ToolProposal(call_id=f"call-000{n}", tool_name="order", arguments=same)
        for n in (1, 2, 3)
    ]
    # No repair: the refused first call ends the run, so the hook raises once.
    state = _run(_graph([spec], [*script, ABSTAIN], repeat_limit=1, repair_attempts=0))
    assert state.is_terminal
    record = assert_only_in_one_traceback(caplog.records, CANARY, "fencepost.gate")
    # The predicate is asked about the first repeat (the call past the repeat limit).
    call_id = "call-0002" if hook == "progress predicate" else "call-0001"
    assert (record.run_id, record.call_id, record.code) == (state.run_id, call_id, code)  # type: ignore[attr-defined]


# -- what the loop decided: INFO ------------------------------------------------------------------


def _info(caplog: pytest.LogCaptureFixture, logger: str) -> list[tuple[str | None, str | None]]:
    return [
        (r.call_id, r.code)  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == logger and r.levelno == logging.INFO
    ]


def test_refusals_and_how_a_run_ended_are_logged_at_info_and_a_clean_run_warns_of_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = harness([call("search_logs", 1), call("admin_reset", 2)]).run()
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert _warnings(caplog) == []
    assert _info(caplog, "fencepost.gate") == [("call-0002", "capability_denied")]
    assert _info(caplog, "fencepost.run") == [(None, "capability_denied")]
    (ended,) = [r for r in caplog.records if r.name == "fencepost.run"]
    assert ended.getMessage() == f"run {state.run_id} ended policy_denied (capability_denied)"


def test_a_call_the_budget_cannot_cover_is_logged_as_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    batch = fp.ToolBatch(calls=(call("search_logs", 1), call("search_logs", 2)))
    state = harness([batch, final_citing_last]).run(tools=1)
    assert state.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert _info(caplog, "fencepost.gate") == [("call-0002", "budget_exhausted")]
    assert _info(caplog, "fencepost.run") == [(None, "tool_calls_exhausted")]


def test_approvals_asked_and_answered_are_logged_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = harness([call("write_note", 1, note="hi"), final_citing_last], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    assert _info(caplog, "fencepost.approval") == [("call-0001", "approval_pending")]
    h.graph.invoke(Command(resume="reject"), config, context=ctx)
    assert _info(caplog, "fencepost.approval") == [
        ("call-0001", "approval_pending"),
        ("call-0001", "rejected"),
    ]
    assert ("call-0001", "rejected") in _info(caplog, "fencepost.gate")


def test_a_model_step_that_failed_and_is_retried_is_logged_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    model = FakeToolChatModel(
        messages=iter(
            [
                RateLimitError("slow down"),
                ai_call("final_answer", {"text": "nothing found", "citations": []}, "call-0009"),
            ]
        )
    )
    graph = fp.create_agent(model, [lookup_order], checkpointer=InMemorySaver())
    state = fp.run_output(graph.invoke(fp.start("q"), thread(), context=context()))
    assert state.termination is fp.TerminationReason.COMPLETED
    retried = [
        r for r in caplog.records if r.name == "fencepost.model" and r.levelno == logging.INFO
    ]
    assert [r.getMessage() for r in retried] == [
        f"run {state.run_id} step 1: the decision model failed with rate_limited; asking it again"
    ]


# -- silent until configured ----------------------------------------------------------------------

_SCRIPT = """
import logging, sys
{configure}
import fencepost as fp
from tests.features.test_logs import lookup_order, _graph, _run
from tests.graph.kit import ABSTAIN, budget, context, thread
order = fp.ToolProposal(call_id="call-0001", tool_name="lookup_order", arguments={{"order_id": "A-1001"}})
graph = _graph([lookup_order], [order, ABSTAIN])
out = graph.invoke(fp.start("q", budget()), thread(), context=context())
print(fp.run_output(out).termination.value)
"""


@pytest.mark.parametrize("configured", [False, True], ids=["not configured", "basicConfig"])
def test_nothing_is_printed_until_the_application_configures_logging(configured: bool) -> None:
    configure = "logging.basicConfig(level=logging.INFO)" if configured else ""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT.format(configure=configure))],
        cwd=ROOT,
        env={**os.environ, "LANGGRAPH_STRICT_MSGPACK": "true"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "insufficient_evidence"
    if not configured:
        assert done.stderr == ""
    else:
        assert "WARNING:fencepost.tools:tool 'lookup_order' raised KeyError" in done.stderr
        assert "Traceback (most recent call last)" in done.stderr
        assert "KeyError: 'satus'" in done.stderr
        assert "INFO:fencepost.run:run " in done.stderr
