"""Inside fencepost: the gate's unit cost, and a profile of one long run.

The policy API is being rewritten while this harness is: everything here imports what exists
at run time and turns a missing or changed function into a "skipped: <reason>" row, never a
crash of ``make bench``.
"""

from __future__ import annotations

import asyncio
import contextvars
import cProfile
import inspect
import os
import pstats
import re
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any
from uuid import uuid4

from common import TOOL_NAME, describe, memory_saver, settle
from langchain_core.runnables.config import var_child_runnable_config

Target = tuple[str, str, bool | None]

# --------------------------------------------------------------------------------------------
# gate
# --------------------------------------------------------------------------------------------


def best_us(fn: Callable[[], Any], number: int, repeat: int = 5) -> float:
    """Best of ``repeat`` timings of ``number`` calls, in µs per call (timeit's rule: the
    minimum is the cost, the rest is noise from the machine)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best * 1e6


def _states(lo: ModuleType, prior: int) -> tuple[Any, Any]:
    """The state a gate sees at the start of a run, and after ``prior`` proposals: the latter
    taken from a real ``prior``-iteration run's checkpoint before its last decision."""
    import fencepost as fp

    system = lo.build_fencepost(memory_saver(), decider=lo.BenchDecisionModel())
    system.run(prior)
    assert system.last_config is not None
    late = None
    for snapshot in system.graph.get_state_history(system.last_config):
        values = snapshot.values
        record = values.get("run") or {}
        if tuple(snapshot.next) == ("decide",) and len(record.get("observations", ())) == prior:
            late = fp.run_output(values)
            break
    if late is None:
        raise RuntimeError(f"no checkpoint before decide with {prior} observations")
    early = fp.run_output({"run": lo.fencepost_input(prior)["request"] | {"step": 0}})
    return early, late


class Skip(Exception):
    """A row whose function is not there (or not callable that way) in this fencepost."""


NUMBER = 2000
REPEAT = 5


def _fresh_proposals(count: int) -> Any:
    """An endless supply of new proposals (fresh call ids and arguments), built up front so
    that building them is not timed; reused in order once ``count`` are used."""
    import itertools

    import fencepost as fp

    made = [
        fp.ToolProposal(
            call_id=f"call-gate-{i:06d}", tool_name=TOOL_NAME, arguments={"query": f"fresh {i}"}
        )
        for i in range(count)
    ]
    return itertools.cycle(made)


