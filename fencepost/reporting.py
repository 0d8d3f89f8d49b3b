"""Runs and the eval report, read from a checkpoint database through LangGraph's checkpointer API.

Stores are opened by :func:`open_store`, which is
:func:`~fencepost.adapters.checkpointers.open_checkpointer` (``read_only=True`` unless the demo is
writing), so every failure is a :class:`~fencepost.adapters.checkpointers.CheckpointerError`: one
safe sentence and a ``code``. Nothing here queries a checkpoint table directly: threads are found
with ``saver.list(None)``, a run with ``saver.get_tuple``, and each thread's latest checkpoint is
validated into :class:`~fencepost.policy.AgentState` with :func:`~fencepost.graph.run_output`. So
the same code reads SQLite, Postgres or an in-memory saver.

Demo runs carry a *batch*: every ``fencepost demo`` invocation gives its runs ids
``run-<batch>-<nn>`` (:func:`demo_run_id`), and the report covers the latest batch unless told
otherwise, so running the demo twice does not double the counts.

Example::

    with open_store("sqlite:///.fencepost/runs.db") as saver:
        runs = load_runs(saver)
    report = build_report(runs)        # the latest demo batch, or every run if there is none
    report.by_reason                   # {"completed": 4, "no_progress": 1, ...}
"""

from __future__ import annotations

import math
import os
import re
import statistics
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from pydantic import BaseModel, Field, ValidationError

from fencepost.adapters.checkpointers import (
    CheckpointerError,
    CheckpointerUnavailable,
    NoSuchCheckpointDatabase,
    NotACheckpointStore,
    checkpointer_errors,
    mask_url,
    open_checkpointer,
    sqlite_file,
)
from fencepost.graph import run_output
from fencepost.graph.state import LayoutRefused, StartRequest, has_run
from fencepost.policy import AgentState, BudgetAxis, StopReport, VerdictCode, stop_report
from fencepost.policy.state import earlier_run

__all__ = [
    "ALL_BATCHES",
    "DEFAULT_DB",
    "PAUSED",
    "RUNNING",
    "AxisUse",
    "Distribution",
    "EvalReport",
    "NoSuchBatch",
    "NoSuchRun",
    "OlderLayoutStore",
    "PendingCall",
    "RunRecord",
    "build_report",
    "demo_run_id",
    "load_run",
    "load_runs",
    "new_demo_batch",
    "open_store",
    "pending_calls",
    "select_batch",
]

DEFAULT_DB = "sqlite:///.fencepost/runs.db"
"""Where ``fencepost demo`` writes, and the other commands read, unless told otherwise."""
PAUSED = "paused: approval"
"""Status of a run waiting at the approval interrupt."""
RUNNING = "in progress"
"""Status of a run that has not ended and is not waiting for a human (running, or crashed)."""
ALL_BATCHES: Final = "all"
"""``--batch all``: every run in the store, whatever batch it belongs to."""

# LangGraph records an interrupt as a pending write on this channel of the latest checkpoint.
_INTERRUPT_CHANNEL = "__interrupt__"
_RESUME_CHANNEL = "__resume__"
_DEMO_RUN_ID = re.compile(r"^run-(?P<batch>[0-9a-f]{6})-(?P<n>\d{2,})$")


# --- errors: the checkpointer family, plus what a lookup can miss ---------------------------------


class NoSuchRun(CheckpointerError):
    """No run with that id (or thread id) in the database."""

    code = "no_such_run"


class NoSuchBatch(CheckpointerError):
    """No demo batch with that id in the database."""

    code = "no_such_batch"


class OlderLayoutStore(CheckpointerError):
    """The database holds fencepost runs only of an earlier state layout, which this version
    refuses to read (:class:`~fencepost.graph.LayoutRefused`), never half-reads."""

    code = "older_state_layout"


# --- opening a store by URL ----------------------------------------------------------------------


