"""A fuzz suite over the real, compiled graph.

Hypothesis draws a hostile run — model output (unknown and invalid tool names, garbage, deeply
nested, huge-integer and NaN arguments, duplicate call ids, batches with random ``depends_on``,
finals citing unknown evidence, abstentions, ``InvalidProposal``, model exceptions of every kind,
usage reports that are negative, huge or not numbers), tool behaviour (``Exception`` and
``BaseException`` subclasses carrying a canary secret, unserializable, nested and huge values,
sleeping past a short timeout or swallowing cancellation, ``Accepted``/``Completed``), a small
random budget with or without a parent account, approval ``terminate`` or ``interrupt`` answered
with random approve/reject/edit/garbage resumes, denials ending the run or as data, with or
without an approver policy (approving, rejecting, asking, raising, answering junk), and the
context's ``app_data`` — and runs it through ``invoke``, ``ainvoke`` or ``stream`` on a
file-backed ``SqliteSaver`` and a durable ``SqliteLedger``. Text anywhere in model output, tool
results, edits and contexts is drawn by ``tests.strategies.any_text``: now and then a lone
surrogate, which hypothesis's own ``text()`` never draws.

For every example:
1. no exception escapes ``invoke``/``ainvoke``/``stream``;
2. nothing runs that the gates did not allow: every tool body that started is a registered tool
   the principal may call, run once per call id, with arguments that pass its strict schema and
   equal the proposal the run records, under an ``allowed`` verdict the graph checkpointed for
   that call id and argument fingerprint, with its budget reserved and its start marked in the
   ledger before it ran, and a receipt; no write runs unless a human or the approver approved
   it (none in ``terminate`` mode without an approver); and (checked once
   per property) no body starts after its run has returned to its caller;
3. no budget axis is exceeded, in state or in the ledger (run account and parent: held <= the
   caller's limit; tokens a model reported past its step's hold only by the step that stops
   the run ``tokens_exhausted``), and state's ``used`` equals the ledger's ``held`` for the run
   account, after every return (and, streamed, after every superstep);
4. every run that returns without pausing has ended with exactly one ``TerminationReason`` (one
   terminal manifest), and invoking the finished thread again runs nothing and changes nothing;
5. the canary appears nowhere: not in the checkpoint database's or the ledger's file bytes (WAL
   included, read raw), not in any chunk of any stream mode, not in what ``invoke`` returns.

Examples: ``FENCEPOST_FUZZ_EXAMPLES`` in total across the properties (``make test``: 2,000 by
default; ``make fuzz``: 10,000). What the suite found is in ``test_fuzz_regressions.py``, and
those input classes are left out of the strategies until fixed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.types import Command
from pydantic import ValidationError

import fencepost as fp
from fencepost.adapters import SqliteLedger
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.graph.state import has_run
from fencepost.policy import BudgetAxis, Phase, UnknownAccount, VerdictCode, proposal_fingerprint
from fencepost.policy.keys import call_key, run_account, started_key
from tests.fuzz.hostile import (
    BY_NAME,
    CANARY,
    CAPABILITIES,
    WORLD,
    Behaviour,
    answers,
    behaviours,
    exception,
    json_values,
    turns,
)
from tests.strategies import any_text

TOTAL_EXAMPLES = int(os.environ.get("FENCEPOST_FUZZ_EXAMPLES", "2000"))
# The examples are split between the two properties below, 3:1.
INVOKE_EXAMPLES = max(1, TOTAL_EXAMPLES * 3 // 4)
STREAM_EXAMPLES = max(1, TOTAL_EXAMPLES - INVOKE_EXAMPLES)

settings.register_profile(
    "fencepost-fuzz",
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.filter_too_much,
    ],
    print_blob=True,
)
FUZZ = settings.get_profile("fencepost-fuzz")

CANARY_BYTES = CANARY.encode()
ROTATE_BYTES = 64 * 1024 * 1024
"""A store's files are replaced once they pass this size."""
MAX_RESUMES = 4
AXES = tuple(BudgetAxis)
EPSILON = 1e-9


