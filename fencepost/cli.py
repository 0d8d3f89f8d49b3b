"""The ``fencepost`` command: demo, runs, show, report, graph; pending, approve, reject and
approvals for approvers.

Every command takes ``--json``. Errors are one line on stderr and a non-zero exit, never a
traceback (with ``--json`` the line is a JSON object ``{"error": code, "message": text}``), and
that includes usage errors (an unknown command or option). Runs are read from the checkpoint
database through LangGraph's checkpointer API only (:mod:`fencepost.reporting`), so SQLite and
Postgres behave the same.

Tables fit the terminal they are printed on, 80 columns included; piped output is laid out for
``$COLUMNS`` (80 when unset). Long cells wrap inside their column instead of being cut, and the
ids a user copies into ``fencepost show`` are never shortened.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer
from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from fencepost.adapters.checkpointers import CheckpointerError, mask_url
from fencepost.adapters.default_ledger import durable_ledger
from fencepost.answering import GraphNotFound, answer_calls, default_graph_spec, load_graph
from fencepost.policy import (
    AgentState,
    BudgetAxis,
    StepManifest,
    StopReport,
    error_code_for,
)
from fencepost.policy.remembered import ScopeStore
from fencepost.policy.stop_report import call_rows, note_rows, report_head
from fencepost.reporting import (
    DEFAULT_DB,
    PAUSED,
    RUNNING,
    EvalReport,
    RunRecord,
    build_report,
    demo_run_id,
    load_run,
    load_runs,
    new_demo_batch,
    open_store,
    pending_calls,
    select_batch,
)

__all__ = ["app", "main"]

P = ParamSpec("P")
R = TypeVar("R")


def _fail_line(message: str, code: str, *, as_json: bool) -> None:
    line = json.dumps({"error": code, "message": message}) if as_json else f"error: {message}"
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class _OneLineUsageErrors(TyperGroup):
    """Usage errors (unknown command or option, bad value) as one line, honouring ``--json``.

    Click would print the usage, a hint and a boxed message over several lines; a script reading
    stderr, or ``--json`` output, wants one line like every other fencepost error.
    """

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            result = super().main(
                args=argv,
                prog_name=prog_name,
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
        except typer.TyperException as exc:  # click's exceptions (typer vendors click)
            if not argv:
                # `fencepost` alone: the help is the answer (the error's message is the help).
                sys.stderr.write(exc.format_message() + "\n")
            else:
                message = " ".join(exc.format_message().split())
                ctx = getattr(exc, "ctx", None)
                if ctx is not None:
                    message += f" (see: {ctx.command_path} --help)"
                _fail_line(message, "usage", as_json="--json" in argv)
            code = exc.exit_code
        except typer.Abort:
            _fail_line("aborted", "aborted", as_json="--json" in argv)
            code = 1
        else:
            if not standalone_mode:
                return result
            # Without standalone mode click returns an Exit's code instead of exiting.
            code = result if isinstance(result, int) else 0
        if not standalone_mode:
            return code
        sys.exit(code)


app = typer.Typer(
    name="fencepost",
    cls=_OneLineUsageErrors,
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
Batch = Annotated[
    str | None,
    typer.Option(
        "--batch",
        help="Demo batch to cover (a batch id, or 'all' for every run). "
        "Default: the latest demo batch, or every run when there is none.",
    ),
]

_REASON_STYLE = {
    "completed": "green",
    "insufficient_evidence": "yellow",
    "needs_clarification": "yellow",
    "cancelled": "yellow",
    "approval_required": "yellow",
    PAUSED: "cyan",
    RUNNING: "cyan",
}


def _console() -> Console:
    # A terminal gives its width; a pipe or CI log gets $COLUMNS or 80. Either way every table
    # below wraps long cells inside their column, so nothing is cut at any width.
    return Console(highlight=False)


def _table(title: str | None = None) -> Table:
    """A compact table: a rule under the header, two spaces between columns, no outer frame."""
    return Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
        padding=(0, 1),
    )


def _fail(message: str, code: str, *, as_json: bool, exit_code: int = 1) -> NoReturn:
    _fail_line(message, code, as_json=as_json)
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
        except CheckpointerError as exc:
            # Checkpointer errors are fencepost's own sentences (URL masked); no driver text.
            _fail(str(exc), exc.code, as_json=as_json)
        except GraphNotFound as exc:
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


def _steps_calls(state: AgentState, *, left: bool = False) -> str:
    b = state.budget
    if left:
        return f"{b.steps_remaining} / {b.tool_calls_remaining}"
    return f"{b.steps_used} / {b.tool_calls_used}"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


# --- demo -----------------------------------------------------------------------------------------


def _progress(name: str, m: dict[str, Any]) -> Text:
    tool = m.get("tool_name") or m.get("decision_kind") or ""
    line = Text("  ⋯ ", style="dim", no_wrap=True, overflow="ellipsis")
    line.append(f"{name:<22}", style="bold")
    line.append(f" step {m.get('step')} · {m.get('phase')} {tool} → {m.get('outcome')}")
    return line


@app.command()
@_guarded
def demo(db: Db = DEFAULT_DB, as_json: AsJson = False) -> None:
    """Run the demo scenarios through the real graph and store them in DB.

    One scenario per way a run can end: incidents investigated with citations, a refund rule, budgets, a deadline, an unknown tool, a repeated call, a denied capability, writes that need approval (paused, then approved or cancelled), a failing tool and a failing model.

    The runs of one invocation form a batch (run ids run-BATCH-NN); `fencepost report` covers the latest batch.
    """
    from fencepost.demo import SCENARIOS, DemoRun, run_scenario

    console = _console()
    batch = new_demo_batch()
    runs: list[DemoRun] = []
    with open_store(db, create=True) as saver:
        for n, scenario in enumerate(SCENARIOS, start=1):
            run_id = demo_run_id(batch, n)
            if as_json:
                runs.append(run_scenario(scenario, saver, run_id=run_id))
                continue
            with Live(console=console, transient=True, refresh_per_second=15) as live:

                def on_manifest(sc: Any, m: dict[str, Any], live: Live = live) -> None:
                    live.update(_progress(sc.name, m))

                def on_pause(
                    sc: Any, calls: list[dict[str, Any]], answer: str, live: Live = live
                ) -> None:
                    tools = ", ".join(f"{c['tool_name']} ({c['effect']})" for c in calls)
                    live.console.print(
                        Text.assemble(
                            ("  ⏸ ", "cyan"),
                            (f"{sc.name:<22}", "bold"),
                            f" needs approval: {tools} → ",
                            (answer, "bold cyan"),
                        )
                    )

                run = run_scenario(
                    scenario, saver, on_manifest=on_manifest, on_pause=on_pause, run_id=run_id
                )
            runs.append(run)
            reason = run.termination.value if run.termination else PAUSED
            mark, style = ("✔", "green") if run.as_expected else ("✘", "red")
            b = run.state.budget
            console.print(
                Text.assemble(
                    (f"  {mark} ", style),
                    (f"{scenario.name:<22}", "bold"),
                    " ",
                    (f"{reason:<21}", _style(reason)),
                    (
                        f" {b.steps_used} steps · {b.tool_calls_used} calls · "
                        f"{_ms(run.duration_seconds)}",
                        "dim",
                    ),
                )
            )
    unexpected = [r for r in runs if not r.as_expected]
    where = mask_url(db)
    if as_json:
        _print_json(
            {
                "db": where,
                "batch": batch,
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
        console.print(f"fencepost demo: {len(runs)} runs (batch {batch}) stored in {where}")
        table = _table()
        table.add_column("run id", no_wrap=True)
        table.add_column("scenario", no_wrap=True)
        table.add_column("terminal reason", min_width=15)
        table.add_column("steps / calls", justify="right", min_width=5)
        table.add_column("left", justify="right", no_wrap=True)
        for r in runs:
            reason = r.termination.value if r.termination else PAUSED
            shown = Text(reason, style=_style(reason))
            if not r.as_expected:
                shown.append(f" (expected {r.scenario.expected.value})", style="bold red")
            table.add_row(
                r.run_id,
                r.scenario.name,
                shown,
                _steps_calls(r.state),
                _steps_calls(r.state, left=True),
            )
        console.print(table)
        console.print(
            "Inspect them: [bold]fencepost runs[/] · [bold]fencepost show RUN_ID[/] · "
            "[bold]fencepost report[/]" + ("" if db == DEFAULT_DB else f"  (with --db {where})")
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
    return local.strftime("%H:%M:%S" if today else "%m-%d %H:%M")


@app.command()
@_guarded
def runs(
    db: Db = DEFAULT_DB,
    as_json: AsJson = False,
    limit: Annotated[int | None, typer.Option(help="Show only the newest N runs.", min=1)] = None,
    batch: Annotated[
        str | None,
        typer.Option("--batch", help="Only the runs of this demo batch ('latest' for the newest)."),
    ] = None,
) -> None:
    """The runs stored in DB, newest first, with their terminal reason or pause."""
    where = mask_url(db)
    with open_store(db) as saver:
        records = load_runs(saver, source=db)
    if batch is not None:
        records, _ = select_batch(records, None if batch == "latest" else batch, source=db)
    records = records[:limit] if limit else records
    if as_json:
        _print_json([r.summary() for r in records])
        return
    console = _console()
    if not records:
        console.print(f"No runs in {where} yet. Try: fencepost demo")
        return
    console.print(f"{len(records)} runs in {where}, newest first")
    table = _table()
    table.expand = True
    # Ids are copied into `fencepost show`: never shortened. The question wraps instead.
    table.add_column("run id", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("steps /\ncalls", justify="right", no_wrap=True)
    table.add_column("updated", no_wrap=True)
    table.add_column("scenario · question", ratio=1, min_width=20, overflow="fold")
    for r in records:
        about = Text(r.scenario or "-", style="bold")
        about.append("\n")
        about.append(r.state.question, style="dim")
        table.add_row(
            r.run_id,
            Text(r.status, style=_style(r.status)),
            _steps_calls(r.state),
            _when(r.updated_at),
            about,
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
        "report": record.report.model_dump(mode="json") if record.report else None,
        "telemetry": _telemetry(record),
    }


LOGS_WHERE = (
    "the `fencepost` loggers (logging.basicConfig(level=logging.INFO)): tracebacks of what "
    "raised, refusals, approvals, endings"
)


def _telemetry(record: RunRecord) -> dict[str, Any]:
    """Where this run's logs and traces are: its state holds no exception text, and no span
    holds a payload (docs/observability.md)."""
    return {
        "logs": LOGS_WHERE,
        "traces": {
            "span": "invoke_agent",
            "gen_ai.conversation.id": record.thread_id,
            "fencepost.run_id": record.run_id,
        },
    }


def _manifest_tool(m: StepManifest) -> Text:
    tool = Text(m.tool_name or m.decision_kind or "")
    if m.tool_name and m.effect is not None and m.effect.value != "read":
        tool.append(f" ({m.effect.value})", style="yellow")
    return tool


def _manifest_outcome(m: StepManifest) -> Text:
    outcome = Text(m.outcome, style="red" if m.outcome in ("denied", "error") else "")
    verdict = m.verdict.value if m.verdict else None
    details = [d for d in (verdict, m.code) if d and d not in (m.outcome, "allowed")]
    if details:
        outcome.append(" " + " · ".join(dict.fromkeys(details)), style="dim")
    return outcome


def _spans(parts: tuple[tuple[str, str], ...], sep: str = " ") -> Text:
    text = Text()
    for n, (part, style) in enumerate(parts):
        text.append((sep if n else "") + part, style=style)
    return text


def _print_stop_report(console: Console, report: StopReport, what_to_do: str | None = None) -> None:
    """The report of the contract's table: ids, tools and codes only, every call in one row.
    The rows are the report's own (``str(report)`` prints the same), the calls in a table;
    ``what_to_do``, when given, says it in place of the report's own sentence."""
    head = Text.assemble(*report_head(report))
    if report.reason is not None:
        start = len("stop report ")
        head.stylize(_style(report.reason.value), start, start + len(report.kind.value))
    console.print(head)
    rows = call_rows(report)
    if rows:
        calls = _table()
        calls.add_column("", no_wrap=True)
        calls.add_column("call id", no_wrap=True)
        calls.add_column("tool", min_width=12, overflow="fold")
        calls.add_column("code", min_width=12, overflow="fold")
        for label, ((call_id, _), (tool, _), *code) in rows:
            calls.add_row(label, call_id, tool, _spans(tuple(code)))
        console.print(calls)
    for label, parts in note_rows(report):
        if label == "what to do" and what_to_do is not None:
            parts = ((what_to_do, ""),)
        console.print(Text.assemble((f"  {label} ", "dim"), _spans(parts)))


