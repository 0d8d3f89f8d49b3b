"""Memory per in-flight run: the bytes each concurrent run holds, as a slope over several counts.

Part of ``--short`` (see ``bench.py``). Each system (fencepost with the chat-model adapter, the
bare model + ToolNode loop) gets one event loop, one InMemorySaver and one compiled graph; runs
are started in equal steps, and after each step, once every run started is held inside its next
model call, the memory tracemalloc counts is read. The figure is the least-squares slope of
those bytes over the in-flight counts: what one more run in flight costs.

Why a slope and not one window: a dict that grows by doubling (the saver's ``blobs`` and
``writes``) resizes at a run number set by how many entries a run adds, so the growth over one
window of runs is 2x the steady cost when a resize lands in it and 1x when none does; which side
that happens to is an accident of entry counts. The fit over several counts spreads each resize
over the range, as a long-running process sees it, and the intercept takes what is paid once
(first-call caches, the compiled graph's lazily built parts) out of the per-run figure. Nothing
is left out: tracemalloc runs from before the first run is started until the last point, so
every byte that any run holds while in flight counts.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from common import (
    TALLY,
    PausingChatModel,
    System,
    build_bare,
    describe,
    memory_saver,
    run_config,
    settle,
)

SHORT_N = 5
"""Tool iterations each run does before it waits."""

HELD_SECONDS = 3600.0
"""fencepost's model timeout here: longer than the part can hold a run paused."""

TARGET_KB = 150.0
BY_FILE_ROWS = 12

Target = tuple[str, str, bool | None]


def deep_size(obj: Any, seen: set[int] | None = None) -> int:
    """``sys.getsizeof`` summed over containers, bytes and strings reachable from ``obj``."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple | set | frozenset):
        size += sum(deep_size(v, seen) for v in obj)
    return size


def saver_bytes(saver: Any) -> int:
    """What an InMemorySaver holds: its storage, writes and blobs, deep."""
    seen: set[int] = set()
    return sum(deep_size(getattr(saver, name, {}), seen) for name in ("storage", "writes", "blobs"))


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ``ys`` over ``xs``."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


@dataclass
class Point:
    """The memory held with ``runs`` runs in flight."""

    runs: int
    traced: int
    """Bytes tracemalloc counts above what it counted before the first run started."""
    saver: int
    """Deep size of the InMemorySaver's storage, writes and blobs."""


@dataclass
class Series:
    """One system's points, its fitted slopes, and where its bytes were allocated."""

    points: list[Point] = field(default_factory=list)
    by_file: list[tuple[str, float]] = field(default_factory=list)
    """(file, bytes per run) between the first and the last point, largest first."""
    error: str | None = None

    @property
    def per_run_kb(self) -> float:
        return slope([p.runs for p in self.points], [p.traced for p in self.points]) / 1024

    @property
    def saver_kb(self) -> float:
        return slope([p.runs for p in self.points], [p.saver for p in self.points]) / 1024


def _short_path(filename: str) -> str:
    parts = Path(filename).parts
    for anchor in ("site-packages", "fencepost", "benchmarks", "lib"):
        if anchor in parts:
            i = len(parts) - 1 - parts[::-1].index(anchor)
            tail = parts[i + 1 :] if anchor in ("site-packages", "lib") else parts[i:]
            return "/".join(tail) if tail else filename
    return filename


def measure(build: Callable[[Any, Any], System], counts: Sequence[int]) -> Series:
    """Start runs until ``counts[i]`` are in flight, for each ``i``, reading memory at each.

    Each run is an ``ainvoke`` of ``SHORT_N`` tool iterations that then waits inside its next
    model call; at the end all are released and verified."""
    chat = PausingChatModel(n=SHORT_N)
    saver = memory_saver()
    system = build(saver, chat)
    TALLY.reset(0)
    settle()
    series = Series()
    runs = counts[-1]

    async def main() -> None:
        chat.gate = asyncio.Event()
        tasks: list[asyncio.Task[Any]] = []

        async def launch_until_paused(count: int) -> None:
            while len(tasks) < count:
                config = run_config(SHORT_N)
                coro = system.graph.ainvoke(system.make_input(SHORT_N), config, **system.kwargs)
                tasks.append(asyncio.ensure_future(coro))
            while chat.paused < count:
                done = [t for t in tasks if t.done()]
                if done:  # a run that ended before its pause failed or did not loop
                    exc = done[0].exception()
                    raise exc or RuntimeError(
                        f"a run ended before its pause: {done[0].result()!r:.80}"
                    )
                await asyncio.sleep(0.005)

        first: tracemalloc.Snapshot | None = None
        try:
            gc.collect()
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                for i, count in enumerate(counts):
                    await launch_until_paused(count)
                    gc.collect()
                    traced = tracemalloc.get_traced_memory()[0] - base
                    series.points.append(Point(count, traced, saver_bytes(saver)))
                    if i == 0:
                        first = tracemalloc.take_snapshot()
                    elif i == len(counts) - 1 and first is not None:
                        last = tracemalloc.take_snapshot()
                        span = count - counts[0]
                        series.by_file = [
                            (_short_path(s.traceback[0].filename), s.size_diff / span)
                            for s in last.compare_to(first, "filename")
                        ]
                        del first, last
            finally:
                tracemalloc.stop()
            chat.gate.set()
            outs = await asyncio.gather(*tasks)
        except BaseException:
            chat.gate.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        problems = {p for out in outs if (p := system.check(out, SHORT_N))}
        if (
            problems
            or TALLY.tool_calls != SHORT_N * runs
            or TALLY.model_calls != (SHORT_N + 1) * runs
        ):
            raise RuntimeError(
                f"verification failed: {TALLY.tool_calls} tool calls and {TALLY.model_calls} "
                f"model calls for {runs} runs; {sorted(problems)[:2]}"
            )

    try:
        asyncio.run(main())
    except Exception as exc:
        series.error = describe(exc)
    return series