@contextmanager
def open_store(
    url: str, *, create: bool = False, writable: bool = False
) -> Iterator[BaseCheckpointSaver[Any]]:
    """A checkpointer for ``url`` with fencepost's serializer.

    ``writable=True`` (an approver's answer) opens an existing database for writing: it must
    exist, as for reading, and is not created.

    ``create=True`` (the demo) opens it with
    :func:`~fencepost.adapters.checkpointers.open_checkpointer`, making the SQLite file's
    directory, the file and the checkpoint tables as needed. Otherwise it is opened
    ``read_only=True``: the database must exist, is never changed, and a missing relative SQLite
    file says where it was looked for (and, for the default, to run ``fencepost demo`` first).
    Raises a :class:`~fencepost.adapters.checkpointers.CheckpointerError` (one safe line).
    """
    with ExitStack() as stack:
        if create:
            _make_directory(url)
            saver = stack.enter_context(open_checkpointer(url))
        else:
            try:
                if writable:
                    # Checked to exist first: opening it for writing would create it.
                    stack.enter_context(open_checkpointer(url, read_only=True))
                saver = stack.enter_context(open_checkpointer(url, read_only=not writable))
            except NoSuchCheckpointDatabase as exc:
                raise _missing(url, exc) from None
        yield saver


def _make_directory(url: str) -> None:
    path = sqlite_file(url)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        shown = mask_url(url)
        raise CheckpointerUnavailable(shown, f"cannot create the directory for {shown}") from None


def _missing(url: str, exc: NoSuchCheckpointDatabase) -> NoSuchCheckpointDatabase:
    path = sqlite_file(url)
    if path is None or path.is_absolute():
        return exc
    here = os.getcwd()
    if url == DEFAULT_DB:
        message = (
            f"no such database: {exc.url} (in {here}): run `fencepost demo` first to create "
            "it, or pass --db"
        )
    else:
        message = f"no such database: {exc.url} (relative to {here})"
    return NoSuchCheckpointDatabase(exc.url, message)


# --- demo batches -----------------------------------------------------------------------------------


def new_demo_batch() -> str:
    """A fresh batch id for one ``fencepost demo`` invocation (six hex digits)."""
    return uuid.uuid4().hex[:6]


def demo_run_id(batch: str, n: int) -> str:
    """The run (and thread) id of the ``n``-th scenario of demo batch ``batch``.

    >>> demo_run_id("3f9a1c", 7)
    'run-3f9a1c-07'
    """
    return f"run-{batch}-{n:02d}"


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
    approval_rights: tuple[str, ...] = ()
    """The approval right a principal other than the requester must hold to answer a paused
    run's waiting calls, each once, as the approval request names them (none from a request
    that names none: an older fencepost's)."""
    four_eyes: bool = False
    """Whether the paused run refuses its requester's own answer."""

    @property
    def run_id(self) -> str:
        """The run id (the demo uses it as the thread id too)."""
        return self.state.run_id

    @property
    def batch(self) -> str | None:
        """The demo batch the run belongs to (see :func:`demo_run_id`), or ``None``."""
        match = _DEMO_RUN_ID.match(self.run_id)
        return match["batch"] if match and self.scenario is not None else None

    @property
    def ended(self) -> bool:
        """Whether the run has a terminal reason (not paused, not in progress)."""
        return self.state.termination is not None

    @property
    def report(self) -> StopReport | None:
        """The run's stop report: for a run paused for approval, the one naming the calls it
        waits for (as :func:`~fencepost.graph.run_output` derives it); ``None`` while a run is
        still going.

        For an ended run, the one its terminal node wrote; a run ended by a fencepost without
        stop reports gets one derived from its receipts now (the batch it stopped in is gone, so
        a proposal left without a receipt is not listed).
        """
        if self.state.termination is None:
            return self.state.report
        return self.state.report or stop_report(self.state)

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
            "batch": self.batch,
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
        if has_run(values):
            return run_output(values)
        request = values.get("request")
        if request is not None:
            # Started but not yet through its first step (or crashed there).
            req = StartRequest.model_validate(request, strict=False)
            return AgentState(run_id=req.run_id, question=req.question, budget=req.budget)
    except (ValidationError, LayoutRefused):
        return None
    return None


