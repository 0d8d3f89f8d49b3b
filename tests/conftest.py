"""Shared fixtures. Postgres tests read FENCEPOST_TEST_POSTGRES_DSN; .ci/run sets it."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import uuid
from collections.abc import Iterator
from multiprocessing.context import BaseContext
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

POSTGRES_DSN_ENV = "FENCEPOST_TEST_POSTGRES_DSN"

# What the races between processes and the crash tests' processes import: the one server
# process below imports it once.
_WORKER_PRELOAD = [
    "fencepost",
    "fencepost.adapters",
    "psycopg",
    "langgraph.checkpoint.sqlite",
    "langgraph.checkpoint.postgres",
    "tests.graph.crash_worker",
    "tests.adapters.test_ledger_contract",
    "tests.adapters.test_ledger_postgres_concurrency",
    "tests.adapters.test_ledger_window_processes",
]


def worker_processes() -> BaseContext:
    """How the tests that race real processes, or SIGKILL one mid-call and resume in another
    (``tests/graph/test_crash_resume.py``), start them: each a fresh process forked from one
    single-threaded server that imported fencepost and the racing test modules once.

    Nothing is shared with the test process (no threads, connections or state): the children
    are what ``spawn`` made, without paying an interpreter's start and fencepost's imports each
    (dozens of seconds of CPU across the suite, which a busy machine stretches many times over).
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_WORKER_PRELOAD)
    return context


# Every property test, its own @settings included (they inherit what they leave unset): no
# deadline per example and no "too slow" health check. Both judge wall-clock time, which a
# machine whose cores are all busy stretches many times over, and the suite must pass there.
settings.register_profile("fencepost", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fencepost")


def _utf8_safe(value: Any) -> Any:
    """``value`` with every string that has no UTF-8 form (a lone surrogate) backslash-escaped."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {_utf8_safe(k): _utf8_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_utf8_safe(v) for v in value)
    return value


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(report: Any) -> Any:
    """A test's report as data that a pytest-xdist worker can send: many tests feed lone
    surrogates to the runtime on purpose (``tests.strategies.any_text``), and their captured
    logs and failure messages quote them; execnet refuses a string with no UTF-8 form, which
    crashed the whole run instead of reporting the test."""
    data = yield
    return _utf8_safe(data)


@pytest.fixture
def postgres_dsn() -> str:
    """The test server's DSN; skips with the reason when the variable is not set.

    When the variable IS set (as in CI) an unreachable server fails the test loudly instead.
    """
    dsn = os.environ.get(POSTGRES_DSN_ENV)
    if not dsn:
        pytest.skip(f"{POSTGRES_DSN_ENV} is not set: Postgres tests need a real server")
    return dsn


@pytest.fixture
def postgres_schema(postgres_dsn: str) -> Iterator[str]:
    """A DSN whose search_path is a fresh schema, dropped afterwards, so tests never collide."""
    import psycopg

    schema = f"fp_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in postgres_dsn else "?"
    yield f"{postgres_dsn}{sep}options=-csearch_path%3D{schema}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def spans() -> Iterator[Any]:
    """Every span started during the test, in an ``InMemorySpanExporter``
    (``tests.telemetry_kit``: the process's test tracer provider, set on first use)."""
    from tests.telemetry_kit import span_recorder

    with span_recorder().recording() as exporter:
        yield exporter


@pytest.fixture
def on_time_pool(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh pool of the process's sizes in place of the process's own, whose bodies start
    before their callers wait for them whatever the machine's load (``OnTimeThreads``)."""
    from fencepost.graph.containment import tools as tool_runner
    from tests.graph.kit import OnTimeThreads

    pool = OnTimeThreads()
    monkeypatch.setattr(tool_runner, "_threads", pool)
    return pool


_sigint_left: list[Any] = []
"""The SIGINT handler the last test in this process left (none yet: the process's own)."""


@pytest.fixture(autouse=True)
def _sigint_handler_left_as_found(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves SIGINT's handler other than it found it fails (and the handler is put
    back), and so does one that finds it other than the last test left it (a fixture of wider
    scope, or an import, changed it in between): a handler left behind (an event loop's, which
    swallows Ctrl-C) would make the Ctrl-C tests that follow in its worker prove nothing, or
    fail, for a reason of another's making. A test that needs Python's own handler asks for
    ``python_sigint``."""
    before = signal.getsignal(signal.SIGINT)
    if _sigint_left and before is not _sigint_left[0]:
        found, _sigint_left[:] = _sigint_left[0], [before]
        pytest.fail(
            f"SIGINT's handler changed before {request.node.nodeid} ran: {before!r}, where the "
            f"test before it left {found!r} (a fixture of wider scope or an import set it)",
            pytrace=False,
        )
    _sigint_left[:] = [before]
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is before or before is None:  # None: one not set from Python, none to put back
        return
    signal.signal(signal.SIGINT, before)
    pytest.fail(
        f"{request.node.nodeid} left SIGINT's handler {after!r} (it found {before!r})",
        pytrace=False,
    )


@pytest.fixture
def python_sigint() -> Iterator[None]:
    """Python's own SIGINT handler for the test (Ctrl-C raises ``KeyboardInterrupt`` in the
    main thread), and the process's own put back after it.

    A Ctrl-C test proves what a caller's Ctrl-C does, and that holds only under Python's
    handler: the process may have been started with SIGINT ignored (a background job of a
    non-interactive shell, as a CI step or ``make test &`` can be), and such a test would then
    skip, or wait out its model's minute for a KeyboardInterrupt that never comes.
    """
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("Ctrl-C reaches the main thread only")
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)
