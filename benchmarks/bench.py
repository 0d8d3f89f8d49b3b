"""``make bench``: every benchmark part side by side in one process, written to results.md.

Parts (each has a flag; no flag runs them all):

    --loop     fencepost vs create_agent + limits vs a bare model + ToolNode loop vs create_agent
               + fp.FencepostMiddleware, InMemory and SQLite savers, invoke and ainvoke; and
               the cost of one more node boundary (--middleware-only: the fencepost, create_agent
               + limits and create_agent + fp.FencepostMiddleware columns alone)
    --peers    the same loop against Pydantic AI (FunctionModel + UsageLimits) and the OpenAI
               Agents SDK (a custom Model, max_turns), beside the three LangGraph systems
    --floor    fencepost with a minimal DecisionModel vs an empty two-node LangGraph loop
    --growth   ms per iteration and SQLite checkpoint bytes per iteration at the start, middle
               and end of one long run
    --short    5-iteration runs vs the bare loop, and memory per in-flight run: the slope of
               traced bytes over five counts of runs held in flight at once (to --inflight)
    --gate     the gate's µs per proposal, policy functions and in the node, at 0 and 1,000
               prior proposals
    --fairness how soon tenant B's sync tool starts while tenant A holds 8, 32 or 256 hung
               bodies (inside their timeout, and left behind), every B call verified
    --tracing  the loop with OpenTelemetry off, installed but sampling nothing, and recording
               every span (InMemorySaver, invoke and ainvoke)
    --profile  cProfile of one 500-iteration fencepost run: self time by package, top 25
    --others   the other benchmark scripts in this directory (ledger_throughput.py, ...), each in
               its own process with a time limit, their output copied into the report

Every comparison runs in one process in interleaved rounds (a, b, c, a, b, c, ...) after a
discarded warm-up, and every timed run is verified (N tool calls counted in the tool body, N+1
model calls, the final answer); the report gives ratios, and absolute times only as context.

A full run (no part flag, no --quick) regenerates ``benchmarks/results.md``; a partial or quick
run prints its report and writes only with ``--out``. ``--quick`` is a smoke run of everything
(small sizes, about a minute). fencepost is imported once: if it does not import, or a fencepost
system crashes, its rows say why and everything else still runs. Each part has a time limit and
the whole run a hard one, so ``make bench`` always stops by itself.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import common

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.md"
NOTES_MARK = "<!-- reading the results: written by hand, kept by make bench -->"
"""Where the hand-written reading of the numbers starts in results.md: a full run rewrites what
is above it and keeps it, so the prose the README links to survives a new measurement."""


def kept_notes(path: Path) -> str:
    """The hand-written section of ``path`` (from :data:`NOTES_MARK` on), or ``""``."""
    if not path.exists():
        return ""
    text = path.read_text(encoding="utf-8")
    start = text.find(NOTES_MARK)
    return "" if start < 0 else "\n" + text[start:]


MINE = {"bench", "common", "fairness", "loop_overhead", "peers", "scaling", "micro", "tracing"}
"""This harness's modules; every other ``*.py`` here is a script ``--others`` runs."""
OTHERS_TITLE = "## Other benchmark scripts"
# tracing sets the process's global tracer provider (once per process): it runs after the
# parts whose numbers it could touch, sampling nothing once it is done.
PARTS = (
    "loop",
    "peers",
    "floor",
    "growth",
    "short",
    "gate",
    "fairness",
    "profile",
    "tracing",
    "others",
)
Target = tuple[str, str, bool | None]


LOAD_AT_START = os.getloadavg()[0]


class PartTimeout(BaseException):
    """A part ran past its time limit. A BaseException so no ``except Exception`` in the code
    under test can mistake it for a model or tool error and carry on."""


def _alarm(signum: int, frame: Any) -> None:
    raise PartTimeout


def import_fencepost() -> tuple[ModuleType | None, str]:
    """``loop_overhead`` (which imports fencepost), or None and why not."""
    try:
        import loop_overhead
    except Exception as exc:
        traceback.print_exc()
        return None, f"fencepost did not import ({common.describe(exc)})"
    note = loop_overhead.choose_decider()
    print(f"fencepost decision model: {note}", file=sys.stderr)
    return loop_overhead, ""


