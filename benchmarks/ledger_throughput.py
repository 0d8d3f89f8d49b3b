"""Ledger throughput and fairness: reservations per second, in one process and across processes.

Measures, for each backend, and prints one markdown table:

- **one process**: after 1.5 s of discarded warm-up, sequential ``reserve`` calls (each its own
  key, on a run account under a tenant account) for a fixed time; reserve/s and the median and
  p99 latency. Then ``reserve`` + ``settle`` pairs/s, and ``areserve`` gathered 8 at a time on
  one loop.
- **8 processes, one shared parent**: 8 spawned processes, each with its own run account under
  ONE tenant account whose limit is 8 x ``per_process``; all start at the same instant and reserve
  in a tight loop until the tenant is exhausted. Reports the aggregate reserve/s, each process's
  share (fair share = ``per_process``), whether every process got at least a quarter of its
  fair share, and overspend (what the tenant holds beyond its limit: must be 0). Every
  reservation locks the one tenant row until its commit is durable, so these rows are serial.
- **8 processes, independent accounts**: the same, each process on a top-level account of its
  own (limit ``per_process``): nothing shared, so commits can overlap (Postgres groups them).
- **spend windows** (rows marked ``+ 2 spend windows``, SQLite ``FULL`` and Postgres
  ``synchronous_commit=on``): the same one-process and shared-parent rows with a tenant carrying
  two windows on the axis reserved (a calendar day in Europe/Berlin and a rolling hour), so
  every reservation checks and counts in both; in the shared row the windows are the tenant's
  only limit, and overspend is what a window holds beyond it. ``--windows-only`` runs just these.

Durability settings are part of each row: SQLite ``synchronous=FULL`` (the default: a commit is
on disk when ``reserve`` returns) and ``NORMAL`` (not synced per commit: survives a crash of the
process, not of the machine); Postgres ``synchronous_commit`` on (the default) and off (a server
crash can lose the last few hundred milliseconds of commits; never a torn ledger). Each commit
at full durability waits for one fsync, so the disk's fsync latency, measured before each row,
and printed in it, bounds those rows (a shared parent row is locked until its commit is on disk).

Targets (issue 12): PostgresLedger >= 1,500 reserve/s in one process, >= 1,000/s across 8
processes; SqliteLedger >= 2,500 reserve/s in one process; fair (no process below a quarter of its
fair share) and zero overspend. Reported, never asserted: a measurement, not a test.

Usage::

    .venv/bin/python benchmarks/ledger_throughput.py            # ~1-2 min on 2 cores
    .venv/bin/python benchmarks/ledger_throughput.py --seconds 1 --per-process 100   # quicker

Postgres rows run when ``FENCEPOST_BENCH_POSTGRES_DSN`` (or ``FENCEPOST_TEST_POSTGRES_DSN``) is
set; each run uses a throwaway schema. The whole run stops by itself: every phase is bounded in
time, and a watchdog ends the process after ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from fencepost.adapters.ledger_postgres import PostgresLedger
from fencepost.adapters.ledger_sqlite import SqliteLedger
from fencepost.policy.budget import BudgetExhausted
from fencepost.policy.ledger import InMemoryLedger, Ledger
from fencepost.policy.windows import Window

PROCESSES = 8
WARM_UP_SECONDS = 1.5
"""Reservations made and discarded before a one-process row is timed."""
BENCH_SECONDS = 150
"""What ``make bench`` gives this script: every backend, Postgres included, takes about a
minute on a 2-core machine (and the spend-window rows half a minute more), longer than the
bench's default share."""


# -- backends --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """How to open one backend, picklable so spawned processes can open it too."""

    kind: str  # memory | sqlite | postgres
    label: str
    target: str = ""  # file path or DSN
    setting: str = ""  # SQLite synchronous, or Postgres synchronous_commit ("" = default)
    schema: str = ""  # Postgres: the throwaway schema every table and function goes in
    windows: bool = False  # the tenant carries spend windows (a day and a rolling hour)

    def open(self) -> Ledger:
        if self.kind == "memory":
            return InMemoryLedger()
        if self.kind == "sqlite":
            return SqliteLedger(
                self.target, synchronous="NORMAL" if self.setting == "NORMAL" else "FULL"
            )
        # One libpq ``options``: the throwaway schema, and the commit setting if any.
        options = f"-csearch_path%3D{self.schema}"
        if self.setting:
            options += f"%20-csynchronous_commit%3D{self.setting}"
        sep = "&" if "?" in self.target else "?"
        return PostgresLedger(f"{self.target}{sep}options={options}", min_size=1, max_size=8)


