"""A stop report reads as text (``str`` and rich), in the words ``fencepost show`` uses, and a run
paused for approval has one too: ``waiting_for`` names the calls and the one condition needed."""

from __future__ import annotations

import io
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import BaseModel, ConfigDict
from rich.console import Console

import fencepost as fp
from fencepost.policy.stop_report import ReportedCall

USER = fp.RunContext(
    tenant_id="acme",
    principal=fp.Principal(id="u-1", capabilities={"logs:read", "notes:write"}),
)


@fp.tool(effect="read", capability="logs:read")
def search_logs(query: str) -> dict[str, Any]:
    """Search the service logs."""
    return {"hits": [query]}


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    note: str


write_note = fp.ToolSpec(
    name="write_note",
    description="Save a note.",
    args_model=NoteArgs,
    effect="write",
    capability="notes:write",
    execute=lambda args, ctx: {"saved": True},
)


def _completed() -> fp.StopReport:
    agent = fp.create_agent(
        fp.ScriptedDecisionModel(
            [
                fp.ToolProposal(
                    call_id="call-0001", tool_name="search_logs", arguments={"query": "q"}
                ),
                fp.FinalProposal(answer=fp.AnswerPayload(text="a", citations=("call-0001",))),
            ]
        ),
        [search_logs],
    )
    report = fp.run_output(agent.invoke(fp.start("why?"), context=USER)).report
    assert report is not None
    return report


def _rich(value: object) -> str:
    out = io.StringIO()
    Console(file=out, width=100, color_system=None).print(value)
    return out.getvalue()


def test_a_stop_report_prints_as_readable_text_not_a_repr() -> None:
    text = str(_completed())
    assert "StopReport(" not in text and "kind=" not in text and "ReportedCall" not in text
    lines = text.splitlines()
    assert lines[0] == "stop report completed"
    assert any(line.split() == ["completed", "call-0001", "search_logs"] for line in lines)
    assert "cited call-0001" in " ".join(text.split())


def test_rich_prints_a_stop_report_as_the_same_text() -> None:
    report = _completed()
    assert _rich(report).split() == str(report).split()


def test_a_budget_stop_says_what_never_started_and_what_to_do() -> None:
    agent = fp.create_agent(
        fp.ScriptedDecisionModel(
            [
                fp.ToolProposal(
                    call_id="call-0001", tool_name="search_logs", arguments={"query": "q"}
                ),
                fp.ToolProposal(
                    call_id="call-0002", tool_name="search_logs", arguments={"query": "r"}
                ),
            ]
        ),
        [search_logs],
    )
    budget = fp.RuntimeBudget(steps_remaining=5, tool_calls_remaining=1)
    report = fp.run_output(agent.invoke(fp.start("why?", budget), context=USER)).report
    assert report is not None and report.kind is fp.StopKind.STOPPED
    text = " ".join(str(report).split())
    assert "stop report stopped · tool_budget_exhausted" in text
    assert "never started call-0002 search_logs budget_exhausted" in text
    assert "effects made none" in text
    assert "RuntimeBudget(tool_calls_remaining=" in text  # the fix, in one sentence


def test_a_run_paused_for_approval_has_a_report_naming_the_call_and_the_condition() -> None:
    agent = fp.create_agent(
        fp.ScriptedDecisionModel(
            [fp.ToolProposal(call_id="call-0001", tool_name="write_note", arguments={"note": "x"})]
        ),
        [write_note],
        checkpointer=InMemorySaver(),
        approval="interrupt",
    )
    config = {"configurable": {"thread_id": "paused-1"}}
    out = agent.invoke(fp.start("note it"), config, context=USER)
    assert "__interrupt__" in out
    for values in (out, agent.get_state(config).values):
        state = fp.run_output(values)
        assert state.termination is None
        report = state.report
        assert report is not None
        assert report.kind is fp.StopKind.WAITING_FOR_INPUT and report.reason is None
        assert report.waiting_for is not None
        assert report.waiting_for.condition == "approval"
        assert report.waiting_for.calls == ("call-0001",)
        assert [c.tool_name for c in report.never_started] == ["write_note"]
        assert [c.call_id for c in report.never_started] == ["call-0001"]
        assert "waiting for approval of call-0001 (write_note)" in " ".join(str(report).split())


def test_a_run_still_in_progress_has_no_report() -> None:
    state = fp.AgentState(
        run_id="r-1",
        question="q",
        budget=fp.RuntimeBudget(steps_remaining=1, tool_calls_remaining=1),
    )
    assert fp.run_output({"run": state.model_dump(mode="json")}).report is None


def test_paused_report_is_derived_from_the_waiting_calls_of_the_batch_alone() -> None:
    from fencepost.policy import BatchEntry, Verdict, VerdictCode, proposal_fingerprint
    from fencepost.policy.stop_report import paused_report

    def entry(call_id: str, code: VerdictCode, tool: str) -> BatchEntry:
        proposal = fp.ToolProposal(call_id=call_id, tool_name=tool, arguments={})
        verdict = Verdict(
            call_id=call_id, tool_name=tool, code=code, fingerprint=proposal_fingerprint(tool, {})
        )
        return BatchEntry(proposal=proposal, verdict=verdict)

    class Paused:
        receipts: tuple[fp.Receipt, ...] = ()
        batch = (
            entry("call-0001", VerdictCode.ALLOWED, "search_logs"),
            entry("call-0002", VerdictCode.APPROVAL_PENDING, "write_note"),
        )

    report = paused_report(Paused())
    assert report is not None and report.waiting_for is not None
    assert report.waiting_for.calls == ("call-0002",)
    assert sorted(c.call_id for c in report.never_started) == ["call-0001", "call-0002"]

    class Going:
        receipts: tuple[fp.Receipt, ...] = ()
        batch = (entry("call-0001", VerdictCode.ALLOWED, "search_logs"),)

    assert paused_report(Going()) is None


def test_fencepost_show_reads_a_paused_runs_report_as_run_output_gives_it() -> None:
    from fencepost.reporting import RunRecord

    agent = fp.create_agent(
        fp.ScriptedDecisionModel(
            [fp.ToolProposal(call_id="call-0001", tool_name="write_note", arguments={"note": "x"})]
        ),
        [write_note],
        checkpointer=InMemorySaver(),
        approval="interrupt",
    )
    config = {"configurable": {"thread_id": "paused-2"}}
    agent.invoke(fp.start("note it"), config, context=USER)
    state = fp.run_output(agent.get_state(config).values)
    record = RunRecord(
        thread_id="paused-2",
        state=state,
        status="paused",
        scenario=None,
        started_at=None,
        updated_at=None,
    )
    assert record.report is not None and record.report.waiting_for is not None
    assert record.report.waiting_for.calls == ("call-0001",)


@settings(max_examples=200, deadline=None)
@example(call_id="call-[bold red]0001[/]")
@example(call_id="call-\\[link=x]0001")
@example(call_id="000000\\[")  # rich drops a backslash before any "[", tag or not
@example(call_id="call-0001\\\\")  # backslashes at the end would escape the closing tag
@given(
    call_id=st.text(
        st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Zs", "Cf", "Mn", "Me")),
        min_size=8,
        max_size=40,
    )
)
def test_any_call_id_prints_the_same_through_rich_as_through_str(call_id: str) -> None:
    report = fp.StopReport(
        kind=fp.StopKind.FAILED,
        reason=fp.TerminationReason.FAILED,
        failed=(ReportedCall(call_id=call_id, tool_name="search_logs"),),
    )
    assert _rich(report).split() == str(report).split()
