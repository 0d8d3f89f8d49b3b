"""Shared test kit for graph tests: a small registry, contexts and run helpers."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.adapters import SqliteLedger
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.graph.containment import tool_threads
from fencepost.graph.settings import LoopConfig, settings_of
from fencepost.policy.keys import run_account
from fencepost.policy.tasks import pending_tasks
from fencepost.policy.tool_decorator import tool
from tests.unhurried import UNHURRIED_SECONDS


class OnTimeThreads(tool_threads.ToolThreads):
    """The tool-thread pool of a machine that schedules its threads on time: a call's body has
    started before its caller begins waiting for it, so its deadline always finds it running.

    Under load a worker thread may take a body only after the body's deadline; that body is
    withdrawn and never starts (``tests/graph/test_a_call_starts_only_while_its_run_is_live``).
    A test pinning what becomes of a body that did start (left behind, its thread no longer
    counted, its write uncertain) runs on this pool, so its body has started whatever the
    machine's load. It waits for the body's own signal, never for the clock; what the pool
    decides (slots, shares, withdrawn or left behind) is the real pool's.
    """

    async def start(
        self, fn: Callable[[], Any], deadline: float, tenant: str
    ) -> tool_threads.LoopJob | None:
        began = threading.Event()
        job = await super().start(_signalling(fn, began), deadline, tenant)
        if job is not None:
            # Held here, the caller's loop judges no deadline of this call before its body runs.
            _until_began(began)
        return job

    def start_blocking(
        self, fn: Callable[[], Any], deadline: float, tenant: str
    ) -> tool_threads.BlockingJob | None:
        began = threading.Event()
        job = super().start_blocking(_signalling(fn, began), deadline, tenant)
        if job is not None:
            _until_began(began)
        return job


def _signalling(fn: Callable[[], Any], began: threading.Event) -> Callable[[], Any]:
    def body() -> Any:
        began.set()
        return fn()

    return body


def _until_began(began: threading.Event) -> None:
    # No caller withdraws a job before its start returns, so its worker is sure to come.
    assert began.wait(30), "a body handed to a thread never started"


class SearchArgs(BaseModel):
    """The search tool's arguments, for tests that build their own ToolSpec around them."""

    model_config = ConfigDict(extra="forbid", strict=True)
    query: str


@dataclass
class Calls:
    """Records every tool body that actually ran."""

    log: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)

    def count(self, name: str) -> int:
        return sum(1 for n, _, _ in self.log if n == name)


ABSTAIN = fp.AbstainProposal(reason="insufficient_evidence")
"""The model declining to answer: ends a run insufficient_evidence."""
DOCS = frozenset({"docs:write"})
"""The capability the upload registry's tools need."""


def make_registry(
    calls: Calls, *, search_result: Any = None, extra: Sequence[fp.ToolSpec] = ()
) -> fp.ToolRegistry:
    @tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=UNHURRIED_SECONDS)
    def search_logs(query: str, ctx: fp.ToolContext) -> Any:
        """Search logs."""
        calls.log.append(("search_logs", {"query": query}, ctx.idempotency_key))
        return (
            search_result
            if search_result is not None
            else {"hits": [{"id": "log-1", "line": "500 /checkout"}]}
        )

    @tool(effect=fp.Effect.WRITE, capability="notes:write", timeout_seconds=UNHURRIED_SECONDS)
    async def write_note(note: str, ctx: fp.ToolContext) -> Any:
        """Write a note."""
        calls.log.append(("write_note", {"note": note}, ctx.idempotency_key))
        return {"written": True}

    @tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=UNHURRIED_SECONDS)
    def explode(ctx: fp.ToolContext) -> Any:
        """Always fails."""
        calls.log.append(("explode", {}, ctx.idempotency_key))
        raise RuntimeError("password=hunter2 at db.internal:5432")

    @tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=0.3)
    async def hang(ctx: fp.ToolContext) -> Any:
        """Never returns."""
        calls.log.append(("hang", {}, ctx.idempotency_key))
        await asyncio.sleep(30)
        return {"never": True}

    @tool(effect=fp.Effect.READ, capability="admin", timeout_seconds=UNHURRIED_SECONDS)
    def admin_reset(ctx: fp.ToolContext) -> Any:
        """Admin only."""
        calls.log.append(("admin_reset", {}, ctx.idempotency_key))
        return {"reset": True}

    return fp.ToolRegistry([search_logs, write_note, explode, hang, admin_reset, *extra])


