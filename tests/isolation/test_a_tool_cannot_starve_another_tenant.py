"""A blocked or leaked worker cannot starve healthy tools: one tenant's hung sync bodies leave
another tenant's tool a thread (DESIGN, "Isolation: runs, tenants, callers").

Every tenant holds a bounded share of the sync-tool threads, and the process a bounded total:
tenant A's hung bodies — still inside their timeout, or left behind past it — take from A's
share only, so tenant B's healthy tool starts at once whatever A does. Bodies that must outlive
their deadline block on an event the test releases, never on a long sleep, and every scenario
that could hang runs under ``finishes`` (a failure, not a hung suite).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fencepost as fp
from fencepost.graph.containment import tool_threads
from fencepost.graph.containment import tools as tool_runner
from fencepost.graph.containment.shared_loop import run_sync
from fencepost.graph.containment.tools import ToolRun, run_tool, run_tool_blocking
from fencepost.policy import Deadline, ErrorCode, ToolContext
from tests.graph.kit import (
    Calls,
    OnTimeThreads,
    call,
    context,
    final_citing_last,
    harness,
    make_registry,
)
from tests.graph.test_tool_isolation import NoArgs, finishes, spec, wait_until


def tenant(name: str) -> ToolContext:
    return ToolContext(
        run_id=f"run-{name}", tenant_id=name, principal_id="u-1", deadline=Deadline.after(600)
    )


A, B = tenant("tenant-a"), tenant("tenant-b")


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[tool_threads.ToolThreads]:
    """A pool of the process's own sizes, with no other test's leftovers in it, whose bodies
    start before their callers wait for them whatever the machine's load (``OnTimeThreads``):
    a body these tests leave behind has started."""
    fresh = OnTimeThreads()
    monkeypatch.setattr(tool_runner, "_threads", fresh)
    yield fresh


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Held by the hung bodies; set when the test ends, so every thread goes home."""
    event = threading.Event()
    yield event
    event.set()


def hung(gate: threading.Event) -> Callable[..., Any]:
    def body(_: NoArgs, __: ToolContext) -> None:
        gate.wait(120)  # a blocking call that ignores its deadline

    return body


def healthy(ran: list[str]) -> Callable[..., Any]:
    def body(_: NoArgs, ctx: ToolContext) -> str:
        ran.append(ctx.tenant_id)
        return "ok"

    return body


def hold(ctx: ToolContext, n: int, gate: threading.Event, *, timeout: float) -> None:
    """``n`` calls of ``ctx``'s tenant, each on a caller thread of its own, blocked in a body."""
    for _ in range(n):
        threading.Thread(
            target=run_tool_blocking,
            args=(spec(hung(gate)), NoArgs(), ctx),
            kwargs={"timeout_seconds": timeout},
            daemon=True,
        ).start()


async def abandon(ctx: ToolContext, rounds: int, gate: threading.Event) -> list[ToolRun]:
    """``rounds`` runs of 32 concurrent calls each, every body left behind at its deadline."""
    runs: list[ToolRun] = []
    for _ in range(rounds):
        runs += await asyncio.gather(
            *(run_tool(spec(hung(gate)), NoArgs(), ctx, timeout_seconds=0.05) for _ in range(32))
        )
    return runs


