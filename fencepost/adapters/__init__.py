"""Edges to other ecosystems: chat models, tools, checkpointers, durable ledgers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fencepost.adapters.scripted import ScriptedDecisionModel

if TYPE_CHECKING:
    from fencepost.adapters.chat_model import ChatModelDecider
    from fencepost.adapters.checkpointers import (
        CheckpointerError,
        aopen_checkpointer,
        open_checkpointer,
    )
    from fencepost.adapters.child_run import ChildRunResult, child_run_tool
    from fencepost.adapters.ledger_postgres import PostgresLedger
    from fencepost.adapters.ledger_sqlite import SqliteLedger
    from fencepost.adapters.tools import ToolAdapterError, tool_spec

__all__ = [
    "ChatModelDecider",
    "CheckpointerError",
    "ChildRunResult",
    "PostgresLedger",
    "ScriptedDecisionModel",
    "SqliteLedger",
    "ToolAdapterError",
    "aopen_checkpointer",
    "child_run_tool",
    "open_checkpointer",
    "tool_spec",
]

# Imported on first use, so the package loads without the `sqlite` / `postgres` extras.
_LAZY = {
    "PostgresLedger": "fencepost.adapters.ledger_postgres",
    "SqliteLedger": "fencepost.adapters.ledger_sqlite",
    "ChatModelDecider": "fencepost.adapters.chat_model",
    "CheckpointerError": "fencepost.adapters.checkpointers",
    "open_checkpointer": "fencepost.adapters.checkpointers",
    "aopen_checkpointer": "fencepost.adapters.checkpointers",
    "ChildRunResult": "fencepost.adapters.child_run",
    "child_run_tool": "fencepost.adapters.child_run",
    "ToolAdapterError": "fencepost.adapters.tools",
    "tool_spec": "fencepost.adapters.tools",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
