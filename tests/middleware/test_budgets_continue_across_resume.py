"""Invariant 4 in the middleware binding: a run's budget — model steps, tool calls and the
tokens its steps were settled at — continues across ``Command(resume=...)``; it does not
restart, as LangChain's run counters do. On a real ``InMemorySaver`` and a real SQLite saver
(with a SQLite ledger), both files on disk."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import fencepost as fp
from tests.middleware.kit import Ran, agent, ask, chat, ctx, lc_tools, specs, thread

USAGE = {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120}


def _write_then_search() -> Iterator[AIMessage]:
    """A write (which waits for approval), then searches forever; each step reports 120 tokens."""
    yield AIMessage(
        "",
        tool_calls=[{"name": "write_note", "args": {"note": "rollback"}, "id": "call-0001"}],
        usage_metadata=USAGE,  # type: ignore[arg-type]
    )
    for n in itertools.count(2):
        call = {"name": "search_logs", "args": {"query": f"q{n}"}, "id": f"call-{n:04d}"}
        yield AIMessage("", tool_calls=[call], usage_metadata=USAGE)  # type: ignore[arg-type]


@contextmanager
def _saver_and_ledger(kind: str, tmp_path: Path) -> Iterator[tuple[Any, fp.Ledger | None]]:
    if kind == "memory":
        yield InMemorySaver(), None
        return
    with SqliteSaver.from_conn_string(str(tmp_path / "saver.db")) as saver:
        yield saver, fp.SqliteLedger(str(tmp_path / "ledger.db"))


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_steps_tool_calls_and_tokens_continue_across_an_approvals_resume(
    kind: str, tmp_path: Path
) -> None:
    ran = Ran()
    tools = lc_tools(ran)
    limits = fp.RuntimeBudget(steps_remaining=3, tool_calls_remaining=10, tokens_remaining=10_000)
    model = chat(_write_then_search())
    with _saver_and_ledger(kind, tmp_path) as (saver, ledger):
        mw = fp.FencepostMiddleware(
            specs(tools), budget=limits, approval="interrupt", ledger=ledger
        )
        graph, config = agent(model, tools, [mw], saver=saver), thread()
        paused = graph.invoke(ask(), config, context=ctx())
        assert "__interrupt__" in paused
        assert paused["fencepost_run"]["budget"]["steps_used"] == 1 and ran.bodies == []

        out = graph.invoke(Command(resume="approve"), config, context=ctx())
        # A second resume of the ended run runs nothing and spends nothing.
        again = graph.invoke(Command(resume="approve"), config, context=ctx())
    assert out["termination"] == fp.TerminationReason.STEP_BUDGET_EXHAUSTED.value
    assert len(model.received) == 3  # 3 steps in all, not 3 after the resume
    assert ran.bodies == ["write_note:rollback", "search_logs:q2", "search_logs:q3"]
    spent = out["fencepost_run"]["budget"]
    assert (spent["steps_used"], spent["tool_calls_used"], spent["tokens_used"]) == (3, 3, 360)
    assert again["fencepost_run"]["budget"] == spent