def _approval_calls(latest: CheckpointTuple) -> list[dict[str, Any]]:
    """The waiting calls the latest approval request names (its interrupt value's ``calls``)."""
    found: list[dict[str, Any]] = []
    for write in latest.pending_writes or ():
        if write[1] != _INTERRUPT_CHANNEL:
            continue
        values = write[2] if isinstance(write[2], list | tuple) else (write[2],)
        for interrupt in values:
            value = getattr(interrupt, "value", None)
            if isinstance(value, dict) and value.get("fencepost") == "approval":
                found.extend(c for c in value.get("calls") or () if isinstance(c, dict))
    return found


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

    The run record is a delta channel: a checkpoint's own blob does not hold it, LangGraph
    reassembles it from the thread's writes. Reading through the graph
    keeps the report on LangGraph's API instead of re-implementing that.
    """
    from fencepost.adapters.agent_graph import build_agent_graph
    from fencepost.policy import InMemoryLedger, ToolRegistry

    # A ledger of its own, never one derived from the store: the reader spends nothing, and a
    # store opened read-only must not get ledger tables.
    graph = build_agent_graph(ToolRegistry([]), _NoModel(), ledger=InMemoryLedger())
    return graph.compile(checkpointer=saver)


def _older_layout(latest: CheckpointTuple) -> bool:
    """Whether a thread's latest checkpoint is of fencepost's first layout (a channel per field)."""
    versions = latest.checkpoint.get("channel_versions") or {}
    return "run_id" in versions and "run" not in versions


def _record(latest: CheckpointTuple, started_at: datetime | None, reader: Any) -> RunRecord | None:
    values = latest.checkpoint.get("channel_values") or {}
    if "run" in (latest.checkpoint.get("channel_versions") or {}):
        # The run record is a delta channel: LangGraph rebuilds it from the thread's writes.
        values = reader.get_state(latest.config).values
    state = _state_of(values)
    if state is None:
        return None
    waiting: tuple[str, ...] = ()
    rights: tuple[str, ...] = ()
    four_eyes = False
    if state.termination is not None:
        status = state.termination.value
    elif _waiting_for_human(latest):
        status = PAUSED
        waiting = tuple(
            e.proposal.tool_name for e in state.batch if e.verdict.code.value == "approval_pending"
        )
        asked = _approval_calls(latest)
        rights = tuple(
            dict.fromkeys(str(c["approval_right"]) for c in asked if c.get("approval_right"))
        )
        four_eyes = any(c.get("four_eyes") is True for c in asked)
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
        approval_rights=rights,
        four_eyes=four_eyes,
    )


def load_runs(
    saver: BaseCheckpointSaver[Any], *, source: str = "the checkpoint database"
) -> list[RunRecord]:
    """Every fencepost run in the database, newest first: each thread's latest run and the
    runs its conversation keeps, then the runs of each branch a fork left behind (the run a
    fork branched from, as it ended or paused).

    ``source`` is the database's URL, named (password masked) in error messages. Raises
    :class:`~fencepost.adapters.checkpointers.NotACheckpointStore` when the database holds
    LangGraph threads but none of them is a fencepost run.
    """
    latest: dict[str, CheckpointTuple] = {}
    first_ts: dict[str, datetime] = {}
    # Every checkpoint and its parent, per thread: a checkpoint no other one follows heads a
    # branch (a fork, LangGraph's time travel, leaves the branch it left behind as it was).
    seen: dict[str, set[str]] = {}
    parents: dict[str, set[str]] = {}
    with checkpointer_errors(source):
        for tup in saver.list(None):
            conf = tup.config["configurable"]
            if conf.get("checkpoint_ns", ""):
                continue  # subgraph checkpoints belong to their parent's run
            thread = str(conf["thread_id"])
            seen.setdefault(thread, set()).add(str(conf["checkpoint_id"]))
            parent = ((tup.parent_config or {}).get("configurable") or {}).get("checkpoint_id")
            if parent is not None:
                parents.setdefault(thread, set()).add(str(parent))
            held = latest.get(thread)
            if held is None or conf["checkpoint_id"] > held.config["configurable"]["checkpoint_id"]:
                latest[thread] = tup
            ts = _ts(tup)
            if ts is not None and (thread not in first_ts or ts < first_ts[thread]):
                first_ts[thread] = ts
    reader = _reader(saver)
    with checkpointer_errors(source):
        records = [r for t, tup in latest.items() if (r := _record(tup, first_ts.get(t), reader))]
        left = [
            r
            for t, tup in latest.items()
            for head in sorted(seen[t] - parents.get(t, set()), reverse=True)
            if head != tup.config["configurable"]["checkpoint_id"]
            and (r := _branch_record(saver, t, head, first_ts.get(t), reader))
        ]
    if latest and not records:
        shown = mask_url(source)
        older = sum(1 for tup in latest.values() if _older_layout(tup))
        if older:
            raise OlderLayoutStore(
                shown,
                f"{shown} holds {older} fencepost run(s) written by state layout 1, which this "
                "version refuses to read: read them with the version that wrote them",
            )
        raise NotACheckpointStore(
            shown, f"{shown} holds LangGraph checkpoints, but none of them is a fencepost run"
        )
    records.sort(
        key=lambda r: (r.updated_at.timestamp() if r.updated_at else 0.0, r.thread_id),
        reverse=True,
    )
    out: list[RunRecord] = []
    shown_runs: set[tuple[str, str, str | None]] = set()
    for run in (run for record in [*records, *left] for run in _with_earlier(record)):
        key = (run.thread_id, run.state.run_id, run.state.branch)
        if key not in shown_runs:
            shown_runs.add(key)
            out.append(run)
    return out


def _branch_record(
    saver: BaseCheckpointSaver[Any],
    thread: str,
    head: str,
    started_at: datetime | None,
    reader: Any,
) -> RunRecord | None:
    """The run at the head of a branch of ``thread`` other than its latest one (where a fork
    left it)."""
    tup = saver.get_tuple(
        {"configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": head}}
    )
    return None if tup is None else _record(tup, started_at, reader)


def _with_earlier(latest: RunRecord) -> list[RunRecord]:
    """The thread's runs, newest first: its latest run, then each earlier run its conversation
    keeps (:class:`~fencepost.policy.turns.Turn`: no observations or manifests, and no times of
    their own, which the thread's checkpoints do not name per run)."""
    return [
        latest,
        *(
            RunRecord(
                thread_id=latest.thread_id,
                state=earlier_run(turn),
                status=turn.termination.value if turn.termination else RUNNING,
                scenario=latest.scenario,
                started_at=None,
                updated_at=None,
            )
            for turn in reversed(latest.state.turns)
        ),
    ]


def load_run(
    saver: BaseCheckpointSaver[Any], run_id: str, *, source: str = "the checkpoint database"
) -> RunRecord:
    """The run whose thread id (or run id) is ``run_id``; raises :class:`NoSuchRun`."""
    with checkpointer_errors(source):
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
    shown = mask_url(source)
    raise NoSuchRun(shown, f"no such run: {run_id[:128]!r} in {shown}")


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
    """The eval view of a checkpoint database: terminal reasons and budget use of ended runs.

    Paused and in-progress runs have no terminal reason yet: they are counted apart and left out
    of the reasons, the per-run distributions and the budget use.
    """

    batch: str | None = None
    """The demo batch reported, or ``None`` when the report covers every run."""
    batches: list[str] = Field(default_factory=list)
    """Every demo batch in the database, newest first."""
    runs: int
    """Runs reported (ended, paused and in progress)."""
    ended: int
    """Runs with a terminal reason."""
    paused: int
    """Runs waiting at the approval interrupt."""
    in_progress: int
    """Runs not ended and not waiting for a human (still running, or crashed and resumable)."""
    by_reason: dict[str, int]
    """Count of each terminal reason among the ended runs, most frequent first."""
    by_scenario: dict[str, dict[str, int]]
    """Per scenario (checkpoint metadata ``scenario``), the count of each status."""
    steps: Distribution
    """Model steps per ended run."""
    tool_calls: Distribution
    """Tool calls per ended run."""
    budget: list[AxisUse]
    """Budget use by axis, over the ended runs."""

    @property
    def by_status(self) -> dict[str, int]:
        """Every status: the terminal reasons, then paused and in-progress runs (when any)."""
        extra = {PAUSED: self.paused, RUNNING: self.in_progress}
        return {**self.by_reason, **{k: v for k, v in extra.items() if v}}


def _batches(runs: Sequence[RunRecord]) -> list[str]:
    """The demo batches among ``runs``, the one whose newest run is newest first."""
    newest: dict[str, float] = {}
    for r in runs:
        if r.batch is None:
            continue
        when = max(
            (t.timestamp() for t in (r.started_at, r.updated_at) if t is not None), default=0.0
        )
        newest[r.batch] = max(newest.get(r.batch, 0.0), when)
    return sorted(newest, key=lambda b: (newest[b], b), reverse=True)


def select_batch(
    runs: Sequence[RunRecord], batch: str | None = None, *, source: str = "the checkpoint database"
) -> tuple[list[RunRecord], str | None]:
    """The runs of one demo batch, and that batch.

    ``batch=None`` picks the latest demo batch, or every run when there is no demo batch;
    :data:`ALL_BATCHES` every run (the batch returned is then ``None``). An unknown batch raises
    :class:`NoSuchBatch` naming the ones there are.
    """
    if batch == ALL_BATCHES:
        return list(runs), None
    known = _batches(runs)
    if batch is None:
        if not known:
            return list(runs), None
        batch = known[0]
    elif batch not in known:
        shown = mask_url(source)
        there = ", ".join(known[:5]) + (", ..." if len(known) > 5 else "") if known else "none"
        raise NoSuchBatch(
            shown, f"no demo batch {batch[:32]!r} in {shown} (batches, newest first: {there})"
        )
    return [r for r in runs if r.batch == batch], batch


def build_report(
    runs: Sequence[RunRecord], *, batch: str | None = None, source: str = "the checkpoint database"
) -> EvalReport:
    """Terminal reasons, steps and tool calls per run, and budget use by axis.

    ``batch`` selects the runs as :func:`select_batch` does: by default the latest demo batch
    (or every run, when none of them is a demo run).
    """
    chosen, picked = select_batch(runs, batch, source=source)
    ended = [r for r in chosen if r.ended]
    by_scenario: dict[str, Counter[str]] = {}
    for r in chosen:
        by_scenario.setdefault(r.scenario or "-", Counter())[r.status] += 1
    axes = []
    for axis in BudgetAxis:
        used = [float(r.state.budget.used(axis)) for r in ended]
        shares = []
        exhausted = 0
        for r in ended:
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
        batch=picked,
        batches=_batches(runs),
        runs=len(chosen),
        ended=len(ended),
        paused=sum(r.status == PAUSED for r in chosen),
        in_progress=sum(r.status == RUNNING for r in chosen),
        by_reason=dict(Counter(r.status for r in ended).most_common()),
        by_scenario={k: dict(v.most_common()) for k, v in sorted(by_scenario.items())},
        steps=Distribution.of([r.state.budget.steps_used for r in ended]),
        tool_calls=Distribution.of([r.state.budget.tool_calls_used for r in ended]),
        budget=axes,
    )


