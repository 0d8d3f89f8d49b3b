"""The ``fencepost`` command: demo, runs, show, report, graph.

Every command takes ``--json``. Errors are one line on stderr and a non-zero exit, never a
traceback (with ``--json`` the line is a JSON object ``{"error": code, "message": text}``).
Runs are read from the checkpoint database through LangGraph's checkpointer API only
(:mod:`fencepost.reporting`), so SQLite and Postgres behave the same.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fencepost.policy import AgentState, BudgetAxis, error_code_for
from fencepost.reporting import (
    DEFAULT_DB,
    PAUSED,
    RUNNING,
    EvalReport,
    RunRecord,
    StoreError,
    build_report,
    load_run,
    load_runs,
    open_store,
    parse_store_url,
)

__all__ = ["app", "main"]

app = typer.Typer(
    name="fencepost",
    help="Bounded tool-calling agent runs on LangGraph: run the demo, inspect runs, report.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

Db = Annotated[
    str,
    typer.Option(
        "--db",
        envvar="FENCEPOST_DB",
        help="Checkpoint database: sqlite:///PATH (relative), sqlite:////ABS/PATH or postgresql://...",
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for machines instead of tables.")]

P = ParamSpec("P")
R = TypeVar("R")

_REASON_STYLE = {
    "completed": "green",
    "insufficient_evidence": "yellow",
    "needs_clarification": "yellow",
    "cancelled": "yellow",
    "approval_required": "yellow",
    PAUSED: "cyan",
    RUNNING: "cyan",
}


def _console(*, stderr: bool = False) -> Console:
    # A pipe or a CI log gets a readable fixed width instead of rich's 80-column default.
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 120
    return Console(stderr=stderr, width=width, highlight=False)


def _fail(message: str, code: str, *, as_json: bool, exit_code: int = 1) -> NoReturn:
    line = json.dumps({"error": code, "message": message}) if as_json else f"error: {message}"
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    raise typer.Exit(exit_code)


def _guarded(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn every failure of a command into one line and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        as_json = bool(kwargs.get("as_json", False))
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except StoreError as exc:
            # StoreError messages are fencepost's own sentences (URL masked); no driver text.
            _fail(str(exc), exc.code, as_json=as_json)
        except KeyboardInterrupt:
            _fail("interrupted", "interrupted", as_json=as_json, exit_code=130)
        except Exception as exc:
            # Only the safe code and the exception's type: its text may hold anything.
            code = error_code_for(exc).value
            _fail(f"unexpected {code} error ({type(exc).__name__})", code, as_json=as_json)

    return wrapper


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _style(status: str) -> str:
    return _REASON_STYLE.get(status, "red")


def _budget_left(state: AgentState) -> str:
    b = state.budget
    return f"{b.steps_remaining} steps · {b.tool_calls_remaining} calls"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


# --- demo -----------------------------------------------------------------------------------------


def _progress(name: str, m: dict[str, Any]) -> Text:
    tool = m.get("tool_name") or m.get("decision_kind") or ""
    deadline = m.get("deadline_remaining_ms")
    left = f"{m.get('steps_remaining')} steps, {m.get('tool_calls_remaining')} tool calls"
    if deadline is not None:
        left += f", {deadline / 1000:.1f} s"
    line = Text("  ⋯ ", style="dim")
    line.append(f"{name:<22}", style="bold")
    line.append(f" step {m.get('step')} · {m.get('phase')} {tool} → {m.get('outcome')}")
    line.append(f" · left: {left}", style="dim")
    return line


@app.command()
@_guarded
def demo(db: Db = DEFAULT_DB, as_json: AsJson = False) -> None:
    """Run the demo scenarios through the real graph and store them in DB.

    One scenario per way a run can end: a release-caused and a database-caused incident
    investigated with citations, a refund rule, budgets, a deadline, an unknown tool, a repeated
    call, a denied capability, writes that need approval (paused at the interrupt, then approved
    or cancelled), a failing tool and a failing model.
    """
    from fencepost.demo import SCENARIOS, DemoRun, run_scenario

    console = _console()
    runs: list[DemoRun] = []
    with open_store(db, create=True) as saver:
        for scenario in SCENARIOS:
            if as_json:
                runs.append(run_scenario(scenario, saver))
                continue
            last: dict[str, Any] = {}
            with Live(console=console, transient=True, refresh_per_second=15) as live:

                def on_manifest(
                    sc: Any, m: dict[str, Any], live: Live = live, last: dict[str, Any] = last
                ) -> None:
                    if m.get("tool_name"):
                        last["tool_name"] = m["tool_name"]
                    live.update(_progress(sc.name, m))

                def on_pause(
                    sc: Any, calls: list[dict[str, Any]], answer: str, live: Live = live
                ) -> None:
                    tools = ", ".join(f"{c['tool_name']} ({c['effect']})" for c in calls)
                    live.console.print(
                        Text.assemble(
                            ("  ⏸ ", "cyan"),
                            (f"{sc.name:<22}", "bold"),
                            f" paused: approval needed for {tools} → a human answers ",
                            (answer, "bold cyan"),
                        )
                    )

                run = run_scenario(scenario, saver, on_manifest=on_manifest, on_pause=on_pause)
            runs.append(run)
            reason = run.termination.value if run.termination else PAUSED
            mark, style = ("✔", "green") if run.as_expected else ("✘", "red")
            console.print(
                Text.assemble(
                    (f"  {mark} ", style),
                    (f"{scenario.name:<22}", "bold"),
                    f" step {run.state.step} · {last.get('tool_name') or '-'} → ",
                    (reason, _style(reason)),
                    (f" · left: {_budget_left(run.state)} · {_ms(run.duration_seconds)}", "dim"),
                )
            )
    unexpected = [r for r in runs if not r.as_expected]
    where = parse_store_url(db).display
    if as_json:
        _print_json(
            {
                "db": where,
                "runs": [
                    {
                        "run_id": r.run_id,
                        "scenario": r.scenario.name,
                        "expected": r.scenario.expected.value,
                        "termination": r.termination.value if r.termination else None,
                        "as_expected": r.as_expected,
                        "steps": r.state.budget.steps_used,
                        "tool_calls": r.state.budget.tool_calls_used,
                        "budget_left": {
                            "steps": r.state.budget.steps_remaining,
                            "tool_calls": r.state.budget.tool_calls_remaining,
                        },
                        "last_error_code": r.state.last_error_code,
                        "paused_for": list(r.paused_for),
                        "duration_seconds": r.duration_seconds,
                    }
                    for r in runs
                ],
            }
        )
    else:
        console.print()
        console.print(f"fencepost demo: {len(runs)} runs stored in {where}")
        table = Table()
        for col, kw in (
            ("run id", {"no_wrap": True}),
            ("scenario", {"no_wrap": True}),
            ("steps", {"justify": "right"}),
            ("tool calls", {"justify": "right"}),
            ("terminal reason", {"no_wrap": True}),
            ("budget left", {"no_wrap": True}),
            ("duration", {"justify": "right", "no_wrap": True}),
        ):
            table.add_column(col, **kw)
        for r in runs:
            reason = r.termination.value if r.termination else PAUSED
            shown = Text(reason, style=_style(reason))
            if not r.as_expected:
                shown.append(f" (expected {r.scenario.expected.value})", style="bold red")
            table.add_row(
                r.run_id,
                r.scenario.name,
                str(r.state.budget.steps_used),
                str(r.state.budget.tool_calls_used),
                shown,
                _budget_left(r.state),
                _ms(r.duration_seconds),
            )
        console.print(table)
        console.print(
            "Inspect them: [bold]fencepost runs[/] · [bold]fencepost show RUN_ID[/] · "
            "[bold]fencepost report[/]" + ("" if db == DEFAULT_DB else f"  (with --db {db})")
        )
    if unexpected:
        names = ", ".join(r.scenario.name for r in unexpected)
        _fail(
            f"{len(unexpected)} scenario(s) ended with an unexpected reason: {names}",
            "unexpected_reason",
            as_json=as_json,
        )


# --- runs -----------------------------------------------------------------------------------------


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    local = value.astimezone()
    today = datetime.now(local.tzinfo).date() == local.date()
    return local.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M")


@app.command()
@_guarded
def runs(
    db: Db = DEFAULT_DB,
    as_json: AsJson = False,
    limit: Annotated[int | None, typer.Option(help="Show only the newest N runs.", min=1)] = None,
) -> None:
    """The runs stored in DB, newest first, with their terminal reason or pause."""
    with open_store(db) as saver:
        records = load_runs(saver, source=parse_store_url(db).display)
    records = records[:limit] if limit else records
    if as_json:
        _print_json([r.summary() for r in records])
        return
    console = _console()
    if not records:
        console.print(f"No runs in {parse_store_url(db).display} yet. Try: fencepost demo")
        return
    console.print(f"{len(records)} runs in {parse_store_url(db).display}, newest first")
    table = Table()
    # Ids are copied into `fencepost show`: never shortened. The question gives way first.
    table.add_column("run id", no_wrap=True, min_width=16)
    table.add_column("scenario", no_wrap=True, min_width=20)
    table.add_column("status", no_wrap=True, min_width=21)
    table.add_column("steps / calls", justify="right", no_wrap=True, min_width=13)
    table.add_column("updated", no_wrap=True, min_width=8)
    table.add_column("question", overflow="fold")
    for r in records:
        table.add_row(
            r.run_id,
            r.scenario or "-",
            Text(r.status, style=_style(r.status)),
            f"{r.state.budget.steps_used} / {r.state.budget.tool_calls_used}",
            _when(r.updated_at),
            _clip(r.state.question, 60),
        )
    console.print(table)


# --- show -----------------------------------------------------------------------------------------


def _show_data(record: RunRecord) -> dict[str, Any]:
    state = record.state
    tools_by_call = {o.call_id: o.tool_name for o in state.observations}
    answer = state.final_answer
    return {
        "run": record.summary(),
        "termination": state.termination.value if state.termination else None,
        "last_error_code": state.last_error_code,
        "budget": {
            axis.value: {"used": state.budget.used(axis), "left": state.budget.remaining(axis)}
            for axis in BudgetAxis
        },
        "manifests": [m.model_dump(mode="json") for m in state.manifests],
        "receipts": [r.model_dump(mode="json") for r in state.receipts],
        "final_answer": answer.text if answer else None,
        "citations": [
            {"call_id": c, "tool_name": tools_by_call.get(c)}
            for c in (answer.citations if answer else ())
        ],
    }


@app.command()
@_guarded
def show(
    run_id: Annotated[str, typer.Argument(help="A run id (or thread id) from `fencepost runs`.")],
    db: Db = DEFAULT_DB,
    as_json: AsJson = False,
) -> None:
    """One run: its step manifests as a timeline, receipts, answer, citations and end."""
    with open_store(db) as saver:
        record = load_run(saver, run_id, source=parse_store_url(db).display)
    data = _show_data(record)
    if as_json:
        _print_json(data)
        return
    state = record.state
    console = _console()
    head = Text.assemble(
        ("run ", "dim"),
        (record.run_id, "bold"),
        ("  scenario ", "dim"),
        record.scenario or "-",
        ("  status ", "dim"),
        (record.status, _style(record.status)),
    )
    if state.last_error_code:
        head.append("  code ", style="dim")
        head.append(state.last_error_code, style="bold")
    console.print(head)
    console.print(Text.assemble(("question ", "dim"), state.question))
    if record.thread_id != record.run_id:
        console.print(Text.assemble(("thread ", "dim"), record.thread_id))

    timeline = Table(title="timeline (step manifests)", title_justify="left")
    timeline.add_column("step", justify="right", no_wrap=True, min_width=4)
    for col in ("phase", "kind", "tool", "verdict", "outcome", "code"):
        timeline.add_column(col, no_wrap=True, min_width=len(col))
    timeline.add_column("left: steps / calls", justify="right", no_wrap=True, min_width=11)
    timeline.add_column("deadline", justify="right", no_wrap=True, min_width=8)
    for m in state.manifests:
        tool = m.tool_name or ""
        if m.effect is not None and m.effect.value != "read":
            tool += f" ({m.effect.value})"
        timeline.add_row(
            str(m.step),
            m.phase.value,
            m.decision_kind or "",
            tool,
            m.verdict.value if m.verdict else "",
            Text(m.outcome, style="red" if m.outcome in ("denied", "error") else ""),
            m.code or "",
            f"{m.steps_remaining} / {m.tool_calls_remaining}",
            _ms(m.deadline_remaining_ms / 1000) if m.deadline_remaining_ms is not None else "-",
        )
    console.print(timeline)

    if state.receipts:
        receipts = Table(title="receipts", title_justify="left")
        for col in ("call id", "tool", "status", "error code", "attempts"):
            receipts.add_column(col, no_wrap=True)
        for r in state.receipts:
            receipts.add_row(
                r.call_id,
                r.tool_name,
                r.status.value,
                r.error_code.value if r.error_code else "",
                str(r.attempts),
            )
        console.print(receipts)
    else:
        console.print(Text("receipts: none (no tool call was executed)", style="dim"))

    if state.final_answer is not None:
        console.print(Text.assemble(("answer ", "dim"), state.final_answer.text))
        for c in data["citations"]:
            console.print(
                Text.assemble(("  cites ", "dim"), c["call_id"], (f" ({c['tool_name']})", "dim"))
            )
    if record.status == PAUSED:
        console.print(
            Text.assemble(
                ("waiting for approval of ", "cyan"), ", ".join(record.waiting_for) or "a call"
            )
        )
    elif record.status == RUNNING:
        console.print(Text("not ended: still running, or crashed and resumable", style="cyan"))
    else:
        console.print(
            Text.assemble(
                ("terminal reason ", "dim"),
                (record.status, _style(record.status)),
                ("  error code ", "dim"),
                state.last_error_code or "-",
                ("  budget left ", "dim"),
                _budget_left(state),
            )
        )


# --- report ---------------------------------------------------------------------------------------


def _num(value: float) -> str:
    return f"{value:g}"


def _print_report(report: EvalReport, where: str) -> None:
    console = _console()
    if not report.runs:
        console.print(f"No runs in {where} yet. Try: fencepost demo")
        return
    console.print(f"{report.runs} runs in {where}")
    reasons = Table(title="terminal reasons", title_justify="left")
    reasons.add_column("reason", no_wrap=True)
    reasons.add_column("runs", justify="right")
    reasons.add_column("share", justify="right")
    for status, count in report.by_status.items():
        reasons.add_row(
            Text(status, style=_style(status)), str(count), f"{count / report.runs:.0%}"
        )
    console.print(reasons)

    per_run = Table(title="per run", title_justify="left")
    for col in ("", "median", "p90", "max"):
        per_run.add_column(col, justify="right" if col else "left")
    for label, dist in (("steps", report.steps), ("tool calls", report.tool_calls)):
        per_run.add_row(label, _num(dist.median), _num(dist.p90), _num(dist.max))
    console.print(per_run)

    budget = Table(title="budget use by axis", title_justify="left")
    for col in ("axis", "runs limited", "used total", "used median", "used p90", "used max"):
        budget.add_column(col, justify="left" if col == "axis" else "right")
    budget.add_column("share of limit (median / p90)", justify="right")
    budget.add_column("runs exhausted", justify="right")
    for axis in report.budget:
        share = (
            f"{axis.share_of_limit.median:.0%} / {axis.share_of_limit.p90:.0%}"
            if axis.share_of_limit
            else "not limited"
        )
        budget.add_row(
            axis.axis,
            str(axis.runs_limited),
            _num(axis.used_total),
            _num(axis.used.median),
            _num(axis.used.p90),
            _num(axis.used.max),
            share,
            str(axis.runs_exhausted),
        )
    console.print(budget)


@app.command()
@_guarded
def report(db: Db = DEFAULT_DB, as_json: AsJson = False) -> None:
    """The eval view: terminal reasons, steps and tool calls per run, budget use by axis."""
    where = parse_store_url(db).display
    with open_store(db) as saver:
        result = build_report(load_runs(saver, source=where))
    if as_json:
        _print_json(result.model_dump(mode="json"))
    else:
        _print_report(result, where)


# --- graph ----------------------------------------------------------------------------------------


@app.command()
@_guarded
def graph(as_json: AsJson = False) -> None:
    """The loop as a Mermaid diagram (paste it into a Markdown ```mermaid block)."""
    from fencepost.demo import build_demo_graph

    text = build_demo_graph().get_graph().draw_mermaid()
    if as_json:
        _print_json({"mermaid": text})
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def main() -> None:
    """Console-script entry point (``fencepost = "fencepost.cli:main"``)."""
    try:
        app(prog_name="fencepost")
    except SystemExit:
        raise
    except BaseException as exc:  # last resort: never a traceback
        code = error_code_for(exc).value if isinstance(exc, Exception) else "interrupted"
        sys.stderr.write(f"error: unexpected {code} error ({type(exc).__name__})\n")
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
