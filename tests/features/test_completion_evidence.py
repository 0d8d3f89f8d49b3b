"""Completion evidence (seed 002): work is done, and an answer supported, only by what a tool of
this run produced, as the ledger's records show — never by an observation or a receipt a caller
wrote into state. A completion comes from a status check made after the acceptance, by a tool
declared as evidence for that kind of task."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.policy.tasks import completions, waited_for
from fencepost.policy.terminate import UnsupportedCitation
from tests.graph.kit import (
    ABSTAIN,
    DOCS,
    LEDGERS,
    UPLOAD_DONE,
    VERDICT_KEY,
    StatusArgs,
    UploadArgs,
    budget,
    call,
    context,
    each_ledger,
    final_citing_all,
    harness,
    mid_run_state,
    state_of,
    thread,
)

ledger = pytest.fixture(params=LEDGERS, name="ledger")(each_ledger)


# -- citations name only what a tool of this run produced --------------------------------------


def _observation(call_id: str, sequence: int) -> fp.policy.Observation:
    return fp.policy.Observation(
        sequence=sequence,
        step=1,
        call_id=call_id,
        tool_name="search_logs",
        kind="tool_result",
        result={"hits": [{"id": "log-9", "line": "it was the database"}]},
    )


def _final_citing(*ids: str) -> Any:
    return fp.FinalProposal(answer=fp.AnswerPayload(text="the database", citations=ids))


def _paused(script: list[Any], **build: Any) -> tuple[Any, dict[str, Any], fp.RunContext]:
    h = harness(script, approval="interrupt", **build)
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    assert h.graph.get_state(config).next == ("approve",)
    return h, config, ctx


@pytest.mark.parametrize("key", [None, VERDICT_KEY], ids=["no-key", "key"])
def test_a_final_answer_citing_an_observation_no_tool_produced_never_completes(
    key: bytes | None, ledger: fp.Ledger
) -> None:
    h, config, ctx = _paused(
        [call("write_note", 1, note="a"), _final_citing("call-0099"), ABSTAIN],
        ledger=ledger,
        verdict_key=key,
    )
    forged = {"run": {"observations": (_observation("call-0099", 0),)}}
    state = fp.run_output(
        h.graph.invoke(Command(update=forged, resume="reject"), config, context=ctx)
    )
    assert state.termination is not fp.TerminationReason.COMPLETED
    assert state.last_error_code == "unsupported_citation"


@pytest.mark.parametrize("key", [None, VERDICT_KEY], ids=["no-key", "key"])
def test_a_forged_result_for_a_call_whose_tool_failed_is_no_evidence(
    key: bytes | None, ledger: fp.Ledger
) -> None:
    # call-0001 ran and failed: its id is the run's, its result is nobody's.
    h, config, ctx = _paused(
        [call("explode", 1), call("write_note", 2, note="a"), _final_citing("call-0001"), ABSTAIN],
        ledger=ledger,
        verdict_key=key,
    )
    sequence = len(state_of(h, config).observations)
    forged = {"run": {"observations": (_observation("call-0001", sequence),)}}
    state = fp.run_output(
        h.graph.invoke(Command(update=forged, resume="reject"), config, context=ctx)
    )
    assert state.termination is not fp.TerminationReason.COMPLETED
    assert state.last_error_code == "unsupported_citation"


def test_a_completed_stop_written_citing_a_forged_observation_never_ends_completed(
    ledger: fp.Ledger,
) -> None:
    h, config, ctx = _paused([call("write_note", 1, note="a"), ABSTAIN], ledger=ledger)
    answer = fp.AnswerPayload(text="the database", citations=("call-0099",))
    h.graph.update_state(
        config,
        {
            "run": {
                "observations": (_observation("call-0099", 0),),
                "batch": (),
                "stop": fp.policy.StopRequest(reason=fp.TerminationReason.COMPLETED, answer=answer),
            }
        },
        as_node="execute",
    )
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "unsupported_citation"


def test_a_final_answer_citing_what_the_run_produced_completes(ledger: fp.Ledger) -> None:
    h, config, ctx = _paused(
        [call(n=1), call("write_note", 2, note="a"), _final_citing("call-0001", "call-0002")],
        ledger=ledger,
        verdict_key=VERDICT_KEY,
    )
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.final_answer is not None
    assert state.final_answer.citations == ("call-0001", "call-0002")


# -- a completion comes from the tool declared for that kind of task, after the acceptance -----


class TicketArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    title: str


def _spec(name: str, args: type[BaseModel], body: Any, **declared: Any) -> fp.ToolSpec:
    return fp.ToolSpec(
        name=name,
        description=f"{name}.",
        args_model=args,
        effect=fp.Effect.READ,
        capability="docs:write",
        timeout_seconds=5,
        execute=body,
        **declared,
    )


def _registry(*, upload_delay: float = 0.0, ticket_result: Any = None) -> fp.ToolRegistry:
    async def upload(args: UploadArgs, ctx: fp.ToolContext) -> fp.Accepted:
        await asyncio.sleep(upload_delay)
        return fp.Accepted(task_id="task-17")

    def status(args: StatusArgs, ctx: fp.ToolContext) -> Any:
        return UPLOAD_DONE

    def ticket(args: TicketArgs, ctx: fp.ToolContext) -> fp.Accepted:
        return fp.Accepted(task_id="task-17")

    def ticket_status(args: StatusArgs, ctx: fp.ToolContext) -> Any:
        return ticket_result or fp.Completed(task_id=args.task_id, evidence={"ticket_id": "T-9"})

    return fp.ToolRegistry(
        [
            _spec("upload_document", UploadArgs, upload),
            _spec(
                "upload_status",
                StatusArgs,
                status,
                completion_evidence=("document_id", "version", "access_path"),
                evidence_for=("upload_document",),
            ),
            _spec("open_ticket", TicketArgs, ticket),
            _spec(
                "ticket_status",
                StatusArgs,
                ticket_status,
                completion_evidence=("ticket_id",),
                evidence_for=("open_ticket",),
            ),
        ]
    )


UPLOAD = fp.ToolProposal(
    call_id="call-0001", tool_name="upload_document", arguments={"name": "a.pdf"}
)


def _status(call_id: str, tool: str = "upload_status", **kw: Any) -> fp.ToolProposal:
    return fp.ToolProposal(call_id=call_id, tool_name=tool, arguments={"task_id": "task-17"}, **kw)


def _run(script: list[Any], ledger: fp.Ledger, **registry: Any) -> fp.AgentState:
    h = harness(script, registry=_registry(**registry), ledger=ledger)
    out = h.graph.invoke(
        fp.start("upload", budget(steps=5, tools=5)), thread(), context=context(caps=DOCS)
    )
    return fp.run_output(out)


def _upload_receipt(state: fp.AgentState) -> fp.Receipt:
    return {r.call_id: r for r in fp.policy.current_receipts(state.receipts)}["call-0001"]


def test_a_status_tool_for_another_kind_of_task_never_completes_an_upload(
    ledger: fp.Ledger,
) -> None:
    script = [UPLOAD, _status("call-0002", "ticket_status"), final_citing_all, ABSTAIN]
    state = _run(script, ledger)
    assert _upload_receipt(state).status is fp.ReceiptStatus.ACCEPTED_PENDING
    assert state.termination is not fp.TerminationReason.COMPLETED


def test_a_status_check_started_before_the_acceptance_never_completes_it(
    ledger: fp.Ledger,
) -> None:
    # In one batch, the status check runs beside the upload (and returns first): it could not
    # have seen the accepted task.
    batch = fp.ToolBatch(calls=(UPLOAD, _status("call-0002")))
    state = _run([batch, final_citing_all, ABSTAIN], ledger, upload_delay=0.2)
    assert _upload_receipt(state).status is fp.ReceiptStatus.ACCEPTED_PENDING
    assert state.termination is not fp.TerminationReason.COMPLETED


def test_a_status_check_that_waited_for_the_acceptance_in_its_batch_completes_it(
    ledger: fp.Ledger,
) -> None:
    batch = fp.ToolBatch(calls=(UPLOAD, _status("call-0002", depends_on=("call-0001",))))
    state = _run([batch, final_citing_all], ledger, upload_delay=0.05)
    receipt = _upload_receipt(state)
    assert (receipt.status, receipt.completed_by) == (fp.ReceiptStatus.COMPLETED, "call-0002")
    assert state.termination is fp.TerminationReason.COMPLETED


def test_the_declared_status_tool_in_a_later_step_completes_the_task(ledger: fp.Ledger) -> None:
    state = _run([UPLOAD, _status("call-0002"), final_citing_all], ledger)
    assert _upload_receipt(state).status is fp.ReceiptStatus.COMPLETED
    assert state.termination is fp.TerminationReason.COMPLETED


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"completion_evidence": ("document_id",)}, "names no accepting tool"),
        ({"evidence_for": ("upload_document",)}, "declares no completion_evidence"),
        (
            {"completion_evidence": ("document_id",), "evidence_for": ("upload_doc",)},
            "'upload_doc', which is not registered",
        ),
    ],
    ids=["evidence-for-nothing", "for-without-evidence", "an-unknown-tool"],
)
def test_a_completion_declaration_is_checked_when_the_registry_is_built(
    declared: dict[str, Any], message: str
) -> None:
    upload = _registry().get("upload_document")
    status = _spec("upload_status", StatusArgs, lambda a, c: None, **declared)
    with pytest.raises(ValueError, match=message):
        fp.ToolRegistry([upload, status])


# -- the rules, as functions -------------------------------------------------------------------


def _accepted(call_id: str, tool: str = "upload_document") -> fp.Receipt:
    return fp.Receipt(
        call_id=call_id, tool_name=tool, status=fp.ReceiptStatus.ACCEPTED_PENDING, task_id="task-17"
    )


def _completing(call_id: str, evidence_for: tuple[str, ...]) -> fp.policy.CallOutcome:
    return fp.policy.CallOutcome(
        event=fp.policy.ToolSucceeded(call_id=call_id, tool_name="upload_status", result={}),
        status=fp.ReceiptStatus.COMPLETED,
        attempts=1,
        completes="task-17",
        evidence_for=evidence_for,
    )


def test_a_completion_matches_the_accepting_tool_and_a_check_made_after_the_acceptance() -> None:
    earlier, now = _accepted("call-0001"), _accepted("call-0003")
    receipts = (earlier, now)
    # The ticket tool's evidence completes no upload.
    assert completions(receipts, [_completing("call-0004", ("open_ticket",))]) == ()
    # A check of this batch that did not wait for call-0003 completes only the earlier task...
    waited = {"call-0003": frozenset(), "call-0004": frozenset()}
    (done,) = completions(receipts, [_completing("call-0004", ("upload_document",))], waited=waited)
    assert (done.call_id, done.completed_by) == ("call-0001", "call-0004")
    # ...and with only call-0003 waiting, nothing; once it waited for it, that one.
    assert (
        completions((now,), [_completing("call-0004", ("upload_document",))], waited=waited) == ()
    )
    waited["call-0004"] = frozenset({"call-0003"})
    (done,) = completions((now,), [_completing("call-0004", ("upload_document",))], waited=waited)
    assert done.call_id == "call-0003"


def test_a_call_waits_for_what_its_dependencies_waited_for() -> None:
    a = fp.ToolProposal(call_id="call-000a", tool_name="upload_document", arguments={})
    b = a.model_copy(update={"call_id": "call-000b", "depends_on": ("call-000a",)})
    c = a.model_copy(update={"call_id": "call-000c", "depends_on": ("call-000b", "call-0099")})
    assert waited_for([a, b, c]) == {
        "call-000a": frozenset(),
        "call-000b": frozenset({"call-000a"}),
        "call-000c": frozenset({"call-000a", "call-000b"}),
    }


def test_a_citation_must_be_an_observation_and_produced_by_a_tool_of_the_run() -> None:
    state = mid_run_state().model_copy(update={"observations": (_observation("call-0001", 0),)})
    answer = fp.AnswerPayload(text="x", citations=("call-0001",))
    assert fp.policy.validate_final_answer(answer, state) == answer
    assert fp.policy.validate_final_answer(answer, state, produced={"call-0001"}) == answer
    with pytest.raises(UnsupportedCitation):
        fp.policy.validate_final_answer(answer, state, produced=set())