def _who_may_answer(record: RunRecord) -> str:
    """Who may answer a paused run's approval, in words: the requester (unless four-eyes) or a
    principal of its tenant holding the right the approval request names."""
    tenant = record.state.tenant_id or "its tenant"
    requester = record.state.principal_id or "the requester"
    right = " and ".join(record.approval_rights) or "the call's approval right"
    if record.four_eyes:
        return f"a principal of {tenant} other than {requester} holding {right} (four-eyes)"
    return f"{requester} (the requester) or a principal of {tenant} holding {right}"


def _approve_command(record: RunRecord, db: str) -> str:
    """The ``fencepost approve`` line that answers a paused run as an approver."""
    calls = [e.call_id for e in record.state.batch if e.verdict.code.value == "approval_pending"]
    parts = ["fencepost approve", record.run_id, *(f"--call {c}" for c in dict.fromkeys(calls))]
    parts.append("--as <principal>")
    parts.extend(f"--capability {r}" for r in record.approval_rights)
    if db != DEFAULT_DB:
        parts.append(f"--db {mask_url(db)}")
    return " ".join(parts)


def _answer_hint(record: RunRecord, db: str) -> str:
    """What to do about a paused run: who may answer, and the command that answers."""
    return (
        f"answer as {_who_may_answer(record)}: {_approve_command(record, db)} "
        "(or fencepost reject; fencepost pending shows the arguments)"
    )


