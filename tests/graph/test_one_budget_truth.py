"""One budget truth: the ledger holds what a run spent, and state's budget is its view.

Every reservation (step, tool call, tokens, cost, mutation) goes through the
graph's ledger; ``AgentState.budget`` is written from the ledger's balance of the run's account
(``fencepost.policy.keys.run_account``) after each reservation and settlement. So:
- a parent account's limit stops the run with the axis named, and state never says more was used
  than the ledger holds;
- tokens are reserved before a model step (an estimate) and settled after; a report beyond the
  estimate must fit too, or the run stops; absurd reports are charged the estimate, typed;
- a tool's declared cost is charged on the cost axis;
- after every superstep of any run (random scripts, parents, batches, approvals, crash-resume),
  for every axis, state's ``used`` equals the ledger's ``held``, and no account holds more than
  its limit;
- an async graph never runs a blocking ledger call on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

import fencepost as fp
from fencepost.adapters import PostgresLedger, SqliteLedger
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.graph.settings import settings_of
from fencepost.graph.state import has_run
from fencepost.graph.token_count import count_tokens
from fencepost.policy import BudgetAxis, Reservation, UnknownAccount
from fencepost.policy.keys import run_account
from fencepost.policy.tool_decorator import tool
from fencepost.policy.usage import input_text, reply_text
from fencepost.reporting import load_runs
from tests.graph.kit import ABSTAIN, Calls, call, context, final_citing_last, make_registry, thread

AXES = tuple(BudgetAxis)


def priced_tool(calls: Calls, cost: float) -> fp.ToolSpec:
    """A read tool that declares a cost per call."""

    @tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=5)
    def priced_lookup(key: str, ctx: fp.ToolContext) -> Any:
        """Look something up, at a price."""
        calls.log.append(("priced_lookup", {"key": key}, ctx.idempotency_key))
        return {"value": key}

    return priced_lookup.model_copy(update={"cost": cost})


def priced(n: int) -> fp.ToolProposal:
    return call("priced_lookup", n, key=f"k{n}")


def account_of(config: Mapping[str, Any], state: fp.AgentState) -> str:
    return run_account(config["configurable"]["thread_id"], state.run_id)


def held(ledger: fp.Ledger, account: str) -> dict[str, float]:
    return dict(ledger.balance(account).held)


def assert_state_is_the_ledgers_view(state: fp.AgentState, ledger: fp.Ledger, account: str) -> None:
    holding = held(ledger, account)
    for axis in AXES:
        assert state.budget.used(axis) == pytest.approx(holding.get(axis.value, 0.0)), (
            f"{axis.value}: state says {state.budget.used(axis)}, the ledger holds {holding}"
        )


def with_parent(account: str, **kw: Any) -> fp.RunContext:
    return context(**kw).model_copy(update={"budget_account": account})


def graph_over(
    script: list[Any],
    ledger: fp.Ledger,
    calls: Calls,
    *,
    extra: tuple[fp.ToolSpec, ...] = (),
    **kw: Any,
) -> tuple[Any, ScriptedDecisionModel, InMemorySaver]:
    model = ScriptedDecisionModel(script)
    saver = InMemorySaver()
    registry = make_registry(calls, extra=extra)
    graph = fp.build_agent_graph(registry, model, ledger=ledger, **kw).compile(checkpointer=saver)
    return graph, model, saver


# -- a parent account's limit and a tenant's token limit -------------------------------------------


def test_a_parent_account_of_one_tool_call_runs_one_and_state_shows_what_the_ledger_holds() -> None:
    ledger = fp.InMemoryLedger()
    ledger.open_account("team", {"tool_calls": 1})
    calls = Calls()
    graph, _, saver = graph_over([call(n=1), call(n=2), ABSTAIN], ledger, calls)
    config = thread()
    out = graph.invoke(
        fp.start("q", fp.RuntimeBudget(steps_remaining=6, tool_calls_remaining=4)),
        config,
        context=with_parent("team"),
    )
    state = fp.run_output(out)
    assert calls.count("search_logs") == 1  # the second call never ran
    assert [r.call_id for r in state.receipts if r.status is fp.ReceiptStatus.COMPLETED] == [
        "call-0001"
    ]
    account = account_of(config, state)
    assert state.budget.tool_calls_used == held(ledger, account)["tool_calls"] == 1
    assert held(ledger, "team")["tool_calls"] == 1
    assert state.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert state.last_error_code == "tool_calls_exhausted"
    assert_state_is_the_ledgers_view(state, ledger, account)
    # What `fencepost report` reads from the checkpoint agrees.
    (record,) = load_runs(saver)
    assert record.summary()["tool_calls"] == 1


def test_a_tenant_token_limit_stops_the_run_at_the_first_step_past_it_naming_the_axis() -> None:
    # No estimate configured: the first step holds the tenant's 10 and reports 3,000. All of
    # it is charged (the tenant is left past its limit) and the run stops there, axis named.
    ledger = fp.InMemoryLedger()
    ledger.open_account("tenant", {"tokens": 10})
    calls = Calls()

    def costly(decision: Any) -> Callable[[fp.DecisionInput], fp.Decided]:
        def make(inp: fp.DecisionInput) -> fp.Decided:
            d = decision(inp) if callable(decision) else decision
            return fp.Decided(decision=d, input_tokens=2_000, output_tokens=1_000)

        return make

    script = [costly(call(n=1)), costly(call(n=2)), costly(final_citing_last)]
    graph, model, _ = graph_over(script, ledger, calls)
    config = thread()
    out = graph.invoke(
        fp.start("q", fp.RuntimeBudget(steps_remaining=6, tool_calls_remaining=4)),
        config,
        context=with_parent("tenant"),
    )
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert state.last_error_code == "tokens_exhausted"
    assert model.calls == 1  # no second step was asked for
    assert calls.log == []  # the step that crossed the limit proposes nothing that runs
    assert held(ledger, "tenant").get("tokens", 0.0) == 3_000
    assert_state_is_the_ledgers_view(state, ledger, account_of(config, state))


@pytest.mark.parametrize("tokens_per_step", [5, 3_000])
def test_a_tenant_token_limit_never_lets_a_run_complete_past_it(tokens_per_step: int) -> None:
    ledger = fp.InMemoryLedger()
    ledger.open_account("tenant", {"tokens": 10})
    calls = Calls()
    script = [
        fp.Decided(decision=call(n=1), input_tokens=2_000, output_tokens=1_000),
        lambda inp: fp.Decided(
            decision=final_citing_last(inp), input_tokens=2_000, output_tokens=1_000
        ),
    ]
    graph, model, _ = graph_over(script, ledger, calls, tokens_per_step=tokens_per_step)
    config = thread()
    state = fp.run_output(
        graph.invoke(
            fp.start("q", fp.RuntimeBudget(steps_remaining=6, tool_calls_remaining=4)),
            config,
            context=with_parent("tenant"),
        )
    )
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert state.last_error_code == "tokens_exhausted"
    # Whatever the estimate, the step holds the 10 tokens unspent (never more than is left)
    # and goes out once; what it reported is charged in full, nothing more after it.
    assert model.calls == 1
    assert held(ledger, "tenant").get("tokens", 0.0) == 3_000 * model.calls
    assert_state_is_the_ledgers_view(state, ledger, account_of(config, state))


def test_a_tenant_with_no_tokens_left_stops_a_new_run_before_the_model_is_asked() -> None:
    ledger = fp.InMemoryLedger()
    ledger.open_account("tenant", {"tokens": 10})
    ledger.open_account("earlier-run", {}, parent="tenant")
    ledger.charge("earlier-run", "spent", {"tokens": 10})  # spent, not merely held
    calls = Calls()
    script = [fp.Decided(decision=call(n=1), input_tokens=2_000, output_tokens=1_000)]
    graph, model, _ = graph_over(script, ledger, calls)
    state = fp.run_output(
        graph.invoke(
            fp.start("q", fp.RuntimeBudget(steps_remaining=6, tool_calls_remaining=4)),
            thread(),
            context=with_parent("tenant"),
        )
    )
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert state.last_error_code == "tokens_exhausted"
    assert model.calls == 0


def test_a_run_token_limit_lets_a_step_hold_what_is_unspent_and_ends_past_it() -> None:
    # Each step holds what it sends plus 40, capped at what the run has not spent: the third
    # holds the 20 left, reports 40, is charged all 40, and the run ends past its limit.
    ledger = fp.InMemoryLedger()
    calls = Calls()
    script = [
        fp.Decided(decision=call(n=1), input_tokens=30, output_tokens=10),
        fp.Decided(decision=call(n=2), input_tokens=30, output_tokens=10),
        lambda inp: fp.Decided(decision=final_citing_last(inp), input_tokens=30, output_tokens=10),
    ]
    graph, model, _ = graph_over(script, ledger, calls, tokens_per_step=40)
    config = thread()
    state = fp.run_output(
        graph.invoke(
            fp.start(
                "q",
                fp.RuntimeBudget(steps_remaining=6, tool_calls_remaining=4, tokens_remaining=100),
            ),
            config,
            context=context(),
        )
    )
    assert model.calls == 3
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert state.last_error_code == "tokens_exhausted"
    assert state.budget.tokens_used == 120
    assert_state_is_the_ledgers_view(state, ledger, account_of(config, state))


# -- cost and usage ---------------------------------------------------------------------------------


def test_a_declared_tool_cost_is_charged_and_the_call_it_cannot_cover_never_runs() -> None:
    ledger = fp.InMemoryLedger()
    calls = Calls()
    script = [priced(1), priced(2), priced(3), final_citing_last]
    graph, _, _ = graph_over(script, ledger, calls, extra=(priced_tool(calls, 2.5),))
    config = thread()
    state = fp.run_output(
        graph.invoke(
            fp.start(
                "q",
                fp.RuntimeBudget(steps_remaining=8, tool_calls_remaining=8, cost_remaining=5),
            ),
            config,
            context=context(),
        )
    )
    assert calls.count("priced_lookup") == 2
    assert state.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert state.last_error_code == "cost_exhausted"
    assert state.budget.cost_used == 5.0
    assert state.budget.cost_remaining == 0.0
    assert_state_is_the_ledgers_view(state, ledger, account_of(config, state))


def _decided_with_usage(decision: Any, usage: Any) -> fp.Decided:
    # model_construct: what an adapter with a bug could hand over, past Decided's own validation.
    return fp.Decided.model_construct(
        decision=decision, input_tokens=usage, output_tokens=usage, generated_call_ids=()
    )


@pytest.mark.parametrize(
    "usage", [-5, "3000", True, 2**64], ids=["negative", "string", "bool", "two_to_the_64"]
)
def test_usage_no_one_can_trust_is_charged_the_text_count_and_never_raises(usage: Any) -> None:
    ledger = fp.InMemoryLedger()
    calls = Calls()
    counted: list[int] = []

    def counting(decision: Any, inp: fp.DecisionInput) -> fp.Decided:
        counted.append(count_tokens(input_text(inp)) + count_tokens(reply_text(decision)))
        return _decided_with_usage(decision, usage)

    script = [
        lambda inp: counting(call(n=1), inp),
        lambda inp: counting(final_citing_last(inp), inp),
    ]
    graph, _, _ = graph_over(script, ledger, calls, tokens_per_step=7)
    config = thread()
    state = fp.run_output(
        graph.invoke(
            fp.start(
                "q",
                fp.RuntimeBudget(
                    steps_remaining=6, tool_calls_remaining=4, tokens_remaining=100_000
                ),
            ),
            config,
            context=context(),
        )
    )
    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.budget.tokens_used == sum(counted)  # two steps, each its text's count
    assert_state_is_the_ledgers_view(state, ledger, account_of(config, state))


# -- the property: after every superstep, state's budget is the ledger's ---------------------------

TOOLS = ("search_logs", "write_note", "priced_lookup", "explode")


class Crash(BaseException):
    """The process dies here (not an Exception: nothing in the loop may swallow it)."""


class CrashAfter:
    """Mixed into a ledger: the process dies right after the ``crash_at``-th write is durable."""

    crash_at: int | None = None
    writes = 0

    def _written(self) -> None:
        self.writes += 1
        if self.writes == self.crash_at:
            self.crash_at = None
            raise Crash

    def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        done = super().reserve(account, key, amounts)  # type: ignore[misc]
        self._written()
        return done  # type: ignore[no-any-return]

    def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        done = super().settle(key, actual)  # type: ignore[misc]
        self._written()
        return done  # type: ignore[no-any-return]


class CrashingMemoryLedger(CrashAfter, fp.InMemoryLedger):
    pass


class CrashingSqliteLedger(CrashAfter, SqliteLedger):
    pass


@dataclass(frozen=True)
class Turn:
    """One model decision of a random script."""

    kind: str  # "calls", "final", "abstain"
    tools: tuple[str, ...] = ()
    usage: tuple[int, int] | None = None


@dataclass(frozen=True)
class Plan:
    budget: fp.RuntimeBudget
    parent: dict[str, float] | None
    turns: tuple[Turn, ...]
    approval: str
    answers: tuple[str, ...]
    backend: str
    tokens_per_step: int
    crash_at: int | None
    fresh_graph_on_resume: bool


@st.composite
def plans(draw: st.DrawFn, *, crash: bool = False, restart: bool = False) -> Plan:
    """A random run. ``crash``: always on the SQLite files, always dying at some ledger write.
    ``restart``: paused for approval of a batch with a write in it, and every resume (approval
    or crash) taken by a new graph object, on a backend whose ledger outlives it (files, or the
    saver's own in-memory ledger every graph object on it shares)."""
    budget = fp.RuntimeBudget(
        steps_remaining=draw(st.integers(2 if crash else 0, 7)),
        tool_calls_remaining=draw(st.integers(0, 6)),
        tokens_remaining=draw(st.none() | st.integers(0, 300)),
        cost_remaining=draw(st.none() | st.sampled_from([0.0, 1.5, 3.0, 4.5, 10.0])),
        mutations_remaining=draw(st.none() | st.integers(0, 3)),
    )
    parent: dict[str, float] | None = None
    if draw(st.sampled_from([True, True, False])):
        small = {
            "steps": st.integers(0, 6),
            "tool_calls": st.integers(0, 4),
            "tokens": st.integers(0, 200),
            "cost": st.sampled_from([0.0, 1.5, 3.0]),
            "mutations": st.integers(0, 2),
        }
        axes = draw(st.sets(st.sampled_from(sorted(small))))
        parent = {axis: float(draw(small[axis])) for axis in sorted(axes)}
    usage = st.none() | st.tuples(st.integers(0, 80), st.integers(0, 40))
    turn = st.one_of(
        st.builds(
            Turn,
            kind=st.just("calls"),
            tools=st.lists(st.sampled_from(TOOLS), min_size=1, max_size=4).map(tuple),
            usage=usage,
        ),
        st.builds(Turn, kind=st.sampled_from(["final", "abstain"]), usage=usage),
    )
    crash_at = st.integers(1, 6)
    turns = tuple(draw(st.lists(turn, min_size=1, max_size=6)))
    if restart:
        # A read beside a write first: the write waits for a human, the read is reserved.
        first = tuple(draw(st.permutations(["search_logs", "write_note"])))
        turns = (Turn(kind="calls", tools=first), *turns)
        backend = draw(st.sampled_from(["sqlite", "sqlite-default", "memory-default"]))
    else:
        backend = (
            "sqlite"
            if crash
            else draw(st.sampled_from(["memory", "sqlite", "sqlite-default", "memory-default"]))
        )
    return Plan(
        budget=budget,
        parent=parent,
        turns=turns,
        approval="interrupt"
        if restart
        else draw(st.sampled_from(["terminate", "interrupt", "interrupt"])),
        answers=tuple(draw(st.lists(st.sampled_from(["approve", "reject"]), max_size=6))),
        # "sqlite-default": no ledger passed, the graph keeps its budget in the checkpoint
        # file; "memory-default": no ledger passed, every graph object on the one InMemorySaver
        # shares its in-memory ledger (an app building its agent per request).
        backend=backend,
        tokens_per_step=draw(st.sampled_from([0, 0, 5, 30])),
        crash_at=draw(crash_at if crash else st.none() | crash_at),  # see Run.open
        fresh_graph_on_resume=restart or draw(st.booleans()),
    )


def script_of(turns: tuple[Turn, ...]) -> list[Any]:
    """The scripted model's entries: unique call ids, distinct arguments, usage as reported."""
    entries: list[Any] = []
    n = 0
    for turn in turns:
        usage = (
            {}
            if turn.usage is None
            else dict(zip(("input_tokens", "output_tokens"), turn.usage, strict=True))
        )
        if turn.kind == "calls":
            proposals = []
            for name in turn.tools:
                n += 1
                if name == "search_logs":
                    proposals.append(call(n=n))
                elif name == "write_note":
                    proposals.append(call("write_note", n, note=f"note {n}"))
                elif name == "priced_lookup":
                    proposals.append(priced(n))
                else:
                    proposals.append(call("explode", n))
            decision: Any = (
                proposals[0] if len(proposals) == 1 else fp.ToolBatch(calls=tuple(proposals))
            )
            entries.append(fp.Decided(decision=decision, **usage))
        elif turn.kind == "final":

            def final(inp: fp.DecisionInput, usage: dict[str, int] = usage) -> fp.Decided:
                cited = [o.call_id for o in inp.observations if o.error_code is None][-1:]
                answer = fp.AnswerPayload(text="the answer", citations=tuple(cited))
                return fp.Decided(decision=fp.FinalProposal(answer=answer), **usage)

            entries.append(final)
        else:
            entries.append(fp.Decided(decision=ABSTAIN, **usage))
    return entries


@dataclass
class Run:
    """One random run: its graph, ledger and checkpointer, rebuilt on a 'new process'."""

    plan: Plan
    root: Path
    calls: Calls = field(default_factory=Calls)
    stack: ExitStack = field(default_factory=ExitStack)
    model: ScriptedDecisionModel | None = None
    ledger: Any = None
    saver: Any = None
    graph: Any = None
    crashed: bool = False

    @property
    def forgets_ended(self) -> bool:
        """The ledger is one fencepost made in memory: an ended run's account is dropped."""
        return self.plan.backend == "memory-default"

    def open(self, *, crash_at: int | None) -> None:
        """Open the ledger and checkpointer (the same files again, for a sqlite backend). A
        backend whose ledger the graph makes itself never crashes (nothing to make crash)."""
        backend = self.plan.backend
        passed: Any
        if backend in ("sqlite", "sqlite-default"):
            conn = sqlite3.connect(self.root / "checkpoints.db", check_same_thread=False)
            self.stack.callback(conn.close)
            self.saver = SqliteSaver(conn)
            passed = CrashingSqliteLedger(self.root / "ledger.db") if backend == "sqlite" else None
            if passed is not None:
                self.stack.callback(passed.close)
        elif backend == "memory-default":
            self.saver = self.saver or InMemorySaver()
            passed = None  # the saver's own: nothing to make crash
        else:
            passed = self.ledger if self.ledger is not None else CrashingMemoryLedger()
            self.saver = self.saver or InMemorySaver()
        if passed is not None:
            passed.crash_at = crash_at
            passed.writes = 0
        if self.model is None:
            self.model = ScriptedDecisionModel(script_of(self.plan.turns))
        registry = make_registry(self.calls, extra=(priced_tool(self.calls, 1.5),))
        self.graph = fp.build_agent_graph(
            registry,
            self.model,
            ledger=passed,
            approval=self.plan.approval,  # type: ignore[arg-type]
            tokens_per_step=self.plan.tokens_per_step,
            max_concurrent_tools=2,
        ).compile(checkpointer=self.saver)
        built = settings_of(self.graph)
        assert built is not None
        self.ledger = built.ledger
        if backend == "sqlite-default":
            assert isinstance(self.ledger, SqliteLedger)  # derived from the checkpoint file
        if backend == "memory-default":
            assert type(self.ledger) is fp.InMemoryLedger  # the saver's, whichever graph
        if self.plan.parent is not None:
            # The application's pool, opened at every start (idempotent: the same terms).
            self.ledger.open_account("parent", self.plan.parent)

    def reopen(self) -> None:
        """A new graph object over the same checkpoints, as a restarted worker builds it."""
        self.stack.close()
        self.stack = ExitStack()
        self.open(crash_at=None)

    @property
    def restarts(self) -> bool:
        """Whether a new graph object is built on every resume (after a crash or an approval)."""
        return self.plan.fresh_graph_on_resume and self.plan.backend != "memory"


def check_superstep(
    run: Run, config: dict[str, Any], parent: str | None, *, stale: str | None = None
) -> fp.AgentState | None:
    """The invariants that hold after every superstep of every run.

    ``stale`` is the checkpoint a crash left behind: the superstep after it died before its
    checkpoint was written, so the ledger may be ahead of it. A resumed stream shows it again
    before running anything; it is not a superstep's result and is not checked.
    """
    snapshot = run.graph.get_state(config)
    values = snapshot.values
    if not has_run(values) or snapshot.config["configurable"].get("checkpoint_id") == stale:
        return None
    state = fp.run_output(values)
    ledger = run.ledger
    account = account_of(config, state)
    try:
        balance = ledger.balance(account)
    except UnknownAccount:
        # Only a run refused at its very first step (its parent could not be found) has none,
        # or an ended one, dropped from a ledger fencepost made in memory.
        assert (run.forgets_ended and state.is_terminal) or state.budget.used(BudgetAxis.STEPS) == 0
        return state
    for axis in AXES:
        assert state.budget.used(axis) == pytest.approx(balance.held.get(axis.value, 0.0)), (
            f"after a superstep, {axis.value}: state {state.budget} vs ledger {balance.held}"
        )
    accounts = [balance] + ([ledger.balance(parent)] if parent else [])
    for each in accounts:
        for axis, limit in each.limits.items():
            if each.held.get(axis, 0.0) <= limit + 1e-9:
                continue
            # Only tokens a model reported past its step's hold are charged past a limit, and
            # the run stops at that step.
            assert axis == "tokens", f"{each.account} over on {axis}"
            stopping = state.stop.error_code if state.stop is not None else None
            assert "tokens_exhausted" in (stopping, state.last_error_code), state
    # Every tool body that started was charged (an attempt is never refunded).
    assert len(run.calls.log) <= balance.held.get("tool_calls", 0.0)
    return state


def drive(run: Run, config: dict[str, Any], ctx: fp.RunContext) -> fp.AgentState:
    """Stream the run to its end superstep by superstep, answering approvals and surviving one
    crash, checking the invariants after every superstep."""
    parent = ctx.budget_account
    answers = list(run.plan.answers)
    pending: Any = fp.start("q", run.plan.budget)
    stale: str | None = None
    for _ in range(40):
        try:
            for _values in run.graph.stream(
                pending, config, context=ctx, stream_mode="values", durability="sync"
            ):
                check_superstep(run, config, parent, stale=stale)
        except Crash:
            event("crashed and resumed" + (" in a new graph" if run.restarts else ""))
            run.crashed = True
            # The process died mid-superstep: that superstep's checkpoint was never written, so
            # the ledger may be ahead of state until the re-run writes the view again. Resume,
            # in a new graph over the same files when the plan says so.
            if run.restarts:
                run.reopen()
            snapshot = run.graph.get_state(config)
            stale = snapshot.config["configurable"].get("checkpoint_id")
            started = "request" in snapshot.values
            pending = None if started else fp.start("q", run.plan.budget)
            continue
        snapshot = run.graph.get_state(config)
        state = check_superstep(run, config, parent, stale=stale)
        if not snapshot.next:
            assert state is not None and state.termination is not None
            return state
        if any(t.interrupts for t in snapshot.tasks):
            if run.restarts:
                run.reopen()  # the approval is answered by a worker that started since
            event(
                f"answered an approval ({run.plan.backend}{', new graph' if run.restarts else ''})"
            )
            pending = Command(resume=answers.pop(0) if answers else "reject")
        else:
            pending = None
    raise AssertionError("the run never ended")


def check_random_run(plan: Plan) -> None:
    with tempfile.TemporaryDirectory() as root:
        run = Run(plan=plan, root=Path(root))
        try:
            run.open(crash_at=plan.crash_at)
            ctx = context() if plan.parent is None else with_parent("parent")
            config = thread()
            state = drive(run, config, ctx)
            assert state.is_terminal
            if not run.crashed and not run.forgets_ended:
                # With no crash every call reservation was a start: a call the ledger holds
                # that never ran was charged twice somewhere (a resume counting it again).
                held_calls = run.ledger.balance(account_of(config, state)).held
                assert held_calls.get("tool_calls", 0.0) == len(run.calls.log), state.receipts
            event(f"ended {state.termination} ({state.last_error_code})")
            if any(r.error_code is fp.ErrorCode.BUDGET_EXHAUSTED for r in state.receipts):
                event("a batch was cut by a budget")
        finally:
            run.stack.close()


PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@PROPERTY
@given(plan=plans())
def test_after_every_superstep_state_budget_is_what_the_ledger_holds(plan: Plan) -> None:
    check_random_run(plan)


@PROPERTY
@given(plan=plans(restart=True))
def test_a_run_resumed_by_a_new_graph_object_is_charged_once_per_call_it_started(
    plan: Plan,
) -> None:
    check_random_run(plan)


@PROPERTY
@given(plan=plans(crash=True))
def test_after_a_crash_and_a_resume_state_budget_is_still_what_the_ledger_holds(
    plan: Plan,
) -> None:
    check_random_run(plan)


# -- async graphs never block the loop -------------------------------------------------------------

SYNC_METHODS = (
    "open_account",
    "close_account",
    "reserve",
    "settle",
    "release",
    "get",
    "balance",
    "reserved",
    "begin_attempt",
    "start_attempt",
    "finish_attempt",
    "settle_and_reserve",
)


@dataclass
class ThreadLog:
    sync: list[tuple[str, int]] = field(default_factory=list)
    twins: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def thread_recording(cls: type[fp.Ledger], log: ThreadLog) -> type[fp.Ledger]:
    """``cls`` with every sync method recording its thread and every async twin its use."""

    def sync_spy(name: str) -> Callable[..., Any]:
        real = getattr(cls, name)

        def spied(self: Any, *args: Any, **kwargs: Any) -> Any:
            with log.lock:
                log.sync.append((name, threading.get_ident()))
            return real(self, *args, **kwargs)

        return spied

    def twin_spy(name: str) -> Callable[..., Any]:
        real = getattr(cls, name)

        async def spied(self: Any, *args: Any, **kwargs: Any) -> Any:
            with log.lock:
                log.twins.append(name)
            return await real(self, *args, **kwargs)

        return spied

    methods = {name: sync_spy(name) for name in SYNC_METHODS}
    methods.update({f"a{name}": twin_spy(f"a{name}") for name in SYNC_METHODS})
    return type(f"ThreadRecording{cls.__name__}", (cls,), methods)


def _async_run_over(
    ledger: fp.Ledger, log: ThreadLog, calls: Calls
) -> tuple[int, list[tuple[str, int]], fp.AgentState]:
    """An async run with a batch (concurrent calls), an approval and a final answer; the loop's
    thread and the sync ledger calls made while it ran."""
    batch = fp.ToolBatch(calls=(call(n=1), call(n=2), call("write_note", 3, note="n")))
    model = ScriptedDecisionModel([batch, call(n=4), final_citing_last])
    graph = fp.build_agent_graph(
        make_registry(calls), model, ledger=ledger, approval="interrupt", tokens_per_step=5
    ).compile(checkpointer=InMemorySaver())
    config, ctx = thread(), with_parent("tenant")
    start = fp.start(
        "q",
        fp.RuntimeBudget(
            steps_remaining=6, tool_calls_remaining=6, tokens_remaining=100_000, cost_remaining=3
        ),
    )

    async def scenario() -> tuple[int, list[tuple[str, int]], dict[str, Any]]:
        await graph.ainvoke(start, config, context=ctx)
        out = await graph.ainvoke(Command(resume="approve"), config, context=ctx)
        with log.lock:
            seen = list(log.sync)
        return threading.get_ident(), seen, out

    loop_thread, seen, out = asyncio.run(scenario())
    state = fp.run_output(out)
    assert_state_is_the_ledgers_view(state, ledger, account_of(config, state))
    return loop_thread, seen, state


@pytest.fixture(params=["sqlite", "postgres"])
def recorded_ledger(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[fp.Ledger, ThreadLog]]:
    log = ThreadLog()
    if request.param == "postgres":
        dsn = request.getfixturevalue("postgres_schema")
        ledger: Any = thread_recording(PostgresLedger, log)(dsn)
    else:
        ledger = thread_recording(SqliteLedger, log)(tmp_path / "ledger.db")
    with ledger:
        ledger.open_account("tenant", {"tool_calls": 10, "tokens": 1_000_000})
        log.sync.clear()
        yield ledger, log


def test_an_async_graph_never_runs_a_blocking_ledger_call_on_the_event_loop_thread(
    recorded_ledger: tuple[fp.Ledger, ThreadLog],
) -> None:
    ledger, log = recorded_ledger
    calls = Calls()
    loop_thread, seen, state = _async_run_over(ledger, log, calls)
    assert state.termination is fp.TerminationReason.COMPLETED
    assert calls.count("search_logs") == 3 and calls.count("write_note") == 1
    on_loop = [name for name, ident in seen if ident == loop_thread]
    assert on_loop == [], f"blocking ledger calls on the event loop's thread: {on_loop}"
    # The run went through the async twins (the instrument was live).
    assert {
        "aopen_account",
        "areserve",
        "asettle",
        "aclose_account",
        "astart_attempt",
        "afinish_attempt",
    } <= set(log.twins)
