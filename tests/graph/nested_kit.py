"""A fencepost graph nested in a plain LangGraph parent: a node that invokes it, or the compiled
graph added as a subgraph node."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command
from typing_extensions import TypedDict

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from tests.graph.kit import Calls, budget, call, context, final_citing_last, make_registry, thread


class Parent(TypedDict, total=False):
    """A parent graph's state: how the nested run ended."""

    out: str


class Host(TypedDict, total=False):
    """A parent graph that holds the compiled fencepost graph as a subgraph node: it shares the
    graph's own channels."""

    request: dict[str, Any]
    run: dict[str, Any]
    audit: str


def nested_paused(
    ledger: fp.InMemoryLedger, saver: InMemorySaver, *, own_saver: bool = False
) -> tuple[Any, Any, dict[str, Any], fp.RunContext, Calls]:
    """A parent graph whose node runs a fencepost graph that pauses for approval of a write:
    the parent, the nested graph, the parent's config, the context, the tool calls made."""
    calls = Calls()
    model = ScriptedDecisionModel(
        [call("write_note", 1, note="a"), final_citing_last, final_citing_last]
    )
    built = fp.build_agent_graph(make_registry(calls), model, ledger=ledger, approval="interrupt")
    nested = built.compile(checkpointer=saver) if own_saver else built.compile()
    ctx = context()

    def agent(_: Parent) -> dict[str, str]:
        out = fp.run_output(nested.invoke(fp.start("q", budget()), context=ctx))
        return {"out": f"{out.termination}:{out.last_error_code}"}

    parent = StateGraph(Parent)
    parent.add_node("agent", agent)
    parent.add_edge(START, "agent")
    parent.add_edge("agent", END)
    compiled = parent.compile(checkpointer=saver)
    config = thread()
    compiled.invoke({}, config, context=ctx)
    assert compiled.get_state(config).next == ("agent",)
    return compiled, nested, config, ctx, calls


def approved(parent: Any, config: dict[str, Any], ctx: fp.RunContext, calls: Calls) -> Any:
    """What the parent returns once the nested run's approval is answered, and how many times
    the write it waited on ran."""
    out = parent.invoke(Command(resume="approve"), config, context=ctx)
    return out, calls.count("write_note")


def nested_config(parent: Any, config: dict[str, Any]) -> dict[str, Any]:
    """The nested run's own config: the parent's thread and the nested run's namespace."""
    sub = parent.get_state(config, subgraphs=True).tasks[0].state
    assert sub is not None and not isinstance(sub, dict)
    namespace = sub.config["configurable"]["checkpoint_ns"]
    return {
        "configurable": {
            "thread_id": config["configurable"]["thread_id"],
            "checkpoint_ns": namespace,
        }
    }
