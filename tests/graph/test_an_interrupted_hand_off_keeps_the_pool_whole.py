"""A caller interrupted (Ctrl-C) while the tool pool hands its body to a new thread keeps the
pool whole: the interruption reaches the caller, the slot is counted once, and the worker that
takes the job after all never dies on bookkeeping the caller undid."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from fencepost.graph.containment import tool_threads


def test_a_ctrl_c_during_a_new_threads_start_reaches_the_caller_and_leaves_the_pool_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = tool_threads.ToolThreads(2, 4, 4)
    ran = threading.Event()
    worker_errors: list[BaseException] = []
    original_start = threading.Thread.start
    original_hook = threading.excepthook

    def start_then_interrupted(self: threading.Thread) -> None:
        # The thread starts, and the caller's wait for it is interrupted, as a SIGINT does.
        original_start(self)
        raise KeyboardInterrupt

    def hook(args: Any) -> None:
        worker_errors.append(args.exc_value)

    monkeypatch.setattr(threading, "excepthook", hook)
    monkeypatch.setattr(threading.Thread, "start", start_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        pool.start_blocking(ran.set, deadline=float("inf"), tenant="acme")
    monkeypatch.setattr(threading.Thread, "start", original_start)

    # The new thread took the job before the caller withdrew it (its body ran, its slot released
    # when it ended), or after (dropped, counting nothing): either way the pool is whole.
    finished = threading.Event()
    job = pool.start_blocking(finished.set, deadline=float("inf"), tenant="acme")
    assert job is not None
    assert finished.wait(30)
    for _ in range(300):
        if pool.stats() == (0, 0):
            break
        threading.Event().wait(0.1)
    assert pool.stats() == (0, 0)
    assert pool.tenants() == {}
    assert worker_errors == []
    threading.excepthook = original_hook
