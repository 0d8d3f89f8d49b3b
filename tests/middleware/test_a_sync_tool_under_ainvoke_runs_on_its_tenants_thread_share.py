"""DESIGN, "Isolation: runs, tenants, callers", in the middleware binding under ``ainvoke``: a
sync LangChain tool runs on a fencepost thread of its tenant's share (never on the event loop's
default executor, where create_agent's async tool handler would send it), held to its deadline
and left behind past it, and a share with no thread for it fails the call ``unavailable``
without running it; the run goes on, and nothing the tool does leaves ``ainvoke`` but the
caller's own cancellation."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, tool
from pydantic import Field

import fencepost as fp
from fencepost.graph.containment import tool_threads
from fencepost.graph.containment import tools as tool_runner
from tests.graph.kit import OnTimeThreads
from tests.middleware.kit import agent, ask, budget, call, chat, ctx, then_answer, thread


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Held by tool bodies that must outlive their deadline; set when the test ends."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def small_pool(monkeypatch: pytest.MonkeyPatch) -> tool_threads.ToolThreads:
    """Two threads that may grow to four, all of them one tenant's; bodies start before their
    callers wait for them, whatever the machine's load (``OnTimeThreads``)."""
    pool = OnTimeThreads(base=2, cap=4, tenant_cap=4)
    monkeypatch.setattr(tool_runner, "_threads", pool)
    return pool


def _run(search: BaseTool, *, timeout: float = 30) -> dict[str, Any]:
    spec = fp.tool(search, effect="read", capability="logs:read", timeout_seconds=timeout)
    guard = fp.FencepostMiddleware([spec], budget=budget())
    graph = agent(chat(then_answer(call("search_logs", {"query": "q"}, 1))), [search], [guard])
    out: dict[str, Any] = asyncio.run(graph.ainvoke(ask(), thread(), context=ctx()))
    return out


def _answers(out: dict[str, Any]) -> list[Any]:
    return [json.loads(str(m.content)) for m in out["messages"] if isinstance(m, ToolMessage)]


def test_a_sync_tool_in_an_async_middleware_run_runs_on_its_tenants_thread_share() -> None:
    ran_on: list[str] = []

    @tool
    def search_logs(query: str) -> str:
        """Search the service logs."""
        ran_on.append(threading.current_thread().name)
        return f"found {query}"

    out = _run(search_logs)
    assert out["termination"] == "completed"
    assert ran_on == ["fencepost-tool"]
    shown = [str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)]
    assert shown == ["found q"]


def test_a_hung_sync_tool_under_ainvoke_is_left_behind_on_its_share_at_its_deadline(
    small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    @tool
    def search_logs(query: str) -> str:
        """Search the service logs."""
        release.wait(60)  # a blocking client that ignores its deadline
        return "late"

    out = _run(search_logs, timeout=0.2)
    assert out["termination"] == "completed"
    assert _answers(out) == [{"error_code": "timeout"}]
    # Its thread is its tenant's, counted as left behind: no longer a healthy one.
    assert small_pool.tenants() == {"acme": (1, 1)}
    release.set()


def test_a_sync_tool_whose_share_has_no_thread_never_runs_and_is_unavailable(
    small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    ran: list[str] = []

    @tool
    def search_logs(query: str) -> str:
        """Search the service logs."""
        ran.append(query)
        release.wait(60)
        return "late"

    for _ in range(4):  # four bodies left behind: the tenant's whole share
        assert _answers(_run(search_logs, timeout=0.2)) == [{"error_code": "timeout"}]
    assert small_pool.stats() == (4, 4)
    out = _run(search_logs, timeout=30)
    assert out["termination"] == "completed"
    assert _answers(out) == [{"error_code": "unavailable"}]
    assert ran == ["q"] * 4
    release.set()


async def test_cancelling_an_async_run_while_its_sync_tool_runs_leaves_the_tool_behind(
    small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    started = threading.Event()

    @tool
    def search_logs(query: str) -> str:
        """Search the service logs."""
        started.set()
        release.wait(60)
        return "late"

    spec = fp.tool(search_logs, effect="read", capability="logs:read")
    guard = fp.FencepostMiddleware([spec], budget=budget())
    graph = agent(chat(then_answer(call("search_logs", {"query": "q"}, 1))), [search_logs], [guard])
    running = asyncio.ensure_future(graph.ainvoke(ask(), thread(), context=ctx()))
    while not started.is_set():
        await asyncio.sleep(0.01)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert small_pool.stats() == (1, 1)
    release.set()


def test_the_callers_sync_tool_is_left_as_it_was() -> None:
    @tool
    def search_logs(query: str) -> str:
        """Search the service logs."""
        return f"found {query}"

    assert _run(search_logs)["termination"] == "completed"
    # Only the copy handed to create_agent's handler runs on the share; the tool given to
    # create_agent keeps LangChain's own ``ainvoke``.
    assert "ainvoke" not in search_logs.__dict__


class _Uncopyable(BaseTool):
    """A sync tool whose copy (application code: its class overrides ``model_copy``) raises
    once it has been registered (``fp.tool`` copies it then, where raising is the developer's
    to see)."""

    name: str = "search_logs"
    description: str = "Search the service logs."
    raises: type[BaseException] = RuntimeError
    copies: list[int] = Field(default_factory=list)

    def _run(self, query: str) -> str:
        return f"found {query}"

    def model_copy(self, *, update: Any = None, deep: bool = False) -> Any:
        if self.copies:
            raise self.raises("no copy of me")
        self.copies.append(1)
        return super().model_copy(update=update, deep=deep)


@pytest.mark.parametrize("raises", [RuntimeError, SystemExit, KeyboardInterrupt])
def test_a_sync_tool_whose_copy_raises_under_ainvoke_fails_its_call_and_never_ends_the_process(
    raises: type[BaseException],
) -> None:
    # What the tool's own code raises as it is readied for its thread is its call's failure,
    # as what its body raises is: the run goes on, and nothing leaves ``ainvoke``.
    out = _run(_Uncopyable(raises=raises))
    assert out["termination"] == "completed"
    assert _answers(out) == [{"error_code": "internal_error"}]