def test_a_tenants_hung_bodies_inside_their_timeout_leave_another_tenant_a_thread(
    pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    # 32 of A's bodies, each still inside its own 120 s: every thread the pool keeps for healthy
    # bodies would be taken by them, and B would wait out its own deadline.
    hold(A, 32, release, timeout=120)
    wait_until(lambda: pool.stats() == (32, 0))
    ran: list[str] = []
    result = finishes(
        lambda: run_tool_blocking(spec(healthy(ran)), NoArgs(), B, timeout_seconds=30),
        within=60,
    )
    assert result == ToolRun(value="ok")
    assert ran == ["tenant-b"]
    release.set()
    wait_until(lambda: pool.stats() == (0, 0))


def test_a_tenants_bodies_left_behind_at_the_cap_leave_another_tenant_a_thread(
    pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    # 8 runs of 32 bodies, each left behind at its deadline: 256, the process's cap. A fills
    # its own share; what it tries past that fails at once, and never runs.
    runs = finishes(lambda: run_sync(abandon(A, 8, release)), within=120)
    left_behind = ToolRun(error=ErrorCode.TIMEOUT, abandoned=True, cut_off=True)
    refused = ToolRun(error=ErrorCode.UNAVAILABLE, never_started=True)
    assert pool.tenant_cap < pool.cap == len(runs)
    assert runs == [left_behind] * pool.tenant_cap + [refused] * (pool.cap - pool.tenant_cap)
    assert pool.stats() == (pool.tenant_cap, pool.tenant_cap)
    ran: list[str] = []
    result = finishes(
        lambda: run_tool_blocking(spec(healthy(ran)), NoArgs(), B, timeout_seconds=30),
        within=60,
    )
    assert result == ToolRun(value="ok")
    assert ran == ["tenant-b"]
    release.set()
    wait_until(lambda: pool.stats() == (0, 0))


def test_a_tenant_whose_share_is_all_left_behind_fails_fast_and_its_body_never_runs(
    pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    finishes(lambda: run_sync(abandon(A, pool.tenant_cap // 32, release)), within=120)
    assert pool.stats() == (pool.tenant_cap, pool.tenant_cap)
    ran: list[str] = []
    # Its 60 s are not spent queueing behind threads of its own that may never come back.
    result = finishes(
        lambda: run_tool_blocking(spec(healthy(ran)), NoArgs(), A, timeout_seconds=60),
        within=30,
    )
    assert result == ToolRun(error=ErrorCode.UNAVAILABLE, never_started=True)
    assert ran == []
    release.set()
    wait_until(lambda: pool.stats() == (0, 0))
    assert run_tool_blocking(spec(healthy(ran)), NoArgs(), A, timeout_seconds=5) == ToolRun(
        value="ok"
    )


def test_tenants_minted_by_one_caller_never_hold_more_than_the_process_total(
    release: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tenant id is the caller's to choose: a caller minting ids gets a share per id, but
    # never more threads than the process's total, and at that total every call fails fast.
    small = OnTimeThreads(base=2, cap=8, tenant_cap=4)
    monkeypatch.setattr(tool_runner, "_threads", small)

    async def four_left_behind(ctx: ToolContext) -> list[ToolRun]:
        runs: list[ToolRun] = []
        for _ in range(2):
            runs += await asyncio.gather(
                *(run_tool(spec(hung(release)), NoArgs(), ctx, timeout_seconds=0.05) for _ in "ab")
            )
        return runs

    for n in range(3):
        finishes(lambda n=n: run_sync(four_left_behind(tenant(f"minted-{n}"))))
    assert small.stats() == (8, 8)
    ran: list[str] = []
    result = finishes(
        lambda: run_tool_blocking(spec(healthy(ran)), NoArgs(), tenant("late"), timeout_seconds=60),
        within=30,
    )
    assert result == ToolRun(error=ErrorCode.UNAVAILABLE, never_started=True)
    assert ran == []
    release.set()
    wait_until(lambda: small.stats() == (0, 0))


def test_the_shares_hold_only_tenants_with_bodies_on_threads(
    pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    # Keyed by a name the caller chooses, so never a cache: nothing outlives a tenant's bodies,
    # however many tenant ids have been seen.
    ran: list[str] = []
    for n in range(50):
        assert run_tool_blocking(
            spec(healthy(ran)), NoArgs(), tenant(f"t-{n}"), timeout_seconds=5
        ) == ToolRun(value="ok")
    hold(A, 2, release, timeout=120)
    wait_until(lambda: pool.stats() == (2, 0))
    assert pool.tenants() == {"tenant-a": (2, 0)}
    release.set()
    wait_until(lambda: pool.stats() == (0, 0))
    assert pool.tenants() == {}


def test_another_tenants_run_completes_while_a_tenants_bodies_hang(
    pool: tool_threads.ToolThreads, release: threading.Event
) -> None:
    # The real graph: tenant B's run, its search tool given 5 s, while 32 of A's bodies hang.
    hold(A, 32, release, timeout=120)
    wait_until(lambda: pool.stats() == (32, 0))
    calls = Calls()
    h = harness([call(), final_citing_last], registry=make_registry(calls), calls=calls)
    state = finishes(lambda: h.run(ctx=context(tenant="tenant-b")), within=60)
    assert calls.count("search_logs") == 1
    assert [r.status for r in state.receipts] == [fp.ReceiptStatus.COMPLETED]
    assert state.termination is fp.TerminationReason.COMPLETED