# -- the store: one checkpoint file and one ledger file, reused across examples ----------------------


@dataclass(frozen=True)
class Build:
    """The ``build_agent_graph`` settings an example runs with."""

    approval: str
    tokens_per_step: int
    max_concurrent_tools: int
    repeat_limit: int
    model_retries: int
    answer_margin: int
    require_citations: bool
    verdict_key: bool = False
    """Whether the gate seals its verdicts (``VERDICT_KEY``); only such runs get forged batches."""
    denial: str = "end_run"
    """What a capability or semantic denial does (``build_agent_graph(denial=...)``)."""
    approver: str = "none"
    """Which of :data:`APPROVERS` answers first about each write (``"none"``: no approver)."""


def _mixed(request: fp.ApproverInput) -> fp.ApproverDecision:
    """Approve, reject or ask, by the call id: the same answer for the same call."""
    pick = sum(request.proposal.call_id.encode()) % 3
    if pick == 0:
        return fp.ApproverDecision.approve()
    return fp.ApproverDecision.reject("fuzz_mixed") if pick == 1 else fp.ApproverDecision.ask()


def _raises(request: fp.ApproverInput) -> fp.ApproverDecision:
    raise RuntimeError(CANARY)


CONTROL_FLOW = ("CancelledError", "GeneratorExit", "SystemExit", "KeyboardInterrupt")
"""What an approver may raise that nobody asked for: its failure (``approver_failed``)."""


def _breaks_out(request: fp.ApproverInput) -> fp.ApproverDecision:
    raise exception(CONTROL_FLOW[sum(request.proposal.call_id.encode()) % len(CONTROL_FLOW)])


async def _async_breaks_out(request: fp.ApproverInput) -> fp.ApproverDecision:
    await asyncio.sleep(0)
    raise exception(CONTROL_FLOW[sum(request.proposal.call_id.encode()) % len(CONTROL_FLOW)])


async def _async_approve(request: fp.ApproverInput) -> fp.ApproverDecision:
    await asyncio.sleep(0)
    return fp.ApproverDecision.approve()


APPROVERS: dict[str, Any] = {
    "none": None,
    "approve": lambda request: fp.ApproverDecision.approve(),
    "async_approve": _async_approve,
    "reject": lambda request: fp.ApproverDecision.reject("fuzz_reject"),
    "ask": lambda request: fp.ApproverDecision.ask(),
    "mixed": _mixed,
    "raises": _raises,
    "breaks_out": _breaks_out,
    "async_breaks_out": _async_breaks_out,
    "junk": lambda request: {"decision": "approve"},
}
"""The approvers an example's graph may have, by name (a Build is hashable)."""
NO_APPROVAL = frozenset({"reject", "raises", "breaks_out", "async_breaks_out", "junk"})
"""Approvers under which no write is ever approved by the approver."""


class Delegate:
    """The graph's decision model: plays back the current example's script."""

    def __init__(self) -> None:
        self.current = ScriptedDecisionModel([])

    async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:
        return await self.current.decide(inp, deadline=deadline)