CAPS = frozenset({"logs:read", "notes:write"})


def context(
    *,
    tenant: str = "acme",
    principal: str = "u-1",
    caps: frozenset[str] = CAPS,
    seconds: float | None = UNHURRIED_SECONDS,
    deadline: fp.Deadline | None = None,
) -> fp.RunContext:
    return fp.RunContext(
        tenant_id=tenant,
        principal=fp.Principal(id=principal, capabilities=caps),
        deadline=deadline
        if deadline is not None
        else (fp.Deadline.after(seconds) if seconds else None),
    )


def call(tool: str = "search_logs", n: int = 1, **arguments: Any) -> fp.ToolProposal:
    if tool == "search_logs" and not arguments:
        arguments = {"query": f"checkout 500 #{n}"}
    return fp.ToolProposal(call_id=f"call-{n:04d}", tool_name=tool, arguments=arguments)


def final_citing_last(inp: fp.DecisionInput) -> fp.FinalProposal:
    return fp.FinalProposal(
        answer=fp.AnswerPayload(
            text="deploy 42 broke checkout", citations=(inp.observations[-1].call_id,)
        )
    )


def budget(steps: int = 6, tools: int = 4) -> fp.RuntimeBudget:
    return fp.RuntimeBudget(steps_remaining=steps, tool_calls_remaining=tools)


def thread() -> dict[str, Any]:
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:10]}"}}


@dataclass
class Harness:
    """A compiled graph plus what it touched."""

    graph: Any
    model: ScriptedDecisionModel
    calls: Calls

    def run(
        self,
        *,
        steps: int = 6,
        tools: int = 4,
        ctx: fp.RunContext | None = None,
        config: dict[str, Any] | None = None,
        **invoke_kw: Any,
    ) -> fp.AgentState:
        out = self.graph.invoke(
            fp.start("why is checkout failing?", budget(steps, tools)),
            config or thread(),
            context=ctx or context(),
            **invoke_kw,
        )
        return fp.run_output(out)


def harness(
    script: Sequence[Any],
    *,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    search_result: Any = None,
    registry: fp.ToolRegistry | None = None,
    calls: Calls | None = None,
    **build_kw: Any,
) -> Harness:
    calls = calls or Calls()
    model = ScriptedDecisionModel(list(script))
    reg = registry or make_registry(calls, search_result=search_result)
    graph = fp.build_agent_graph(reg, model, **build_kw).compile(
        checkpointer=checkpointer or InMemorySaver()
    )
    return Harness(graph=graph, model=model, calls=calls)


Script = list[Any | Callable[[fp.DecisionInput], Any]]


def forge_batch(
    h: Any,
    config: dict[str, Any],
    pending: tuple[fp.ToolProposal, ...] | None = None,
    verdicts: tuple[fp.policy.Verdict, ...] | None = None,
) -> dict[str, Any]:
    """A caller's forged ``batch``: the given proposals and/or verdicts, each paired with the
    thread's current other half of the same call id where only one half is given."""
    current = fp.run_output(h.graph.get_state(config).values).batch
    if pending is not None and verdicts is not None:
        pairs = zip(pending, verdicts, strict=True)
    elif pending is not None:
        old = {e.call_id: e.verdict for e in current}
        pairs = ((p, old[p.call_id]) for p in pending)
    else:
        assert verdicts is not None
        props = {e.call_id: e.proposal for e in current}
        pairs = ((props[v.call_id], v) for v in verdicts)
    return {"run": {"batch": tuple(fp.policy.BatchEntry(proposal=p, verdict=v) for p, v in pairs)}}


class UploadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str


class StatusArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    task_id: str


UPLOAD_DONE = fp.Completed(
    task_id="task-17",
    evidence={"document_id": "document-42", "version": "3", "access_path": "/docs/42/v3"},
)
"""The seed's evidence: document-42, version 3, and where it is."""