def tenant_windows(spec: Spec, limit: float) -> list[Window]:
    """The spend windows a windowed row's tenant carries: a calendar day and a rolling hour,
    both on the axis reserved, so every reservation checks (and counts in) both."""
    if not spec.windows:
        return []
    return [
        Window(axis="tool_calls", limit=limit, period="day", tz="Europe/Berlin"),
        Window(axis="tool_calls", limit=limit, period=timedelta(hours=1)),
    ]


def close(ledger: Ledger) -> None:
    if isinstance(ledger, SqliteLedger | PostgresLedger):
        ledger.close()


@contextmanager
def postgres_schema(dsn: str) -> Iterator[str]:
    """A fresh schema's name, dropped afterwards."""
    import psycopg

    schema = f"fp_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


# -- one process -----------------------------------------------------------------------------------


@dataclass
class Single:
    reserve_per_s: float
    p50_us: float
    p99_us: float
    pairs_per_s: float
    async_per_s: float


def one_process(spec: Spec, seconds: float) -> Single:
    ledger = spec.open()
    run = f"run-{uuid.uuid4().hex[:8]}"
    try:
        ledger.open_account("tenant", {"tool_calls": 1e12}, windows=tenant_windows(spec, 1e12))
        ledger.open_account(run, {"tool_calls": 1e12}, parent="tenant")
        # Warm-up, discarded: prepared statements and caches, and on a small machine the
        # scheduler settling the client and the server on their cores (Postgres climbs from
        # about 1,000 to about 1,500 reserve/s over its first second or so).
        warm_until, w = time.perf_counter() + WARM_UP_SECONDS, 0
        while w < 50 or time.perf_counter() < warm_until:
            ledger.reserve(run, f"warm-{w}", {"tool_calls": 1})
            w += 1
        latencies: list[float] = []
        i = 0
        start = time.perf_counter()
        end = start + seconds
        while (now := time.perf_counter()) < end:
            ledger.reserve(run, f"r-{i}", {"tool_calls": 1})
            latencies.append(time.perf_counter() - now)
            i += 1
        reserve_rate = i / (time.perf_counter() - start)

        pairs = 0
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            ledger.reserve(run, f"p-{pairs}", {"tool_calls": 1})
            ledger.settle(f"p-{pairs}", {"tool_calls": 1})
            pairs += 1
        pair_rate = pairs / (time.perf_counter() - start)

        async def gathered() -> float:
            done = 0
            start = time.perf_counter()
            end = start + seconds
            while time.perf_counter() < end:
                await asyncio.gather(
                    *(ledger.areserve(run, f"a-{done + k}", {"tool_calls": 1}) for k in range(8))
                )
                done += 8
            return done / (time.perf_counter() - start)

        async_rate = asyncio.run(gathered())
        latencies.sort()
        return Single(
            reserve_rate,
            statistics.median(latencies) * 1e6,
            latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e6,
            pair_rate,
            async_rate,
        )
    finally:
        close(ledger)


# -- 8 processes against one parent ----------------------------------------------------------------