@dataclass
class Store:
    """A file-backed SqliteSaver and SqliteLedger, and the graphs compiled over them."""

    root: Path
    generation: int = 0
    model: Delegate = field(default_factory=Delegate)
    builders: dict[Build, Any] = field(default_factory=dict)
    agraphs: dict[Build, Any] = field(default_factory=dict)
    aio: AsyncSide | None = None
    clean: dict[Path, tuple[int, int]] = field(default_factory=dict)
    """Each file's (size, mtime) when its bytes were last found free of the canary."""
    graphs: dict[Build, Any] = field(default_factory=dict)
    conn: sqlite3.Connection | None = None
    saver: SqliteSaver | None = None
    ledger: SqliteLedger | None = None

    def open(self) -> None:
        self.generation += 1
        conn = sqlite3.connect(self.checkpoint_path, check_same_thread=False)
        # The file is scanned, not crash-tested: fsync per write would only slow the search.
        conn.execute("PRAGMA synchronous = OFF")
        self.conn = conn
        self.saver = SqliteSaver(conn)
        self.ledger = SqliteLedger(self.ledger_path, synchronous="NORMAL")
        self.builders = {}
        self.graphs = {}
        self.agraphs = {}

    def close(self) -> None:
        if self.aio is not None:
            self.aio.close()
            self.aio = None
        if self.ledger is not None:
            self.ledger.close()
        if self.conn is not None:
            self.conn.close()
        self.conn = self.saver = self.ledger = None

    @property
    def checkpoint_path(self) -> Path:
        return self.root / f"checkpoints-{self.generation}.db"

    @property
    def ledger_path(self) -> Path:
        return self.root / f"ledger-{self.generation}.db"

    def files(self) -> list[Path]:
        paths = []
        for base in (self.checkpoint_path, self.ledger_path):
            for suffix in ("", "-wal", "-journal"):
                path = Path(f"{base}{suffix}")
                if path.exists():
                    paths.append(path)
        return paths

    def leaks(self, secret: bytes) -> bool:
        """Whether ``secret`` is in any of the files' raw bytes.

        A file unchanged (size and mtime) since it was last found clean is not read again: in
        WAL mode every write lands in the ``-wal`` file first (read each time), and the main
        file changes only when SQLite checkpoints the WAL into it.
        """
        for path in self.files():
            stat = path.stat()
            seen = (stat.st_size, stat.st_mtime_ns)
            if self.clean.get(path) == seen:
                continue
            if secret in path.read_bytes():
                return True
            self.clean[path] = seen
        return False

    def rotate_if_large(self) -> None:
        if sum(p.stat().st_size for p in self.files()) > ROTATE_BYTES:
            # The full scan of the files being retired already passed with the last example.
            self.close()
            self.open()

    def builder(self, build: Build) -> Any:
        """The uncompiled graph (over this store's ledger) for ``build``."""
        if build not in self.builders:
            self.builders[build] = fp.build_agent_graph(
                fp.ToolRegistry(list(BY_NAME.values())),
                self.model,
                ledger=self.ledger,
                approval=build.approval,  # type: ignore[arg-type]
                tokens_per_step=build.tokens_per_step,
                max_concurrent_tools=build.max_concurrent_tools,
                repeat_limit=build.repeat_limit,
                model_retries=build.model_retries,
                answer_margin=build.answer_margin,
                require_citations=build.require_citations,
                verdict_key=VERDICT_KEY if build.verdict_key else None,
                denial=build.denial,  # type: ignore[arg-type]
                approver=APPROVERS[build.approver],
            )
        return self.builders[build]

    def graph(self, build: Build) -> Any:
        """``build`` compiled over the sync saver (``invoke``, ``stream``, and every read)."""
        if build not in self.graphs:
            self.graphs[build] = self.builder(build).compile(checkpointer=self.saver)
        return self.graphs[build]

    def ainvoke(self, build: Build, payload: Any, out: Outcome) -> Any:
        """``ainvoke`` of ``build`` on a long-lived event loop (as a server runs graphs), over an
        ``AsyncSqliteSaver`` on the same checkpoint file."""
        if self.aio is None:
            self.aio = AsyncSide(self.checkpoint_path)
        if build not in self.agraphs:
            self.agraphs[build] = self.builder(build).compile(checkpointer=self.aio.saver)
        graph = self.agraphs[build]
        return self.aio.run(graph.ainvoke(payload, out.config, context=out.ctx))


