"""What OpenTelemetry tracing costs a run: off, installed but sampling nothing, and on.

One part of ``make bench`` (``bench.py --tracing``). The same fencepost graph (the chat-model
adapter around the fake chat model, InMemorySaver) runs ``N`` tool iterations three ways, in
interleaved rounds in one process, every run verified:

- *no OpenTelemetry*: fencepost's telemetry found no ``opentelemetry`` package (as when the
  ``otel`` extra is not installed): its hooks read a context variable and return;
- *sampled out*: an OpenTelemetry SDK provider is configured and samples nothing (an app with
  tracing set up and this trace not sampled): one non-recording agent span per invoke, nothing
  else;
- *on*: every span recorded (one ``invoke_agent`` and ``N`` ``execute_tool`` spans a run), by a
  ``SimpleSpanProcessor`` into an ``InMemorySpanExporter`` (no network: the span work itself);
  each run's spans are checked (one agent span, one tool span per iteration, all under it).

The global tracer provider can be set once per process, so this part sets one whose sampler it
switches per run; "no OpenTelemetry" is fencepost's own "not installed" state, set for those runs.
"No OpenTelemetry" runs twice a round, the second as a control: how far two runs of the same
system drift apart is the noise "costs nothing measurable" is judged against. Ratios are the
median of each round's ratio (runs next to each other, so the machine's drift cancels out).

A 3 ms iteration on a shared machine drifts by more than what tracing adds, so the part also
measures that directly: one more verified run per mode with fencepost's telemetry entry points
(every hook a node calls, the agent span's start, enter, leave and end, the tool span's) timed
as they run, summed, per iteration. That is what the targets judge: tracing off or sampled out
at most 1% of an iteration ("nothing measurable"), on at most 10%; the interleaved rows show the
whole loop beside it, with the control row's drift as its noise.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from types import ModuleType
from typing import Any

from common import Cell, Entry, Key, System, describe, interleave, memory_saver

Target = tuple[str, str, bool | None]

MODES = ("off", "control", "sampled_out", "on")
LABELS = {
    "off": "no OpenTelemetry (the `otel` extra not installed)",
    "control": "no OpenTelemetry, again (the control: two runs of the same system)",
    "sampled_out": "OpenTelemetry SDK configured, sampling nothing",
    "on": "tracing on: every span recorded (SimpleSpanProcessor, InMemorySpanExporter)",
}
OFF_LIMIT = 0.01
"""'Costs nothing measurable': the telemetry's own time, at most 1% of an iteration."""
ON_LIMIT = 0.10
"""Tracing on: at most 10% of an iteration."""

HOOKS = (
    "recorded",
    "gated",
    "batch_refused",
    "budget_refused",
    "approvals_answered",
    "retrying",
    "tool_call",
    "calls_ended",
    "_start",
)
"""The telemetry module's entry points (what the nodes and the stream wrapper call)."""


class Tracing:
    """The process's tracer provider for this part, and the switch between the three modes."""

    def __init__(self) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

        from fencepost.adapters import telemetry

        switch = self

        class Switch(Sampler):
            def should_sample(
                self,
                parent_context: Any,
                trace_id: int,
                name: str,
                kind: Any = None,
                attributes: Any = None,
                links: Any = None,
                trace_state: Any = None,
            ) -> SamplingResult:
                if switch.recording:
                    return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
                return SamplingResult(Decision.DROP)

            def get_description(self) -> str:
                return "bench-switch"

        self.recording = False
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=Switch())
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        trace.set_tracer_provider(provider)
        if trace.get_tracer_provider() is not provider:
            raise RuntimeError("a global tracer provider was already set in this process")
        self.telemetry = telemetry
        # fencepost looks OpenTelemetry up once; "off" swaps in its not-installed answer.
        telemetry._looked = False
        self.installed = telemetry._opentelemetry()
        if self.installed is None:
            raise RuntimeError("fencepost did not find opentelemetry")

    def mode(self, mode: str) -> None:
        self.exporter.clear()
        self.recording = mode == "on"
        self.telemetry._otel = None if mode in ("off", "control") else self.installed

    def check(self, n: int) -> str | None:
        """The spans of the run that just ended, when recording: 1 agent span, n tool spans."""
        spans = self.exporter.get_finished_spans()
        agents = [s for s in spans if s.name.startswith("invoke_agent")]
        tools = [s for s in spans if s.name.startswith("execute_tool")]
        if len(agents) != 1 or len(tools) != n or len(spans) != n + 1:
            return f"recorded {len(agents)} agent and {len(tools)} tool spans, expected 1 and {n}"
        parent = agents[0].context.span_id
        if any(t.parent is None or t.parent.span_id != parent for t in tools):
            return "a tool span is not under the agent span"
        return None


