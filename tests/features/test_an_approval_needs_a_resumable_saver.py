"""A pause must be resumable: an approval graph refuses, in one sentence naming the public fix,
what could never resume it.

- ``approval="interrupt"`` compiled with checkpointing turned off (``checkpointer=False``) is
  refused at compile; compiled with none (``None``, legitimate: a subgraph inherits its parent's
  saver, LangGraph Server supplies one) it is refused when run at the top level with none.
- A sync-only saver (``SqliteSaver``) under ``ainvoke``/``astream`` names ``fp.aopen_checkpointer``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from tests.graph.kit import (
    Calls,
    budget,
    call,
    context,
    final_citing_last,
    make_registry,
    thread,
)

INTERNAL_NAMES = ("langgraph.", "AsyncSqliteSaver", "_internal", "fencepost.graph")


def _graph(**build: Any) -> Any:
    return fp.build_agent_graph(
        make_registry(Calls()),
        ScriptedDecisionModel([call("write_note", 1, note="x"), final_citing_last]),
        approval="interrupt",
        **build,
    )


def _one_public_sentence(message: str, fix: str) -> None:
    assert fix in message
    assert message.count(". ") == 0 and "\n" not in message
    assert not any(name in message for name in INTERNAL_NAMES)


def test_compiling_an_approval_graph_with_checkpointing_off_is_refused() -> None:
    with pytest.raises(fp.GraphConfigError) as refused:
        _graph().compile(checkpointer=False)
    _one_public_sentence(str(refused.value), "fp.create_agent(..., checkpointer=...)")


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_running_an_approval_graph_with_no_checkpointer_is_refused_before_it_pauses(
    mode: str,
) -> None:
    graph = _graph().compile()
    with pytest.raises(fp.GraphConfigError) as refused:
        if mode == "invoke":
            graph.invoke(fp.start("q", budget()), thread(), context=context())
        else:
            await graph.ainvoke(fp.start("q", budget()), thread(), context=context())
    _one_public_sentence(str(refused.value), "fp.create_agent(..., checkpointer=...)")


def test_create_agent_without_a_checkpointer_is_refused_when_run() -> None:
    agent = fp.create_agent(
        ScriptedDecisionModel([call("write_note", 1, note="x")]),
        make_registry(Calls()),
        approval="interrupt",
    )
    with pytest.raises(fp.GraphConfigError, match=r"checkpointer=\.\.\."):
        agent.invoke(fp.start("q", budget()), thread(), context=context())


async def test_a_sync_saver_under_ainvoke_names_the_async_opener(tmp_path: Path) -> None:
    with SqliteSaver.from_conn_string(str(tmp_path / "cp.db")) as saver:
        graph = _graph().compile(checkpointer=saver)
        with pytest.raises(fp.GraphConfigError) as refused:
            await graph.ainvoke(fp.start("q", budget()), thread(), context=context())
    _one_public_sentence(str(refused.value), "fp.aopen_checkpointer")
    assert "SqliteSaver" in str(refused.value)
