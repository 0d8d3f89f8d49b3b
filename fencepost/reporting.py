"""Runs and the eval report, read from a checkpoint database through LangGraph's checkpointer API.

Nothing here queries a checkpoint table directly: threads are found with ``saver.list(None)``, a
run with ``saver.get_tuple``, and each thread's latest checkpoint is validated into
:class:`~fencepost.policy.AgentState` with :func:`~fencepost.graph.run_output`. So the same code
reads SQLite, Postgres or an in-memory saver.

Example::

    with open_store("sqlite:///.fencepost/runs.db") as saver:
        runs = load_runs(saver)
        report = build_report(runs)
    report.by_status  # {"completed": 4, "no_progress": 1, ...}
"""

from __future__ import annotations

import math
import sqlite3
import statistics
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from pydantic import BaseModel, ValidationError

from fencepost.adapters.checkpointers import mask_url
from fencepost.graph import fencepost_serializer, run_output
from fencepost.graph.state import StartRequest
from fencepost.policy import AgentState, BudgetAxis

__all__ = [
    "DEFAULT_DB",
    "PAUSED",
    "RUNNING",
    "AxisUse",
    "Distribution",
    "EvalReport",
    "NoSuchDatabase",
    "NoSuchRun",
    "NotACheckpointStore",
    "RunRecord",
    "StoreError",
    "StoreUnavailable",
    "StoreURL",
    "UnsupportedURL",
    "build_report",
    "load_run",
    "load_runs",
    "open_store",
    "parse_store_url",
]

DEFAULT_DB = "sqlite:///.fencepost/runs.db"
"""Where ``fencepost demo`` writes, and the other commands read, unless told otherwise."""
PAUSED = "paused: approval"
"""Status of a run waiting at the approval interrupt."""
RUNNING = "in progress"
"""Status of a run that has not ended and is not waiting for a human (running, or crashed)."""

# LangGraph records an interrupt as a pending write on this channel of the latest checkpoint.
_INTERRUPT_CHANNEL = "__interrupt__"
_RESUME_CHANNEL = "__resume__"


# --- errors: each one a clear, safe line for the command line ---------------------------------


class StoreError(Exception):
    """A checkpoint database could not be read as a fencepost store. ``str()`` is safe to show."""

    code = "store_error"


class UnsupportedURL(StoreError):
    """The database URL names no backend fencepost knows."""

    code = "unsupported_url"


class NoSuchDatabase(StoreError):
    """The database does not exist (and the command does not create one)."""

    code = "no_such_database"


class NotACheckpointStore(StoreError):
    """The database exists but holds no fencepost checkpoints (or is not a database at all)."""

    code = "not_a_checkpoint_store"


class StoreUnavailable(StoreError):
    """The database could not be reached or read right now."""

    code = "store_unavailable"


class NoSuchRun(StoreError):
    """No run with that id (or thread id) in the database."""

    code = "no_such_run"


# --- opening a store by URL ----------------------------------------------------------------------


@dataclass(frozen=True)
class StoreURL:
    """A parsed database URL: ``sqlite:///relative.db``, ``sqlite:////abs.db`` or ``postgresql://``.

    The SQLite forms follow the SQLAlchemy convention (three slashes: relative, four: absolute),
    as :func:`fencepost.adapters.checkpointers.open_checkpointer` does; a bare path is a SQLite
    file too.
    """

    kind: Literal["sqlite", "postgres"]
    target: str
    """The SQLite file path, or the Postgres connection string."""
    url: str
    """The URL in canonical form (a bare path becomes ``sqlite:///PATH``)."""
    display: str
    """The URL with any password masked: safe to print."""


def parse_store_url(url: str) -> StoreURL:
    """Parse a database URL.

    >>> parse_store_url("sqlite:///.fencepost/runs.db").target
    '.fencepost/runs.db'
    >>> parse_store_url("postgresql://app:secret@db:5432/runs").display
    'postgresql://app:***@db:5432/runs'
    """
    if url.startswith(("postgresql://", "postgres://")):
        return StoreURL("postgres", url, url, mask_url(url))
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :].split("?", 1)[0]
    elif "://" in url or url.startswith("sqlite:"):
        scheme = url.split(":", 1)[0][:20]
        raise UnsupportedURL(
            f"unsupported database URL scheme {scheme!r} (use sqlite:///PATH or postgresql://...)"
        )
    else:
        path = url
    if not path or path == ":memory:":
        raise UnsupportedURL(
            "a database URL needs a file: sqlite:///PATH (in-memory keeps nothing)"
        )
    canonical = f"sqlite:///{path}"
    return StoreURL("sqlite", path, canonical, canonical)