def _drive(coro: Any) -> Any:
    """Run a node body over the sync graph's I/O, which never suspends, to its result."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise Skip("the gate step suspended under SyncIO")


def _policy_gate(lo: ModuleType) -> tuple[str, Callable[[Any], Callable[[], Any]]]:
    """The gate as a policy function: ``gating.gate_batch`` of one proposal when it exists
    (what the node calls now), else ``gate_proposal``."""
    try:
        from fencepost.policy.gating import gate_batch
    except ImportError:
        gate_batch = None
    principal = lo.RUN_CONTEXT.principal
    if gate_batch is not None:

        def make_batch(state: Any) -> Callable[[], Any]:
            proposals = _fresh_proposals(NUMBER)
            return lambda: gate_batch(
                lo.REGISTRY,
                (next(proposals),),
                state,
                principal,
                repeat_limit=3,
                approval="terminate",
            )

        return "policy: `gating.gate_batch` of one proposal", make_batch
    policy = __import__("fencepost.policy").policy
    gate_proposal = getattr(policy, "gate_proposal", None)
    if gate_proposal is None:
        raise Skip("neither fencepost.policy.gating.gate_batch nor gate_proposal found")

    def make(state: Any) -> Callable[[], Any]:
        proposals = _fresh_proposals(NUMBER)
        return lambda: gate_proposal(lo.REGISTRY, next(proposals), state, principal)

    return "policy: `gate_proposal`", make


def _policy_reserve(lo: ModuleType) -> tuple[str, Callable[[Any], Callable[[], Any]]]:
    """The tool-call reservation: on the ledger (``call_amounts`` of the tool, a fresh
    key per call), as the gate reserves it."""
    import fencepost as fp

    try:
        from fencepost.policy.reservations import call_amounts
    except ImportError:
        call_amounts = None
    if call_amounts is not None:
        amounts = call_amounts(lo.REGISTRY.get(TOOL_NAME))

        def make_ledger(state: Any) -> Callable[[], Any]:
            import itertools

            ledger = fp.InMemoryLedger()
            account = f"bench-gate-{uuid4()}"
            try:
                ledger.open_account(account, dict.fromkeys(amounts, 1e12), parent=None, owner={})
            except TypeError as exc:
                raise Skip(f"InMemoryLedger.open_account: {exc}") from exc
            keys = itertools.count()
            return lambda: ledger.reserve(account, f"{account}/call/{next(keys)}", amounts)

        return "ledger: `InMemoryLedger.reserve` of one tool call", make_ledger
    raise Skip("no reservation function found (reservations.call_amounts)")


def _in_node(lo: ModuleType) -> tuple[str, Callable[[Any], Callable[[], Any]]]:
    """The gate step as ``decide`` runs it: ``graph.gate.gate`` over the sync graph's I/O
    (gates, fingerprint counts, manifests and the ledger reservation), else the older
    ``Nodes._gate`` (gates, fingerprints, state reservation, manifests)."""
    import fencepost as fp

    try:
        from fencepost.graph.account import open_run
        from fencepost.graph.gate import gate
        from fencepost.graph.node_io import SyncIO
        from fencepost.graph.settings import settings_of
    except ImportError:
        gate = None
    if gate is not None:
        cfg = settings_of(fp.build_agent_graph(lo.REGISTRY, lo.BenchDecisionModel()))
        if cfg is None:
            raise Skip("graph.settings.settings_of found no settings for a built graph")
        params = list(inspect.signature(gate).parameters)
        if params[:5] != ["io", "state", "ctx", "calls", "usage"]:
            raise Skip(f"gate_step.gate takes ({', '.join(params)})")

        def make_step(state: Any) -> Callable[[], Any]:
            io = SyncIO(cfg)
            budget = fp.RuntimeBudget(steps_remaining=10**9, tool_calls_remaining=10**9)
            # Inside a node, LangGraph's config (the thread the run's account is named from) is
            # in context; outside one, every account lookup would pay a RuntimeError instead.
            in_node = contextvars.copy_context()
            in_node.run(
                var_child_runnable_config.set, {"configurable": {"thread_id": f"bench-{uuid4()}"}}
            )
            opened = in_node.run(
                _drive,
                open_run(io, state.model_copy(update={"budget": budget}), lo.RUN_CONTEXT),
            )
            if not isinstance(opened, fp.AgentState):
                raise Skip(f"open_run refused the run: {opened!r:.80}")
            proposals = _fresh_proposals(NUMBER * (REPEAT + 1) + 1)
            return lambda: in_node.run(
                _drive, gate(io, opened, lo.RUN_CONTEXT, (next(proposals),), {})
            )

        return "in-node: `gate_step.gate` (decide's gate step, incl. ledger reservation)", make_step
    try:
        builder = fp.build_agent_graph(lo.REGISTRY, lo.BenchDecisionModel())
        owner = getattr(getattr(builder.nodes["decide"].runnable, "func", None), "__self__", None)
    except Exception as exc:
        raise Skip(describe(exc)) from exc
    old = getattr(owner, "_gate", None)
    if old is None:
        raise Skip("neither graph.gate.gate nor a decide node with `_gate` found")
    params = list(inspect.signature(old).parameters)
    if params[:4] != ["state", "calls", "ctx", "usage"]:
        raise Skip(f"`_gate` takes ({', '.join(params)}), not (state, calls, ctx, usage)")

    def make_old(state: Any) -> Callable[[], Any]:
        proposals = _fresh_proposals(NUMBER)
        return lambda: old(state, (next(proposals),), lo.RUN_CONTEXT, {})

    return "in-node: `Nodes._gate` (decide's gate step, incl. state reservation)", make_old


def gate_part(lo: ModuleType | None, fp_error: str, prior: int) -> tuple[str, list[Target]]:
    """µs per proposal: the policy functions alone, and the gate as the node runs it."""
    lines = [
        f"## Gate micro-benchmark: µs per proposal, at 0 and {prior:,} prior proposals",
        "",
        "A new proposal (fresh call id and arguments, the registered read tool; built before "
        "the clock starts) gated against the state at the start of a run and against the "
        f"state a {prior:,}-iteration run had before its last decision (taken from that "
        f"run's checkpoint). Best of {REPEAT} timings of {NUMBER:,} calls. The policy API is "
        "being rewritten: each row measures what this fencepost has (the row names the "
        "function) and a row whose function is missing says so instead of a number. "
        "**Policy** rows call the policy functions directly; **in-node** is the gate step "
        "`decide` runs on a proposal (duplicate-id check, every gate, fingerprint counts, "
        "manifests, the reservation).",
        "",
        f"| what | 0 prior | {prior:,} prior | {prior:,} / 0 | target |",
        "|---|---:|---:|---:|---:|",
    ]
    if lo is None:
        return "\n".join([*lines, f"| all rows | skipped: {fp_error} | | | |", ""]), []
    try:
        early, late = _states(lo, prior)
    except Exception as exc:
        return "\n".join([*lines, f"| all rows | skipped: {describe(exc)} | | | |", ""]), []

    rows: list[tuple[str, Callable[[Any], Callable[[], Any]] | str, str]] = []
    gate_row = reserve_row = None
    for find in (_policy_gate, _policy_reserve):
        try:
            label, make = find(lo)
        except Exception as exc:
            rows.append(
                (find.__name__.lstrip("_").replace("_", " "), f"skipped: {describe(exc)}", "")
            )
            continue
        rows.append((label, make, ""))
        if find is _policy_gate:
            gate_row = make
        else:
            reserve_row = make
    if gate_row is not None and reserve_row is not None:
        g, r = gate_row, reserve_row

        def both(state: Any) -> Callable[[], Any]:
            one, two = g(state), r(state)

            def run() -> None:
                one()
                two()

            return run

        rows.append(("policy: the gate + the reservation (the two rows above)", both, "<= 20 µs"))
    else:
        rows.append(
            ("policy: the gate + the reservation", "skipped: a part is missing", "<= 20 µs")
        )
    try:
        label, make = _in_node(lo)
        rows.append((label, make, "<= 30 µs, flat"))
    except Exception as exc:
        rows.append(("in-node gate step", f"skipped: {describe(exc)}", "<= 30 µs, flat"))

    targets: list[Target] = []
    for label, make, target in rows:
        if isinstance(make, str):
            lines.append(f"| {label} | {make} | | | {target} |")
            continue
        try:
            a = best_us(make(early), NUMBER, REPEAT)
            b = best_us(make(late), NUMBER, REPEAT)
        except Exception as exc:
            lines.append(f"| {label} | skipped: {describe(exc)} | | | {target} |")
            continue
        verdict = ""
        if target:
            limit = 20 if "20" in target else 30
            met = max(a, b) <= limit and ("flat" not in target or b / a <= 1.25)
            verdict = f"{target}: {'met' if met else 'MISSED'}"
            kind = "policy (gate + reservation)" if limit == 20 else "in-node"
            targets.append(
                (
                    f"gate, {kind}, µs/proposal at 0 / {prior:,} prior ({target})",
                    f"{a:.1f} / {b:.1f}",
                    met,
                )
            )
        lines.append(f"| {label} | {a:.1f} | {b:.1f} | {b / a:.2f} | {verdict} |")
    lines += [
        "",
        f'("flat" is read as the {prior:,}-prior cost within 1.25x of the 0-prior cost.)',
        "",
    ]
    return "\n".join(lines), targets


# --------------------------------------------------------------------------------------------
# profile
# --------------------------------------------------------------------------------------------


def _scaffolding(key: tuple[str, int, str]) -> bool:
    filename, _, func = key
    if func == "<method 'run' of '_contextvars.Context' objects>":
        return True
    name = Path(filename).name
    return Path(filename).parent.name == "asyncio" and name in (
        "base_events.py",
        "events.py",
        "runners.py",
    )


def _short_path(filename: str) -> str:
    if "site-packages" + os.sep in filename:
        return filename.split("site-packages" + os.sep, 1)[1]
    stdlib = re.search(r"python3\.\d+/(.*)$", filename)
    if stdlib:
        return stdlib.group(1)
    try:
        return str(Path(filename).resolve().relative_to(Path(__file__).resolve().parents[1]))
    except ValueError:
        return filename


def _package(filename: str) -> str:
    """``fencepost``, ``langgraph``, ``pydantic``, ``asyncio``... for a profiled function."""
    if filename == "~" or filename.startswith("<"):
        return "builtins (C functions)"
    parts = Path(filename).parts
    if "site-packages" in parts:
        top = parts[parts.index("site-packages") + 1]
        return top.removesuffix(".py")
    if "fencepost" in parts:
        return "fencepost"
    if "benchmarks" in parts:
        return "benchmarks (fake model, tool)"
    for i, part in enumerate(parts):
        if part.startswith("python3") and i + 1 < len(parts):
            return f"stdlib: {parts[i + 1].removesuffix('.py')}"
    return "other"


def profile_part(lo: ModuleType | None, fp_error: str, n: int, top: int = 25) -> str:
    """cProfile of one fencepost ``ainvoke`` of ``n`` iterations: where the time goes."""
    header = [
        f"## Profile: one {n}-iteration fencepost run, top {top} functions by cumulative time",
        "",
    ]
    if lo is None:
        return "\n".join([*header, f"skipped: {fp_error}", ""])
    try:
        system = lo.build_fencepost(memory_saver())
        asyncio.run(system.arun(min(n, 50)))  # warm
        settle()
        config, data = system._start(n)
        profiler = cProfile.Profile()

        async def profiled() -> tuple[Any, float]:
            # Only the run itself: not the event loop's start and stop, not the setup.
            t0 = time.perf_counter()
            profiler.enable()
            try:
                out = await system.graph.ainvoke(data, config, **system.kwargs)
            finally:
                profiler.disable()
            return out, time.perf_counter() - t0

        out, total = asyncio.run(profiled())
        system._verify(out, n)
    except Exception as exc:
        return "\n".join([*header, f"skipped: {describe(exc)}", ""])
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]

    # Self time (tottime) by where the code lives: the parts sum to the profiled total.
    by_package: dict[str, float] = {}
    for (filename, _, _), row in stats.items():
        by_package[_package(filename)] = by_package.get(_package(filename), 0.0) + row[2]
    profiled = sum(by_package.values()) or total
    buckets = sorted(by_package.items(), key=lambda kv: kv[1], reverse=True)
    small = [kv for kv in buckets if kv[1] < 0.01 * profiled]
    buckets = [kv for kv in buckets if kv[1] >= 0.01 * profiled]
    if small:
        buckets.append((f"{len(small)} others, each < 1%", sum(v for _, v in small)))
    rows = sorted(
        ((k, v) for k, v in stats.items() if not _scaffolding(k)),
        key=lambda kv: kv[1][3],
        reverse=True,
    )[:top]
    lines = [
        *header,
        f"cProfile of one `ainvoke` (InMemorySaver, {lo.DECIDER_NOTE.split(' (')[0]}, the fake "
        "chat model; one thread, so nothing hides on the portal thread). cProfile slows "
        f"Python code 2-3x: read the shares, not the times. Wall time of the profiled run: "
        f"{total * 1000 / n:.2f} ms per iteration.",
        "",
        "Self time by package (cProfile `tottime`, summed over each package's functions):",
        "",
        "| package | ms/iter | share |",
        "|---|---:|---:|",
    ]
    lines += [f"| {k} | {v * 1000 / n:.2f} | {v / profiled:.0%} |" for k, v in buckets]
    lines += [
        "",
        f"Top {top} functions by cumulative time (including what they call), leaving out the "
        "event loop's own frames (`asyncio` base_events/events/runners, `Context.run`), "
        "which only wrap everything below them. Under `ainvoke` LangGraph runs each node as "
        "its own asyncio task, so the rows are several call trees, each started by the event "
        "loop: a node's time is not inside `ainvoke`'s, and a coroutine's `ncalls` counts "
        "its resumptions:",
        "",
        "| ncalls | tottime ms/iter | cumtime ms/iter | function |",
        "|---:|---:|---:|---|",
    ]
    for (filename, line, func), (cc, nc, tt, ct, _) in rows:
        calls = f"{nc}" if nc == cc else f"{nc}/{cc}"
        where = f"{_short_path(filename)}:{line}" if filename != "~" else "builtin"
        lines.append(
            f"| {calls} | {tt * 1000 / n:.3f} | {ct * 1000 / n:.3f} | `{func}` ({where}) |"
        )
    lines.append("")
    return "\n".join(lines)