@app.command()
@_guarded
def show(
    run_id: Annotated[str, typer.Argument(help="A run id (or thread id) from `fencepost runs`.")],
    db: Db = DEFAULT_DB,
    as_json: AsJson = False,
) -> None:
    """One run: its step manifests as a timeline, receipts, answer, citations and end, and where
    its logs and traces are."""
    with open_store(db) as saver:
        record = load_run(saver, run_id, source=db)
    data = _show_data(record)
    if record.status == PAUSED:
        data["answer"] = {
            "rights": list(record.approval_rights),
            "four_eyes": record.four_eyes,
            "requester": record.state.principal_id,
            "who_may_answer": _who_may_answer(record),
            "command": _approve_command(record, db),
        }
    if as_json:
        _print_json(data)
        return
    state = record.state
    console = _console()
    console.print(
        Text.assemble(
            ("run ", "dim"), (record.run_id, "bold"), ("  scenario ", "dim"), record.scenario or "-"
        )
    )
    status = Text.assemble(("status ", "dim"), (record.status, _style(record.status)))
    if state.last_error_code:
        status.append("  code ", style="dim")
        status.append(state.last_error_code, style="bold")
    console.print(status)
    console.print(Text.assemble(("question ", "dim"), state.question))
    if record.thread_id != record.run_id:
        console.print(Text.assemble(("thread ", "dim"), record.thread_id))

    console.print()
    timeline = _table("timeline (step manifests)")
    timeline.expand = True
    # Fixed columns are as narrow as their values; the tool name takes what is left, so an
    # 80-column terminal shows the longest demo tool name and terminal reason unbroken.
    timeline.add_column("#", justify="right", no_wrap=True)
    timeline.add_column("phase", no_wrap=True)
    timeline.add_column("tool / decision", ratio=1, min_width=12, overflow="fold")
    timeline.add_column("outcome", min_width=21, max_width=21, overflow="fold")
    timeline.add_column("steps/calls\nleft", justify="right", no_wrap=True)
    timeline.add_column("time\nleft", justify="right", no_wrap=True)
    for m in state.manifests:
        timeline.add_row(
            str(m.step),
            m.phase.value,
            _manifest_tool(m),
            _manifest_outcome(m),
            f"{m.steps_remaining} / {m.tool_calls_remaining}",
            _ms(m.deadline_remaining_ms / 1000) if m.deadline_remaining_ms is not None else "-",
        )
    console.print(timeline)

    if state.receipts:
        receipts = _table("receipts")
        receipts.add_column("call id", no_wrap=True)
        receipts.add_column("tool", min_width=12, overflow="fold")
        receipts.add_column("status", min_width=9, overflow="fold")
        receipts.add_column("attempts", justify="right")
        for r in state.receipts:
            status = Text(r.status.value, style="" if r.status.value == "completed" else "red")
            if r.error_code:
                status.append(f" {r.error_code.value}", style="dim")
            receipts.add_row(r.call_id, r.tool_name, status, str(r.attempts))
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
        b = state.budget
        console.print(
            Text.assemble(
                ("terminal reason ", "dim"),
                (record.status, _style(record.status)),
                ("  error code ", "dim"),
                state.last_error_code or "-",
            )
        )
        console.print(
            Text.assemble(
                ("budget left ", "dim"),
                f"{b.steps_remaining} steps · {b.tool_calls_remaining} tool calls",
            )
        )
    if record.report is not None:
        console.print()
        hint = _answer_hint(record, db) if record.status == PAUSED else None
        _print_stop_report(console, record.report, hint)
    # Exception text is in none of the above (only its code): the developer's log has it.
    console.print()
    console.print(Text.assemble(("logs ", "dim"), LOGS_WHERE))
    console.print(
        Text.assemble(
            ("traces ", "dim"),
            "OpenTelemetry invoke_agent spans with gen_ai.conversation.id ",
            (record.thread_id, "bold"),
            " and fencepost.run_id ",
            (record.run_id, "bold"),
        )
    )