class AsyncSide:
    """An event loop on its own thread, with an async checkpointer bound to it.

    Whatever escapes the loop itself (asyncio re-raises a task's ``SystemExit`` and
    ``KeyboardInterrupt`` out of ``run_forever``) is recorded, and the loop goes on serving.
    """

    def __init__(self, path: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.escaped: list[BaseException] = []
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, name="fuzz-async", daemon=True)
        self.thread.start()
        self.conn, self.saver = self.run(self._connect(path))

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        while not self.stopping:
            try:
                self.loop.run_forever()
            except BaseException as exc:  # recorded: property 1 fails the example on it
                self.escaped.append(exc)

    @staticmethod
    async def _connect(path: Path) -> tuple[aiosqlite.Connection, AsyncSqliteSaver]:
        conn = await aiosqlite.connect(path)
        await conn.execute("PRAGMA synchronous = OFF")
        return conn, AsyncSqliteSaver(conn)  # binds this loop

    def run(self, coro: Any, timeout: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _shutdown(self) -> None:
        await self.conn.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:  # tool bodies left behind at their deadline
            task.cancel()
        if others:
            await asyncio.wait(others, timeout=30)

    def close(self) -> None:
        self.run(self._shutdown())
        self.stopping = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=60)
        self.loop.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path)
    s.open()
    try:
        yield s
    finally:
        s.close()


# -- a hostile run -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    build: Build
    budget: fp.RuntimeBudget
    parent: dict[str, float] | None
    deadline_seconds: float | None
    script: tuple[Any, ...]
    behaviours: tuple[Behaviour, ...]
    knock_again: bool
    app_data: dict[str, Any]


small_parent = st.fixed_dictionaries(
    {},
    optional={
        "steps": st.sampled_from([6.0, 3.0, 8.0, 4.0, 1.0, 0.0]),
        "tool_calls": st.sampled_from([4.0, 2.0, 5.0, 3.0, 1.0, 0.0]),
        "tokens": st.sampled_from([200.0, 60.0, 300.0, 100.0, 10.0, 0.0]),
        "cost": st.sampled_from([3.0, 1.5, 1.0, 0.0]),
        "mutations": st.sampled_from([2.0, 1.0, 0.0]),
    },
)


def plans(*, sync: bool) -> st.SearchStrategy[Plan]:
    """A hostile run; ``sync``: for ``invoke``/``stream`` (see ``hostile.turns``)."""
    return st.builds(
        Plan,
        build=st.builds(
            Build,
            approval=st.sampled_from(["terminate", "interrupt", "interrupt"]),
            tokens_per_step=st.sampled_from([0, 0, 7, 40]),
            max_concurrent_tools=st.sampled_from([1, 4]),
            repeat_limit=st.sampled_from([1, 3]),
            model_retries=st.sampled_from([0, 2]),
            answer_margin=st.sampled_from([0, 1]),
            require_citations=st.booleans(),
            verdict_key=st.booleans(),
            denial=st.sampled_from(["end_run", "observe"]),
            approver=st.sampled_from(["none", "none", "none", *sorted(set(APPROVERS) - {"none"})]),
        ),
        budget=st.builds(
            fp.RuntimeBudget,
            steps_remaining=st.sampled_from([3, 4, 5, 6, 3, 4, 5, 6, 0, 1, 2]),
            tool_calls_remaining=st.sampled_from([3, 4, 5, 2, 3, 4, 1, 0]),
            tokens_remaining=st.none() | st.none() | st.sampled_from([200, 80, 300, 40, 0]),
            cost_remaining=st.none() | st.sampled_from([4.0, 1.5, 0.5, 0.0]),
            mutations_remaining=st.none() | st.sampled_from([2, 3, 1, 0]),
        ),
        parent=st.none() | st.none() | small_parent,
        deadline_seconds=st.sampled_from([None, None, 30.0, 30.0, 0.05]),
        script=st.lists(turns(sync=sync), min_size=1, max_size=6).map(tuple),
        behaviours=st.lists(behaviours, min_size=1, max_size=4).map(tuple),
        knock_again=st.sampled_from([False, False, False, True]),
        app_data=st.dictionaries(any_text(max_size=6), json_values, max_size=2),
    )


