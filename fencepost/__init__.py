"""fencepost: tool-calling agents on LangGraph as a bounded loop that ends with a typed reason.

The root holds what a user writes; everything else stays importable from its submodule
(``fencepost.policy`` for the contract, ``fencepost.graph`` for the binding,
``fencepost.adapters`` for the edges).

Example::

    import fencepost as fp

    graph = fp.build_agent_graph(fp.ToolRegistry([search_logs]), model).compile(
        checkpointer=InMemorySaver()
    )
    out = graph.invoke(fp.start("why is checkout slow?"), config, context=fp.RunContext(...))
    fp.run_output(out).termination
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fencepost import graph, policy
from fencepost.graph import (
    CommandRefused,
    ForkRefused,
    GraphConfigError,
    acancel,
    build_agent_graph,
    cancel,
    fencepost_serializer,
    run_output,
    start,
)
from fencepost.policy import (
    AbstainProposal,
    Accepted,
    AgentState,
    AnswerPayload,
    Completed,
    Deadline,
    Decided,
    DecisionInput,
    Effect,
    ErrorCode,
    FinalProposal,
    InMemoryLedger,
    InvalidProposal,
    Ledger,
    Principal,
    Receipt,
    ReceiptStatus,
    RunContext,
    RuntimeBudget,
    StepManifest,
    StopKind,
    StopReport,
    TerminationReason,
    ToolBatch,
    ToolContext,
    ToolError,
    ToolProposal,
    ToolRegistry,
    ToolSpec,
)
from fencepost.policy.tool_decorator import tool

if TYPE_CHECKING:
    from fencepost.adapters.ledger_postgres import PostgresLedger
    from fencepost.adapters.ledger_sqlite import SqliteLedger

__all__ = [
    "AbstainProposal",
    "Accepted",
    "AgentState",
    "AnswerPayload",
    "CommandRefused",
    "Completed",
    "Deadline",
    "Decided",
    "DecisionInput",
    "Effect",
    "ErrorCode",
    "FinalProposal",
    "ForkRefused",
    "GraphConfigError",
    "InMemoryLedger",
    "InvalidProposal",
    "Ledger",
    "PostgresLedger",
    "Principal",
    "Receipt",
    "ReceiptStatus",
    "RunContext",
    "RuntimeBudget",
    "SqliteLedger",
    "StepManifest",
    "StopKind",
    "StopReport",
    "TerminationReason",
    "ToolBatch",
    "ToolContext",
    "ToolError",
    "ToolProposal",
    "ToolRegistry",
    "ToolSpec",
    "acancel",
    "build_agent_graph",
    "cancel",
    "fencepost_serializer",
    "graph",
    "policy",
    "run_output",
    "start",
    "tool",
]

# The durable ledgers load their database drivers on first use, so `import fencepost` works
# without the postgres extra.
_LAZY = {
    "PostgresLedger": "fencepost.adapters.ledger_postgres",
    "SqliteLedger": "fencepost.adapters.ledger_sqlite",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
