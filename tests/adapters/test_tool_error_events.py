"""A wrapped LangChain tool's failure reaches callbacks and events as a safe code, never its text.

LangChain hands whatever a tool raised to every callback (``on_tool_error``) before the caller
sees it: tracers and ``astream_events`` consumers would all get the tool's message.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import traceback
from typing import Any

import pytest
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import BaseTool, ToolException, tool
from pydantic import BaseModel, field_validator

import fencepost as fp
from fencepost.adapters import tool_spec
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.graph.containment.tools import ToolRun, run_tool
from tests.adapters.fakes import SECRET, build, ctx, thread

READ: dict[str, Any] = {"effect": fp.Effect.READ, "capability": "logs:read", "timeout_seconds": 5}
TOOL_CTX = fp.ToolContext(
    run_id="run-1", tenant_id="acme", principal_id="u-1", deadline=fp.Deadline.after(60)
)


@tool
def sync_tool_exception(query: str) -> str:
    """Fails with a ToolException."""
    raise ToolException(f"{query}: {SECRET}")


@tool
async def async_value_error(query: str) -> str:
    """Fails with a ValueError."""
    raise ValueError(f"{query}: {SECRET}")


@tool
def sync_runtime_error(query: str) -> str:
    """Fails with a RuntimeError chained to another one."""
    try:
        raise KeyError(SECRET)
    except KeyError as inner:
        raise RuntimeError(SECRET) from inner


@tool
async def async_system_exit(query: str) -> str:
    """Exits, as argparse does on bad input."""
    raise SystemExit(SECRET)


FAILING = [
    (sync_tool_exception, fp.ErrorCode.INTERNAL_ERROR),
    (async_value_error, fp.ErrorCode.INVALID_ARGUMENT),
    (sync_runtime_error, fp.ErrorCode.INTERNAL_ERROR),
    (async_system_exit, fp.ErrorCode.INTERNAL_ERROR),
]


def leaks(events: list[dict[str, Any]]) -> list[str]:
    """Every place the secret shows up: the events, and the text of any error they carry."""
    found = [e["event"] for e in events if "hunter2" in repr(e)]
    for event in events:
        error = event.get("data", {}).get("error")
        if isinstance(error, BaseException):
            text = "".join(traceback.format_exception(error))
            if "hunter2" in text or error.__context__ is not None or error.__cause__ is not None:
                found.append(f"{event['event']} error text/chain")
    return found


async def tool_events(spec: fp.ToolSpec, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of one run_tool call made inside a traced runnable (as a graph node is)."""

    async def call(_: Any) -> ToolRun:
        args = spec.args_model.model_validate(arguments)
        return await run_tool(spec, args, TOOL_CTX, timeout_seconds=5)

    return [dict(e) async for e in RunnableLambda(call).astream_events(None, version="v2")]


@pytest.mark.parametrize(("failing", "code"), FAILING, ids=[t.name for t, _ in FAILING])
async def test_a_failing_tool_reaches_astream_events_of_the_graph_without_its_text(
    failing: BaseTool, code: fp.ErrorCode
) -> None:
    spec = tool_spec(failing, **READ)
    model = ScriptedDecisionModel(
        [
            fp.ToolProposal(call_id="call-000001", tool_name=spec.name, arguments={"query": "q"}),
            lambda _: fp.FinalProposal(answer=fp.AnswerPayload(text="done")),
        ]
    )
    graph = build(fp.ToolRegistry([spec]), model)
    budget = fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=2)
    events = [
        e
        async for e in graph.astream_events(
            fp.start("q", budget), thread(), context=ctx(), version="v2"
        )
    ]
    tool_events = [e for e in events if e["event"].startswith("on_tool")]
    assert [e["event"] for e in tool_events] == ["on_tool_start", "on_tool_error"]
    error = tool_events[-1]["data"]["error"]
    assert isinstance(error, fp.ToolError) and error.code is code
    assert str(error) == code.value
    assert leaks(events) == []


async def test_a_tool_that_succeeds_keeps_its_start_and_end_events() -> None:
    @tool
    async def search(query: str) -> dict[str, str]:
        """Search."""
        return {"hit": query}

    events = await tool_events(tool_spec(search, **READ), {"query": "q"})
    tool_evts = [e for e in events if e["event"].startswith("on_tool")]
    assert [e["event"] for e in tool_evts] == ["on_tool_start", "on_tool_end"]
    assert tool_evts[-1]["data"]["output"] == {"hit": "q"}


async def test_a_base_tool_subclass_fails_without_its_text() -> None:
    class Legacy(BaseTool):
        name: str = "legacy"
        description: str = "A BaseTool with only _run."

        def _run(self, query: str) -> str:
            raise PermissionError(SECRET)

    spec = tool_spec(Legacy(), **READ)
    events = await tool_events(spec, {"query": "q"})
    assert [e["event"] for e in events if e["event"].startswith("on_tool")] == [
        "on_tool_start",
        "on_tool_error",
    ]
    assert leaks(events) == []


async def test_the_tools_own_argument_validation_fails_without_its_text() -> None:
    class Query(BaseModel):
        query: str

        @field_validator("query")
        @classmethod
        def _no_bad_words(cls, value: str) -> str:
            raise ValueError(f"rejected {value!r}: {SECRET}")

    @tool(args_schema=Query)
    def picky(query: str) -> str:
        """Validates its own input."""
        return query

    # The strict model fencepost builds from the schema lets it through; LangChain's does not.
    events = await tool_events(tool_spec(picky, **READ), {"query": "q"})
    errors = [e["data"]["error"] for e in events if e["event"] == "on_tool_error"]
    assert [type(e) for e in errors] == [fp.ToolError]
    assert errors[0].code is fp.ErrorCode.INVALID_ARGUMENT
    assert leaks(events) == []


async def test_the_callers_tool_object_is_left_as_it_was() -> None:
    spec = tool_spec(async_value_error, **READ)
    result = await run_tool(
        spec, spec.args_model.model_validate({"query": "q"}), TOOL_CTX, timeout_seconds=5
    )
    assert result == ToolRun(error=fp.ErrorCode.INVALID_ARGUMENT)
    with pytest.raises(ValueError, match="hunter2"):
        await async_value_error.ainvoke({"query": "q"})


async def test_a_sync_only_tool_runs_on_the_runtimes_thread_pool_not_the_loops_executor() -> None:
    seen: list[str] = []

    @tool
    def where(query: str) -> str:
        """Reports its thread."""
        seen.append(threading.current_thread().name)
        return query

    @tool
    async def awhere(query: str) -> str:
        """Reports its thread."""
        seen.append(threading.current_thread().name)
        return query

    sync_spec, async_spec = tool_spec(where, **READ), tool_spec(awhere, **READ)
    assert not inspect.iscoroutinefunction(sync_spec.execute)
    assert inspect.iscoroutinefunction(async_spec.execute)
    for spec in (sync_spec, async_spec):
        args = spec.args_model.model_validate({"query": "q"})
        assert await run_tool(spec, args, TOOL_CTX, timeout_seconds=5) == ToolRun(value="q")
    assert seen == ["fencepost-tool", threading.current_thread().name]
    await asyncio.sleep(0)