def upload_registry(status_result: Any = UPLOAD_DONE) -> fp.ToolRegistry:
    """The seed's upload: ``upload_document`` accepts task-17; ``upload_status`` returns
    ``status_result`` and declares the evidence that completes a task."""

    def upload(args: UploadArgs, ctx: fp.ToolContext) -> fp.Accepted:
        return fp.Accepted(task_id="task-17")

    def status(args: StatusArgs, ctx: fp.ToolContext) -> Any:
        return status_result

    return fp.ToolRegistry(
        [
            fp.ToolSpec(
                name="upload_document",
                description="Upload a document; returns a task id.",
                args_model=UploadArgs,
                effect=fp.Effect.READ,
                capability="docs:write",
                timeout_seconds=UNHURRIED_SECONDS,
                execute=upload,
            ),
            fp.ToolSpec(
                name="upload_status",
                description="The status of an upload task.",
                args_model=StatusArgs,
                effect=fp.Effect.READ,
                capability="docs:write",
                timeout_seconds=UNHURRIED_SECONDS,
                execute=status,
                completion_evidence=("document_id", "version", "access_path"),
                evidence_for=("upload_document",),
            ),
        ]
    )


UPLOAD = fp.ToolProposal(
    call_id="call-0001", tool_name="upload_document", arguments={"name": "a.pdf"}
)
"""The seed's upload: its tool accepts task-17."""
STATUS = fp.ToolProposal(
    call_id="call-0002", tool_name="upload_status", arguments={"task_id": "task-17"}
)
"""The status check of task-17 (its evidence shows it done with :data:`UPLOAD_DONE`)."""


def upload_graph(script: list[Any], *, status: Any = UPLOAD_DONE, **build: Any) -> Harness:
    """A harness over :func:`upload_registry` (``status``: what the status tool returns)."""
    return harness(script, registry=upload_registry(status), **build)


def thread_account(config: dict[str, Any]) -> str:
    """The ledger account of the run on ``config``'s thread (a top-level graph's)."""
    return run_account(config["configurable"]["thread_id"], "unused-with-a-thread")


@dataclass
class TwoTenants:
    """Tenant A's run stopped after its upload, and tenant B's graph on its own checkpointer,
    both on one thread id and one ledger."""

    ledger: fp.InMemoryLedger
    config: dict[str, Any]
    ctx_a: fp.RunContext
    ctx_b: fp.RunContext
    a: Harness
    b: Harness


def two_tenants(b_script: list[Any]) -> TwoTenants:
    """:class:`TwoTenants`: A runs upload, status, final; B runs ``b_script``."""
    ledger = fp.InMemoryLedger()
    config = thread()
    ctx_a, ctx_b = context(caps=DOCS), context(tenant="globex", principal="u-9", caps=DOCS)
    a = upload_graph([UPLOAD, STATUS, final_citing_all], ledger=ledger)
    start_upload(a, config, ctx_a)
    b = upload_graph(b_script, ledger=ledger)
    return TwoTenants(ledger, config, ctx_a, ctx_b, a, b)


def start_upload(h: Harness, config: dict[str, Any], ctx: fp.RunContext) -> None:
    """Start a run and stop it after its first tool step ran (the upload, accepted)."""
    h.graph.invoke(
        fp.start("upload", budget(steps=6, tools=4)),
        config,
        context=ctx,
        interrupt_after=["execute"],
    )
    _assert_accepted(state_of(h, config))


async def astart_upload(h: Harness, config: dict[str, Any], ctx: fp.RunContext) -> None:
    """:func:`start_upload` on the async graph (``ainvoke``)."""
    await h.graph.ainvoke(
        fp.start("upload", budget(steps=6, tools=4)),
        config,
        context=ctx,
        interrupt_after=["execute"],
    )
    _assert_accepted(fp.run_output((await h.graph.aget_state(config)).values))


def _assert_accepted(state: fp.AgentState) -> None:
    # What the tests after it build on: else a test of completions fails later, and for another
    # reason (an upload that timed out leaves no task, so "nothing pending" holds vacuously).
    accepted = [r.task_id for r in pending_tasks(state.receipts)]
    assert accepted == ["task-17"], (state.receipts, state.last_error_code)


@contextmanager
def sqlite_files(tmp_path: Path) -> Iterator[tuple[SqliteSaver, SqliteLedger]]:
    """A SqliteSaver and a SqliteLedger on files: what a new process opens again."""
    conn = sqlite3.connect(tmp_path / "runs.db", check_same_thread=False)
    ledger = SqliteLedger(tmp_path / "ledger.db")
    try:
        yield SqliteSaver(conn), ledger
    finally:
        ledger.close()
        conn.close()


