"""A decision model whose ``decide`` is a plain ``def`` runs on a thread of its run's tenant's
share, as a sync tool body does, under ``invoke`` and ``ainvoke``, and is held to the same
containment as an ``async def`` model: its deadline (left behind on its thread past it), what it
raises (``BaseException`` included: that step's failure, logged once on ``fencepost.model`` and
nowhere else), its tenant's share of threads (none left: ``unavailable``, never run), and the
caller's own cancellation (raised to the caller, the model left behind).

Each test drives the real compiled graph; anything that could hang runs under ``finishes``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_config

import fencepost as fp
from fencepost.graph.containment import tool_threads
from tests.graph import test_tool_isolation as isolation
from tests.graph.kit import ABSTAIN, Calls, budget, call, context, make_registry, thread
from tests.graph.test_tool_isolation import BASE_EXCEPTIONS, SECRET, finishes, wait_until
from tests.telemetry_kit import assert_only_in_one_traceback

release = isolation.release
"""A fixture: an event models that must outlive their deadline wait on, set when a test ends."""
small_pool = isolation.small_pool
"""A fixture: a pool of 2 threads that may grow to 4, in place of the process's pool."""

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


class SyncModel:
    """A decision model with a plain ``def decide``: plays a script, notes where it ran."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.threads: list[str] = []
        self.seen: list[Any] = []

    def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:
        self.threads.append(threading.current_thread().name)
        entry = self.script.pop(0)
        if callable(entry):
            entry = entry(input)
        if isinstance(entry, BaseException):
            raise entry
        return entry


def _graph(model: Any, saver: InMemorySaver | None = None, **build: Any) -> Any:
    return fp.build_agent_graph(make_registry(Calls()), model, **build).compile(
        checkpointer=saver or InMemorySaver()
    )


def _run(graph: Any, mode: str, config: dict[str, Any] | None = None) -> fp.AgentState:
    config = config or thread()
    if mode == "invoke":
        out = graph.invoke(fp.start("q", budget()), config, context=context())
    else:
        out = asyncio.run(graph.ainvoke(fp.start("q", budget()), config, context=context()))
    return fp.run_output(out)


MODES = ["invoke", "ainvoke"]


@pytest.mark.parametrize("mode", MODES)
def test_a_sync_decide_runs_on_a_tool_thread_with_its_runs_config_and_context_vars(
    mode: str,
) -> None:
    def sees_its_run(_: fp.DecisionInput) -> fp.ToolProposal:
        seen.append((get_config()["configurable"]["thread_id"], REQUEST_ID.get()))
        return call("search_logs")

    seen: list[tuple[str, str]] = []
    model = SyncModel([sees_its_run, ABSTAIN])
    config = thread()

    def as_its_caller() -> fp.AgentState:
        REQUEST_ID.set("req-7")  # the caller's, on the thread that invokes
        return _run(_graph(model), mode, config)

    state = finishes(as_its_caller)
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    assert len(state.observations) == 1
    assert model.threads == ["fencepost-tool", "fencepost-tool"]
    assert seen == [(config["configurable"]["thread_id"], "req-7")]


@pytest.mark.parametrize("exc", BASE_EXCEPTIONS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("mode", MODES)
def test_a_base_exception_from_a_sync_decide_is_that_steps_internal_error_logged_once(
    exc: BaseException,
    mode: str,
    small_pool: tool_threads.ToolThreads,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    saver = InMemorySaver()
    state = finishes(lambda: _run(_graph(SyncModel([exc]), saver, model_retries=0), mode))
    assert state.termination is fp.TerminationReason.FAILED
    assert state.last_error_code == "internal_error"
    assert SECRET not in repr(state)
    assert SECRET not in repr(list(saver.storage.values())) + repr(saver.writes)
    # The runtime keeps serving: the pool's thread is back, the next run runs.
    wait_until(lambda: small_pool.stats() == (0, 0))
    again = finishes(lambda: _run(_graph(SyncModel([call("search_logs"), ABSTAIN])), mode))
    assert len(again.observations) == 1
    assert_only_in_one_traceback(caplog.records, SECRET, "fencepost.model")


@pytest.mark.parametrize("mode", MODES)
def test_a_sync_decide_raising_its_own_cancellation_ends_its_step_cancelled(mode: str) -> None:
    state = finishes(
        lambda: _run(_graph(SyncModel([asyncio.CancelledError()]), model_retries=0), mode)
    )
    assert state.termination is fp.TerminationReason.FAILED
    assert state.last_error_code == "cancelled"


def _stuck(gate: threading.Event) -> Callable[[fp.DecisionInput], Any]:
    def stuck(_: fp.DecisionInput) -> Any:
        gate.wait(60)  # ignores its deadline, as a blocking client would
        return ABSTAIN

    return stuck


@pytest.mark.parametrize("mode", MODES)
def test_a_sync_decide_past_its_deadline_ends_its_step_with_timeout_and_is_left_behind(
    mode: str, small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    model = SyncModel([_stuck(release)])
    graph = _graph(model, model_timeout_seconds=0.2, model_retries=0)
    state = finishes(lambda: _run(graph, mode))
    assert state.termination is fp.TerminationReason.FAILED
    assert state.last_error_code == "timeout"
    # Its thread is left behind: it no longer counts against the tenant's healthy share.
    assert small_pool.stats() == (1, 1)
    release.set()
    wait_until(lambda: small_pool.stats() == (0, 0))


@pytest.mark.parametrize("mode", MODES)
def test_a_tenant_whose_threads_are_all_left_behind_fails_a_sync_decide_fast_as_unavailable(
    mode: str, small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    for _ in range(4):  # the cap is 4
        stuck = _graph(SyncModel([_stuck(release)]), model_timeout_seconds=0.1, model_retries=0)
        assert finishes(lambda g=stuck: _run(g, mode)).last_error_code == "timeout"
    assert small_pool.stats() == (4, 4)
    patient = SyncModel([ABSTAIN])
    # Its own 120 s are not spent queueing behind threads that may never come back.
    state = finishes(
        lambda: _run(_graph(patient, model_timeout_seconds=120, model_retries=0), mode),
        within=50,
    )
    assert state.termination is fp.TerminationReason.FAILED
    assert state.last_error_code == "unavailable"
    assert patient.threads == []  # never ran
    release.set()
    wait_until(lambda: small_pool.stats() == (0, 0))


def test_the_callers_cancellation_of_ainvoke_is_raised_and_the_sync_decide_left_behind(
    small_pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    started = threading.Event()

    def blocks(_: fp.DecisionInput) -> Any:
        started.set()
        release.wait(60)
        return ABSTAIN

    graph = _graph(SyncModel([blocks]), model_timeout_seconds=60)

    async def cancelled_while_it_blocks() -> None:
        task = asyncio.ensure_future(
            graph.ainvoke(fp.start("q", budget()), thread(), context=context())
        )
        while not started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    finishes(lambda: asyncio.run(cancelled_while_it_blocks()))
    assert small_pool.stats() == (1, 1)
    release.set()
    wait_until(lambda: small_pool.stats() == (0, 0))


@pytest.mark.parametrize("mode", MODES)
def test_a_def_decide_handing_back_an_awaitable_is_awaited_as_an_async_one(mode: str) -> None:
    class Wrapped:
        """A ``def decide`` around an ``async def`` (as a tracing decorator makes one)."""

        async def _decide(self, input: fp.DecisionInput) -> fp.Decision:
            await asyncio.sleep(0)
            return call("search_logs") if not input.observations else ABSTAIN

        def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:
            return self._decide(input)

    state = finishes(lambda: _run(_graph(Wrapped()), mode))
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    assert len(state.observations) == 1


def test_ctrl_c_while_invoke_waits_on_a_sync_decide_reaches_the_caller_and_leaves_it_behind(
    small_pool: tool_threads.ToolThreads, release: threading.Event, python_sigint: None
) -> None:
    started = threading.Event()

    def blocks(_: fp.DecisionInput) -> Any:
        started.set()
        release.wait(60)
        return ABSTAIN

    main = threading.main_thread().ident
    assert main is not None

    def fire() -> None:
        if started.wait(60):
            time.sleep(0.2)  # the node's thread is in its wait by now
            signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=fire, daemon=True).start()
    graph = _graph(SyncModel([blocks]), model_timeout_seconds=600)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        graph.invoke(fp.start("q", budget()), thread(), context=context(seconds=None))
    # A bound, not a measurement: a caller that waited would spend the model's 600 s.
    assert time.monotonic() - began < 60
    assert small_pool.stats() == (1, 1)
    release.set()
    wait_until(lambda: small_pool.stats() == (0, 0))
