"""Token holds a service can run on: a model step holds a bounded estimate (what it sends plus
the model's output cap), never all that is left; busy is not exhausted (a step crowded out by
steps in flight waits for them); usage is settled honestly (a missing report is charged a count
of the text sent and received, never the hold), and concurrent runs overshoot a shared token
limit by at most each in-flight step's reply beyond its estimate."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

import fencepost as fp
from fencepost.adapters import SqliteLedger
from fencepost.graph.token_count import count_tokens
from fencepost.policy.keys import run_account
from fencepost.policy.usage import input_text, reply_text
from tests.graph.kit import Calls, call, context, final_citing_last, make_registry, thread
from tests.graph.test_one_budget_truth import Crash, CrashingMemoryLedger
from tests.middleware.test_a_step_crowded_out_by_steps_in_flight_waits import WatchedLedger

TENANT = "tenant"
FINAL = fp.FinalProposal(answer=fp.AnswerPayload(text="done"))


def tenant_context() -> fp.RunContext:
    return context().model_copy(update={"budget_account": TENANT})


def sent(inp: fp.DecisionInput) -> int:
    """Tokens a step's input counts for, as the graph counts it."""
    return count_tokens(input_text(inp))


class TwoStepModel:
    """Proposes a call, then answers citing it; reports ``tokens`` a step (or nothing with
    ``None``). Each call yields a while, so concurrent runs overlap in it."""

    def __init__(self, tokens: int | None, *, steps: int = 2, wait: float = 0.02) -> None:
        self.tokens = tokens
        self.steps = steps
        self.wait = wait
        self.lock = threading.Lock()
        self.inputs: list[fp.DecisionInput] = []
        self.replies: list[Any] = []

    async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
        with self.lock:
            self.inputs.append(inp)
        await asyncio.sleep(self.wait)
        decision: Any = call(n=1)
        if len(inp.observations) + 1 >= self.steps:
            decision = final_citing_last(inp) if inp.observations else FINAL
        with self.lock:
            self.replies.append(decision)
        if self.tokens is None:
            return fp.Decided(decision=decision)
        return fp.Decided(
            decision=decision,
            input_tokens=self.tokens // 2,
            output_tokens=self.tokens - self.tokens // 2,
        )


def budget() -> fp.RuntimeBudget:
    return fp.RuntimeBudget(steps_remaining=6, tool_calls_remaining=4)