# --------------------------------------------------------------------------------------------
# parts not in their own module
# --------------------------------------------------------------------------------------------


def peers_part(
    lo: ModuleType | None, fp_error: str, n: int, rounds: int
) -> tuple[str, list[Target]]:
    """fencepost and the LangGraph baselines (InMemorySaver) vs Pydantic AI and the Agents SDK."""
    import asyncio

    from peers import build_openai_agents, build_pydantic_ai

    cells: dict[common.Key, common.Cell] = {}
    builders: list[tuple[str, Callable[[], common.System]]] = []
    if lo is not None:
        builders.append(("fencepost", lambda: lo.build_fencepost(common.memory_saver())))
    else:
        cells["sync", "fencepost"] = common.Cell(error=fp_error)
        cells["async", "fencepost"] = common.Cell(error=fp_error)
    builders += [
        ("create_agent", lambda: common.build_create_agent(common.memory_saver(), limit=n + 5)),
        ("bare", lambda: common.build_bare(common.memory_saver())),
        ("pydantic_ai", build_pydantic_ai),
        ("openai_agents", build_openai_agents),
    ]
    entries: list[common.Entry] = []
    async_entries: list[common.Entry] = []
    for name, build in builders:
        try:
            system = build()
        except Exception as exc:
            why = common.describe(exc)
            cells["sync", name] = common.Cell(error=why)
            cells["async", name] = common.Cell(error=why)
            continue
        entries.append(common.Entry((("sync", name),), system, "sync"))
        async_entries.append(common.Entry((("async", name),), system, "async"))
    with asyncio.Runner() as runner:
        rounds = common.interleave(
            [*entries, *async_entries],
            cells,
            n=n,
            rounds=rounds,
            warm_up_n=min(n, 40),
            runner=runner,
            label="peers",
        )
    labels = {
        "fencepost": "fencepost (InMemorySaver)",
        "create_agent": "create_agent + limits (InMemorySaver)",
        "bare": "bare model + ToolNode loop (InMemorySaver)",
        "pydantic_ai": "Pydantic AI: FunctionModel + UsageLimits",
        "openai_agents": "OpenAI Agents SDK: custom Model + max_turns",
    }
    lines = [
        f"## Peers: the same {n}-iteration tool loop, median ms per iteration over {rounds} "
        "interleaved rounds",
        "",
        "Every system: a fake model that makes one call of the same trivial tool per turn "
        "(counted in the tool body) and then answers, the framework's own limits on, no "
        "network (Pydantic AI's `FunctionModel`; a custom Agents SDK `Model` with tracing "
        "disabled). The peers hold their run in memory, so the LangGraph systems use "
        "InMemorySaver. Sync is `invoke` / `run_sync` / `Runner.run_sync`; async is `ainvoke` / "
        "`agent.run` / `Runner.run`. The ratios are fencepost's time over each system's: "
        "below 1 fencepost is faster.",
        "",
        "| system | sync ms/iter | async ms/iter | fencepost / this, sync | fencepost / this, async |",
        "|---|---:|---:|---:|---:|",
    ]
    targets: list[Target] = []
    for name, label in labels.items():
        s, a = cells.get(("sync", name)), cells.get(("async", name))
        fs, fa = cells.get(("sync", "fencepost")), cells.get(("async", "fencepost"))
        peer = name in ("pydantic_ai", "openai_agents")
        rs, ra = (
            common.ratio(fs, s, 1.0 if peer else None),
            common.ratio(fa, a, 1.0 if peer else None),
        )
        if name == "fencepost":
            rs = ra = ""
        lines.append(
            f"| {label} | {s.fmt() if s else 'n/a'} | {a.fmt() if a else 'n/a'} | {rs} | {ra} |"
        )
        if peer:
            targets.append(
                (
                    f"fencepost / {name} (stay ahead: < 1), sync / async",
                    f"{rs} / {ra}",
                    _both(rs, ra),
                )
            )
    lines += [
        "",
        '(`met` here means fencepost is ahead, the issue\'s "stay ahead".)',
        "",
    ]
    return "\n".join(lines), targets


def _both(*cells: str) -> bool | None:
    if any(c.endswith("MISSED") for c in cells):
        return False
    if all(c.endswith("met") for c in cells):
        return True
    return None