def state_of(h: Harness, config: dict[str, Any]) -> fp.AgentState:
    """The thread's state as an AgentState."""
    return fp.run_output(h.graph.get_state(config).values)


def paused_for_approval(**build_kw: Any) -> tuple[Harness, dict[str, Any], fp.RunContext]:
    """A run paused for approval of its first call, a write; then it answers, citing it."""
    h = harness(
        [call("write_note", 1, note="a"), final_citing_last, final_citing_last],
        approval="interrupt",
        **build_kw,
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    assert h.graph.get_state(config).next == ("approve",)
    return h, config, ctx


def final_citing_all(inp: fp.DecisionInput) -> fp.FinalProposal:
    """A final answer citing every successful observation."""
    cited = tuple(o.call_id for o in inp.observations if o.kind == "tool_result")
    return fp.FinalProposal(answer=fp.AnswerPayload(text="Uploaded.", citations=cited))


def upload_accepted() -> tuple[Harness, dict[str, Any], fp.RunContext]:
    """A run stopped after an upload its tool accepted (a task pending, not shown done)."""
    h = harness(
        [
            fp.ToolProposal(
                call_id="call-0001", tool_name="upload_document", arguments={"name": "a.pdf"}
            ),
            final_citing_all,
            final_citing_all,
            ABSTAIN,
        ],
        registry=upload_registry({"status": "done"}),
    )
    config, ctx = thread(), context(caps=DOCS)
    h.graph.invoke(
        fp.start("upload", budget(steps=5, tools=3)),
        config,
        context=ctx,
        interrupt_after=["execute"],
    )
    return h, config, ctx


def loop_settings() -> LoopConfig:
    """The settings a built graph's nodes run with, for calling a node's step directly."""
    cfg = settings_of(fp.build_agent_graph(make_registry(Calls()), ScriptedDecisionModel([])))
    assert cfg is not None
    return cfg


def mid_run_state(step: int = 2, **budget: Any) -> fp.AgentState:
    """A run's state at model step ``step`` (its budget view overridden by ``budget``)."""
    return fp.AgentState(
        run_id="run-0001",
        tenant_id="acme",
        principal_id="u-1",
        question="why?",
        step=step,
        budget=fp.RuntimeBudget(
            **({"steps_remaining": 5, "tool_calls_remaining": 4, "tokens_used": 7} | budget)
        ),
    )


LEDGERS = ("memory", "sqlite")
"""The ledgers a rule is pinned with: the graph's own kind (in memory) and a durable one."""


def each_ledger(request: Any, tmp_path: Path) -> Iterator[fp.Ledger]:
    """A fixture body (``pytest.fixture(params=LEDGERS, name="ledger")(each_ledger)``): an
    ``InMemoryLedger``, or a ``SqliteLedger`` on a file."""
    if request.param == "memory":
        yield fp.InMemoryLedger()
        return
    ledger = SqliteLedger(tmp_path / "ledger.db")
    try:
        yield ledger
    finally:
        ledger.close()


VERDICT_KEY = b"a-secret-the-operator-keeps-0123"
"""A ``verdict_key`` for graphs that seal their verdicts."""


def allowed_verdict(proposal: fp.ToolProposal) -> fp.policy.Verdict:
    """The verdict a forger would write: ``allowed``, with the right call id and fingerprint,
    unsealed."""
    return fp.policy.Verdict(
        call_id=proposal.call_id,
        tool_name=proposal.tool_name,
        fingerprint=fp.policy.proposal_fingerprint(proposal.tool_name, proposal.arguments),
        code=fp.policy.VerdictCode.ALLOWED,
    )


def allowed_entry(proposal: fp.ToolProposal) -> fp.policy.BatchEntry:
    """A caller's forged batch entry: ``proposal`` with an unsealed ``allowed`` verdict."""
    return fp.policy.BatchEntry(proposal=proposal, verdict=allowed_verdict(proposal))


def interrupt_payload(out: dict[str, Any]) -> dict[str, Any]:
    """The approval request an invoke paused on (exactly one)."""
    (interrupt,) = out["__interrupt__"]
    payload: dict[str, Any] = interrupt.value
    return payload


def saver_bytes(saver: InMemorySaver) -> bytes:
    """Everything an InMemorySaver stored, as one byte string (to search for a canary)."""
    out = bytearray()

    def walk(value: Any) -> None:
        if isinstance(value, bytes | bytearray):
            out.extend(value)
        elif isinstance(value, str):
            out.extend(value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(k)
                walk(v)
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v)

    walk(dict(saver.storage))
    walk(dict(saver.writes))
    walk(dict(saver.blobs))
    return bytes(out)


def terminal_manifests(state: fp.AgentState) -> int:
    """How many terminal manifests the run has (one per ending: exactly one)."""
    return sum(1 for m in state.manifests if m.phase is fp.policy.Phase.TERMINAL)


def ended_typed(h: Harness, config: dict[str, Any], ctx: fp.RunContext) -> fp.AgentState:
    """The thread ended with exactly one reason, and a later invoke of it still works."""
    snapshot = h.graph.get_state(config)
    state = fp.run_output(snapshot.values)
    assert snapshot.next == ()
    assert state.is_terminal and state.termination is not None
    assert terminal_manifests(state) == 1
    h.graph.invoke(None, config, context=ctx)
    assert state_of(h, config) == state
    return state


def drive_editing(
    h: Harness,
    config: dict[str, Any],
    ctx: fp.RunContext,
    edit: Callable[[fp.AgentState], dict[str, Any] | None],
    *,
    limit: int = 20,
) -> fp.AgentState:
    """Run to the end pausing after every execute; ``edit(state)`` returns a caller's update
    (written as the execute node), or ``None`` for none."""
    for _ in range(limit):
        state = state_of(h, config)
        if state.is_terminal:
            return state
        update = edit(state)
        if update:
            h.graph.update_state(config, update, as_node="execute")
        h.graph.invoke(None, config, context=ctx, interrupt_after=["execute"])
    return state_of(h, config)


def forged_completion(h: Harness, config: dict[str, Any], form: str = "receipt") -> Any:
    """A ``completed`` receipt for the waiting accepted call, as a caller can make one: a
    Receipt, or (``form="json"``) the JSON a server client sends."""
    [waiting] = pending_tasks(state_of(h, config).receipts)
    forged: Any = waiting.model_copy(update={"status": fp.ReceiptStatus.COMPLETED})
    return forged.model_dump(mode="json") if form == "json" else forged


def forge_completion(h: Harness, config: dict[str, Any], form: str = "receipt") -> None:
    """Append :func:`forged_completion` to the receipts, and clear the open tasks."""
    forged = forged_completion(h, config, form)
    h.graph.update_state(
        config, {"run": {"receipts": [forged], "open_tasks": []}}, as_node="execute"
    )


def edit_and_continue(
    h: Harness, config: dict[str, Any], ctx: fp.RunContext, update: dict[str, Any], how: str
) -> fp.AgentState:
    """Apply a caller's state edit (``how``: ``update_state`` as the decide node, or a
    ``Command`` going to execute), then let the thread continue."""
    if how == "update_state":
        h.graph.update_state(config, update, as_node="decide")
        h.graph.invoke(None, config, context=ctx)
        return state_of(h, config)
    command = Command(update=update, goto="execute")
    waiting = h.graph.get_state(config).next
    if waiting not in ((), ("execute",)):
        # A goto beside another node the thread waits on (the approval) would make two writers
        # of one field in one step: refused whole, nothing saved.
        before = h.graph.get_state(config)
        with pytest.raises(fp.CommandRefused):
            h.graph.invoke(command, config, context=ctx)
        assert h.graph.get_state(config).config == before.config
    else:
        h.graph.invoke(command, config, context=ctx)
    return state_of(h, config)


def write_then_read_paused_before_read(
    first: str,
) -> tuple[Harness, dict[str, Any], fp.RunContext, fp.ToolProposal, fp.ToolProposal]:
    """A write answered with ``first`` ("approve" or "reject"), then a read paused before it
    runs."""
    write, read = call("write_note", 1, note="hi"), call(n=2)
    h = harness([write, read, ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    h.graph.invoke(Command(resume=first), config, context=ctx, interrupt_before=["execute"])
    if first == "approve":
        # Paused before the approved write runs; let it run, then pause before the read.
        h.graph.invoke(None, config, context=ctx, interrupt_before=["execute"])
    assert h.graph.get_state(config).next == ("execute",)
    assert state_of(h, config).pending == (read,)
    return h, config, ctx, write, read
