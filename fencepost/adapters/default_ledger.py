"""The ledger of a graph built with none: as durable as the checkpointer it is compiled with,
and the same for every graph object compiled with that checkpointer.

A run's budget and owner live in its ledger account, and a run is only ever continued on a
ledger that holds it (one that never saw it refuses it, typed): so every graph object that can
reach a run's checkpoints must reach the same ledger. Checkpoints held in memory (LangGraph's
``InMemorySaver``, an in-memory SQLite database, a store opened only to read) get one
:class:`~fencepost.policy.InMemoryLedger` per saver object, kept here and found again from the
saver itself (never from a name a caller chooses): an app that builds its agent per request on
one module-level saver has one budget truth. A SQLite checkpointer on a file gets a
:class:`~fencepost.adapters.SqliteLedger` on that same file (its own tables beside LangGraph's),
so every process that opens the file shares the books (a ``SqliteSaver``'s ledger takes turns
on the saver's lock, rather than finding the file busy with its commits); a Postgres one that fencepost's
``open_checkpointer`` opened (it knows the connection string) a
:class:`~fencepost.adapters.PostgresLedger` in the same database. Any other — a Postgres saver
built by hand, an ``AsyncSqliteSaver`` built by hand, one fencepost does not know — is refused
at compile with one sentence saying which ledger to pass: none is guessed.

A graph compiled with no checkpointer of its own (none, or ``True``/``False``) keeps the
in-memory ledger of its graph object: LangGraph gives a nested graph's nodes no public way to
reach the parent's saver, so such a graph is built once (not per request), or given a ledger.
"""

from __future__ import annotations

import sqlite3
import threading
import weakref
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.memory import InMemorySaver

from fencepost.policy import InMemoryLedger, Ledger

if TYPE_CHECKING:
    from fencepost.adapters.ledger_sqlite import WriterLock


class LedgerNeeded(ValueError):
    """No ledger as durable as the checkpointer can be made: the message says what to pass."""


def durable_ledger(checkpointer: Any) -> Ledger | None:
    """A ledger as durable as ``checkpointer`` for a graph built with none, or ``None`` when
    there is no saver object to keep one beside (``None``, ``True``, ``False``: the graph's own
    in-memory ledger). Raises :class:`LedgerNeeded` otherwise.

    Checkpoints in memory get the saver's own :func:`in_memory_ledger`, the same for every graph
    compiled with it. A ledger made for a checkpointer fencepost's opener opened is closed with
    it; one made for a ``SqliteSaver`` built by hand is closed when the graph compiled with it
    is collected.
    """
    if checkpointer is None or isinstance(checkpointer, bool):
        return None
    if isinstance(checkpointer, InMemorySaver):
        return in_memory_ledger(checkpointer)
    from fencepost.adapters.checkpointers import checkpoint_store, close_with

    kind, where = checkpoint_store(checkpointer) or ("", "")
    if not kind:
        path = _sqlite_file(checkpointer)
        kind, where = ("sqlite", path) if path is not None else ("", "")
    if kind == "read_only" or (kind == "sqlite" and where == ""):
        # A store opened only to read, or an in-memory SQLite database (gone with the process,
        # as the ledger is): an in-memory ledger is as durable.
        return in_memory_ledger(checkpointer)
    ledger: Ledger
    if kind == "sqlite":
        from fencepost.adapters.ledger_sqlite import SqliteLedger

        ledger = SqliteLedger(where, writer_lock=_saver_lock(checkpointer))
    elif kind == "postgres":
        from fencepost.adapters.ledger_postgres import PostgresLedger

        ledger = PostgresLedger(where)
    else:
        raise LedgerNeeded(_what_to_pass(type(checkpointer).__name__))
    close = getattr(ledger, "close", None)
    if callable(close):
        close_with(checkpointer, close)
    return ledger


# Each saver's in-memory ledger, by the saver object's identity (a saver class that defines
# equality must not make two savers share one), dropped when the saver is collected.
_IN_MEMORY: dict[int, tuple[weakref.ref[Any], InMemoryLedger]] = {}
_IN_MEMORY_LOCK = threading.Lock()


def in_memory_ledger(saver: Any) -> InMemoryLedger:
    """The in-memory ledger of every graph built with no ledger and compiled with ``saver``, a
    checkpointer that keeps its checkpoints in memory: made at the first such compile, kept as
    long as the saver is. :class:`LedgerNeeded` for a saver that cannot be referenced weakly
    (no ledger can then be kept beside it, nor found again)."""
    key = id(saver)
    with _IN_MEMORY_LOCK:
        kept = _IN_MEMORY.get(key)
        if kept is not None and kept[0]() is saver:
            return kept[1]
        try:
            ref = weakref.ref(saver)
        except TypeError:
            raise LedgerNeeded(_what_to_pass(type(saver).__name__)) from None
        ledger = InMemoryLedger()
        _IN_MEMORY[key] = (ref, ledger)
        weakref.finalize(saver, _forget, key, ref)
        return ledger


def _forget(key: int, ref: weakref.ref[Any]) -> None:
    with _IN_MEMORY_LOCK:
        kept = _IN_MEMORY.get(key)
        if kept is not None and kept[0] is ref:
            del _IN_MEMORY[key]


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


def _saver_lock(checkpointer: Any) -> WriterLock | None:
    """The lock a ``SqliteSaver`` holds around each of its transactions, for its ledger on the
    same file to take turns with (``SqliteLedger``'s ``writer_lock``); ``None`` for any other
    checkpointer (an ``AsyncSqliteSaver``'s lock is its event loop's)."""
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError:  # pragma: no cover - the sqlite extra is not installed
        return None
    if not isinstance(checkpointer, SqliteSaver):
        return None
    lock: WriterLock = checkpointer.lock
    return lock


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