# --- report ---------------------------------------------------------------------------------------


def _num(value: float) -> str:
    return f"{value:g}"


def _report_scope(report: EvalReport, where: str) -> str:
    if report.batch is None:
        scope = f"{report.runs} runs in {where}"
        if report.batches:
            scope += f" ({len(report.batches)} demo batches)"
        return scope
    scope = f"{report.runs} runs of demo batch {report.batch} in {where}"
    if len(report.batches) > 1:
        latest = "the latest" if report.batch == report.batches[0] else "not the latest"
        scope += f" ({latest} of {len(report.batches)}; --batch all for every run)"
    return scope


def _print_report(report: EvalReport, where: str) -> None:
    console = _console()
    if not report.runs:
        console.print(f"No runs in {where} yet. Try: fencepost demo")
        return
    console.print(_report_scope(report, where))
    console.print()
    if report.ended:
        reasons = _table("terminal reasons")
        reasons.add_column("reason", no_wrap=True)
        reasons.add_column("runs", justify="right")
        reasons.add_column("share", justify="right")
        for status, count in report.by_reason.items():
            reasons.add_row(
                Text(status, style=_style(status)), str(count), f"{count / report.ended:.0%}"
            )
        console.print(reasons)
    else:
        console.print(Text("terminal reasons: none (no run has ended)", style="dim"))
    not_ended = [
        f"{n} {label}"
        for n, label in (
            (report.paused, "paused for approval"),
            (report.in_progress, "in progress"),
        )
        if n
    ]
    if not_ended:
        console.print(
            Text(f"not ended (no terminal reason yet): {', '.join(not_ended)}", style="cyan")
        )
    if not report.ended:
        return

    console.print()
    per_run = _table(f"per ended run ({report.ended})")
    for col in ("", "median", "p90", "max"):
        per_run.add_column(col, justify="right" if col else "left")
    for label, dist in (("steps", report.steps), ("tool calls", report.tool_calls)):
        per_run.add_row(label, _num(dist.median), _num(dist.p90), _num(dist.max))
    console.print(per_run)

    console.print()
    budget = _table("budget use by axis (per ended run)")
    budget.add_column("axis", no_wrap=True)
    budget.add_column("runs limited", justify="right", min_width=7)
    budget.add_column("used total", justify="right", min_width=5)
    budget.add_column("used median / p90 / max", justify="right", min_width=11)
    budget.add_column("share of limit median / p90", justify="right", min_width=11)
    budget.add_column("runs exhausted", justify="right", min_width=9)
    for axis in report.budget:
        share = (
            f"{axis.share_of_limit.median:.0%} / {axis.share_of_limit.p90:.0%}"
            if axis.share_of_limit
            else "not limited"
        )
        used = axis.used
        budget.add_row(
            axis.axis,
            str(axis.runs_limited),
            _num(axis.used_total),
            f"{_num(used.median)} / {_num(used.p90)} / {_num(used.max)}",
            share,
            str(axis.runs_exhausted),
        )
    console.print(budget)


