"""MCP tools, loaded through langchain-mcp-adapters from a real MCP server, run as ToolSpecs.

The server (tests/adapters/mcp_server.py) is the ``mcp`` package's FastMCP over streamable HTTP
on 127.0.0.1, started for this module and stopped after it. Its tools read, write and fail; each
test runs them through the full compiled graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import BaseTool
from langchain_mcp_adapters.client import MultiServerMCPClient
from langgraph.types import Command

import fencepost as fp
from fencepost.adapters import aopen_checkpointer, tool_spec
from fencepost.adapters.scripted import ScriptedDecisionModel
from tests.adapters.fakes import (
    ai_call,
    ai_calls,
    arun,
    build,
    ctx,
    decider,
    final_citing_all,
    thread,
)
from tests.adapters.mcp_server import SECRET, NoteStore, running_mcp_server


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[tuple[str, NoteStore]]:
    store = NoteStore()
    with running_mcp_server(store) as url:
        yield url, store


@pytest.fixture
def store(mcp_server: tuple[str, NoteStore]) -> NoteStore:
    _, store = mcp_server
    store.notes = {"deploy-42": "rolled back at 10:02"}
    store.writes.clear()
    return store


async def mcp_tools(url: str) -> dict[str, BaseTool]:
    client = MultiServerMCPClient({"notes": {"transport": "streamable_http", "url": url}})
    return {t.name: t for t in await client.get_tools()}


async def mcp_registry(url: str) -> fp.ToolRegistry:
    tools = await mcp_tools(url)
    return fp.ToolRegistry(
        [
            tool_spec(
                tools["get_note"],
                effect=fp.Effect.READ,
                capability="notes:read",
                timeout_seconds=10,
            ),
            tool_spec(
                tools["put_note"],
                effect=fp.Effect.WRITE,
                capability="notes:write",
                timeout_seconds=10,
                # The server takes the tenant as an argument: the model must not choose it.
                inject={"tenant_id": lambda c: c.tenant_id},
            ),
            tool_spec(
                tools["explode"], effect=fp.Effect.READ, capability="notes:read", timeout_seconds=10
            ),
        ]
    )


def call(tool_name: str, n: int = 1, **arguments: Any) -> fp.ToolProposal:
    return fp.ToolProposal(call_id=f"call-mcp-{n:04d}", tool_name=tool_name, arguments=arguments)


def cite_last(inp: fp.DecisionInput) -> fp.FinalProposal:
    return fp.FinalProposal(
        answer=fp.AnswerPayload(text="see the note", citations=(inp.observations[-1].call_id,))
    )


CAPS = ("notes:read", "notes:write")


async def test_mcp_read_tool_runs_through_the_graph(
    mcp_server: tuple[str, NoteStore], store: NoteStore
) -> None:
    url, _ = mcp_server
    model = ScriptedDecisionModel([call("get_note", key="deploy-42"), cite_last])
    state = await arun(build(await mcp_registry(url), model), context=ctx(CAPS))

    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.observations[0].result == "rolled back at 10:02"
    assert state.final_answer is not None and state.final_answer.citations == ("call-mcp-0001",)


async def test_mcp_catalog_is_strict_and_hides_injected_properties(
    mcp_server: tuple[str, NoteStore],
) -> None:
    url, _ = mcp_server
    catalog = {e["name"]: e["parameters"] for e in (await mcp_registry(url)).model_catalog()}
    assert set(catalog) == {"get_note", "put_note", "explode"}
    assert set(catalog["put_note"]["properties"]) == {"key", "text"}
    assert all(p["additionalProperties"] is False for p in catalog.values())


async def test_mcp_write_waits_for_approval_then_runs_once_with_the_trusted_tenant(
    mcp_server: tuple[str, NoteStore], store: NoteStore
) -> None:
    url, _ = mcp_server
    model = ScriptedDecisionModel([call("put_note", key="k1", text="hello"), cite_last])
    graph = build(await mcp_registry(url), model, approval="interrupt")
    config = thread()
    context = ctx(CAPS)
    await graph.ainvoke(
        fp.start("note it", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=2)),
        config,
        context=context,
    )
    assert store.writes == []  # paused for a human before the write
    out = await graph.ainvoke(Command(resume="approve"), config, context=context)
    state = fp.run_output(out)

    assert state.termination is fp.TerminationReason.COMPLETED
    assert store.writes == [("k1", "acme")]
    assert store.notes["k1"] == "hello"
    assert [r.status for r in state.receipts] == [fp.ReceiptStatus.COMPLETED]


async def test_the_model_cannot_set_the_injected_tenant(
    mcp_server: tuple[str, NoteStore], store: NoteStore
) -> None:
    url, _ = mcp_server
    model = ScriptedDecisionModel([call("put_note", key="k", text="t", tenant_id="other")])
    state = await arun(
        build(await mcp_registry(url), model, approval="interrupt"), context=ctx(CAPS)
    )

    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert store.writes == []


async def test_mcp_tool_errors_become_safe_codes_and_their_text_is_kept_nowhere(
    mcp_server: tuple[str, NoteStore], store: NoteStore, tmp_path: Path
) -> None:
    url, _ = mcp_server
    model, chat = decider(
        [
            ai_call("explode", {"reason": "now"}, "call_mcp_fail_01"),
            ai_call("get_note", {"key": "missing"}, "call_mcp_fail_02"),
            "Nothing useful came back.",
        ]
    )
    async with aopen_checkpointer(f"sqlite:///{tmp_path / 'runs.db'}") as saver:
        state = await arun(
            build(await mcp_registry(url), model, checkpointer=saver), context=ctx(CAPS)
        )

    assert [o.error_code for o in state.observations] == [fp.ErrorCode.INTERNAL_ERROR] * 2
    assert state.termination is fp.TerminationReason.COMPLETED
    needle = "hunter2"
    assert needle in SECRET
    assert needle not in state.model_dump_json()
    assert all(needle not in str(m.content) for batch in chat.received for m in batch)
    for path in tmp_path.iterdir():
        assert needle.encode() not in path.read_bytes()


async def test_a_batch_of_mcp_calls_is_joined_by_call_id(
    mcp_server: tuple[str, NoteStore], store: NoteStore
) -> None:
    url, _ = mcp_server
    store.notes["deploy-43"] = "fine"
    model, _ = decider(
        [
            ai_calls(
                ("get_note", {"key": "deploy-42"}, "call_mcp_b_0001"),
                ("get_note", {"key": "deploy-43"}, "call_mcp_b_0002"),
            ),
            final_citing_all,
        ]
    )
    state = await arun(build(await mcp_registry(url), model), context=ctx(CAPS))

    assert state.termination is fp.TerminationReason.COMPLETED
    by_id = {o.call_id: o.result for o in state.observations}
    assert by_id == {"call_mcp_b_0001": "rolled back at 10:02", "call_mcp_b_0002": "fine"}


async def test_an_unreachable_mcp_server_is_a_safe_code_not_a_crash(store: NoteStore) -> None:
    with running_mcp_server(NoteStore()) as url:
        registry = await mcp_registry(url)
    # The server is gone now: the call fails at the transport.
    model = ScriptedDecisionModel([call("get_note", key="deploy-42"), cite_last])
    state = await arun(build(registry, model), context=ctx(CAPS))

    assert state.observations[0].kind == "tool_error"
    assert state.observations[0].error_code is fp.ErrorCode.UNAVAILABLE
    assert state.observations[0].retryable is True
    assert state.termination is not None
