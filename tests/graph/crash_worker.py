"""The child process of the crash tests: builds the graph on a durable saver + ledger and runs it.

The tests start it with :func:`run_phase` in a process forked from
``tests.conftest.worker_processes`` (a fresh process that shares nothing with the test's, without
an interpreter's start and fencepost's imports each time); by hand it runs as
``python tests/graph/crash_worker.py '<json spec>'`` (see :class:`Spec`). Phases:

- ``crash``: start the run (approving a write in interrupt mode) and reach a point that hangs —
  a tool body or the decision model. The parent SIGKILLs this process there; it never returns.
- ``resume``: ``graph.invoke(None, config, context=<same RunContext>)`` in a fresh process and
  print the run's output as JSON (``{"state": ...}``) on the last line of stdout.
- ``read``: under ``LANGGRAPH_STRICT_MSGPACK=true``, read a finished thread back from the SQLite
  file, validate it into ``AgentState`` and print what the serializer logged or warned.

Everything a test asserts on is written durably (appended and fsynced) before the hang, so a
SIGKILL cannot lose it: ``tools.jsonl`` (one line per tool body start: tool, idempotency key,
attempt) and ``model.jsonl`` (one line per model call: the step it was given).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from pydantic import BaseModel, ConfigDict

# Runnable as a script from the repository root, without installing the test package.
_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import fencepost as fp  # noqa: E402

HANG_SECONDS = 600.0
"""How long a hang point sleeps: the test kills the process as soon as it hears it is there
(``HANDSHAKE_FD``); the bound only keeps an orphan from living forever."""

HANDSHAKE_FD = "FENCEPOST_CRASH_HANDSHAKE_FD"
"""The environment variable naming the pipe the crash phase writes one byte to once it is at
its hang point: the test waits on that byte (or the pipe's end, if the process exits), never on
a clock, so a loaded machine cannot make it give up early."""

READ_TOOL = "search_logs"
IDEMPOTENT_WRITE_TOOL = "record_note"
NON_IDEMPOTENT_WRITE_TOOL = "post_message"
FIRST_CALL_ID = "call-0001"
CAPABILITIES = frozenset({"logs:read", "notes:write", "chat:post"})


class Spec(BaseModel):
    """What one child process does. Serialised as JSON on the command line."""

    model_config = ConfigDict(extra="forbid")

    phase: Literal["crash", "resume", "read"]
    backend: Literal["sqlite", "postgres"] = "sqlite"
    checkpoint: str
    """SQLite checkpoint file, or the Postgres DSN."""
    ledger: str
    """SQLite ledger file, or the Postgres DSN."""
    workdir: str
    """Where the hang markers and the durable tool/model logs live."""
    thread_id: str
    run_id: str
    deadline: datetime
    """The run's absolute deadline: the same instant in every process (the same RunContext)."""
    tool: str = READ_TOOL
    """The tool the model proposes first."""
    hang: Literal["tool", "model", "none"] = "tool"
    """Where the crash phase hangs (once per workdir: a retry in the next process goes on)."""
    hang_step: int = 1
    """With ``hang="model"``: the step whose decision hangs."""
    steps: int = 4
    tool_calls: int = 2
    serde: Literal["fencepost", "plain"] = "fencepost"
    """``read`` only: ``plain`` reads with LangGraph's default serializer (the negative control)."""


class SearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    query: str


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    note: str


def _append(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line and fsync it: it must survive the SIGKILL that follows."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _first_time(marker: Path) -> bool:
    """Create ``marker`` atomically; True only for the first process (and call) to get there."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, str(os.getpid()).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    handshake = os.environ.get(HANDSHAKE_FD)
    if handshake:
        os.write(int(handshake), b"!")
    return True


class Probe:
    """The durable logs and the hang-once points of one scenario."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.dir = Path(spec.workdir)
        self.tools_log = self.dir / "tools.jsonl"
        self.model_log = self.dir / "model.jsonl"
        self.marker = self.dir / "hanging"

    def tool_started(self, name: str, ctx: fp.ToolContext) -> None:
        _append(
            self.tools_log,
            {
                "tool": name,
                "key": ctx.idempotency_key,
                "attempt": ctx.attempt,
                "run_id": ctx.run_id,
                "pid": os.getpid(),
            },
        )
        if self.spec.hang == "tool" and _first_time(self.marker):
            time.sleep(HANG_SECONDS)  # killed here; a sync tool runs in a worker thread

    async def model_called(self, step: int) -> None:
        _append(self.model_log, {"step": step, "pid": os.getpid()})
        if self.spec.hang == "model" and step == self.spec.hang_step and _first_time(self.marker):
            await asyncio.sleep(HANG_SECONDS)  # killed here, mid-decision


def registry(probe: Probe) -> fp.ToolRegistry:
    """A read, an idempotent write and a non-idempotent write, each logging its start durably."""

    def search(args: SearchArgs, ctx: fp.ToolContext) -> Any:
        probe.tool_started(READ_TOOL, ctx)
        return {"hits": [{"id": "log-1", "line": "500 /checkout"}]}

    def record_note(args: NoteArgs, ctx: fp.ToolContext) -> Any:
        # Honours the idempotency key: a retry with the same key would upsert, not duplicate.
        probe.tool_started(IDEMPOTENT_WRITE_TOOL, ctx)
        return {"recorded": ctx.idempotency_key}

    def post_message(args: NoteArgs, ctx: fp.ToolContext) -> Any:
        probe.tool_started(NON_IDEMPOTENT_WRITE_TOOL, ctx)
        return {"posted": True}

    common: dict[str, Any] = {"timeout_seconds": 30}
    return fp.ToolRegistry(
        [
            fp.ToolSpec(
                name=READ_TOOL,
                description="Search logs.",
                args_model=SearchArgs,
                effect=fp.Effect.READ,
                capability="logs:read",
                execute=search,
                **common,
            ),
            fp.ToolSpec(
                name=IDEMPOTENT_WRITE_TOOL,
                description="Record a note, keyed by the idempotency key.",
                args_model=NoteArgs,
                effect=fp.Effect.WRITE,
                capability="notes:write",
                idempotent=True,
                execute=record_note,
                **common,
            ),
            fp.ToolSpec(
                name=NON_IDEMPOTENT_WRITE_TOOL,
                description="Post a chat message (no idempotency).",
                args_model=NoteArgs,
                effect=fp.Effect.WRITE,
                capability="chat:post",
                idempotent=False,
                execute=post_message,
                **common,
            ),
        ]
    )


class CrashModel:
    """A decision model whose answer depends only on the input, so a new process continues it.

    (A scripted model counts its calls in memory, which a crash resets.) No observation yet: call
    the scenario's tool. Last observation a result: a final answer citing it. An error: abstain.
    """

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    async def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:
        await self.probe.model_called(input.step)
        if not input.observations:
            arguments: dict[str, Any] = (
                {"query": "checkout 500"}
                if self.probe.spec.tool == READ_TOOL
                else {"note": "checkout is failing"}
            )
            return fp.ToolProposal(
                call_id=FIRST_CALL_ID, tool_name=self.probe.spec.tool, arguments=arguments
            )
        last = input.observations[-1]
        if last.is_evidence:
            return fp.FinalProposal(
                answer=fp.AnswerPayload(text="deploy 42 broke checkout", citations=(last.call_id,))
            )
        return fp.AbstainProposal(reason="insufficient_evidence")


def run_context(spec: Spec) -> fp.RunContext:
    """The trusted context: identical in every process of a scenario."""
    return fp.RunContext(
        tenant_id="acme",
        principal=fp.Principal(id="u-1", capabilities=CAPABILITIES),
        deadline=fp.Deadline(at=spec.deadline),
    )


@contextmanager
def durable_parts(spec: Spec) -> Iterator[tuple[Any, fp.Ledger]]:
    """The checkpointer and the ledger for ``spec.backend``, both with fencepost's serializer."""

    if spec.backend == "sqlite":
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        from fencepost.adapters import SqliteLedger

        conn = sqlite3.connect(spec.checkpoint, check_same_thread=False)
        ledger = SqliteLedger(spec.ledger)
        try:
            yield SqliteSaver(conn), ledger
        finally:
            ledger.close()
            conn.close()
    else:
        from langgraph.checkpoint.postgres import PostgresSaver

        from fencepost.adapters import PostgresLedger

        with PostgresSaver.from_conn_string(spec.checkpoint) as saver:
            saver.setup()
            pg_ledger = PostgresLedger(spec.ledger)
            try:
                yield saver, pg_ledger
            finally:
                pg_ledger.close()


def _config(spec: Spec) -> RunnableConfig:
    return {"configurable": {"thread_id": spec.thread_id}}


# Every invoke passes durability="sync": each checkpoint is written before the next step starts.
# With the default "async" a SIGKILL may also lose the checkpoint written just before the hang,
# which moves the resume point one node back (an approval would be asked for again); "sync" keeps
# the scenario deterministic. The ledger's reservations are synchronous either way.


def crash(spec: Spec) -> int:
    """Start the run and hang where the spec says; reaching the end means the hang never came."""
    probe = Probe(spec)
    ctx = run_context(spec)
    with durable_parts(spec) as (saver, ledger):
        graph = fp.build_agent_graph(
            registry(probe), CrashModel(probe), approval="interrupt", ledger=ledger
        ).compile(checkpointer=saver)
        budget = fp.RuntimeBudget(steps_remaining=spec.steps, tool_calls_remaining=spec.tool_calls)
        out = graph.invoke(
            fp.start("why is checkout failing?", budget, run_id=spec.run_id),
            _config(spec),
            context=ctx,
            durability="sync",
        )
        if "__interrupt__" in out:
            # The write is approved before the crash: the resume must not need a second approval.
            from langgraph.types import Command

            out = graph.invoke(
                Command(resume="approve"), _config(spec), context=ctx, durability="sync"
            )
    print(json.dumps({"unexpected": "the crash phase finished without hanging"}))
    return 3


def resume(spec: Spec) -> int:
    """A new process picks the thread up where the dead one left it."""
    probe = Probe(spec)
    with durable_parts(spec) as (saver, ledger):
        graph = fp.build_agent_graph(
            registry(probe), CrashModel(probe), approval="interrupt", ledger=ledger
        ).compile(checkpointer=saver)
        out = graph.invoke(None, _config(spec), context=run_context(spec), durability="sync")
        interrupted = "__interrupt__" in out
        state = fp.run_output(out)
    print(json.dumps({"state": state.model_dump(mode="json"), "interrupted": interrupted}))
    return 0


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname}: {record.getMessage()}")


def read(spec: Spec) -> int:
    """Read a finished thread back from the SQLite file under strict msgpack, as a reporter would."""
    import sqlite3

    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    from langgraph.checkpoint.sqlite import SqliteSaver

    records = _Records()
    serde_logger = logging.getLogger("langgraph.checkpoint.serde.jsonplus")
    serde_logger.addHandler(records)
    serde_logger.setLevel(logging.DEBUG)
    serde = JsonPlusSerializer()
    types: dict[str, str] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        conn = sqlite3.connect(spec.checkpoint)
        try:
            saver = SqliteSaver(conn, serde=serde)
            tup = saver.get_tuple(_config(spec))
            assert tup is not None, "no checkpoint for the thread"
            # The run record is a delta channel: LangGraph reassembles it from the thread's
            # writes, so it is read through a compiled graph's get_state.
            from fencepost.adapters.scripted import ScriptedDecisionModel

            reader = fp.build_agent_graph(fp.ToolRegistry([]), ScriptedDecisionModel([]))
            values = reader.compile(checkpointer=saver).get_state(tup.config).values
            record = values.get("run") or {}
            for name in ("budget", "termination", "observations", "receipts", "manifests"):
                value = record.get(name)
                item = value[0] if isinstance(value, list | tuple) and value else value
                types[name] = f"{type(item).__module__}.{type(item).__qualname__}"
            error: str | None = None
            try:
                state = fp.run_output(values)
                dumped: dict[str, Any] | None = state.model_dump(mode="json")
            except Exception as exc:  # reported to the parent, which fails the test
                error, dumped = type(exc).__name__, None
        finally:
            conn.close()
    print(
        json.dumps(
            {
                "strict": os.environ.get("LANGGRAPH_STRICT_MSGPACK"),
                "logged": records.messages,
                "warnings": [str(w.message) for w in caught],
                "types": types,
                "error": error,
                "state": dumped,
            }
        )
    )
    return 0


def export_spans(path: str) -> None:
    """Export every span this process ends to ``path`` as a JSON line, appended and fsynced
    (``FENCEPOST_TEST_SPANS``: the span tests read what a killed process exported)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Appended(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            for span in spans:
                assert isinstance(span, ReadableSpan)
                _append(Path(path), _span_record(span))
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Appended()))
    trace.set_tracer_provider(provider)


def _span_record(span: Any) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "name": span.name,
        "trace": span.context.trace_id,
        "span": span.context.span_id,
        "parent": span.parent.span_id if span.parent is not None else None,
        "end": span.end_time,
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, **dict(e.attributes or {})} for e in span.events],
    }


def run_phase(
    spec_json: str, out: str, err: str, env: dict[str, str], handshake: Connection | None
) -> None:
    """The entry of a forked worker process: one phase, its stdout and stderr in ``out`` and
    ``err`` (the last stdout line is the report), the exit status that of the script.

    ``env`` is the test's environment, taken as this process's own: a forked process has the
    environment its fork server started with, not the one the test set since. ``handshake`` is
    the write end of the pipe the crash phase signals its hang point on (``HANDSHAKE_FD``)."""
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(env)
    if handshake is not None:
        os.environ[HANDSHAKE_FD] = str(handshake.fileno())
    try:
        code = main([__file__, spec_json])
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def main(argv: list[str]) -> int:
    spec = Spec.model_validate_json(argv[1])
    if os.environ.get("FENCEPOST_TEST_SPANS"):
        export_spans(os.environ["FENCEPOST_TEST_SPANS"])
        # The developer logs beside them, one file per process.
        logging.basicConfig(
            filename=f"{os.environ['FENCEPOST_TEST_SPANS']}.{spec.phase}.log",
            level=logging.INFO,
            format="%(levelname)s %(name)s %(message)s",
        )
    return {"crash": crash, "resume": resume, "read": read}[spec.phase](spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
