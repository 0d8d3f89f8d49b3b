"""A tool thread holds what wakes it (an eventfd, where the platform has one) for its own life
only: threads the pool does not keep close theirs as they end, so a burst of calls never leaves
descriptors behind, and a parked thread is still woken for its next call."""

from __future__ import annotations

import os
import threading
import time

import pytest

from fencepost.graph.containment import tool_threads

_FDS = "/proc/self/fd"


def _open_descriptors() -> int:
    return len(os.listdir(_FDS))


@pytest.mark.skipif(not os.path.isdir(_FDS), reason="needs /proc/self/fd")
def test_threads_past_the_kept_ones_close_their_bells_as_they_end() -> None:
    pool = tool_threads.ToolThreads(base=1, cap=8, tenant_cap=8)
    before = _open_descriptors()
    release = threading.Event()
    started = threading.Semaphore(0)

    def held() -> str:
        started.release()
        release.wait(60)
        return "done"

    # Six tenants, one healthy body each at once (base=1): six threads at once.
    jobs = [pool.start_blocking(held, float("inf"), f"tenant-{i}") for i in range(6)]
    assert all(job is not None for job in jobs)
    for _ in jobs:
        assert started.acquire(timeout=60)  # six bodies on six threads at once
    release.set()
    for job in jobs:
        assert job is not None and job.wait(60)
        assert job.outcome is not None and job.outcome.value == "done"

    # The pool keeps one parked thread (base=1); the other five end and close what woke them.
    end = time.monotonic() + 60
    while _open_descriptors() > before + pool.base and time.monotonic() < end:
        time.sleep(0.01)
    assert _open_descriptors() <= before + pool.base
    assert pool.stats() == (0, 0)

    # The kept thread is woken for the next call.
    again = pool.start_blocking(lambda: "again", float("inf"), "tenant-0")
    assert again is not None and again.wait(60)
    assert again.outcome is not None and again.outcome.value == "again"