def _system(lo: ModuleType, tracing: Tracing, mode: str) -> System:
    system: System = lo.build_fencepost(memory_saver(), name=f"fencepost ({mode})")
    reset = system.before_run
    check = system.check

    def before_run() -> None:
        reset()
        tracing.mode(mode)

    def checked(out: Any, n: int) -> str | None:
        problem = check(out, n)
        if problem is None and mode == "on":
            problem = tracing.check(n)
        return problem

    system.before_run = before_run
    system.check = checked
    return system


class HookClock:
    """Times fencepost's telemetry entry points while installed (see the module docstring)."""

    def __init__(self, telemetry: ModuleType) -> None:
        self.telemetry = telemetry
        self.seconds = 0.0
        self._saved: list[tuple[Any, str, Any]] = []

    def _wrap(self, owner: Any, name: str) -> None:
        original = getattr(owner, name)
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                clock.seconds += time.perf_counter() - t0

        self._saved.append((owner, name, original))
        setattr(owner, name, timed)

    def __enter__(self) -> HookClock:
        t = self.telemetry
        for name in HOOKS:
            self._wrap(t, name)
        for name in ("__enter__", "__exit__", "ended"):
            self._wrap(t.ToolCall, name)
        for name in ("enter", "leave", "end", "failed"):
            self._wrap(t.AgentRun, name)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()


def hook_cost(lo: ModuleType, tracing: Tracing, mode: str, n: int) -> float:
    """Microseconds per iteration fencepost's telemetry took in one verified run of ``mode``."""
    system = _system(lo, tracing, mode)
    with HookClock(tracing.telemetry) as clock:
        system.run(n)
    return clock.seconds * 1e6 / n


def tracing_part(
    lo: ModuleType | None, fp_error: str, n: int, rounds: int
) -> tuple[str, list[Target]]:
    """The section for results.md and its targets."""
    title = (
        f"## Tracing: {n} tool iterations with OpenTelemetry off, sampled out and on, median ms "
        f"per iteration over {rounds} interleaved rounds"
    )
    if lo is None:
        return f"{title}\n\nskipped: {fp_error}\n", []
    cells: dict[Key, Cell] = {}
    try:
        tracing = Tracing()
    except Exception as exc:
        return f"{title}\n\nskipped: {describe(exc)}\n", []
    entries: list[Entry] = []
    for mode in MODES:
        system = _system(lo, tracing, mode)
        entries.append(Entry(((mode, "sync"),), system, "sync"))
        entries.append(Entry(((mode, "async"),), system, "async"))
    try:
        with asyncio.Runner() as runner:
            rounds = interleave(
                entries,
                cells,
                n=n,
                rounds=rounds,
                warm_up_n=min(n, 40),
                runner=runner,
                label="tracing",
            )
        hooks = {mode: hook_cost(lo, tracing, mode, n) for mode in ("off", "sampled_out", "on")}
    except Exception as exc:
        return f"{title}\n\nfailed: {describe(exc)}\n", []
    finally:
        tracing.mode("sampled_out")  # later parts run as an app with tracing set up, unsampled
    title = title.rsplit(" over ", 1)[0] + f" over {rounds} interleaved rounds"
    return _table(title, cells, n, hooks), _targets(cells, hooks)


