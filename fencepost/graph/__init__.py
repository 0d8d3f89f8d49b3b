"""The LangGraph binding: state schema, nodes, routing, the loop's settings and event stream, run context."""

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
    "cancel",
    "run_output",
    "start",
]