def counts_up_to(runs: int, steps: int = 5) -> list[int]:
    """``steps`` equally spaced in-flight counts ending at ``runs``."""
    step = max(1, runs // steps)
    return [step * (i + 1) for i in range(steps - 1)] + [runs]


def memory_part(lo: ModuleType | None, fp_error: str, runs: int) -> tuple[str, list[Target]]:
    """The memory table of ``--short``: fencepost and the bare loop, up to ``runs`` in flight."""
    counts = counts_up_to(runs)
    rows: dict[str, Series] = {}
    if lo is None:
        rows["fencepost"] = Series(error=fp_error)
    else:

        def build_fp(saver: Any, chat: Any) -> System:
            # The first runs wait inside their model call until the last is paused and every
            # point is read: minutes on a loaded machine, past the default model timeout
            # (its runs would retry or end, and verification fail). A setting, no bytes a run.
            return lo.build_fencepost(
                saver, decider=lo.make_decider(chat), model_timeout_seconds=HELD_SECONDS
            )

        rows["fencepost"] = measure(build_fp, counts)
    rows["bare loop"] = measure(lambda saver, chat: build_bare(saver, chat), counts)
    for name, row in rows.items():
        fit = "" if row.error or len(row.points) < 2 else f"{row.per_run_kb:.1f} KB/run"
        print(f"  memory {name}: {fit} {row.error or ''}", file=sys.stderr)
    counts_text = ", ".join(str(c) for c in counts)
    lines = [
        f"### Memory per in-flight run: slope over {counts_text} runs in flight",
        "",
        "For each system, one event loop, one InMemorySaver and one compiled graph; `ainvoke` "
        f"runs are started in steps until {counts_text} are in flight, each doing {SHORT_N} "
        "tool iterations and then waiting inside its next model call (an `asyncio.Event`): "
        "checkpoints in the saver, the run's task, LangGraph's loop state, and any per-run "
        "state the system keeps are all held. tracemalloc runs from before the first run "
        "starts; at each count, after `gc.collect()`, the traced bytes are read. "
        "**Per run** is the least-squares slope of those bytes over the counts (what one more "
        "run in flight costs); a dict that doubles (the saver's blobs and writes) is spread "
        "over the range instead of charged to whichever system's window its resize lands in, "
        "and what is paid once (first-call caches) stays in the intercept. **Saver share** is "
        "the same slope of the deep `sys.getsizeof` of the saver's storage, writes and blobs. "
        "Then the runs are released and each is verified (`completed` / final answer, "
        f"{SHORT_N} tool calls each).",
        "",
        "| system | per run (slope) | saver share | vs bare loop | target |",
        "|---|---:|---:|---:|---:|",
    ]
    bare = rows["bare loop"]
    targets: list[Target] = []
    for name, row in rows.items():
        if row.error:
            lines.append(f"| {name} | {row.error} | | | |")
            continue
        vs = f"{row.per_run_kb / bare.per_run_kb:.2f}x" if not bare.error else "n/a"
        target = ""
        if name == "fencepost":
            met = row.per_run_kb <= TARGET_KB
            target = f"<= {TARGET_KB:.0f} KB: {'met' if met else 'MISSED'}"
            targets.append(
                (
                    f"memory per in-flight run, slope to {runs} runs (<= {TARGET_KB:.0f} KB)",
                    f"{row.per_run_kb:.0f} KB",
                    met,
                )
            )
        lines.append(
            f"| {name} | {row.per_run_kb:.1f} KB | {row.saver_kb:.1f} KB | {vs} | {target} |"
        )
    lines += [
        "",
        "The points (traced KB above the start / KB per run at that count):",
        "",
        "| system | " + " | ".join(f"{c} runs" for c in counts) + " |",
        "|---|" + "---:|" * len(counts),
    ]
    for name, row in rows.items():
        if row.error:
            continue
        cells = [f"{p.traced / 1024:.0f} / {p.traced / 1024 / p.runs:.1f}" for p in row.points]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Where the bytes were allocated, KB per run between {counts[0]} and {runs} runs in "
        "flight (tracemalloc, by file of the innermost frame):",
        "",
        "| file | " + " | ".join(rows) + " |",
        "|---|" + "---:|" * len(rows),
    ]
    by_file = {name: dict(row.by_file) for name, row in rows.items()}
    order = sorted(
        {f for d in by_file.values() for f in d},
        key=lambda f: -max(abs(d.get(f, 0.0)) for d in by_file.values()),
    )
    for f in order[:BY_FILE_ROWS]:
        cells = [f"{d[f] / 1024:.1f}" if f in d else "" for d in by_file.values()]
        lines.append(f"| `{f}` | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines), targets