def _warm(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def _contend(spec: Spec, run: str, start_at: float, stop_at: float) -> tuple[int, int, float]:
    """Reserve on ``run`` until it (or its parent) is exhausted, or time is up.

    Returns (granted, refused, seconds from start_at to this lane's last reservation attempt).
    """
    ledger = spec.open()
    granted = refused = 0
    try:
        time.sleep(max(0.0, start_at - time.time()))
        i = 0
        while time.time() < stop_at:
            try:
                ledger.reserve(run, f"{run}-{i}", {"tool_calls": 1})
                granted += 1
            except BudgetExhausted:
                refused += 1
                break  # exhausted: nothing more for this lane
            i += 1
        return granted, refused, time.time() - start_at
    finally:
        close(ledger)


@dataclass
class Contended:
    total_per_s: float
    shares: list[int]
    fair_share: int
    overspend: float
    finished: bool
    failures: list[str] = field(default_factory=list)

    @property
    def fair(self) -> bool:
        return min(self.shares) * 4 >= self.fair_share


def contended(
    spec: Spec, pool: ProcessPoolExecutor, per_process: int, budget: float, *, shared: bool
) -> Contended:
    """8 lanes at once: under one shared tenant (``shared``), or each on an account of its own."""
    limit = PROCESSES * per_process
    runs = [f"{'lane' if shared else 'solo'}-{lane}" for lane in range(PROCESSES)]
    setup = spec.open()
    try:
        if shared and spec.windows:  # the windows are the tenant's only limit: they must hold
            setup.open_account("shared-tenant", {}, windows=tenant_windows(spec, limit))
        elif shared:
            setup.open_account("shared-tenant", {"tool_calls": limit})
        for run in runs:
            if shared:
                setup.open_account(run, {"tool_calls": 1e12}, parent="shared-tenant")
            else:
                setup.open_account(run, {"tool_calls": per_process})
    finally:
        close(setup)
    start_at = time.time() + 1.0  # every process has opened its ledger by then
    stop_at = start_at + budget
    futures = [pool.submit(_contend, spec, run, start_at, stop_at) for run in runs]
    results = [future.result(timeout=budget + 60) for future in futures]
    check = spec.open()
    try:
        if shared:
            tenant = check.balance("shared-tenant")
            held = max([tenant.held.get("tool_calls", 0.0)] + [use.held for use in tenant.windows])
            overspend = max(0.0, held - limit)
        else:
            overspend = sum(
                max(0.0, check.balance(run).held.get("tool_calls", 0.0) - per_process)
                for run in runs
            )
    finally:
        close(check)
    shares = [granted for granted, _, _ in results]
    elapsed = max(seconds for _, _, seconds in results)
    return Contended(
        total_per_s=sum(shares) / elapsed,
        shares=shares,
        fair_share=per_process,
        overspend=overspend + max(0, sum(shares) - limit),
        finished=sum(shares) == limit,
    )


# -- machine ---------------------------------------------------------------------------------------


def fsync_latency_us(directory: str, n: int = 100) -> float:
    """Median latency of a small write + fdatasync in ``directory`` (what one commit waits for)."""
    fd, path = tempfile.mkstemp(dir=directory)
    try:
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            os.write(fd, b"x" * 128)
            os.fdatasync(fd)
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) * 1e6
    finally:
        os.close(fd)
        os.unlink(path)


def watchdog(seconds: float) -> None:
    """End the process if the benchmark has not finished in ``seconds`` (it must stop by itself)."""

    def fire() -> None:
        print(f"\nledger_throughput: watchdog: still running after {seconds:.0f}s; stopping")
        sys.stdout.flush()
        os._exit(2)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per one-process phase")
    parser.add_argument("--per-process", type=int, default=200, help="fair share, 8 processes")
    parser.add_argument("--contention-seconds", type=float, default=20.0, help="cap per run")
    parser.add_argument("--timeout", type=float, default=300.0, help="watchdog, whole run")
    parser.add_argument(
        "--only", choices=("memory", "sqlite", "postgres"), action="append", help="backends"
    )
    parser.add_argument(
        "--windows-only", action="store_true", help="only the rows of tenants with spend windows"
    )
    args = parser.parse_args(argv)
    watchdog(args.timeout)

    dsn = os.environ.get("FENCEPOST_BENCH_POSTGRES_DSN") or os.environ.get(
        "FENCEPOST_TEST_POSTGRES_DSN"
    )
    with tempfile.TemporaryDirectory(prefix="fp-ledger-bench-") as workdir:
        return run(args, dsn, workdir)