def _cell(cells: dict[Key, Cell], mode: str, how: str) -> Cell | None:
    return cells.get((mode, how))


def _table(title: str, cells: dict[Key, Cell], n: int, hooks: dict[str, float]) -> str:
    lines = [
        title,
        "",
        "The same fencepost graph (the chat-model adapter around the fake chat model, "
        "InMemorySaver), in the same rounds. *Sampled out*: an SDK tracer provider is set and "
        "samples nothing, so each invoke starts one non-recording span and nothing else runs. "
        "*On*: every run's spans are checked (one `invoke_agent`, one `execute_tool` per "
        f"iteration under it: {n + 1} spans a run) and exported to memory synchronously, so the "
        "row is the spans' own cost, with no network. The ratios are over *no OpenTelemetry*, "
        "each the median of the rounds' own ratios; the control row (the same system as the "
        "first, run again) is the noise they sit in.",
        "",
        "| tracing | invoke ms/iter | ainvoke ms/iter | / no OpenTelemetry, invoke "
        "| / no OpenTelemetry, ainvoke |",
        "|---|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        s, a = _cell(cells, mode, "sync"), _cell(cells, mode, "async")
        base_s, base_a = _cell(cells, "off", "sync"), _cell(cells, "off", "async")
        rs = "" if mode == "off" else paired(s, base_s)
        ra = "" if mode == "off" else paired(a, base_a)
        lines.append(
            f"| {LABELS[mode]} | {s.fmt() if s else 'n/a'} | {a.fmt() if a else 'n/a'} "
            f"| {rs} | {ra} |"
        )
    base = _cell(cells, "off", "sync")
    lines += [
        "",
        "### The telemetry's own time per iteration (invoke, one timed run each)",
        "",
        "Every telemetry entry point fencepost calls (the nodes' hooks, the agent span's start, "
        "enter, leave and end, the tool span's enter, outcome and exit), timed as it ran and "
        "summed; the share is of the *no OpenTelemetry* invoke iteration above. An upper "
        "bound: a hook's wall time includes the timer's own (about 0.3 µs a call) and any wait "
        "for the GIL while a tool's worker thread finishes.",
        "",
        "| tracing | µs per iteration | share of an iteration |",
        "|---|---:|---:|",
    ]
    for mode in ("off", "sampled_out", "on"):
        share = f"{hooks[mode] / (base.median * 1000):.2%}" if base and base.ok else "n/a"
        lines.append(f"| {LABELS[mode]} | {hooks[mode]:.1f} | {share} |")
    lines.append("")
    return "\n".join(lines)


def paired_ratio(a: Cell | None, b: Cell | None) -> float | None:
    """The median over rounds of ``a``'s time over ``b``'s in the same round."""
    if a is None or b is None or not a.ok or not b.ok or len(a.samples) != len(b.samples):
        return None
    return statistics.median(x / y for x, y in zip(a.samples, b.samples, strict=True))


def paired(a: Cell | None, b: Cell | None, limit: float | None = None) -> str:
    r = paired_ratio(a, b)
    if r is None:
        return "n/a"
    if limit is None:
        return f"{r:.3f}"
    return f"{r:.3f} {'met' if r <= limit else 'MISSED'}"


def _targets(cells: dict[Key, Cell], hooks: dict[str, float]) -> list[Target]:
    base = _cell(cells, "off", "sync")
    if base is None or not base.ok:
        return []
    iteration_us = base.median * 1000
    out: list[Target] = []
    for mode, what, limit in (
        ("sampled_out", "tracing off or sampled out", OFF_LIMIT),
        ("on", "tracing on", ON_LIMIT),
    ):
        worst = max(hooks[mode], hooks["off"]) if mode == "sampled_out" else hooks[mode]
        share = worst / iteration_us
        out.append(
            (
                f"{what}: the telemetry's µs per iteration, share of one (<= {limit:.0%})",
                f"{worst:.1f} µs = {share:.2%}",
                share <= limit,
            )
        )
    return out
