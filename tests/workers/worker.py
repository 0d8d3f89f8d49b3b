"""One worker process of the many-workers tests: pulls jobs from a Postgres queue and runs them.

Run as ``python tests/workers/worker.py <dsn> <name>``. Every worker of a test shares one
database (the DSN names a throwaway schema): one PostgresSaver (``open_checkpointer``), one
PostgresLedger and the tables below. The worker builds its graph once, says it is ready in
``fp_workers``, then loops: claim the oldest job it may take (``FOR UPDATE SKIP LOCKED``, so two
workers never take the same job), run it, write its result back. Jobs:

- ``start``: ``graph.invoke(fp.start(...), config, context=..., durability="sync")``;
- ``approve``: ``graph.invoke(Command(resume="approve"), ...)``;
- ``resume``: ``graph.invoke(None, ...)`` (a thread whose worker died);
- ``cancel``: ``fp.cancel(graph, config, context=...)``;
- ``read``: the thread's latest state (``graph.get_state``), as any later reader sees it.

A job may name the only worker that may take it (``only_worker``) or one that may not
(``not_worker``); ``per_worker_cap`` caps how many jobs of its batch one worker takes (so a
batch spreads over the workers without relying on timing); ``race`` holds every job of a race
group until all of them are claimed, so they start together on different workers.

Tool bodies record each start in ``fp_effects`` — UNIQUE (run id, call id, attempt) — before
doing anything else: a duplicate start of the same attempt is refused by the database itself and
logged in ``fp_duplicates``. A row in ``fp_hangs`` for the run makes its next tool body block
(after recording its start) until the test SIGKILLs the process.

The worker is bounded: it exits when its parent (the test) goes away or after ``LIFETIME_SECONDS``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from langchain_core.runnables import RunnableConfig
from pydantic import BaseModel, ConfigDict

# Runnable as a script from the repository root, without installing the test package.
_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import fencepost as fp  # noqa: E402

LIFETIME_SECONDS = 1800.0
"""A worker never outlives this, whatever happens to the test that started it (it also exits
when the test process goes away): longer than the module takes on a machine however busy, whose
workers started with it and serve it to the end."""
HANG_SECONDS = 60.0
"""How long a hanging tool body blocks: far longer than any test waits before the SIGKILL."""
RACE_WAIT_SECONDS = 20.0
POLL_SECONDS = 0.02

READ_TOOL = "search_logs"
WRITE_TOOL = "post_message"
"""A non-idempotent write: after a crash mid-call it is reported uncertain, never run again."""
CAPABILITIES = frozenset({"logs:read", "chat:post"})

TABLES = (
    """CREATE TABLE IF NOT EXISTS fp_jobs (
        id bigserial PRIMARY KEY,
        batch text NOT NULL,
        kind text NOT NULL,
        spec jsonb NOT NULL,
        only_worker text,
        not_worker text,
        per_worker_cap int,
        race text,
        race_size int,
        claimed_by text,
        claimed_pid int,
        done boolean NOT NULL DEFAULT false,
        result jsonb
    )""",
    "CREATE TABLE IF NOT EXISTS fp_workers (name text PRIMARY KEY, pid int NOT NULL)",
    """CREATE TABLE IF NOT EXISTS fp_effects (
        run_id text NOT NULL,
        call_id text NOT NULL,
        attempt int NOT NULL,
        tool text NOT NULL,
        worker text NOT NULL,
        pid int NOT NULL,
        UNIQUE (run_id, call_id, attempt)
    )""",
    """CREATE TABLE IF NOT EXISTS fp_duplicates (
        run_id text NOT NULL, call_id text NOT NULL, attempt int NOT NULL, worker text NOT NULL
    )""",
    "CREATE TABLE IF NOT EXISTS fp_hangs (run_id text PRIMARY KEY)",
    """CREATE TABLE IF NOT EXISTS fp_model_calls (
        run_id text NOT NULL, step int NOT NULL, worker text NOT NULL
    )""",
)


class RunSpec(BaseModel):
    """One run, as every worker sees it: the same thread, run id and trusted context."""

    model_config = ConfigDict(extra="forbid")

    thread_id: str
    run_id: str
    plan: str
    """What the decision model does (see :class:`PlanModel`); also the run's question."""
    steps: int
    tool_calls: int
    deadline: datetime
    """One absolute instant: the RunContext is the same on every worker and every resume."""
    principal: str = "u-1"
    """Who the caller says it acts for on this job (tenant ``acme``)."""
    rebind: bool = False
    """``approve`` only: also rewrite the state's principal to this job's (``Command(update=)``)."""


class SearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    query: str


class MessageArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    text: str


class Worker:
    def __init__(self, dsn: str, name: str) -> None:
        self.dsn = dsn
        self.name = name
        self.pid = os.getpid()

    # -- tools ------------------------------------------------------------------------------------

    def record_start(self, tool: str, ctx: fp.ToolContext) -> None:
        """The side effect, counted by the database: one row per (run, call id, attempt)."""
        key = (ctx.run_id, ctx.idempotency_key, ctx.attempt)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            try:
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO fp_effects VALUES (%s, %s, %s, %s, %s, %s)",
                        (*key, tool, self.name, self.pid),
                    )
                    hang = conn.execute(
                        "DELETE FROM fp_hangs WHERE run_id = %s RETURNING 1", (ctx.run_id,)
                    ).fetchone()
            except psycopg.errors.UniqueViolation:
                conn.execute("INSERT INTO fp_duplicates VALUES (%s, %s, %s, %s)", (*key, self.name))
                raise
        if hang:
            time.sleep(HANG_SECONDS)  # the start is committed: the test SIGKILLs us here

    def registry(self) -> fp.ToolRegistry:
        def search(args: SearchArgs, ctx: fp.ToolContext) -> Any:
            self.record_start(READ_TOOL, ctx)
            return {"hits": [{"id": f"log-{args.query}", "line": "500 /checkout"}]}

        def post(args: MessageArgs, ctx: fp.ToolContext) -> Any:
            self.record_start(WRITE_TOOL, ctx)
            return {"posted": True}

        return fp.ToolRegistry(
            [
                fp.ToolSpec(
                    name=READ_TOOL,
                    description="Search logs.",
                    args_model=SearchArgs,
                    effect=fp.Effect.READ,
                    capability="logs:read",
                    timeout_seconds=30,
                    execute=search,
                ),
                fp.ToolSpec(
                    name=WRITE_TOOL,
                    description="Post a chat message (no idempotency).",
                    args_model=MessageArgs,
                    effect=fp.Effect.WRITE,
                    capability="chat:post",
                    idempotent=False,
                    timeout_seconds=30,
                    execute=post,
                ),
            ]
        )

    # -- jobs -------------------------------------------------------------------------------------

    def claim(self, conn: psycopg.Connection[Any]) -> tuple[int, str, dict[str, Any], str] | None:
        with conn.transaction():
            row = conn.execute(
                """SELECT id, kind, spec, race FROM fp_jobs j
                   WHERE claimed_by IS NULL
                     AND (only_worker IS NULL OR only_worker = %(me)s)
                     AND (not_worker IS NULL OR not_worker <> %(me)s)
                     AND (per_worker_cap IS NULL OR per_worker_cap > (
                          SELECT count(*) FROM fp_jobs k
                          WHERE k.batch = j.batch AND k.claimed_by = %(me)s))
                   ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED""",
                {"me": self.name},
            ).fetchone()
            if row is None:
                return None
            conn.execute(
                "UPDATE fp_jobs SET claimed_by = %s, claimed_pid = %s WHERE id = %s",
                (self.name, self.pid, row[0]),
            )
        return row[0], row[1], row[2], row[3]

    def wait_for_race(self, conn: psycopg.Connection[Any], race: str) -> None:
        until = time.monotonic() + RACE_WAIT_SECONDS
        while time.monotonic() < until:
            claimed, size = conn.execute(
                "SELECT count(claimed_by), max(race_size) FROM fp_jobs WHERE race = %s", (race,)
            ).fetchone() or (0, 0)
            if claimed >= size:
                return
            time.sleep(0.005)
        raise TimeoutError(f"race {race}: not every job was claimed")

    def run_job(self, graph: Any, kind: str, spec: RunSpec) -> dict[str, Any]:
        from langgraph.types import Command

        config: RunnableConfig = {"configurable": {"thread_id": spec.thread_id}}
        ctx = fp.RunContext(
            tenant_id="acme",
            principal=fp.Principal(id=spec.principal, capabilities=CAPABILITIES),
            deadline=fp.Deadline(at=spec.deadline),
        )
        if kind == "read":
            state = fp.run_output(graph.get_state(config).values)
            return {"interrupted": False, "state": state.model_dump(mode="json")}
        if kind == "cancel":
            ended = fp.cancel(graph, config, context=ctx)
            assert ended is not None, "nothing ran on the thread"
            return {"interrupted": False, "state": ended.model_dump(mode="json")}
        payload: Any = {
            "start": fp.start(
                spec.plan,
                fp.RuntimeBudget(steps_remaining=spec.steps, tool_calls_remaining=spec.tool_calls),
                run_id=spec.run_id,
            ),
            "approve": Command(resume="approve"),
            "resume": None,
        }[kind]
        if kind == "approve" and spec.rebind:
            # The rewrite as an update of its own: written with the answer, it is refused
            # before anything is saved (an answer cannot change whose run it is).
            graph.invoke(
                Command(update={"run": {"principal_id": spec.principal}}),
                config,
                context=ctx,
                durability="sync",
            )
        out = graph.invoke(payload, config, context=ctx, durability="sync")
        state = fp.run_output(out)
        return {"interrupted": "__interrupt__" in out, "state": state.model_dump(mode="json")}

    def serve(self) -> int:
        from fencepost.adapters import PostgresLedger, open_checkpointer

        parent = os.getppid()
        until = time.monotonic() + LIFETIME_SECONDS
        with (
            open_checkpointer(self.dsn) as saver,
            PostgresLedger(self.dsn, max_size=2) as ledger,
            psycopg.connect(self.dsn, autocommit=True) as conn,
        ):
            graph = fp.build_agent_graph(
                self.registry(), PlanModel(self), approval="interrupt", ledger=ledger
            ).compile(checkpointer=saver)
            conn.execute("INSERT INTO fp_workers VALUES (%s, %s)", (self.name, self.pid))
            while time.monotonic() < until and os.getppid() == parent:
                job = self.claim(conn)
                if job is None:
                    time.sleep(POLL_SECONDS)
                    continue
                job_id, kind, spec, race = job
                try:
                    if race:
                        self.wait_for_race(conn, race)
                    result = self.run_job(graph, kind, RunSpec.model_validate(spec))
                except Exception:
                    result = {"error": traceback.format_exc()}
                result |= {"worker": self.name, "pid": self.pid}
                conn.execute(
                    "UPDATE fp_jobs SET done = true, result = %s WHERE id = %s",
                    (json.dumps(result), job_id),
                )
        return 0


