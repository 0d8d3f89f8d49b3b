"""The ledger of a graph built with none: as durable as the checkpointer it is compiled with.

A run's budget lives in its ledger account, so a ledger that dies with the process while the
checkpoints survive it lets a restarted worker find a paused run with its account gone. The
graph's own :class:`~fencepost.policy.InMemoryLedger` is kept only where the checkpoints are
in memory too (no checkpointer, LangGraph's ``InMemorySaver``, a subgraph's inherited one).
A SQLite checkpointer on a file gets a :class:`~fencepost.adapters.SqliteLedger` on that same
file (its own tables beside LangGraph's), so every process that opens the file shares the
books; a Postgres one that fencepost's ``open_checkpointer`` opened (it knows the connection
string) a :class:`~fencepost.adapters.PostgresLedger` in the same database. Any other — a
Postgres saver built by hand, an ``AsyncSqliteSaver`` built by hand, one fencepost does not
know — is refused at compile with one sentence saying which ledger to pass: none is guessed.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver

from fencepost.policy import Ledger


class LedgerNeeded(ValueError):
    """No ledger as durable as the checkpointer can be made: the message says what to pass."""


def durable_ledger(checkpointer: Any) -> Ledger | None:
    """A ledger as durable as ``checkpointer`` for a graph built with none, or ``None`` when
    the graph's own in-memory ledger already is. Raises :class:`LedgerNeeded` otherwise.

    A ledger made for a checkpointer fencepost's opener opened is closed with it; one made for
    a ``SqliteSaver`` built by hand is closed when the graph compiled with it is collected.
    """
    if checkpointer is None or isinstance(checkpointer, bool | InMemorySaver):
        return None
    from fencepost.adapters.checkpointers import checkpoint_store, close_with

    kind, where = checkpoint_store(checkpointer) or ("", "")
    if not kind:
        path = _sqlite_file(checkpointer)
        kind, where = ("sqlite", path) if path is not None else ("", "")
    if kind == "read_only" or (kind == "sqlite" and where == ""):
        # A store opened only to read, or an in-memory SQLite database (gone with the process,
        # as the ledger is): the graph's own in-memory ledger is as durable.
        return None
    ledger: Ledger
    if kind == "sqlite":
        from fencepost.adapters.ledger_sqlite import SqliteLedger

        ledger = SqliteLedger(where)
    elif kind == "postgres":
        from fencepost.adapters.ledger_postgres import PostgresLedger

        ledger = PostgresLedger(where)
    else:
        raise LedgerNeeded(_what_to_pass(type(checkpointer).__name__))
    close = getattr(ledger, "close", None)
    if callable(close):
        close_with(checkpointer, close)
    return ledger


def _what_to_pass(kind: str) -> str:
    if "Postgres" in kind:
        return (
            f"a graph checkpointed to Postgres ({kind}) needs its budget there too: pass "
            "build_agent_graph(..., ledger=PostgresLedger(dsn)) on the same database, or open "
            "the checkpointer with fencepost.adapters.open_checkpointer(dsn)"
        )
    if "Sqlite" in kind:
        return (
            f"fencepost cannot tell which file this {kind} writes: pass "
            "build_agent_graph(..., ledger=SqliteLedger(path)) on the same file, or open the "
            "checkpointer with fencepost.adapters.open_checkpointer / aopen_checkpointer"
        )
    return (
        f"fencepost keeps no budget beside a {kind}: pass build_agent_graph(..., ledger=...) a "
        "durable ledger (SqliteLedger(path) or PostgresLedger(dsn)), or ledger=InMemoryLedger() "
        "to keep the budget in this process only"
    )


def _sqlite_file(checkpointer: Any) -> str | None:
    """The file a hand-built ``SqliteSaver`` writes (``""`` for an in-memory database), or
    ``None`` for any other checkpointer."""
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError:  # pragma: no cover - the sqlite extra is not installed
        return None
    if not isinstance(checkpointer, SqliteSaver):
        return None
    try:
        with checkpointer.lock:
            rows = checkpointer.conn.execute("PRAGMA database_list").fetchall()
    except sqlite3.Error as exc:  # closed, or made on another thread
        raise LedgerNeeded(
            f"cannot read which file this SqliteSaver writes ({type(exc).__name__}): pass "
            "build_agent_graph(..., ledger=SqliteLedger(path)) on the same file"
        ) from None
    return next((str(row[2] or "") for row in rows if row[1] == "main"), "")