@dataclass(frozen=True)
class PendingCall:
    """One call a paused run waits on a human to approve (``fencepost pending``)."""

    run_id: str
    thread_id: str
    call_id: str
    tool_name: str
    arguments: dict[str, Any]
    """The call's arguments as the model proposed them: what the approver judges."""
    tenant_id: str | None
    requester: str | None
    """The principal the run acts for (who asked for the call)."""
    since: datetime | None
    """When the run paused (its latest checkpoint)."""

    def summary(self) -> dict[str, Any]:
        """The call as JSON."""
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "call_id": self.call_id,
            "tool_name": self.tool_name,
            "arguments": self.arguments,
            "tenant_id": self.tenant_id,
            "requester": self.requester,
            "since": self.since.isoformat() if self.since else None,
        }


def pending_calls(records: Iterable[RunRecord]) -> list[PendingCall]:
    """Every call that paused runs wait on a human for, oldest pause first."""
    found = [
        PendingCall(
            run_id=r.run_id,
            thread_id=r.thread_id,
            call_id=entry.call_id,
            tool_name=entry.proposal.tool_name,
            arguments=dict(entry.proposal.arguments),
            tenant_id=r.state.tenant_id,
            requester=r.state.principal_id,
            since=r.updated_at,
        )
        for r in records
        if r.status == PAUSED
        for entry in r.state.batch
        if entry.verdict.code is VerdictCode.APPROVAL_PENDING
    ]
    return sorted(found, key=lambda p: (p.since is None, p.since or datetime.min, p.call_id))
