"""The LangGraph binding: state schema, nodes, routing, builder, run context, serializer."""

from fencepost.graph.builder import build_agent_graph
from fencepost.graph.cancel import CancelRefused, NestedRunUnreachable, acancel, cancel
from fencepost.graph.compiled import CommandRefused
from fencepost.graph.context import RunContext
from fencepost.graph.settings import GraphConfigError, LoopSettings
from fencepost.graph.state import (
    GraphState,
    InputState,
    LayoutRefused,
    NoRun,
    RunInProgress,
    StartRequest,
    run_output,
    start,
)

__all__ = [
    "CancelRefused",
    "CommandRefused",
    "GraphConfigError",
    "GraphState",
    "InputState",
    "LayoutRefused",
    "LoopSettings",
    "NestedRunUnreachable",
    "NoRun",
    "RunContext",
    "RunInProgress",
    "StartRequest",
    "acancel",
    "build_agent_graph",
    "cancel",
    "run_output",
    "start",
]