@app.command()
@_guarded
def report(db: Db = DEFAULT_DB, as_json: AsJson = False, batch: Batch = None) -> None:
    """The eval view: terminal reasons, steps and tool calls per run, budget use by axis.

    Covers the latest demo batch by default, so running the demo twice does not double the counts (every run when the database holds no demo batch); --batch picks a batch, or 'all'.

    Paused and in-progress runs are counted apart: they have no terminal reason yet.
    """
    with open_store(db) as saver:
        result = build_report(load_runs(saver, source=db), batch=batch, source=db)
    if as_json:
        _print_json(result.model_dump(mode="json"))
    else:
        _print_report(result, mask_url(db))


# --- approvers: pending, approve, reject, approvals -----------------------------------------------

GraphSpec = Annotated[
    str | None,
    typer.Option(
        "--graph",
        help="The graph to resume, as langgraph.json names one (module:attribute or "
        "./path.py:attribute): the uncompiled fp.build_agent_graph(...), or one compiled with its "
        "checkpointer. Default: the one graph in ./langgraph.json.",
    ),
]
AnsweringAs = Annotated[
    str, typer.Option("--as", help="The principal id answering (the approver, not the requester).")
]
Tenant = Annotated[
    str | None,
    typer.Option("--tenant", help="The answering principal's tenant. Default: the run's tenant."),
]
Capabilities = Annotated[
    list[str] | None,
    typer.Option(
        "--capability",
        help="A capability the answering principal holds (repeat for several), e.g. "
        "approve:notes:write.",
    ),
]
Calls = Annotated[
    list[str],
    typer.Option("--call", help="The waiting call id to answer (repeat for each waiting call)."),
]