class PlanModel:
    """A decision model whose answer depends only on its input, so any worker can continue a run.

    The question is the plan: ``answer`` reads once and answers citing it; ``exhaust_tools`` and
    ``exhaust_steps`` read with a new query every step (no repeat, so no ``no_progress``) until a
    budget runs out; ``abstain`` gives up at once; ``write`` posts a message, then answers. An
    error observation (``execution_uncertain`` after a crash) makes it abstain. Each call is
    counted in ``fp_model_calls`` before it answers.
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:
        w = self.worker
        async with await psycopg.AsyncConnection.connect(w.dsn, autocommit=True) as conn:
            await conn.execute(
                "INSERT INTO fp_model_calls VALUES (%s, %s, %s)", (input.run_id, input.step, w.name)
            )
        plan, seen = input.question, input.observations
        call_id = f"call-{len(seen) + 1:04d}"
        if plan == "abstain" or (seen and not seen[-1].is_evidence):
            return fp.AbstainProposal(reason="insufficient_evidence")
        if plan in ("exhaust_tools", "exhaust_steps"):
            return fp.ToolProposal(
                call_id=call_id, tool_name=READ_TOOL, arguments={"query": f"q{len(seen)}"}
            )
        if seen:
            return fp.FinalProposal(
                answer=fp.AnswerPayload(
                    text="deploy 42 broke checkout", citations=(seen[-1].call_id,)
                )
            )
        if plan == "write":
            return fp.ToolProposal(
                call_id=call_id, tool_name=WRITE_TOOL, arguments={"text": "restarting checkout"}
            )
        return fp.ToolProposal(call_id=call_id, tool_name=READ_TOOL, arguments={"query": "q0"})


def setup(dsn: str) -> None:
    """Create the queue and counting tables, the checkpoint tables and the ledger, once."""
    from fencepost.adapters import PostgresLedger, open_checkpointer

    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in TABLES:
            conn.execute(statement)
    with open_checkpointer(dsn), PostgresLedger(dsn, max_size=1):
        pass  # both set themselves up on opening


if __name__ == "__main__":
    sys.exit(Worker(sys.argv[1], sys.argv[2]).serve())