def run(args: argparse.Namespace, dsn: str | None, workdir: str) -> int:
    """Measure every backend with files in ``workdir`` and print the tables."""
    fsync_us = fsync_latency_us(workdir)
    print(f"# Ledger throughput ({platform.python_implementation()} {platform.python_version()},")
    print(f"{os.cpu_count()} cores, {platform.system()}; fdatasync in {workdir}: {fsync_us:.0f} us")
    print(f"median; load average {os.getloadavg()[0]:.2f})\n")

    rows: list[str] = []
    contention_rows: list[str] = []
    independent_rows: list[str] = []
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=PROCESSES, mp_context=ctx) as pool:
        list(pool.map(_warm, [0.5] * PROCESSES))  # start and import every worker first

        def measure(spec: Spec, *, contend: bool = True, solo: bool = True) -> None:
            disk = fsync_latency_us(workdir, 50)  # the disk varies: measured next to each row
            single = one_process(spec, args.seconds)
            rows.append(
                f"| {spec.label} | {single.reserve_per_s:,.0f} | {single.p50_us:,.0f} | "
                f"{single.p99_us:,.0f} | {single.pairs_per_s:,.0f} | {single.async_per_s:,.0f} | "
                f"{disk:,.0f} |"
            )
            print(f"  measured {spec.label}: {single.reserve_per_s:,.0f} reserve/s", flush=True)
            if not contend:
                return
            result = contended(spec, pool, args.per_process, args.contention_seconds, shared=True)
            shares = " ".join(str(s) for s in sorted(result.shares))
            contention_rows.append(
                f"| {spec.label} | {result.total_per_s:,.0f} | {shares} | {result.fair_share} | "
                f"{'yes' if result.fair else 'NO'} | {result.overspend:g} | "
                f"{'yes' if result.finished else 'no (time cap)'} |"
            )
            print(f"  contended {spec.label}: {result.total_per_s:,.0f} reserve/s", flush=True)
            if not solo:
                return
            alone = contended(spec, pool, args.per_process, args.contention_seconds, shared=False)
            independent_rows.append(
                f"| {spec.label} | {alone.total_per_s:,.0f} | {alone.overspend:g} | "
                f"{'yes' if alone.finished else 'no (time cap)'} |"
            )
            print(f"  independent {spec.label}: {alone.total_per_s:,.0f} reserve/s", flush=True)

        only = set(args.only or ("memory", "sqlite", "postgres"))
        plain = not args.windows_only
        if "memory" in only and plain:
            measure(Spec("memory", "InMemoryLedger"), contend=False)
        for setting in ("FULL", "NORMAL") if "sqlite" in only and plain else ():
            path = str(Path(workdir) / f"ledger-{setting.lower()}.db")
            measure(Spec("sqlite", f"SqliteLedger synchronous={setting}", path, setting))
        if "sqlite" in only:
            path = str(Path(workdir) / "ledger-windows.db")
            label = "SqliteLedger synchronous=FULL + 2 spend windows"
            measure(Spec("sqlite", label, path, "FULL", windows=True), solo=False)
        if dsn and "postgres" in only:
            for setting in ("", "off") if plain else ():
                label = f"PostgresLedger synchronous_commit={setting or 'on'}"
                with postgres_schema(dsn) as schema:
                    measure(Spec("postgres", label, dsn, setting, schema))
            with postgres_schema(dsn) as schema:
                label = "PostgresLedger synchronous_commit=on + 2 spend windows"
                measure(Spec("postgres", label, dsn, "", schema, windows=True), solo=False)
        elif "postgres" in only:
            print("  (Postgres rows skipped: set FENCEPOST_BENCH_POSTGRES_DSN)")

    print("\n## One process\n")
    print(
        "| backend | reserve/s | p50 us | p99 us | reserve+settle pairs/s | "
        "areserve x8 gathered/s | fdatasync p50 us (just before) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print(f"\n## {PROCESSES} processes, one shared parent account\n")
    print(
        "| backend | reserve/s (all) | reservations per process (sorted) | fair share | "
        ">= 1/4 fair share | overspend | tenant exhausted |"
    )
    print("|---|---:|---|---:|---|---:|---|")
    print("\n".join(contention_rows))
    print(f"\n## {PROCESSES} processes, each on an account of its own (no shared parent)\n")
    print("| backend | reserve/s (all) | overspend | every account exhausted |")
    print("|---|---:|---:|---|")
    print("\n".join(independent_rows))
    print(
        "\nTargets: Postgres >= 1,500/s one process and >= 1,000/s across 8; SQLite >= 2,500/s "
        "one process; every process >= 1/4 of its fair share; overspend 0."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