@pytest.fixture(params=["memory", "sqlite"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[fp.Ledger]:
    if request.param == "memory":
        yield fp.InMemoryLedger()
    else:
        with SqliteLedger(tmp_path / "ledger.db") as durable:
            yield durable


def test_five_concurrent_runs_on_a_large_tenant_token_budget_all_complete(
    ledger: fp.Ledger,
) -> None:
    ledger.open_account(TENANT, {"tokens": 1_000_000})
    model = TwoStepModel(100)
    graph = fp.build_agent_graph(make_registry(Calls()), model, ledger=ledger).compile(
        checkpointer=InMemorySaver()
    )

    async def all_five() -> list[dict[str, Any]]:
        return await asyncio.gather(
            *(
                graph.ainvoke(fp.start("q", budget()), thread(), context=tenant_context())
                for _ in range(5)
            )
        )

    states = [fp.run_output(out) for out in asyncio.run(all_five())]
    assert [s.termination for s in states] == [fp.TerminationReason.COMPLETED] * 5
    assert ledger.balance(TENANT).held["tokens"] == 5 * 2 * 100  # what they reported


def test_five_runs_in_threads_never_notice_each_other_on_a_large_tenant_budget(
    ledger: fp.Ledger,
) -> None:
    ledger.open_account(TENANT, {"tokens": 1_000_000})
    model = TwoStepModel(100)
    graph = fp.build_agent_graph(make_registry(Calls()), model, ledger=ledger).compile(
        checkpointer=InMemorySaver()
    )

    def one(_: int) -> fp.AgentState:
        return fp.run_output(
            graph.invoke(fp.start("q", budget()), thread(), context=tenant_context())
        )

    with ThreadPoolExecutor(max_workers=5) as pool:
        states = list(pool.map(one, range(5)))
    assert all(s.termination is fp.TerminationReason.COMPLETED for s in states)


def test_on_a_small_pool_runs_take_turns_and_it_pays_for_as_many_whole_runs_as_it_can(
    ledger: fp.Ledger,
) -> None:
    # One-step runs reporting 100 tokens each, on a pool of 300: three whole runs fit. Each
    # step's estimate (its input plus the default output cap) is more than the pool, so a step
    # in flight holds all of it and the others wait their turn instead of ending.
    ledger.open_account(TENANT, {"tokens": 300})
    model = TwoStepModel(100, steps=1)
    graph = fp.build_agent_graph(make_registry(Calls()), model, ledger=ledger).compile(
        checkpointer=InMemorySaver()
    )

    async def all_five() -> list[dict[str, Any]]:
        return await asyncio.gather(
            *(
                graph.ainvoke(fp.start("q", budget()), thread(), context=tenant_context())
                for _ in range(5)
            )
        )

    states = [fp.run_output(out) for out in asyncio.run(all_five())]
    ended = [s.termination for s in states]
    assert ended.count(fp.TerminationReason.COMPLETED) == 3
    assert ended.count(fp.TerminationReason.STEP_BUDGET_EXHAUSTED) == 2
    assert all(s.last_error_code == "tokens_exhausted" for s in states if not s.final_answer)
    # Those that ended exhausted did so with the pool spent, not merely held.
    assert ledger.balance(TENANT).held["tokens"] == 300
    assert model.inputs and len(model.inputs) == 3  # no model was asked past the pool


def test_a_model_that_reports_no_usage_is_charged_the_text_it_was_sent_and_wrote() -> None:
    ledger = fp.InMemoryLedger()
    model = TwoStepModel(None)
    graph = fp.build_agent_graph(make_registry(Calls()), model, ledger=ledger).compile(
        checkpointer=InMemorySaver()
    )
    limited = fp.RuntimeBudget(steps_remaining=6, tool_calls_remaining=4, tokens_remaining=10_000)
    config = thread()
    state = fp.run_output(graph.invoke(fp.start("q", limited), config, context=context()))
    assert state.termination is fp.TerminationReason.COMPLETED, state.last_error_code
    counted = sum(
        sent(inp) + count_tokens(reply_text(reply))
        for inp, reply in zip(model.inputs, model.replies, strict=True)
    )
    assert len(model.inputs) == 2
    assert 0 < counted < 10_000 // 4  # far below the hold each step took
    assert state.budget.tokens_used == counted
    account = run_account(config["configurable"]["thread_id"], state.run_id)
    assert ledger.balance(account).held["tokens"] == counted


def test_concurrent_runs_overshoot_a_token_limit_by_at_most_each_in_flight_replys_excess() -> None:
    # Each step's reply runs a whole pool past its estimate. The pool has room for five
    # estimates: three first steps, each leaving room for the next step of the runs started
    # before it, so three steps fly together: their reports are charged in full (past the
    # limit), and the limit is crossed by no more than what each in-flight step wrote beyond
    # its hold.
    ledger = fp.InMemoryLedger()
    cap = 10
    probe = TwoStepModel(0, steps=1)
    fp.build_agent_graph(make_registry(Calls()), probe, ledger=ledger).compile(
        checkpointer=InMemorySaver()
    ).invoke(fp.start("q", budget()), thread(), context=context())
    estimate = sent(probe.inputs[0]) + cap
    pool = 5 * estimate
    beyond = pool  # each reply alone crosses the limit
    ledger.open_account(TENANT, {"tokens": pool})
    model = TwoStepModel(estimate + beyond, steps=1, wait=0.1)
    graph = fp.build_agent_graph(
        make_registry(Calls()), model, ledger=ledger, tokens_per_step=cap
    ).compile(checkpointer=InMemorySaver())

    async def all_five() -> list[dict[str, Any]]:
        return await asyncio.gather(
            *(
                graph.ainvoke(fp.start("q", budget()), thread(), context=tenant_context())
                for _ in range(5)
            )
        )

    states = [fp.run_output(out) for out in asyncio.run(all_five())]
    spent = ledger.balance(TENANT).held["tokens"]
    flew = len(model.inputs)
    assert spent == flew * (estimate + beyond)  # every report charged as given
    assert spent > pool  # the overshoot happens,
    assert spent <= pool + flew * beyond  # and is bounded by each in-flight reply's excess
    assert flew == 3  # only the holds that fit went out; the rest found the pool spent
    # The charge that crossed the limit ends each run that made it; the rest are refused.
    assert {s.last_error_code for s in states} == {"tokens_exhausted"}


class StepsModel:
    """``steps`` model steps a run: a call (a new one each step) until the last, which answers
    citing the latest result; reports ``tokens`` a step. Each call yields, so runs overlap."""

    def __init__(self, tokens: int, *, steps: int) -> None:
        self.tokens = tokens
        self.steps = steps
        self.lock = threading.Lock()
        self.asked: list[str] = []
        """The run id of every step the model was asked for."""

    async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
        with self.lock:
            self.asked.append(inp.run_id)
        await asyncio.sleep(0.005)
        done = len(inp.observations)
        decision: Any = final_citing_last(inp) if done + 1 >= self.steps else call(n=done + 1)
        half = self.tokens // 2
        return fp.Decided(decision=decision, input_tokens=half, output_tokens=self.tokens - half)


@pytest.mark.parametrize("steps", [2, 3])
def test_runs_under_way_finish_before_new_runs_take_a_small_pool(
    ledger: fp.Ledger, steps: int
) -> None:
    # Twelve runs start at once on a pool that pays for three whole runs (100 tokens a step).
    # Each step holds its input plus an output cap of 200: more than a step reports, so what a
    # run under way needs next is covered by the room kept for it. The pool completes exactly
    # three runs, and no run the model was asked for is left unfinished (a run that spends a
    # step and is then starved wastes what it spent).
    whole = 3
    ledger.open_account(TENANT, {"tokens": whole * steps * 100})
    model = StepsModel(100, steps=steps)

    @fp.tool(effect="read", capability="logs:read", timeout_seconds=10)
    async def search_logs(query: str) -> dict[str, Any]:
        """Search logs (a while: room freed meanwhile is what newcomers would take)."""
        await asyncio.sleep(0.03)
        return {"hits": [query]}

    graph = fp.build_agent_graph(
        fp.ToolRegistry([search_logs]), model, ledger=ledger, tokens_per_step=200
    ).compile(checkpointer=InMemorySaver())

    async def all_twelve() -> list[dict[str, Any]]:
        return await asyncio.gather(
            *(
                graph.ainvoke(fp.start("q", budget()), thread(), context=tenant_context())
                for _ in range(12)
            )
        )

    states = [fp.run_output(out) for out in asyncio.run(all_twelve())]
    completed = [s for s in states if s.termination is fp.TerminationReason.COMPLETED]
    assert len(completed) == whole
    assert all(s.last_error_code == "tokens_exhausted" for s in states if s not in completed)
    started = set(model.asked)
    assert started == {s.run_id for s in completed}  # every run under way finished
    assert len(model.asked) == whole * steps
    assert ledger.balance(TENANT).held["tokens"] == whole * steps * 100


def test_a_run_under_way_is_not_starved_by_runs_that_start_while_its_tool_runs(
    ledger: fp.Ledger,
) -> None:
    # A run takes its first step, then its tool blocks. Three runs start meanwhile, in threads
    # (the sync graph, whose waits sleep). The pool pays for two whole runs: the run under way
    # keeps the room for its next step, so it finishes, and one newcomer after it.
    ledger.open_account(TENANT, {"tokens": 2 * 2 * 100})
    release = threading.Event()
    newcomers_asked = threading.Event()
    first: list[str] = []

    class Model(StepsModel):
        async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
            decided = await super().decide(inp, deadline=deadline)
            with self.lock:
                if len({r for r in self.asked if r not in first}) >= 2:
                    newcomers_asked.set()
            return decided

    model = Model(100, steps=2)

    @fp.tool(effect="read", capability="logs:read", timeout_seconds=10)
    def search_logs(query: str) -> dict[str, Any]:
        """Search logs (the first run's search waits until newcomers had their chance)."""
        if not first:
            first.append(model.asked[0])
            release.wait(5)
        return {"hits": [query]}

    graph = fp.build_agent_graph(
        fp.ToolRegistry([search_logs]), model, ledger=ledger, tokens_per_step=200
    ).compile(checkpointer=InMemorySaver())

    def one(_: int) -> fp.AgentState:
        return fp.run_output(
            graph.invoke(fp.start("q", budget()), thread(), context=tenant_context())
        )

    with ThreadPoolExecutor(max_workers=4) as pool:
        under_way = pool.submit(one, 0)
        while not first:
            threading.Event().wait(0.01)
        later = [pool.submit(one, n) for n in range(1, 4)]
        # Newcomers that could take the pool do so at once; give them the chance, then let
        # the first run's tool return.
        newcomers_asked.wait(1.0)
        release.set()
        head = under_way.result()
        rest = [f.result() for f in later]
    assert head.termination is fp.TerminationReason.COMPLETED, head.last_error_code
    done = [s for s in rest if s.termination is fp.TerminationReason.COMPLETED]
    assert len(done) == 1
    assert {s.run_id for s in done} | {head.run_id} == set(model.asked)
    assert ledger.balance(TENANT).held["tokens"] == 400


def test_newcomers_that_start_together_take_turns_in_the_order_they_were_counted(
    ledger: fp.Ledger,
) -> None:
    # A run takes its first step and its tool blocks; six runs start at the same instant, in
    # threads that switch as often as the interpreter lets them. A newcomer counted as getting
    # its first hold keeps that place in the line: were its turn drawn later, a newcomer
    # counted after it but first in the line would wait for its hold while it waits for that
    # newcomer's turn, both until their deadlines. The pool pays for two whole runs: the run
    # under way and one newcomer complete, every other ends as soon as spending leaves no room.
    ledger.open_account(TENANT, {"tokens": 2 * 2 * 100})
    model = StepsModel(100, steps=2)
    newcomers = 6
    together = threading.Barrier(newcomers + 1)
    release = threading.Event()
    first: list[str] = []

    @fp.tool(effect="read", capability="logs:read", timeout_seconds=10)
    def search_logs(query: str) -> dict[str, Any]:
        """Search logs (the first run's search waits until the newcomers have looked)."""
        if not first:
            first.append(model.asked[0])
            release.wait(5)
        return {"hits": [query]}

    graph = fp.build_agent_graph(
        fp.ToolRegistry([search_logs]), model, ledger=ledger, tokens_per_step=200
    ).compile(checkpointer=InMemorySaver())

    def one(newcomer: bool) -> fp.AgentState:
        if newcomer:
            together.wait()
        return fp.run_output(
            graph.invoke(
                fp.start("q", budget()),
                thread(),
                context=context(seconds=60).model_copy(update={"budget_account": TENANT}),
            )
        )

    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(max_workers=newcomers + 1) as pool:
            under_way = pool.submit(one, False)
            while not first:
                threading.Event().wait(0.01)
            later = [pool.submit(one, True) for _ in range(newcomers)]
            together.wait()
            threading.Event().wait(0.2)  # the newcomers count and join the line meanwhile
            release.set()
            states = [under_way.result(), *(f.result() for f in later)]
    finally:
        sys.setswitchinterval(switching)
    completed = [s for s in states if s.termination is fp.TerminationReason.COMPLETED]
    assert states[0] in completed
    assert len(completed) == 2
    assert {s.last_error_code for s in states if s not in completed} == {"tokens_exhausted"}
    assert set(model.asked) == {s.run_id for s in completed}
    assert ledger.balance(TENANT).held["tokens"] == 400


def test_a_run_resumed_after_a_crash_never_waits_for_its_own_unsettled_step() -> None:
    # The process dies right after a run's first step is held on a tenant pool that pays for
    # one step: that hold stays in flight (an attempt is never refunded). Resumed, the run's
    # next step is refused by the pool, and what holds the room is the run's own attempt,
    # which nothing will settle: the refusal is the spending's. The run ends at once, asking
    # the ledger once, never again and again until its deadline.
    reserves: list[str] = []

    class Ledger(CrashingMemoryLedger):
        def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> fp.Reservation:
            reserves.append(key)
            return super().reserve(account, key, amounts)

    ledger = Ledger()
    ledger.open_account(TENANT, {"steps": 1})
    model = StepsModel(100, steps=2)
    graph = fp.build_agent_graph(make_registry(Calls()), model, ledger=ledger).compile(
        checkpointer=InMemorySaver()
    )
    config = thread()
    ctx = context(seconds=20).model_copy(update={"budget_account": TENANT})
    ledger.crash_at = 1  # the first ledger write: the first step's hold
    with pytest.raises(Crash):
        graph.invoke(fp.start("q", budget()), config, context=ctx)
    assert ledger.in_flight(TENANT)["steps"] == 1
    reserves.clear()
    state = fp.run_output(graph.invoke(None, config, context=ctx))
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert state.last_error_code == "steps_exhausted"
    assert model.asked == []
    assert len(reserves) == 2  # the first step's hold found again, the second's refused once


def test_runs_under_way_finish_first_when_the_app_builds_its_graph_per_request_on_one_saver(
    tmp_path: Path,
) -> None:
    # An app builds its graph per request on one module-level SqliteSaver: each graph gets a
    # SqliteLedger object of its own on the saver's file, and their steps wait in one line
    # (the books the ledgers name). A run takes its first step and its tool blocks; three runs
    # start meanwhile, each on its own graph; the pool pays for two whole runs: the run under
    # way and one newcomer complete.
    path = tmp_path / "app.db"
    with SqliteLedger(path) as opening:
        opening.open_account(TENANT, {"tokens": 2 * 2 * 100})
    saver = SqliteSaver(sqlite3.connect(path, check_same_thread=False))
    release = threading.Event()
    newcomers_asked = threading.Event()
    first: list[str] = []

    class Model(StepsModel):
        async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
            decided = await super().decide(inp, deadline=deadline)
            with self.lock:
                if len({r for r in self.asked if r not in first}) >= 2:
                    newcomers_asked.set()
            return decided

    model = Model(100, steps=2)

    @fp.tool(effect="read", capability="logs:read", timeout_seconds=10)
    def search_logs(query: str) -> dict[str, Any]:
        """Search logs (the first run's search waits until newcomers had their chance)."""
        if not first:
            first.append(model.asked[0])
            release.wait(5)
        return {"hits": [query]}

    def one(_: int) -> fp.AgentState:
        graph = fp.build_agent_graph(
            fp.ToolRegistry([search_logs]), model, tokens_per_step=200
        ).compile(checkpointer=saver)
        return fp.run_output(
            graph.invoke(fp.start("q", budget()), thread(), context=tenant_context())
        )

    with ThreadPoolExecutor(max_workers=4) as pool:
        under_way = pool.submit(one, 0)
        while not first:
            threading.Event().wait(0.01)
        later = [pool.submit(one, n) for n in range(1, 4)]
        # Newcomers that could take the pool do so at once (on a loaded machine, within
        # seconds); give them the chance, then let the first run's tool return.
        newcomers_asked.wait(5.0)
        release.set()
        head = under_way.result()
        rest = [f.result() for f in later]
    assert head.termination is fp.TerminationReason.COMPLETED, head.last_error_code
    assert [s.termination for s in rest].count(fp.TerminationReason.COMPLETED) == 1


def test_a_run_whose_deadline_passes_while_it_waits_for_room_ends_past_its_deadline() -> None:
    # The tenant's pool has room for one step in flight; a run's first step waits for
    # another run's step, in flight past the waiting run's deadline. Nothing of the pool is
    # spent: the run ends deadline_exceeded, not blaming a budget that had room.
    ledger = fp.InMemoryLedger()
    ledger.open_account(TENANT, {"tokens": 300})  # room for one step in flight, not two
    waiter_done = threading.Event()
    in_flight = threading.Event()
    first: list[str] = []

    class Model:
        async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
            if not first:
                first.append(inp.run_id)
                in_flight.set()
                await asyncio.to_thread(waiter_done.wait, 30)
            return fp.Decided(decision=FINAL, input_tokens=40, output_tokens=10)

    graph = fp.build_agent_graph(
        make_registry(Calls()), Model(), ledger=ledger, tokens_per_step=200
    ).compile(checkpointer=InMemorySaver())

    def run(seconds: float) -> fp.AgentState:
        ctx = context(seconds=seconds).model_copy(update={"budget_account": TENANT})
        return fp.run_output(graph.invoke(fp.start("q", budget()), thread(), context=ctx))

    with ThreadPoolExecutor(max_workers=1) as pool:
        holding = pool.submit(run, 60)
        assert in_flight.wait(20)
        try:
            waiting = run(5)
        finally:
            waiter_done.set()
        assert holding.result().termination is fp.TerminationReason.COMPLETED
    assert first == [holding.result().run_id]  # the waiting run's model was never asked
    assert waiting.termination is fp.TerminationReason.DEADLINE_EXCEEDED, waiting.last_error_code


def test_a_run_with_no_shared_pool_never_waits_in_another_tenants_line() -> None:
    # Nothing another tenant does reaches this tenant's runs, and a step waits only for steps
    # in flight that hold the room it needs. Tenant A's pool has room for one step in flight:
    # while its first run's step is in flight, its second run waits in the line; a run of
    # tenant B, whose chain limits nothing, is asked at once, while A's first step is still
    # in flight.
    ledger = WatchedLedger()
    ledger.open_account(TENANT, {"tokens": 300})  # room for one step in flight, not two
    other_asked = threading.Event()
    held_for_other: list[bool] = []
    first: list[str] = []

    class Model:
        async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
            if inp.question == "another tenant's question":
                other_asked.set()
            elif not first:
                first.append(inp.run_id)
                ledger.first_in_model.set()
                # In flight until the other tenant's run was asked (or long past what that
                # takes on a loaded machine).
                held_for_other.append(await asyncio.to_thread(other_asked.wait, 10))
            return fp.Decided(decision=FINAL, input_tokens=40, output_tokens=10)

    graph = fp.build_agent_graph(
        make_registry(Calls()), Model(), ledger=ledger, tokens_per_step=200
    ).compile(checkpointer=InMemorySaver())
    tenant = context(seconds=60).model_copy(update={"budget_account": TENANT})

    def run(question: str, ctx: fp.RunContext) -> fp.AgentState:
        return fp.run_output(graph.invoke(fp.start(question, budget()), thread(), context=ctx))

    with ThreadPoolExecutor(max_workers=3) as pool:
        under_way = pool.submit(run, "q", tenant)
        assert ledger.first_in_model.wait(20)
        newcomer = pool.submit(run, "q", tenant)  # waits in the line for the tenant's room
        assert ledger.another_waits.wait(20)
        other = pool.submit(run, "another tenant's question", context(tenant="other"))
        states = [under_way.result(), newcomer.result(), other.result()]
    assert states[2].termination is fp.TerminationReason.COMPLETED
    assert held_for_other == [True]


def test_a_cancelled_run_keeps_no_room_in_the_pool(ledger: fp.Ledger) -> None:
    # A run takes a step, pauses for an approval, and is cancelled: it is no longer under way,
    # so a run that starts next takes the pool at once, not after the cancelled run's deadline
    # (an hour here; the later run has far less).
    ledger.open_account(TENANT, {"tokens": 2 * 2 * 100})

    class Model(StepsModel):
        async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
            if inp.question != "write":
                return await super().decide(inp, deadline=deadline)
            decision = call("write_note", note="n")
            return fp.Decided(decision=decision, input_tokens=50, output_tokens=50)

    graph = fp.build_agent_graph(
        make_registry(Calls()),
        Model(100, steps=2),
        ledger=ledger,
        tokens_per_step=200,
        approval="interrupt",
    ).compile(checkpointer=InMemorySaver())
    paused_ctx = context(seconds=3600).model_copy(update={"budget_account": TENANT})
    config = thread()
    paused = graph.invoke(fp.start("write", budget()), config, context=paused_ctx)
    assert "__interrupt__" in paused
    cancelled = fp.cancel(graph, config, context=paused_ctx)
    assert cancelled is not None and cancelled.termination is fp.TerminationReason.CANCELLED
    later = fp.run_output(
        graph.invoke(
            fp.start("q", budget()),
            thread(),
            context=context(seconds=20).model_copy(update={"budget_account": TENANT}),
        )
    )
    assert later.termination is fp.TerminationReason.COMPLETED, later.last_error_code


def test_a_run_paused_under_way_keeps_room_for_its_next_step_only_until_its_deadline(
    ledger: fp.Ledger,
) -> None:
    # A run takes a step and pauses for an approval nobody gives. Until its deadline the pool
    # keeps room for its next step, then no longer: a run that starts meanwhile waits that
    # long, not for the paused run to end (it may never), and completes.
    ledger.open_account(TENANT, {"tokens": 2 * 2 * 100})

    class Model(StepsModel):
        async def decide(self, inp: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decided:
            if inp.question != "write":
                return await super().decide(inp, deadline=deadline)
            with self.lock:
                self.asked.append(inp.run_id)
            decision = call("write_note", note="n")
            return fp.Decided(decision=decision, input_tokens=50, output_tokens=50)

    model = Model(100, steps=2)
    graph = fp.build_agent_graph(
        make_registry(Calls()), model, ledger=ledger, tokens_per_step=200, approval="interrupt"
    ).compile(checkpointer=InMemorySaver())
    # Time enough for a machine whose cores are all busy to reach the approval first: the
    # later run waits this long, so it is kept short.
    paused_ctx = context(seconds=2).model_copy(update={"budget_account": TENANT})
    paused = graph.invoke(fp.start("write", budget()), thread(), context=paused_ctx)
    assert "__interrupt__" in paused  # paused under way, holding nothing in flight
    later = fp.run_output(
        graph.invoke(
            fp.start("q", budget()),
            thread(),
            context=context(seconds=60).model_copy(update={"budget_account": TENANT}),
        )
    )
    assert later.termination is fp.TerminationReason.COMPLETED, later.last_error_code
    assert ledger.balance(TENANT).held["tokens"] == 300
