"""Edges to other ecosystems: chat models, tools, checkpointers, durable ledgers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fencepost.adapters.agent import create_agent, tool
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
    from fencepost.adapters.middleware import FencepostMiddleware
    from fencepost.adapters.tools import ToolAdapterError, tool_spec

__all__ = [
    "ChatModelDecider",
    "CheckpointerError",
    "ChildRunResult",
    "FencepostMiddleware",
    "MissingExtra",
    "PostgresLedger",
    "ScriptedDecisionModel",
    "SqliteLedger",
    "ToolAdapterError",
    "aopen_checkpointer",
    "child_run_tool",
    "create_agent",
    "open_checkpointer",
    "tool",
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
    "FencepostMiddleware": "fencepost.adapters.middleware",
    "tool_spec": "fencepost.adapters.tools",
}


# The extra that brings each optional driver, for the one sentence a missing one gets.
_EXTRAS = {
    "psycopg": "postgres",
    "psycopg_pool": "postgres",
    "langgraph.checkpoint.postgres": "postgres",
    "langchain": "langchain",
}


class MissingExtra(ImportError):
    """A name was used whose optional dependencies are not installed; the message names the
    extra that brings them and the command that installs it."""


def load_lazily(owner: str, name: str, module: str) -> Any:
    """``name`` from ``module``, imported now; a driver that is not installed raises
    :class:`MissingExtra` naming the extra instead of a bare ``ModuleNotFoundError``."""
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        extra = _EXTRAS.get(exc.name or "") or _EXTRAS.get(missing)
        if extra is None:
            raise
        raise MissingExtra(
            f"{owner}.{name} needs the {extra!r} extra ({missing} is not installed): run "
            f"pip install -e '.[{extra}]' in your fencepost clone"
        ) from None


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = load_lazily("fencepost.adapters", name, module)
    globals()[name] = value
    return value