@dataclass
class Outcome:
    """What one example did: every chunk or output it saw, and the states it ended calls in."""

    config: dict[str, Any]
    ctx: fp.RunContext
    parent: str | None
    seen: list[Any] = field(default_factory=list)
    """Every output and stream chunk (scanned for the canary)."""
    values: list[dict[str, Any]] = field(default_factory=list)
    """Every full state seen (stream mode: each superstep; otherwise each return)."""


def _call(store: Store, plan: Plan, mode: str, payload: Any, out: Outcome) -> None:
    """One invoke/ainvoke/stream of the graph. Property 1: whatever it raises fails the example.

    Streamed, every superstep's state is checked against the ledger as it arrives (property 3).
    """
    build = plan.build
    graph = store.graph(build)
    if mode == "stream":
        chunks = graph.stream(
            payload,
            out.config,
            context=out.ctx,
            stream_mode=["values", "updates", "custom", "messages"],
        )
        while True:
            try:
                chunk = next(chunks)
            except StopIteration:
                return
            except BaseException as exc:  # property 1: nothing may escape
                raise AssertionError(f"{type(exc).__name__} escaped stream") from exc
            out.seen.append(chunk)
            mode_name, data = chunk
            if mode_name == "values" and has_run(data):
                out.values.append(data)
                check_budget(store, plan, out, fp.run_output(data))
    try:
        if mode == "invoke":
            result = graph.invoke(payload, out.config, context=out.ctx)
        else:
            result = store.ainvoke(build, payload, out)
    except BaseException as exc:  # property 1: nothing may escape
        raise AssertionError(f"{type(exc).__name__} escaped {mode}") from exc
    if store.aio is not None and store.aio.escaped:
        escaped = store.aio.escaped.pop()
        raise AssertionError(f"{type(escaped).__name__} escaped the event loop") from escaped
    out.seen.append(result)


def run_example(store: Store, plan: Plan, mode: str, data: st.DataObject) -> None:
    store.rotate_if_large()
    assert store.ledger is not None
    n = uuid.uuid4().hex[:12]
    run_id = f"fz-{n}"
    parent = None
    if plan.parent is not None:
        parent = f"parent-{n}"
        store.ledger.open_account(parent, plan.parent)
        event("parent account")
    ctx = fp.RunContext(
        tenant_id="acme",
        principal=fp.Principal(id="u-1", capabilities=CAPABILITIES),
        deadline=fp.Deadline.after(plan.deadline_seconds) if plan.deadline_seconds else None,
        budget_account=parent,
        app_data=plan.app_data,
    )
    out = Outcome(config={"configurable": {"thread_id": f"t-{n}"}}, ctx=ctx, parent=parent)
    graph = store.graph(plan.build)
    WORLD.behaviours[run_id] = plan.behaviours
    store.model.current = ScriptedDecisionModel(list(plan.script))
    try:
        start = fp.start("why is checkout failing?", plan.budget, run_id=run_id)
        _call(store, plan, mode, start, out)
        state, interrupts = check_return(store, graph, plan, mode, out)
        resumes, forged = 0, set[Any]()
        while interrupts:
            if resumes == MAX_RESUMES:
                event("left paused")
                break
            waiting = [c["call_id"] for i in interrupts for c in (i.value or {}).get("calls", [])]
            answer = data.draw(answers(waiting), label="resume")
            # Once per pause: a pause keeps an update until it is passed, and a second update of
            # the batch to it is refused (fp.CommandRefused, tests/invariants/test_1_...).
            pause = graph.get_state(out.config).config["configurable"].get("checkpoint_id")
            forge = (
                data.draw(st.sampled_from(FORGERIES), label="forged batch")
                if plan.build.verdict_key and pause not in forged
                else None
            )
            if forge is not None:
                forged.add(pause)
            command = (
                Command(resume=answer)
                if forge is None
                else Command(
                    update={"run": {"batch": forged_batch(graph, out, forge)}}, resume=answer
                )
            )
            _call(store, plan, mode, command, out)
            resumes += 1
            state, interrupts = check_return(store, graph, plan, mode, out)
        if not interrupts:
            check_ended(state)
            code = f"{state.termination.value if state.termination else None}"
            event(f"ended {code} ({state.last_error_code})")
            if plan.knock_again:
                knock_again(store, plan, mode, state, out)
        check_ran(store, graph, plan, out, state)
        check_canary(store, out)
    finally:
        WORLD.forget(run_id)