def others_part(budget: float, quick: bool) -> str:
    """Run the other ``benchmarks/*.py`` scripts, each in its own process, output copied in.

    They share ``budget`` seconds (what is left of ``make bench``'s), at least 30 s each (10 s
    in a quick run, which also sets ``FENCEPOST_BENCH_QUICK=1`` for scripts that honour it), or
    what a script asks for with a module-level ``BENCH_SECONDS = N`` (not in a quick run).
    """
    scripts = sorted(
        p for p in HERE.glob("*.py") if p.stem not in MINE and not p.stem.startswith("_")
    )
    lines = [OTHERS_TITLE, ""]
    if not scripts:
        return "\n".join([*lines, "None in `benchmarks/` yet.", ""])
    share = max(10.0 if quick else 30.0, budget / len(scripts))
    env = os.environ.copy()
    if quick:
        env["FENCEPOST_BENCH_QUICK"] = "1"
    lines += [
        "Each run by `make bench` in its own process (`python benchmarks/<script>`, stopped "
        f"after {share:.0f} s or the time it asks for), its standard output copied below as it "
        "printed it (headings moved three levels down); the script owns what it measures.",
        "",
    ]
    for script in scripts:
        print(f"  others: {script.name}", file=sys.stderr)
        wanted = re.search(r"(?m)^BENCH_SECONDS\s*=\s*(\d+)", script.read_text())
        timeout = max(share, float(wanted.group(1))) if wanted and not quick else share
        t0 = time.perf_counter()
        try:
            done = _run_script(script, timeout, env)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            lines += [f"### {script.name}: stopped after {timeout:.0f} s", "", _nest(out), ""]
            continue
        took = time.perf_counter() - t0
        status = "" if done.returncode == 0 else f", exit status {done.returncode}"
        lines += [f"### {script.name} ({took:.0f} s{status})", ""]
        out = done.stdout.strip()
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-5:])
            out += f"\n\n```\n{tail}\n```"
        lines += [_nest(out) or "(no output)", ""]
        sys.stderr.write(done.stderr[-2000:])
    return "\n".join(lines)


