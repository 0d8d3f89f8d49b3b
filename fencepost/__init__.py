"""fencepost: tool-calling agents on LangGraph as a bounded loop that ends with a typed reason.

The root holds what a user writes (what the README and the docs use, pinned by
``tests/test_public_api.py``); everything else stays importable from its submodule
(``fencepost.policy`` for the contract, ``fencepost.graph`` for the binding,
``fencepost.adapters`` for the edges).

Example::

    import fencepost as fp

    @fp.tool(effect="read", capability="logs:read")
    def search_logs(query: str) -> dict:
        \"\"\"Search the service logs.\"\"\"
        return {"hits": []}

    agent = fp.create_agent(model, [search_logs], checkpointer=InMemorySaver())
    out = agent.invoke(fp.start("why is checkout slow?"), config, context=fp.RunContext(...))
    print(fp.run_output(out).report)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fencepost.adapters import ScriptedDecisionModel, create_agent, tool
from fencepost.adapters.agent_graph import build_agent_graph
from fencepost.adapters.chat_model import ChatModelDecider
from fencepost.adapters.checkpointers import aopen_checkpointer, open_checkpointer
from fencepost.adapters.child_run import ChildRunResult, child_run_tool
from fencepost.adapters.tools import tool_spec
from fencepost.graph import (
    CancelRefused,
    CommandRefused,
    GraphConfigError,
    LayoutRefused,
    LoopSettings,
    NestedRunUnreachable,
    NoRun,
    RunInProgress,
    acancel,
    cancel,
    run_output,
    start,
)
from fencepost.policy import (
    AbstainProposal,
    Accepted,
    AgentState,
    AnswerPayload,
    ApproverDecision,
    ApproverInput,
    Completed,
    Deadline,
    Decided,
    DecisionInput,
    Effect,
    ErrorCode,
    FinalProposal,
    Injected,
    InMemoryLedger,
    InvalidProposal,
    Ledger,
    Principal,
    Provenance,
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
    Trust,
    ValueSource,
    Window,
)
from fencepost.policy.conditional_approval import ApprovalQuestion
from fencepost.policy.conversation_budget import (
    ConversationBudgetDenied,
    aconversation_account,
    conversation_account,
)
from fencepost.policy.pricing import PRICES, ModelPrice, PriceTable
from fencepost.policy.receipt import current_receipts
from fencepost.policy.remembered import ApprovalScope, Remember

if TYPE_CHECKING:
    from fencepost.adapters.ledger_postgres import PostgresLedger
    from fencepost.adapters.ledger_sqlite import SqliteLedger
    from fencepost.adapters.middleware import (
        FencepostMiddleware,
        MiddlewareOrderError,
        check_middleware,
    )

__all__ = [
    "PRICES",
    "ConversationBudgetDenied",
    "ModelPrice",
    "PriceTable",
    "aconversation_account",
    "conversation_account",
    "AbstainProposal",
    "Accepted",
    "AgentState",
    "AnswerPayload",
    "ApprovalQuestion",
    "ApprovalScope",
    "ApproverDecision",
    "ApproverInput",
    "CancelRefused",
    "ChatModelDecider",
    "ChildRunResult",
    "CommandRefused",
    "Completed",
    "Deadline",
    "FencepostMiddleware",
    "MiddlewareOrderError",
    "check_middleware",
    "Decided",
    "DecisionInput",
    "Effect",
    "ErrorCode",
    "FinalProposal",
    "LayoutRefused",
    "RunInProgress",
    "NoRun",
    "GraphConfigError",
    "LoopSettings",
    "InMemoryLedger",
    "Injected",
    "InvalidProposal",
    "Ledger",
    "NestedRunUnreachable",
    "PostgresLedger",
    "Principal",
    "Receipt",
    "ReceiptStatus",
    "Remember",
    "RunContext",
    "RuntimeBudget",
    "ScriptedDecisionModel",
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
    "Trust",
    "ValueSource",
    "Provenance",
    "Window",
    "acancel",
    "aopen_checkpointer",
    "build_agent_graph",
    "cancel",
    "child_run_tool",
    "create_agent",
    "current_receipts",
    "open_checkpointer",
    "run_output",
    "start",
    "tool",
    "tool_spec",
]

# The developer logs (tracebacks of what tools, models and validators raised:
# fencepost.policy.developer_log) stay silent until the application configures logging.
logging.getLogger("fencepost").addHandler(logging.NullHandler())

# The durable ledgers load their database drivers on first use, so `import fencepost` works
# without the postgres extra.
_LAZY = {
    "FencepostMiddleware": "fencepost.adapters.middleware",
    "MiddlewareOrderError": "fencepost.adapters.middleware",
    "check_middleware": "fencepost.adapters.middleware",
    "PostgresLedger": "fencepost.adapters.ledger_postgres",
    "SqliteLedger": "fencepost.adapters.ledger_sqlite",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from fencepost.adapters import load_lazily

    value = load_lazily("fp", name, module)
    globals()[name] = value
    return value