# -- property 3: budgets ---------------------------------------------------------------------------


def check_return(
    store: Store, graph: Any, plan: Plan, mode: str, out: Outcome
) -> tuple[fp.AgentState, list[Any]]:
    """After every return: the run's state and the interrupts it paused on (from what ``invoke``
    returned, or for a stream the checkpoint), checked against the ledger."""
    if mode == "stream":
        snapshot = graph.get_state(out.config)
        values, interrupts = snapshot.values, list(snapshot.interrupts)
    else:
        values = out.seen[-1]
        interrupts = list(values.get("__interrupt__", ()))
    assert has_run(values), "a call returned and no run was recorded"
    state = fp.run_output(values)
    out.values.append(values)
    check_budget(store, plan, out, state)
    return state, interrupts


def check_budget(store: Store, plan: Plan, out: Outcome, state: fp.AgentState) -> None:
    """State's budget is the ledger's view, and no account is over a limit."""
    # The caller's own numbers, not the ledger's, are the oracle for the limits.
    for axis, limit in plan.budget.limits().items():
        if not charged_past(axis, state):
            assert state.budget.used(BudgetAxis(axis)) <= limit + EPSILON, f"state over on {axis}"
    assert store.ledger is not None
    account = run_account(out.config["configurable"]["thread_id"], state.run_id)
    try:
        balance = store.ledger.balance(account)
    except UnknownAccount:
        # Only a run refused before its account could be opened has none.
        assert state.budget.used(BudgetAxis.STEPS) == 0
        return
    for axis in AXES:
        assert state.budget.used(axis) == pytest.approx(balance.held.get(axis.value, 0.0)), (
            f"{axis.value}: state says {state.budget.used(axis)}, the ledger holds {balance.held}"
        )
    accounts = [(balance, plan.budget.limits())]
    if out.parent:
        assert plan.parent is not None
        accounts.append((store.ledger.balance(out.parent), plan.parent))
    for each, limits in accounts:
        for axis, limit in {**each.limits, **limits}.items():
            held = each.held.get(axis, 0.0)
            assert charged_past(axis, state) or held <= min(limit, limits.get(axis, limit)) + (
                EPSILON
            ), f"{each.account} holds {held} {axis}, over its limit {limit}"


def charged_past(axis: str, state: fp.AgentState) -> bool:
    """Whether ``axis`` may be held past its limit here: only tokens a model reported beyond
    its step's hold are charged past a limit, and the run stops at that step."""
    stopping = state.stop.error_code if state.stop is not None else None
    return axis == "tokens" and "tokens_exhausted" in (stopping, state.last_error_code)


# -- property 4: exactly one terminal reason --------------------------------------------------------


def check_ended(state: fp.AgentState) -> None:
    assert state.phase is Phase.TERMINAL, f"returned unpaused in phase {state.phase}"
    assert isinstance(state.termination, fp.TerminationReason)
    terminal = [m for m in state.manifests if m.phase is Phase.TERMINAL]
    assert len(terminal) == 1, f"{len(terminal)} terminal manifests"
    assert terminal[0].code == state.termination.value
    assert state.report is not None
    assert state.stop is None or state.stop.reason is state.termination
    if state.termination is fp.TerminationReason.COMPLETED:
        assert state.final_answer is not None
        evidence = state.evidence_ids()
        assert set(state.final_answer.citations) <= evidence, (
            "a completed answer cites non-evidence"
        )