@app.command()
@_guarded
def pending(db: Db = DEFAULT_DB, as_json: AsJson = False) -> None:
    """The calls paused runs wait on a human to approve: run, thread, call id, tool, arguments,
    requester and since when.

    An operator's tool: it prints the calls' arguments, as the approver must see them.
    """
    with open_store(db) as saver:
        calls = pending_calls(load_runs(saver, source=db))
    if as_json:
        _print_json([c.summary() for c in calls])
        return
    console = _console()
    if not calls:
        console.print(f"Nothing waits for approval in {mask_url(db)}.")
        return
    table = _table()
    table.expand = True
    table.add_column("run id", no_wrap=True)
    table.add_column("call id", no_wrap=True)
    table.add_column("tool", no_wrap=True)
    table.add_column("requester", no_wrap=True)
    table.add_column("since", no_wrap=True)
    table.add_column("arguments", ratio=1, min_width=20, overflow="fold")
    for c in calls:
        who = f"{c.requester or '-'}\n{c.tenant_id or '-'}"
        table.add_row(
            c.run_id if c.run_id == c.thread_id else f"{c.run_id}\n(thread {c.thread_id})",
            c.call_id,
            c.tool_name,
            who,
            _when(c.since),
            json.dumps(c.arguments, ensure_ascii=False, sort_keys=True),
        )
    console.print(table)


def _answer(
    decision: str,
    run_id: str,
    calls: list[str],
    principal: str,
    tenant: str | None,
    capabilities: list[str] | None,
    graph_spec: str | None,
    db: str,
    as_json: bool,
) -> None:
    with open_store(db, writable=True) as saver:
        record = load_run(saver, run_id, source=db)
        waiting = [c for c in pending_calls([record])]
        ids = {c.call_id for c in waiting}
        if not waiting:
            _fail(
                f"run {record.run_id} is not waiting for approval", "not_waiting", as_json=as_json
            )
        if set(calls) != ids:
            # Every waiting call is answered at once (one left out would be rejected): name each.
            listed = ", ".join(sorted(ids))
            _fail(
                f"run {record.run_id} waits on {listed}: name each waiting call with --call",
                "calls_not_waiting" if set(calls) - ids else "calls_left_out",
                as_json=as_json,
            )
        graph = load_graph(graph_spec or default_graph_spec(), saver)
        out = answer_calls(
            graph,
            record.thread_id,
            calls,
            decision,
            principal=principal,
            tenant=tenant or record.state.tenant_id or "",
            capabilities=capabilities or (),
        )
        after = load_run(saver, record.thread_id, source=db)
    still = [c.call_id for c in pending_calls([after]) if c.call_id in ids]
    problem = None
    for interrupt in out.get("__interrupt__", ()) or ():
        value = getattr(interrupt, "value", None)
        if isinstance(value, dict) and isinstance(value.get("error"), dict):
            problem = value["error"].get("code")
    receipts = [r for r in after.state.receipts if r.call_id in ids]
    data = {
        "run_id": after.run_id,
        "decision": decision,
        "calls": sorted(ids),
        "status": after.status,
        "still_waiting": still,
        "problem": problem,
        "receipts": [r.model_dump(mode="json") for r in receipts],
    }
    if as_json:
        _print_json(data)
    else:
        console = _console()
        console.print(
            Text.assemble(
                (f"{decision} ", "bold"),
                (", ".join(sorted(ids)), "bold"),
                (" of run ", "dim"),
                after.run_id,
                (" → ", "dim"),
                (after.status, _style(after.status)),
            )
        )
        for r in receipts:
            console.print(f"  {r.call_id} {r.tool_name}: {r.status.value}")
    if still:
        # The graph's own checks refused the answer: the run still waits, nothing was run.
        _fail(
            f"the answer was not taken: run {after.run_id} still waits on {', '.join(still)}"
            + (f" ({problem})" if problem else ""),
            problem or "answer_refused",
            as_json=as_json,
        )


