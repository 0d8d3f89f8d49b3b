"""Edges to other ecosystems: chat models, tools, checkpointers, durable ledgers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fencepost.adapters.scripted import ScriptedDecisionModel

if TYPE_CHECKING:
    from fencepost.adapters.ledger_postgres import PostgresLedger
    from fencepost.adapters.ledger_sqlite import SqliteLedger

__all__ = ["PostgresLedger", "ScriptedDecisionModel", "SqliteLedger"]

# Imported on first use, so the package loads without the `sqlite` / `postgres` extras.
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
