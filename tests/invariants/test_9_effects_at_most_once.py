"""Invariant 9: an effect runs at most once per call id, and an unknown outcome is ``uncertain``.

A write cut off after it started has an unknown outcome whatever its body's kind. A call id that
already has a receipt never runs again, whatever the batch says: judged by the ledger (which
``update_state`` cannot reach), not only by the receipts in state: an approved write written
back into the batch by a state edit does not run a second time.

Over both bindings (the ``binding`` parameter, ``tests/invariants/bindings.py``: fencepost's graph,
and ``create_agent`` with ``fp.FencepostMiddleware``), at the end of this file: an approval sent
twice, a rollback to the checkpoint before the write ran. The other tests drive the graph's own
state, nodes or settings (``update_state``, ``Command(update=...)``, channels,
``interrupt_before``, repair, the approver, token estimates, savers and ledgers by URL), which the
middleware binding does not have: they stay graph-only.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool as lc_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import fencepost as fp
from fencepost.graph.containment import tools as tool_runner
from fencepost.graph.containment.tools import run_callable_blocking
from fencepost.graph.state import has_run
from fencepost.policy import ErrorCode, ReceiptStatus
from fencepost.policy.batch import BatchEntry
from fencepost.policy.execution import finished_before, ran
from fencepost.policy.keys import call_key
from fencepost.policy.ledger import ReservationStatus
from fencepost.policy.reservations import answered_before
from fencepost.policy.verdict import Verdict, VerdictCode
from tests.graph.kit import (
    ABSTAIN,
    LEDGERS,
    VERDICT_KEY,
    Calls,
    OnTimeThreads,
    allowed_entry,
    allowed_verdict,
    budget,
    call,
    context,
    each_ledger,
    edit_and_continue,
    forge_batch,
    harness,
    make_registry,
    state_of,
    thread,
    thread_account,
    write_then_read_paused_before_read,
)
from tests.graph.test_tool_isolation import NoArgs
from tests.invariants import bindings as bd
from tests.middleware import kit as mw
from tests.policy.factories import make_spec


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def _write(kind: str, effect: fp.Effect, started: list[str], gate: threading.Event) -> fp.ToolSpec:
    def sync_body(_: NoArgs, ctx: fp.ToolContext) -> str:
        started.append(ctx.idempotency_key)
        gate.wait(10)  # past its deadline
        return "written"

    async def async_body(_: NoArgs, ctx: fp.ToolContext) -> str:
        started.append(ctx.idempotency_key)
        await asyncio.sleep(30)  # past its deadline; honours its cancellation
        return "written"

    return fp.ToolSpec(
        name="restart_service",
        description="Restart a service.",
        args_model=NoArgs,
        effect=effect,
        capability="notes:write",
        timeout_seconds=0.05,
        execute=sync_body if kind == "sync" else async_body,
    )


@pytest.mark.parametrize("effect", [fp.Effect.WRITE, fp.Effect.EXTERNAL])
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_a_write_cut_off_at_its_timeout_is_uncertain_whatever_its_bodys_kind(
    effect: fp.Effect, kind: str, mode: str, release: threading.Event, on_time_pool: Any
) -> None:
    # The pool starts a sync body before its deadline can be judged, whatever the load: a write
    # no thread took in time is withdrawn and never started, which is not this rule's case.
    started: list[str] = []
    tool = _write(kind, effect, started, release)
    h = harness([call(tool.name), ABSTAIN], registry=fp.ToolRegistry([tool]), approval="interrupt")
    config, ctx = thread(), context()
    request = fp.start(
        "restart checkout", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=2)
    )
    if mode == "invoke":
        paused = h.graph.invoke(request, config, context=ctx)
        out = h.graph.invoke(Command(resume="approve"), config, context=ctx)
    else:
        paused = await h.graph.ainvoke(request, config, context=ctx)
        out = await h.graph.ainvoke(Command(resume="approve"), config, context=ctx)
    assert "__interrupt__" in paused
    state = fp.run_output(out)
    assert started == ["call-0001"]  # it started: whatever it did may have happened
    assert [(r.status, r.error_code) for r in state.receipts] == [
        (ReceiptStatus.UNCERTAIN, ErrorCode.EXECUTION_UNCERTAIN)
    ]
    assert state.report is not None
    assert state.report.effects_made == ("call-0001",)
    assert [c.call_id for c in state.report.uncertain] == ["call-0001"]


def test_a_read_cut_off_at_its_timeout_is_a_timeout_failure() -> None:
    async def slow(_: NoArgs, __: fp.ToolContext) -> str:
        await asyncio.sleep(30)
        return "late"

    tool = make_spec("slow_read", args_model=NoArgs, execute=slow)
    tool = tool.model_copy(update={"timeout_seconds": 0.05})
    h = harness([call(tool.name), ABSTAIN], registry=fp.ToolRegistry([tool]))
    state = h.run()
    assert [(r.status, r.error_code) for r in state.receipts] == [
        (ReceiptStatus.FAILED, ErrorCode.TIMEOUT)
    ]


@pytest.mark.parametrize("effect", [fp.Effect.WRITE, fp.Effect.EXTERNAL])
def test_the_outcome_of_a_cut_off_write_is_uncertain_and_of_a_write_that_never_started_is_not(
    effect: fp.Effect,
) -> None:
    write = make_spec("restart_service", effect=effect, capability="notes:write")
    entry = _entry(write.name)
    cut = ran(entry, write, 1, error=ErrorCode.TIMEOUT, cut_off=True)
    assert (cut.status, cut.event.error_code) == (  # type: ignore[union-attr]
        ReceiptStatus.UNCERTAIN,
        ErrorCode.EXECUTION_UNCERTAIN,
    )
    never = ran(entry, write, 1, error=ErrorCode.UNAVAILABLE)
    assert (never.status, never.event.error_code) == (  # type: ignore[union-attr]
        ReceiptStatus.FAILED,
        ErrorCode.UNAVAILABLE,
    )
    read = make_spec("search_logs")
    timed_out = ran(_entry(read.name), read, 1, error=ErrorCode.TIMEOUT, cut_off=True)
    assert timed_out.status is ReceiptStatus.FAILED


def _entry(name: str) -> BatchEntry:
    proposal = fp.ToolProposal(call_id="call-0001", tool_name=name, arguments={})
    verdict = Verdict(
        call_id="call-0001", tool_name=name, fingerprint="f", code=VerdictCode.ALLOWED
    )
    return BatchEntry(proposal=proposal, verdict=verdict)


ledger = pytest.fixture(params=LEDGERS, name="ledger")(each_ledger)


def _ran_then_paused(
    ledger: fp.Ledger, key: bytes | None, **build: Any
) -> tuple[Any, dict[str, Any], fp.RunContext]:
    """A run whose searches (call-0001 to 3) ran, now paused for approval of a write."""
    h = harness(
        [call(n=1), call(n=2), call(n=3), call("write_note", 4, note="a"), ABSTAIN, ABSTAIN],
        approval="interrupt",
        verdict_key=key,
        ledger=ledger,
        **build,
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget(steps=8, tools=6)), config, context=ctx)
    assert h.graph.get_state(config).next == ("approve",)
    assert h.calls.count("search_logs") == 3
    return h, config, ctx


def _first_entry(h: Any, config: dict[str, Any]) -> fp.policy.BatchEntry:
    """The gate's own (sealed, with a key) entry of call-0001, from the thread's history."""
    for snapshot in h.graph.get_state_history(config):
        values = snapshot.values
        if not has_run(values):
            continue
        for entry in fp.run_output(values).batch:
            if entry.call_id == "call-0001":
                return entry  # type: ignore[no-any-return]
    raise AssertionError("no batch held call-0001")


@pytest.mark.parametrize("key", [None, VERDICT_KEY], ids=["no-key", "key"])
@pytest.mark.parametrize("how", ["command-update-beside-resume", "update_state-as-approve"])
def test_a_sealed_entry_written_back_mid_run_never_runs_its_call_again(
    how: str, key: bytes | None, ledger: fp.Ledger
) -> None:
    h, config, ctx = _ran_then_paused(ledger, key)
    replayed = _first_entry(h, config)
    if how == "command-update-beside-resume":
        batch = (replayed, *state_of(h, config).batch)
        h.graph.invoke(
            Command(update={"run": {"batch": batch}}, resume="approve"), config, context=ctx
        )
    else:
        h.graph.update_state(config, {"run": {"batch": (replayed,)}}, as_node="approve")
        h.graph.invoke(None, config, context=ctx)
    assert h.calls.count("search_logs") == 3
    state = state_of(h, config)
    assert [(r.status, r.attempts) for r in state.receipts if r.call_id == "call-0001"] == [
        (fp.ReceiptStatus.COMPLETED, 1)
    ]
    assert ledger.get(call_key(thread_account(config), "call-0001", 2)) is None


@pytest.mark.parametrize("key", [None, VERDICT_KEY], ids=["no-key", "key"])
def test_a_call_run_again_from_a_rolled_back_checkpoint_never_runs_twice(
    key: bytes | None, ledger: fp.Ledger
) -> None:
    # Time travel through the graph is a new run on an account of its own
    # (tests/features/test_a_fork_is_a_new_run.py); whoever can write the checkpoint store can
    # still roll the thread back to the checkpoint before its execute step, the same run on the
    # same account. There the state holds no receipt for the call: the ledger alone says
    # attempt 1 ran.
    h, config, ctx = _ran_then_paused(ledger, key)
    history = list(h.graph.get_state_history(config))
    before = next(
        s
        for s in history
        if s.next == ("execute",)
        and any(e.call_id == "call-0001" for e in fp.run_output(s.values).batch)
    )
    saver = h.graph.checkpointer
    assert isinstance(saver, InMemorySaver)
    thread_id, kept = config["configurable"]["thread_id"], before.config["configurable"]
    for snapshot in history:  # the rollback: every checkpoint after ``before``, and its writes
        later = snapshot.config["configurable"]["checkpoint_id"]
        if later > kept["checkpoint_id"]:
            del saver.storage[thread_id][""][later]
    for write_key in [k for k in saver.writes if k[:3] == (thread_id, "", kept["checkpoint_id"])]:
        del saver.writes[write_key]
    assert h.graph.get_state(config).next == ("execute",)
    settled = ledger.get(call_key(thread_account(config), "call-0001", 1))
    assert settled is not None and settled.status is ReservationStatus.SETTLED
    out = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert h.calls.count("search_logs") == 3
    (receipt,) = [r for r in out.receipts if r.call_id == "call-0001"]
    assert receipt.status is fp.ReceiptStatus.UNCERTAIN
    assert receipt.error_code is fp.ErrorCode.EXECUTION_UNCERTAIN
    assert ledger.get(call_key(thread_account(config), "call-0001", 2)) is None


def test_a_call_whose_attempt_finished_is_never_run_again_and_not_guessed() -> None:
    spec = make_registry(Calls()).get("search_logs")
    entry = allowed_entry(call(n=1))
    ran = finished_before(entry, spec, 1, started=True)
    assert (ran.status, ran.attempts) == (fp.ReceiptStatus.UNCERTAIN, 1)
    assert ran.event.error_code is fp.ErrorCode.EXECUTION_UNCERTAIN  # type: ignore[union-attr]
    never = finished_before(entry, spec, 1, started=False)
    assert (never.status, never.attempts) == (fp.ReceiptStatus.DENIED, 0)


def test_an_attempt_the_ledger_holds_answers_its_call_unless_a_crash_lost_the_result() -> None:
    released, settled = ReservationStatus.RELEASED, ReservationStatus.SETTLED
    assert answered_before(released, run_went_on=False)
    assert answered_before(settled, run_went_on=True)
    # Settled in the run's latest step: a crash between the settlement and the checkpoint.
    assert not answered_before(settled, run_went_on=False)
    assert not answered_before(ReservationStatus.RESERVED, run_went_on=True)


@pytest.mark.parametrize("how", ["update_state", "command"])
def test_a_state_edit_cannot_run_an_approved_write_a_second_time(how: str) -> None:
    h, config, ctx, write, read = write_then_read_paused_before_read("approve")
    assert h.calls.count("write_note") == 1
    update = forge_batch(h, config, (read, write), (allowed_verdict(read), allowed_verdict(write)))
    edit_and_continue(h, config, ctx, update, how)
    assert h.calls.count("write_note") == 1


# -- over both bindings: fencepost's graph, and create_agent + FencepostMiddleware -------------


def test_an_approved_write_runs_once_however_often_the_answer_is_sent(
    binding: type[bd.Binding],
) -> None:
    b = bd.waiting_write(binding, "pay")
    b.resume("approve", mw.ctx())
    out = b.resume("approve", mw.ctx())
    assert out.bodies == ["write_note:pay"]


def test_a_write_run_again_from_a_checkpoint_before_it_ran_never_runs_twice(
    binding: type[bd.Binding],
) -> None:
    b = bd.waiting_write(binding, "pay")
    assert b.resume("approve", mw.ctx()).bodies == ["write_note:pay"]
    out = b.before_tools()
    assert out.bodies == ["write_note:pay"]


def test_a_write_that_outlives_its_timeout_is_shown_uncertain_in_either_binding(
    binding: type[bd.Binding], release: threading.Event, on_time_pool: Any
) -> None:
    @lc_tool
    def restart_service(service: str) -> str:
        """Restart a service."""
        release.wait(3)  # past its deadline, in either binding
        return "restarted"

    declared = {"effect": "write", "capability": "notes:write", "timeout_seconds": 0.05}
    b = binding(
        bd.then_answer(bd.call("restart_service", {"service": "checkout"}, 1)),
        steps=4,
        tools=2,
        approval="interrupt",
        extra_tools=[(restart_service, declared)],
    )
    assert b.start(mw.ctx()).paused
    out = b.resume("approve", mw.ctx())
    shown = {m.tool_call_id: str(m.content) for m in out.received[-1] if isinstance(m, ToolMessage)}
    assert "execution_uncertain" in shown["call-0001"]


def test_a_write_no_thread_took_is_never_shown_uncertain_in_either_binding(
    binding: type[bd.Binding], release: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Uncertain only where it is unknown whether the effect happened: a write whose body no
    thread could take (its tenant's share held by a body left behind) never started, and is
    refused ``unavailable`` as the graph binding refuses it, never ``execution_uncertain``."""
    b = bd.waiting_write(binding)
    pool = OnTimeThreads(1, 1, 1)
    monkeypatch.setattr(tool_runner, "_threads", pool)
    hung = run_callable_blocking(lambda: release.wait(30), timeout_seconds=0.05, tenant="acme")
    assert not hung.finished and pool.stats() == (1, 1)  # the tenant's one thread, left behind
    out = b.resume("approve", mw.ctx())
    assert out.bodies == []
    shown = {m.tool_call_id: str(m.content) for m in out.received[-1] if isinstance(m, ToolMessage)}
    assert "unavailable" in shown["call-0001"]