def knock_again(store: Store, plan: Plan, mode: str, ended: fp.AgentState, out: Outcome) -> None:
    """A finished thread invoked again runs nothing and keeps its one terminal reason."""
    before = len(WORLD.runs_of(ended.run_id))
    _call(store, plan, mode, None, out)
    state, _ = check_return(store, store.graph(plan.build), plan, mode, out)
    assert len(WORLD.runs_of(ended.run_id)) == before, "a finished run ran a tool"
    assert state.termination is ended.termination
    assert len([m for m in state.manifests if m.phase is Phase.TERMINAL]) == 1
    assert state.budget == ended.budget
    event("knocked on a finished thread")


# -- forged batches: what a caller with the thread's config writes beside an answer ---------------

VERDICT_KEY = b"fuzz-verdict-key-0123456789abcdef"
FORGERIES = (None, None, "unsealed-write", "replayed")
"""Beside an answer (key builds only): nothing, an allowed write no gate judged, or an entry
the gate sealed earlier in the run written back into the batch."""


def forged_batch(graph: Any, out: Outcome, forge: str) -> tuple[Any, ...]:
    """The paused batch with one entry a caller adds (``FORGERIES``)."""
    current = tuple(graph.get_state(out.config).values.get("batch") or ())
    ids = {e.call_id for e in current}
    if forge == "replayed":
        for snapshot in graph.get_state_history(out.config):
            for entry in snapshot.values.get("batch") or ():
                if entry.verdict.code is VerdictCode.ALLOWED and entry.call_id not in ids:
                    return (*current, entry)
    write = fp.ToolProposal(
        call_id="call-f0rged1", tool_name="write_note", arguments={"note": "forged"}
    )
    verdict = fp.policy.Verdict(
        call_id=write.call_id,
        tool_name=write.tool_name,
        fingerprint=proposal_fingerprint(write.tool_name, write.arguments),
        code=VerdictCode.ALLOWED,
    )
    return (*current, fp.policy.BatchEntry(proposal=write, verdict=verdict))


# -- property 2: nothing runs that the gates did not allow ------------------------------------------


def _allowed_verdicts(
    graph: Any, out: Outcome, run_id: str, key: bytes | None
) -> set[tuple[str, str, str]]:
    """(call id, tool, fingerprint) of every allowed verdict any checkpoint of the run holds
    (with a key: every one the gate sealed; a caller's forged entries are in checkpoints too)."""
    allowed: set[tuple[str, str, str]] = set()
    states = list(out.values)
    states += [s.values for s in graph.get_state_history(out.config)]
    for values in states:
        record = values.get("run") if isinstance(values, dict) else None
        for held in (record or {}).get("batch") or ():
            try:
                entry = fp.policy.BatchEntry.model_validate(held)
            except ValidationError:
                continue  # no entry at all: nothing the executor could run
            verdict = entry.verdict
            if verdict.code is VerdictCode.ALLOWED and (
                key is None or fp.policy.verdict_is_sealed(verdict, run_id=run_id, key=key)
            ):
                allowed.add((verdict.call_id, verdict.tool_name, verdict.fingerprint))
    return allowed