@contextmanager
def _translated(source: str) -> Iterator[None]:
    """Turn driver errors into :class:`StoreError` lines that never carry driver text."""
    try:
        yield
    except StoreError:
        raise
    except sqlite3.DatabaseError as exc:
        # Read, never shown. "attempt to write a readonly database" means the read-only guard
        # stopped LangGraph creating its tables: they were not there.
        if isinstance(exc, sqlite3.OperationalError) and "readonly" not in str(exc):
            raise StoreUnavailable(f"cannot read {source} (busy, locked or unreadable)") from None
        raise NotACheckpointStore(f"{source} is not a fencepost checkpoint store") from None
    except Exception as exc:
        _raise_postgres(exc, source)
        raise


def _raise_postgres(exc: Exception, source: str) -> None:
    try:
        import psycopg
    except ImportError:  # the postgres extra is not installed, so exc cannot be a psycopg error
        return
    if isinstance(exc, psycopg.errors.UndefinedTable):
        raise NotACheckpointStore(f"{source} is not a fencepost checkpoint store") from None
    if isinstance(exc, psycopg.OperationalError):
        # Read, never shown: the driver's text can carry host names and user names.
        if "does not exist" in str(exc):
            raise NoSuchDatabase(f"no such database: {source}") from None
        raise StoreUnavailable(f"cannot connect to {source}") from None
    if isinstance(exc, psycopg.Error):
        raise StoreUnavailable(f"cannot read {source}") from None


@contextmanager
def _read_sqlite(where: StoreURL) -> Iterator[BaseCheckpointSaver[Any]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = Path(where.target)
    if not path.is_file():
        raise NoSuchDatabase(f"no such database: {where.display}")
    # Read-only, so pointing a read command at some other SQLite file never changes it: the
    # saver's setup() would otherwise create LangGraph's tables there.
    with _translated(where.display):
        conn = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False
        )
    try:
        saver = SqliteSaver(conn, serde=fencepost_serializer())
        with _translated(where.display):
            saver.setup()
        yield saver
    finally:
        conn.close()


@contextmanager
def _read_postgres(where: StoreURL) -> Iterator[BaseCheckpointSaver[Any]]:
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg import Connection
        from psycopg.conninfo import conninfo_to_dict, make_conninfo
        from psycopg.rows import dict_row
    except ImportError:
        raise UnsupportedURL(
            "Postgres support is not installed: pip install 'fencepost[postgres]'"
        ) from None
    with _translated(where.display):
        params = conninfo_to_dict(where.target)
        # A read-only session: read commands cannot change the database, whatever it is.
        options = [str(params.get("options") or ""), "-c default_transaction_read_only=on"]
        params["options"] = " ".join(o for o in options if o)
        params.setdefault("connect_timeout", 10)
        conn = Connection.connect(
            make_conninfo("", **params), autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
    with conn:
        # No setup(): it would create tables. A missing table is reported instead.
        saver = PostgresSaver(conn, serde=fencepost_serializer())
        with _translated(where.display):
            saver.get_tuple({"configurable": {"thread_id": "", "checkpoint_ns": ""}})
        yield saver


@contextmanager
def _create(where: StoreURL) -> Iterator[BaseCheckpointSaver[Any]]:
    from fencepost.adapters.checkpointers import (
        CheckpointerError,
        UnsupportedCheckpointerURL,
        open_checkpointer,
    )

    if where.kind == "sqlite":
        try:
            Path(where.target).parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            raise StoreUnavailable(f"cannot create the directory for {where.display}") from None
    try:
        with open_checkpointer(where.url) as saver:
            yield saver
    except UnsupportedCheckpointerURL:
        raise UnsupportedURL(f"unsupported database URL {where.display}") from None
    except CheckpointerError:
        # Its message may quote the driver; ours names the database only.
        raise StoreUnavailable(
            f"cannot open {where.display} as a checkpoint store (unreachable, or not a database)"
        ) from None


@contextmanager
def open_store(url: str, *, create: bool = False) -> Iterator[BaseCheckpointSaver[Any]]:
    """A checkpointer for ``url`` with fencepost's serializer.

    ``create=True`` (the demo) opens it with
    :func:`~fencepost.adapters.checkpointers.open_checkpointer`, making the SQLite file, its
    directory and the checkpoint tables as needed. Otherwise the database must exist, is
    opened read-only and is never changed. Raises a :class:`StoreError` (one safe line).
    """
    where = parse_store_url(url)
    reader = _read_sqlite if where.kind == "sqlite" else _read_postgres
    opener = _create if create else reader
    with opener(where) as saver:
        yield saver


# --- runs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRecord:
    """One thread of a checkpoint database, read as a fencepost run."""

    thread_id: str
    state: AgentState
    """The run's state at its latest checkpoint."""
    status: str
    """The terminal reason, or :data:`PAUSED` / :data:`RUNNING`."""
    scenario: str | None
    """The ``scenario`` key of the checkpoint metadata (the demo sets it), if any."""
    started_at: datetime | None
    updated_at: datetime | None
    waiting_for: tuple[str, ...] = ()
    """Tools a paused run waits for approval of."""

    @property
    def run_id(self) -> str:
        """The run id (the demo uses it as the thread id too)."""
        return self.state.run_id

    @property
    def duration_seconds(self) -> float | None:
        """First to latest checkpoint (a paused run's pause counts)."""
        if self.started_at is None or self.updated_at is None:
            return None
        return max(0.0, (self.updated_at - self.started_at).total_seconds())

    def summary(self) -> dict[str, Any]:
        """The run as JSON-able data (no payload text beyond the question)."""
        budget = self.state.budget
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "scenario": self.scenario,
            "status": self.status,
            "question": self.state.question,
            "steps": budget.steps_used,
            "tool_calls": budget.tool_calls_used,
            "budget_left": {
                axis.value: budget.remaining(axis)
                for axis in BudgetAxis
                if budget.remaining(axis) is not None
            },
            "last_error_code": self.state.last_error_code,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
            "duration_seconds": self.duration_seconds,
            "waiting_for": list(self.waiting_for),
        }