@app.command()
@_guarded
def approve(
    run_id: Annotated[str, typer.Argument(help="A paused run id (or thread id).")],
    call: Calls,
    principal: AnsweringAs,
    tenant: Tenant = None,
    capability: Capabilities = None,
    graph: GraphSpec = None,
    db: Db = DEFAULT_DB,
    as_json: AsJson = False,
) -> None:
    """Approve a waiting call: resumes the real graph with Command(resume=...) as --as, through
    every check a resume passes. An operator's tool (see `fencepost pending`)."""
    _answer("approve", run_id, call, principal, tenant, capability, graph, db, as_json)


@app.command()
@_guarded
def reject(
    run_id: Annotated[str, typer.Argument(help="A paused run id (or thread id).")],
    call: Calls,
    principal: AnsweringAs,
    tenant: Tenant = None,
    capability: Capabilities = None,
    graph: GraphSpec = None,
    db: Db = DEFAULT_DB,
    as_json: AsJson = False,
) -> None:
    """Reject a waiting call: resumes the real graph with Command(resume=...) as --as; the call
    never runs. An operator's tool (see `fencepost pending`)."""
    _answer("reject", run_id, call, principal, tenant, capability, graph, db, as_json)


approvals_app = typer.Typer(
    help="Remembered approvals ('approve always' scopes) kept in the ledger beside --db.",
    no_args_is_help=True,
)
app.add_typer(approvals_app, name="approvals")

ScopeTenant = Annotated[str, typer.Option("--tenant", help="The tenant whose scopes these are.")]


def _scope_store(saver: Any) -> ScopeStore:
    ledger = durable_ledger(saver)
    if not isinstance(ledger, ScopeStore):
        raise GraphNotFound("the ledger beside this database keeps no remembered approvals")
    return ledger


@approvals_app.command("list")
@_guarded
def approvals_list(
    tenant: ScopeTenant,
    db: Db = DEFAULT_DB,
    as_json: AsJson = False,
    revoked: Annotated[bool, typer.Option("--revoked", help="Include revoked scopes.")] = False,
) -> None:
    """A tenant's remembered approvals: scope id, tool, scope, until, who created it."""
    with open_store(db, writable=True) as saver:
        scopes = _scope_store(saver).approval_scopes(tenant, include_revoked=revoked)
    if as_json:
        _print_json([s.model_dump(mode="json") for s in scopes])
        return
    console = _console()
    if not scopes:
        console.print(f"No remembered approvals for tenant {tenant}.")
        return
    table = _table()
    for column in ("scope id", "tool", "scope", "until", "created by", "revoked"):
        table.add_column(column, no_wrap=True)
    for s in scopes:
        table.add_row(
            s.scope_id,
            s.tool_name,
            s.kind,
            _when(s.until),
            f"{s.created_by} ({s.answered_by})",
            _when(s.revoked_at) if s.revoked_at else "",
        )
    console.print(table)


@approvals_app.command("revoke")
@_guarded
def approvals_revoke(
    scope_id: Annotated[str, typer.Argument(help="A scope id from `fencepost approvals list`.")],
    tenant: ScopeTenant,
    db: Db = DEFAULT_DB,
    as_json: AsJson = False,
) -> None:
    """Revoke a tenant's remembered approval: it approves nothing from now on."""
    with open_store(db, writable=True) as saver:
        revoked = _scope_store(saver).revoke_scope(tenant, scope_id, at=datetime.now(UTC))
    if revoked is None:
        _fail(
            f"tenant {tenant} has no remembered approval {scope_id}",
            "no_such_scope",
            as_json=as_json,
        )
    if as_json:
        _print_json(revoked.model_dump(mode="json"))
    else:
        _console().print(f"revoked {revoked.scope_id} ({revoked.tool_name}, {revoked.kind})")


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