def check_ran(store: Store, graph: Any, plan: Plan, out: Outcome, state: fp.AgentState) -> None:
    assert store.ledger is not None
    ran = WORLD.runs_of(state.run_id)
    if not ran:
        return
    event(f"tools ran: {min(len(ran), 4)}{'+' if len(ran) >= 4 else ''}")
    account = run_account(out.config["configurable"]["thread_id"], state.run_id)
    ids = Counter(r.call_id for r in ran)
    assert max(ids.values()) == 1, f"a call id ran twice: {ids.most_common(1)}"
    key = VERDICT_KEY if plan.build.verdict_key else None
    allowed = _allowed_verdicts(graph, out, state.run_id, key)
    proposals = {p.call_id: p for p in state.proposals}
    receipts = {r.call_id: r for r in state.receipts}
    for r in ran:
        spec = BY_NAME[r.tool]
        assert spec.capability in CAPABILITIES, f"{r.tool} ran without its capability"
        if plan.build.approval == "terminate" and plan.build.approver == "none":
            assert spec.effect is fp.Effect.READ, f"{r.tool} ({spec.effect}) ran in terminate mode"
        proposal = proposals.get(r.call_id)
        assert proposal is not None, f"{r.tool} ran for a call the run never recorded"
        assert proposal.tool_name == r.tool
        # An oracle independent of fencepost: the arguments as JSON, through the strict schema.
        checked = spec.args_model.model_validate_json(json.dumps(proposal.arguments), strict=True)
        assert checked.model_dump(mode="json") == r.args, "the body got other arguments"
        fingerprint = proposal_fingerprint(proposal.tool_name, proposal.arguments)
        assert (r.call_id, r.tool, fingerprint) in allowed, (
            f"{r.tool} ran without an allowed verdict"
        )
        receipt = receipts.get(r.call_id)
        assert receipt is not None and receipt.tool_name == r.tool
        assert receipt.status is not fp.ReceiptStatus.DENIED
        assert receipt.attempts >= 1
        if spec.effect is not fp.Effect.READ:
            # A write ran only as someone approved it: the approver, or a human asked.
            assert receipt.approval in ("approver", "human"), f"{r.tool} ran unapproved"
            if plan.build.approver in NO_APPROVAL or plan.build.approver == "ask":
                assert receipt.approval == "human", f"{r.tool} ran as the approver refused it"
        # Reserved and marked started, durably, for this very attempt.
        reservation = store.ledger.get(call_key(account, r.call_id, r.attempt))
        assert reservation is not None and reservation.amounts.get("tool_calls") == 1
        assert store.ledger.get(started_key(account, r.call_id, r.attempt)) is not None
    held = store.ledger.balance(account).held.get("tool_calls", 0.0)
    assert len(ran) <= held, f"{len(ran)} bodies started, {held} tool calls charged"


# -- property 5: the canary ----------------------------------------------------------------------


def check_canary(store: Store, out: Outcome) -> None:
    for chunk in out.seen:
        assert CANARY not in repr(chunk), "the canary reached a returned value or a stream chunk"
    if store.leaks(CANARY_BYTES):
        # Fresh files first: a leak left in the shared files would fail every later example,
        # and hypothesis could not replay, let alone shrink, the one that leaked.
        store.close()
        store.open()
        raise AssertionError("the canary reached the checkpoint or ledger file")


# -- the properties ------------------------------------------------------------------------------


def test_hostile_runs_keep_every_invariant_under_invoke_and_ainvoke(store: Store) -> None:
    @settings(FUZZ, max_examples=INVOKE_EXAMPLES)
    @given(
        drawn=st.sampled_from(["invoke", "invoke", "invoke", "ainvoke"]).flatmap(
            lambda mode: st.tuples(st.just(mode), plans(sync=mode == "invoke"))
        ),
        data=st.data(),
    )
    def prop(drawn: tuple[str, Plan], data: st.DataObject) -> None:
        mode, plan = drawn
        event(mode)
        run_example(store, plan, mode, data)

    prop()
    assert not WORLD.late, f"tool bodies started after their run returned: {WORLD.late[:3]}"


def test_hostile_runs_stream_no_secret_in_any_mode_and_keep_every_invariant(store: Store) -> None:
    @settings(FUZZ, max_examples=STREAM_EXAMPLES)
    @given(plan=plans(sync=True), data=st.data())
    def prop(plan: Plan, data: st.DataObject) -> None:
        run_example(store, plan, "stream", data)

    prop()
    assert not WORLD.late, f"tool bodies started after their run returned: {WORLD.late[:3]}"
