"""Answering a waiting call from the command line: ``fencepost approve|reject``.

An operator's tool: it shows a waiting call's arguments and answers it as a resume does — the
real graph resumed with ``Command(resume=...)`` and a :class:`~fencepost.policy.context.RunContext`
for the answering principal, so every check a resume passes through applies to it too. The
graph is named as ``langgraph.json`` names one (``module:attribute`` or ``./path.py:attribute``)
and must be the uncompiled graph (``fp.build_agent_graph(...)``), which is compiled here with the
checkpoint database's saver (and so the ledger beside it), or one compiled with a checkpointer of
its own.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command

from fencepost.policy.context import RunContext
from fencepost.policy.tool import Principal

__all__ = ["GraphNotFound", "answer_calls", "default_graph_spec", "load_graph"]


class GraphNotFound(ValueError):
    """``--graph`` names nothing that can be resumed (a one-line, safe message)."""

    code = "graph_not_found"


def default_graph_spec(config: Path = Path("langgraph.json")) -> str:
    """The one graph ``langgraph.json`` (in the working directory) names; ``GraphNotFound``
    when there is no such file or it names none or several (then ``--graph`` must choose)."""
    try:
        graphs = json.loads(config.read_text(encoding="utf-8")).get("graphs") or {}
    except (OSError, ValueError, AttributeError):
        raise GraphNotFound(
            "no --graph given and no readable langgraph.json here: pass --graph module:attribute"
        ) from None
    if not isinstance(graphs, Mapping) or len(graphs) != 1:
        raise GraphNotFound(
            f"{config} names {len(graphs) if isinstance(graphs, Mapping) else 0} graphs: "
            "pass --graph module:attribute"
        )
    [spec] = graphs.values()
    if not isinstance(spec, str):
        raise GraphNotFound(f"{config} names a graph that is not a path: pass --graph")
    return spec


def _import(spec: str) -> Any:
    where, sep, attribute = spec.rpartition(":")
    if not sep or not where or not attribute:
        raise GraphNotFound(f"--graph {spec!r} is not module:attribute or ./path.py:attribute")
    try:
        if where.endswith(".py"):
            path = Path(where).resolve()
            loaded = importlib.util.spec_from_file_location(f"_fencepost_graph_{path.stem}", path)
            if loaded is None or loaded.loader is None or not path.is_file():
                raise GraphNotFound(f"--graph: no such file {where}")
            module = importlib.util.module_from_spec(loaded)
            sys.modules[loaded.name] = module
            loaded.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except GraphNotFound:
        raise
    except Exception as exc:
        raise GraphNotFound(f"--graph: cannot import {where} ({type(exc).__name__})") from None
    if not hasattr(module, attribute):
        raise GraphNotFound(f"--graph: {where} has no attribute {attribute!r}")
    return getattr(module, attribute)


def load_graph(spec: str, saver: BaseCheckpointSaver[Any]) -> Pregel[Any, Any, Any, Any]:
    """The graph ``spec`` names, ready to resume runs of ``saver``'s database.

    An uncompiled graph is compiled with ``saver`` (a fencepost graph built with no ledger then
    keeps its budget in the ledger beside that database, where its runs' accounts are). A
    compiled graph is used as it is only when it has a checkpointer of its own; one compiled
    without (the graph ``langgraph.json`` serves) is refused: its ledger never saw these runs,
    and resuming there would end them.
    """
    found = _import(spec)
    if isinstance(found, StateGraph):
        return found.compile(checkpointer=saver)
    if isinstance(found, Pregel):
        if isinstance(found.checkpointer, BaseCheckpointSaver):
            return found
        raise GraphNotFound(
            f"--graph {spec} is compiled without a checkpointer: name the uncompiled graph "
            "(fp.build_agent_graph(...)) or one compiled with its checkpointer and ledger"
        )
    raise GraphNotFound(f"--graph {spec} is not a LangGraph graph ({type(found).__name__})")


def answer_calls(
    graph: Pregel[Any, Any, Any, Any],
    thread_id: str,
    call_ids: Iterable[str],
    decision: str,
    *,
    principal: str,
    tenant: str,
    capabilities: Iterable[str] = (),
) -> dict[str, Any]:
    """Resume ``thread_id`` with ``decision`` (``"approve"`` or ``"reject"``) for each of
    ``call_ids``, as ``principal`` of ``tenant``: the graph's own checks judge the answer.
    Returns what ``invoke`` returned."""
    context = RunContext(
        tenant_id=tenant,
        principal=Principal(id=principal, capabilities=frozenset(capabilities)),
    )
    answer = {call_id: decision for call_id in call_ids}
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    command: Command[Any] = Command(resume=answer)
    result = graph.invoke(command, config, context=context)
    return dict(result) if isinstance(result, Mapping) else {}
