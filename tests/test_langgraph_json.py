"""`langgraph.json` names a graph that LangGraph Server / `langgraph dev` can load and run.

The loader below does what the server does with a ``./path.py:variable`` entry: import the file
by path under a made-up module name, take the variable, compile it if it is an uncompiled
``StateGraph``, and refuse a compiled graph that brings its own checkpointer (the server supplies
persistence). Then the graph runs with the context as JSON, the way the server passes it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel

import fencepost as fp
from fencepost.demo import DEMO_CAPABILITIES

ROOT = Path(__file__).resolve().parent.parent


def load_graph(entry: str) -> Any:
    path, _, variable = entry.rpartition(":")
    modname = path.replace("/", "__").replace(".py", "").lstrip(".")
    spec = importlib.util.spec_from_file_location(modname, ROOT / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(modname, None)
    graph = module.__dict__[variable]
    if isinstance(graph, StateGraph):
        graph = graph.compile()
    return graph


def config() -> dict[str, Any]:
    return json.loads((ROOT / "langgraph.json").read_text())


def server_context() -> dict[str, Any]:
    # JSON, as a LangGraph Server client sends it: fencepost coerces it into a RunContext.
    return {
        "tenant_id": "acme",
        "principal": {"id": "oncall-ana", "capabilities": sorted(DEMO_CAPABILITIES)},
    }


def test_langgraph_json_installs_the_project_and_names_the_demo_graph() -> None:
    cfg = config()
    assert cfg["dependencies"] == ["."]
    assert cfg["graphs"] == {"fencepost_demo": "./fencepost/demo.py:graph"}
    path = cfg["graphs"]["fencepost_demo"].rpartition(":")[0]
    assert (ROOT / path).is_file()


def test_the_named_graph_loads_by_path_without_its_own_checkpointer() -> None:
    graph = load_graph(config()["graphs"]["fencepost_demo"])
    assert isinstance(graph, Pregel)
    assert graph.checkpointer is None  # `langgraph dev` refuses a graph that brings one
    assert {"decide", "execute", "approve", "terminal"} <= set(graph.get_graph().nodes)


def served_graph() -> Any:
    """The named graph as the server runs it: with the server's own persistence attached (an
    approval graph run with none is refused, its pause could never be resumed)."""
    graph = load_graph(config()["graphs"]["fencepost_demo"])
    return graph.copy(update={"checkpointer": InMemorySaver()})


def test_the_named_graph_investigates_an_incident_with_a_json_context() -> None:
    graph = served_graph()
    out = graph.invoke(
        fp.start("Why is checkout returning 500s since 14:00?"),
        {"configurable": {"thread_id": "t-1"}},
        context=server_context(),
    )
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.COMPLETED
    assert [o.tool_name for o in state.observations] == ["search_logs", "deployment_history"]
    assert state.final_answer is not None
    assert set(state.final_answer.citations) == {o.call_id for o in state.observations}


def test_the_named_graph_without_a_context_denies_instead_of_running_tools() -> None:
    graph = served_graph()
    thread = {"configurable": {"thread_id": "t-1"}}
    state = fp.run_output(graph.invoke(fp.start("Why is checkout returning 500s?"), thread))
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "missing_context"
    assert state.observations == ()


def test_the_named_graph_persists_runs_under_a_server_checkpointer() -> None:
    graph = load_graph(config()["graphs"]["fencepost_demo"])
    # What the server does: attach its own persistence to the loaded graph.
    served = graph.copy(update={"checkpointer": InMemorySaver()})
    thread = {"configurable": {"thread_id": "t-1"}}
    served.invoke(fp.start("Why are order lookups timing out?"), thread, context=server_context())
    stored = fp.run_output(served.get_state(thread).values)
    assert stored.termination is fp.TerminationReason.COMPLETED
    assert [o.tool_name for o in stored.observations] == ["search_logs", "db_metrics"]
    # A finished thread stays finished when invoked again (resume with nothing to do).
    again = fp.run_output(served.invoke(None, thread, context=server_context()))
    assert again == stored