def _ts(tup: CheckpointTuple) -> datetime | None:
    try:
        return datetime.fromisoformat(str(tup.checkpoint["ts"]))
    except (KeyError, ValueError):
        return None


def _state_of(values: dict[str, Any]) -> AgentState | None:
    """The run's AgentState, or ``None`` if the thread is not a fencepost run."""
    try:
        if "run_id" in values:
            return run_output(values)
        request = values.get("request")
        if request is not None:
            # Started but not yet through its first step (or crashed there).
            req = StartRequest.model_validate(request, strict=False)
            return AgentState(run_id=req.run_id, question=req.question, budget=req.budget)
    except ValidationError:
        return None
    return None


def _waiting_for_human(latest: CheckpointTuple) -> bool:
    # An interrupt with no resume value yet. (A crash right after a resume can leave the resume
    # written next to the interrupt: that run was answered and continues when invoked again.)
    channels = {w[1] for w in latest.pending_writes or ()}
    return _INTERRUPT_CHANNEL in channels and _RESUME_CHANNEL not in channels


class _NoModel:
    """The reader graph never decides: it only reassembles stored state."""

    async def decide(self, input: Any, *, deadline: Any) -> Any:
        raise RuntimeError("the report reader never runs the loop")


def _reader(saver: BaseCheckpointSaver[Any]) -> Any:
    """A compiled fencepost graph over ``saver``, used only for ``get_state``.

    Observations, receipts and manifests are delta channels: a checkpoint's own blob does not
    hold them, LangGraph reassembles them from the thread's writes. Reading through the graph
    keeps the report on LangGraph's API instead of re-implementing that.
    """
    from fencepost.graph.builder import build_agent_graph
    from fencepost.policy import ToolRegistry

    return build_agent_graph(ToolRegistry([]), _NoModel()).compile(checkpointer=saver)


def _record(latest: CheckpointTuple, started_at: datetime | None, reader: Any) -> RunRecord | None:
    values = latest.checkpoint.get("channel_values") or {}
    if "run_id" in values:
        values = reader.get_state(latest.config).values
    state = _state_of(values)
    if state is None:
        return None
    waiting: tuple[str, ...] = ()
    if state.termination is not None:
        status = state.termination.value
    elif _waiting_for_human(latest):
        status = PAUSED
        waiting = tuple(
            c.tool_name
            for c, v in zip(state.pending, state.verdicts, strict=False)
            if v.code.value == "approval_pending"
        )
    else:
        status = RUNNING
    scenario = (latest.metadata or {}).get("scenario")
    return RunRecord(
        thread_id=str(latest.config["configurable"]["thread_id"]),
        state=state,
        status=status,
        scenario=scenario if isinstance(scenario, str) else None,
        started_at=started_at,
        updated_at=_ts(latest),
        waiting_for=waiting,
    )