def _run_script(
    script: Path, timeout: float, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` to its end or ``timeout``; on timeout its whole process group is killed
    (a script's worker processes too: killing the script alone left them running, holding
    database connections, after ``make bench`` had ended)."""
    with subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=HERE.parent,
        env=env,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout, output=out) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _nest(out: str) -> str:
    """A script's own headings nest under its section ("# X" becomes "#### X"); output with
    no markdown in it (no table, no heading) is kept as printed, in a code block."""
    out = out.strip()
    if out and not re.search(r"(?m)^(\||#)", out):
        return f"```\n{out}\n```"
    return re.sub(r"(?m)^(#{1,3}) ", r"###\1 ", out)


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def sizes(quick: bool, iterations: int | None, rounds: int | None) -> dict[str, int]:
    full = {
        "n": 200,
        "rounds": 5,
        "growth": 1000,
        "growth_runs": 2,
        "short_runs": 100,
        "inflight": 500,
        "prior": 1000,
        "profile": 500,
        "budget": 480,
    }
    small = {
        "n": 20,
        "rounds": 1,
        "growth": 100,
        "growth_runs": 1,
        "short_runs": 10,
        "inflight": 100,
        "prior": 100,
        "profile": 50,
        "budget": 55,
    }
    out = small if quick else full
    if iterations is not None:
        out["n"] = iterations
    if rounds is not None:
        out["rounds"] = rounds
    return out


LIMITS = {
    "loop": 210,
    "peers": 120,
    "floor": 60,
    "growth": 180,
    "short": 150,
    "gate": 60,
    "fairness": 90,
    "profile": 60,
    "tracing": 150,
}
"""Seconds each part may take before it is stopped (typical full run: well under half)."""
SOFT = {"loop": 120, "peers": 75, "floor": 40, "growth": 60, "short": 40, "tracing": 90}
"""Seconds after which a part starts no new round (on an idle machine they finish sooner)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="fencepost benchmarks",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(__doc__ or "").split("\n\n")[1],
    )
    for part in PARTS:
        parser.add_argument(f"--{part}", action="store_true", help=f"run the {part} part")
    parser.add_argument("--quick", action="store_true", help="a smoke run of everything, small")
    parser.add_argument("-n", "--iterations", type=int, help="N for the loop, peers and floor")
    parser.add_argument("--rounds", type=int, help="measured rounds after the warm-up")
    parser.add_argument("--growth-length", type=int, help="iterations of the growth run")
    parser.add_argument("--inflight", type=int, help="concurrent runs for the memory table")
    parser.add_argument("--prior", type=int, help="prior proposals for the gate's late state")
    parser.add_argument("--profile-n", type=int, help="iterations of the profiled run")
    parser.add_argument("--no-async", action="store_true", help="skip the loop's ainvoke rows")
    parser.add_argument(
        "--middleware-only",
        action="store_true",
        help="the loop part with (a) fencepost, (b) create_agent + limits and (d) create_agent + "
        "fp.FencepostMiddleware only (implies --loop)",
    )
    parser.add_argument("--out", type=Path, help="write the report here (a full run: results.md)")
    args = parser.parse_args(argv)

    if args.middleware_only:
        args.loop = True
    chosen = [p for p in PARTS if getattr(args, p)]
    full = not chosen and not args.quick
    parts = chosen or list(PARTS)
    size = sizes(args.quick, args.iterations, args.rounds)
    if args.growth_length:
        size["growth"] = args.growth_length
    if args.inflight:
        size["inflight"] = args.inflight
    if args.prior:
        size["prior"] = args.prior
    if args.profile_n:
        size["profile"] = args.profile_n
    out_path: Path | None = args.out or (RESULTS if full else None)
    given = sys.argv[1:] if argv is None else argv
    command = "make bench" if full and not given else " ".join(["bench.py", *given])

    started = time.perf_counter()
    hard_limit = (660 if not args.quick else 240) * max(
        1.0, min(4.0, LOAD_AT_START / (os.cpu_count() or 1))
    )
    sections: list[str] = []
    targets: list[Target] = []
    failures: list[str] = []

    def hard_stop() -> None:
        # Whatever hangs, `make bench` ends, with what it had measured so far.
        print(f"bench: hard time limit ({hard_limit:.0f}s) hit, stopping", file=sys.stderr)
        failures.append(f"stopped by the hard time limit ({hard_limit:.0f} s): later parts missing")
        report = _header(hard_limit, parts, command, targets, "", failures)
        if out_path is not None:
            out_path.write_text(report + "\n" + "\n".join(sections) + kept_notes(out_path))
        os._exit(3)

    watchdog = threading.Timer(hard_limit, hard_stop)
    watchdog.daemon = True
    watchdog.start()
    signal.signal(signal.SIGALRM, _alarm)

    print(f"bench: parts {', '.join(parts)}; sizes {size}", file=sys.stderr)
    lo, fp_error = import_fencepost()
    # A loaded machine runs every part slower: its limits stretch with the load (up to 4x)
    # rather than stopping a part that would have finished; the spreads say the rest.
    load_scale = max(1.0, min(4.0, LOAD_AT_START / (os.cpu_count() or 1)))
    scale = (0.5 if args.quick else 1.0) * load_scale

    def run(part: str, body: Callable[[], str | tuple[str, list[Target]]]) -> None:
        t0 = time.perf_counter()
        print(f"bench: {part} ...", file=sys.stderr)
        limit = LIMITS.get(part)
        if limit:
            signal.alarm(int(limit * scale) + 1)
        soft = SOFT.get(part)
        common.SOFT_DEADLINE = t0 + soft * scale if soft else None
        try:
            result = body()
        except PartTimeout:
            failures.append(f"{part}: timed out")
            sections.append(
                f"## {part}\n\nstopped: the part ran past its {limit * scale:.0f} s limit.\n"
            )
            return
        except Exception as exc:
            traceback.print_exc()
            failures.append(f"{part}: {common.describe(exc)}")
            sections.append(f"## {part}\n\nfailed: {common.describe(exc)}\n")
            return
        finally:
            signal.alarm(0)
            common.SOFT_DEADLINE = None
        text, found = result if isinstance(result, tuple) else (result, [])
        sections.append(text)
        targets.extend(found)
        print(f"bench: {part} done in {time.perf_counter() - t0:.0f}s", file=sys.stderr)

    n, rounds = size["n"], size["rounds"]
    if "loop" in parts:
        if lo is None:
            sections.append(f"## Loop overhead\n\nskipped: {fp_error}\n")
            failures.append(f"loop: {fp_error}")
        else:
            run("loop", lambda: _loop(lo, n, rounds, not args.no_async, args.middleware_only))
    if "peers" in parts:
        run("peers", lambda: peers_part(lo, fp_error, n, max(1, rounds - 1)))
    if "floor" in parts:
        import scaling

        run("floor", lambda: scaling.floor_part(lo, fp_error, n, rounds))
    if "growth" in parts:
        import scaling

        run(
            "growth", lambda: scaling.growth_part(lo, fp_error, size["growth"], size["growth_runs"])
        )
    if "short" in parts:
        import scaling

        run("short", lambda: scaling.short_part(lo, fp_error, size["short_runs"], size["inflight"]))
    if "gate" in parts:
        import micro

        run("gate", lambda: micro.gate_part(lo, fp_error, size["prior"]))
    if "fairness" in parts:
        import fairness

        run("fairness", lambda: fairness.fairness_part(lo, fp_error, 10 if args.quick else 50))
    if "profile" in parts:
        import micro

        run("profile", lambda: micro.profile_part(lo, fp_error, size["profile"]))
    if "tracing" in parts:
        import tracing

        run("tracing", lambda: tracing.tracing_part(lo, fp_error, n, rounds))
    if "others" in parts:
        left = size["budget"] - (time.perf_counter() - started)
        run("others", lambda: others_part(left, args.quick))
    watchdog.cancel()

    errors = _errors_in(sections, fp_error)
    elapsed = time.perf_counter() - started
    report = (
        _header(elapsed, parts, command, targets, fp_error, failures + errors)
        + "\n"
        + "\n".join(sections)
    )
    print(report)
    if out_path is not None:
        out_path.write_text(report + kept_notes(out_path))
        print(f"bench: written to {out_path}", file=sys.stderr)
    print(f"bench: {elapsed:.0f}s", file=sys.stderr)
    code = 1 if (failures or errors) else 0
    if failures:
        # A part stopped mid-run leaves its threads behind (aiosqlite's connection threads are
        # not daemons), and the interpreter would wait for them at exit for good.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _loop(lo: ModuleType, n: int, rounds: int, with_async: bool, middleware_only: bool) -> str:
    return lo.loop_part(n, rounds, with_async, middleware_only)


def _errors_in(sections: list[str], known: str) -> list[str]:
    """Cells that hold an error instead of a number (verification failures, crashes), other
    than ``known`` (fencepost not importing, said once at the top)."""
    found = []
    for text in sections:
        if text.startswith(OTHERS_TITLE):
            continue
        for line in text.splitlines():
            if known and known in line:
                continue
            if "error: " in line or "verification failed" in line:
                found.append(line.strip()[:200])
    return found


def _header(
    elapsed: float,
    parts: list[str],
    command: str,
    targets: list[Target],
    fp_error: str,
    problems: list[str],
) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# fencepost benchmarks",
        "",
        f"Generated by `{command}` on {when} in {elapsed:.0f} s; parts: {', '.join(parts)}. "
        f"Load average (1 min) at the start {LOAD_AT_START:.1f}, at the end "
        f"{os.getloadavg()[0]:.1f}, on {os.cpu_count()} CPUs: other work on the machine "
        "widens the spreads.",
        "",
        f"Environment: {common.environment()}.",
        "",
        "Every comparison runs side by side in one process, in interleaved rounds after a "
        "discarded warm-up, and every timed run is verified (tool calls counted in the tool "
        "body, model calls counted in the fake model, the final answer checked); a run that "
        "fails verification is an error in its cell, never a sample. The claims are the "
        "ratios: absolute times depend on this machine.",
        "",
    ]
    if fp_error:
        lines += [f"**fencepost rows skipped: {fp_error}.**", ""]
    if targets:
        lines += ["## Targets (issues 12 and 33)", "", "| target | measured | |", "|---|---:|---|"]
        for what, value, met in targets:
            mark = {True: "met", False: "MISSED", None: ""}[met]
            lines.append(
                f"| {what} | {value.replace(' met', '').replace(' MISSED', '')} | {mark} |"
            )
        lines.append("")
    if problems:
        lines += ["Problems in this run:", ""]
        lines += [f"- {p}" for p in problems]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