def load_runs(
    saver: BaseCheckpointSaver[Any], *, source: str = "the checkpoint database"
) -> list[RunRecord]:
    """Every fencepost run in the database, newest first.

    ``source`` names the database in error messages. Raises :class:`NotACheckpointStore` when
    the database holds LangGraph threads but none of them is a fencepost run.
    """
    latest: dict[str, CheckpointTuple] = {}
    first_ts: dict[str, datetime] = {}
    with _translated(source):
        for tup in saver.list(None):
            conf = tup.config["configurable"]
            if conf.get("checkpoint_ns", ""):
                continue  # subgraph checkpoints belong to their parent's run
            thread = str(conf["thread_id"])
            held = latest.get(thread)
            if held is None or conf["checkpoint_id"] > held.config["configurable"]["checkpoint_id"]:
                latest[thread] = tup
            ts = _ts(tup)
            if ts is not None and (thread not in first_ts or ts < first_ts[thread]):
                first_ts[thread] = ts
    reader = _reader(saver)
    with _translated(source):
        records = [r for t, tup in latest.items() if (r := _record(tup, first_ts.get(t), reader))]
    if latest and not records:
        raise NotACheckpointStore(
            f"{source} holds LangGraph checkpoints, but none of them is a fencepost run"
        )
    records.sort(
        key=lambda r: (r.updated_at.timestamp() if r.updated_at else 0.0, r.thread_id),
        reverse=True,
    )
    return records


def load_run(
    saver: BaseCheckpointSaver[Any], run_id: str, *, source: str = "the checkpoint database"
) -> RunRecord:
    """The run whose thread id (or run id) is ``run_id``; raises :class:`NoSuchRun`."""
    with _translated(source):
        tup = saver.get_tuple({"configurable": {"thread_id": run_id, "checkpoint_ns": ""}})
        if tup is not None:
            history = [
                ts
                for t in saver.list({"configurable": {"thread_id": run_id, "checkpoint_ns": ""}})
                if (ts := _ts(t)) is not None
            ]
            record = _record(tup, min(history) if history else None, _reader(saver))
            if record is not None:
                return record
    for record in load_runs(saver, source=source):
        if record.run_id == run_id:
            return record
    raise NoSuchRun(f"no such run: {run_id[:128]!r} in {source}")


# --- the eval report ------------------------------------------------------------------------------


class Distribution(BaseModel):
    """Median, 90th percentile (nearest rank) and maximum of a per-run count."""

    median: float
    p90: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        """The distribution of ``values`` (all zeros when there are none)."""
        if not values:
            return cls(median=0, p90=0, max=0)
        ordered = sorted(values)
        rank = max(1, math.ceil(0.9 * len(ordered)))
        return cls(median=statistics.median(ordered), p90=ordered[rank - 1], max=ordered[-1])


class AxisUse(BaseModel):
    """How runs used one budget axis."""

    axis: str
    runs_limited: int
    """Runs that had a limit on this axis."""
    used_total: float
    used: Distribution
    """Units used per run."""
    share_of_limit: Distribution | None
    """Used / limit per limited run (1.0 = all of it); ``None`` when no run was limited."""
    runs_exhausted: int
    """Limited runs with nothing left on this axis."""


class EvalReport(BaseModel):
    """The eval view of a checkpoint database."""

    runs: int
    by_status: dict[str, int]
    """Count of each terminal reason (plus paused / in-progress runs), most frequent first."""
    by_scenario: dict[str, dict[str, int]]
    """Per scenario (checkpoint metadata ``scenario``), the count of each status."""
    steps: Distribution
    """Model steps per run."""
    tool_calls: Distribution
    """Tool calls per run."""
    budget: list[AxisUse]
    """Budget use by axis."""


def build_report(runs: Sequence[RunRecord]) -> EvalReport:
    """Terminal reasons, steps and tool calls per run, and budget use by axis."""
    statuses = Counter(r.status for r in runs)
    by_scenario: dict[str, Counter[str]] = {}
    for r in runs:
        by_scenario.setdefault(r.scenario or "-", Counter())[r.status] += 1
    axes = []
    for axis in BudgetAxis:
        used = [float(r.state.budget.used(axis)) for r in runs]
        shares = []
        exhausted = 0
        for r in runs:
            left = r.state.budget.remaining(axis)
            if left is None:
                continue
            limit = r.state.budget.used(axis) + left
            shares.append(r.state.budget.used(axis) / limit if limit else 1.0)
            exhausted += left <= 0
        axes.append(
            AxisUse(
                axis=axis.value,
                runs_limited=len(shares),
                used_total=sum(used),
                used=Distribution.of(used),
                share_of_limit=Distribution.of(shares) if shares else None,
                runs_exhausted=exhausted,
            )
        )
    return EvalReport(
        runs=len(runs),
        by_status=dict(statuses.most_common()),
        by_scenario={k: dict(v.most_common()) for k, v in sorted(by_scenario.items())},
        steps=Distribution.of([r.state.budget.steps_used for r in runs]),
        tool_calls=Distribution.of([r.state.budget.tool_calls_used for r in runs]),
        budget=axes,
    )
