"""Completion evidence (seed 002): work accepted is not work done. Work is done, and an answer
supported, only by what a tool of this run produced, as the ledger's records show — never by an
observation or a receipt a caller wrote into state.

The seed's example verbatim: an upload returns task-17 (accepted, pending); a status check that
finds document-42, version 3 and its access path completes it; a success sentence alone does not.
A completion comes from a status check made after the acceptance, by a tool declared as evidence
for that kind of task; two calls that accepted one task id each need their own. A completion a
caller forges (a ``completed`` receipt, as a Receipt or as the JSON a server client sends; open
tasks or receipts cleared or overwritten; a completed stop or termination written into state)
never completes a run: on the graph's own ledger, on a durable one a new process reads, on the
in-memory one every graph object on one saver shares, and on the async graph; and it never stops
the genuine completion.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.adapters import SqliteLedger
from fencepost.policy import Completed, StopRequest, TerminationReason
from fencepost.policy.keys import completed_key, run_account
from fencepost.policy.tasks import completions, pending_tasks, waited_for
from fencepost.policy.terminate import UnsupportedCitation
from tests.graph.kit import (
    ABSTAIN,
    DOCS,
    LEDGERS,
    STATUS,
    UPLOAD,
    UPLOAD_DONE,
    VERDICT_KEY,
    Harness,
    StatusArgs,
    UploadArgs,
    astart_upload,
    budget,
    call,
    context,
    drive_editing,
    each_ledger,
    final_citing_all,
    final_citing_last,
    forge_completion,
    forged_completion,
    harness,
    mid_run_state,
    sqlite_files,
    start_upload,
    state_of,
    terminal_manifests,
    thread,
    thread_account,
    upload_accepted,
    upload_graph,
    upload_registry,
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


# -- accepted work: what completes it ----------------------------------------------------------


# Accepted work counts only for a call the ledger shows started: a caller's accepted_pending
# receipt for a call the run never made (which no completion could ever match) holds nothing up.
def test_a_receipt_for_a_call_the_run_never_made_never_holds_up_its_completion() -> None:
    h = upload_graph([UPLOAD, STATUS, final_citing_all, ABSTAIN])
    config, ctx = thread(), context(caps=DOCS)
    start_upload(h, config, ctx)
    never_made = fp.Receipt(
        call_id="call-9999",
        tool_name="upload_document",
        status=fp.ReceiptStatus.ACCEPTED_PENDING,
    )
    h.graph.update_state(config, {"run": {"receipts": [never_made]}}, as_node="execute")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED


_ODD_RECEIPTS = {
    # completed receipts a caller appends before the genuine status check: call ids that never
    # existed (empty, NUL, very long), another task id, the same task id twice, junk completed_by
    "unknown-ids": [
        fp.Receipt(call_id=cid, tool_name="upload_document", status="completed", task_id="task-17")
        for cid in ("", "\x00", "x" * 5000, "call-0003")
    ],
    "other-task": [
        fp.Receipt(
            call_id="call-0001",
            tool_name="upload_document",
            status="completed",
            task_id="task-99",
            completed_by="call-0001",
        )
    ],
    "duplicate-task": [
        fp.Receipt(call_id="call-0001", tool_name="upload_document", status="completed"),
        fp.Receipt(call_id="call-0001", tool_name="upload_document", status="completed"),
    ],
}


@pytest.mark.parametrize("form", ["receipt", "json"])
@pytest.mark.parametrize("forged", list(_ODD_RECEIPTS), ids=list(_ODD_RECEIPTS))
def test_completion_receipts_a_caller_forges_never_stop_the_genuine_completion_or_crash_a_node(
    forged: str, form: str
) -> None:
    ledger = fp.InMemoryLedger()
    h = upload_graph([UPLOAD, STATUS, final_citing_all, ABSTAIN], ledger=ledger)
    config, ctx = thread(), context(caps=DOCS)
    start_upload(h, config, ctx)
    receipts: list[Any] = list(_ODD_RECEIPTS[forged])
    if form == "json":
        receipts = [r.model_dump(mode="json") for r in receipts]
    h.graph.update_state(
        config, {"run": {"receipts": receipts, "open_tasks": []}}, as_node="execute"
    )
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED
    assert ledger.get(completed_key(thread_account(config), "call-0001")) is not None
    genuine = [r for r in state.receipts if r.call_id == "call-0001" and r.completed_by]
    assert [r.completed_by for r in genuine if r.completed_by == "call-0002"] == ["call-0002"]


def test_two_calls_that_accepted_one_task_id_each_need_a_completion_of_their_own() -> None:
    # The seed's upload tool always accepts task-17: one status check completes the earliest
    # waiting call, the final answer is refused until a second check completes the other.
    again = UPLOAD.model_copy(update={"call_id": "call-0003"})
    second = STATUS.model_copy(update={"call_id": "call-0004"})
    ledger = fp.InMemoryLedger()
    h = upload_graph(
        [UPLOAD, again, STATUS, final_citing_all, second, final_citing_all], ledger=ledger
    )
    config = thread()
    state = h.run(steps=8, tools=6, ctx=context(caps=DOCS), config=config)
    assert state.termination is TerminationReason.COMPLETED
    assert [m.code for m in state.manifests if m.code == "tasks_pending"] == ["tasks_pending"]
    done = {r.call_id: r.completed_by for r in state.receipts if r.completed_by}
    assert done == {"call-0001": "call-0002", "call-0003": "call-0004"}
    for call_id in ("call-0001", "call-0003"):
        assert ledger.get(completed_key(thread_account(config), call_id)) is not None


def test_a_completed_from_a_tool_declaring_no_completion_evidence_completes_nothing() -> None:
    reg = upload_registry()
    plain = reg.get("upload_status").model_copy(
        update={"completion_evidence": (), "evidence_for": ()}
    )
    registry = fp.ToolRegistry([reg.get("upload_document"), plain])
    h = harness(
        [
            call("upload_document", 1, name="a.pdf"),
            call("upload_status", 2, task_id="task-17"),
            ABSTAIN,
        ],
        registry=registry,
    )
    out = h.graph.invoke(
        fp.start("upload", budget(steps=4, tools=3)), thread(), context=context(caps=DOCS)
    )
    state = fp.run_output(out)
    assert [r.call_id for r in pending_tasks(state.receipts)] == ["call-0001"]
    assert state.open_tasks == ("task-17",)


def test_a_genuine_completion_after_a_forged_one_is_still_marked_and_completes_the_run() -> None:
    # A forged receipt makes the call look done in state, but waiting means "not marked done" in
    # the ledger: the genuine status check still finds the call waiting, marks it, completes it.
    h = upload_graph([UPLOAD, STATUS, final_citing_all, ABSTAIN])
    config, ctx = thread(), context(caps=DOCS)
    start_upload(h, config, ctx)
    forge_completion(h, config, "receipt")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED


# -- a completion a caller forges never completes a run ----------------------------------------


# Pending work is judged by the ledger's completion markers, which the execute node writes on
# verified evidence before the receipt and a state update cannot write, never by the receipts in
# state, which a caller can append to.
@pytest.mark.parametrize("form", ["receipt", "json"])
def test_appending_a_forged_completion_receipt_never_lets_a_final_pass_with_a_task_pending(
    form: str,
) -> None:
    h, config, ctx = upload_accepted()
    forge_completion(h, config, form)
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert state.termination is not TerminationReason.COMPLETED


# The terminal node judges a completed stop by the ledger's completion markers too.
@pytest.mark.parametrize("form", ["receipt", "json"])
def test_a_forged_completion_receipt_sent_with_a_completed_stop_never_ends_the_run_completed(
    form: str,
) -> None:
    h, config, ctx = upload_accepted()
    answer = fp.AnswerPayload(text="Uploaded.", citations=("call-0001",))
    forged_stop = StopRequest(reason=TerminationReason.COMPLETED, answer=answer)
    update = {"run": {"receipts": [forged_completion(h, config, form)], "stop": forged_stop}}
    h.graph.update_state(config, update, as_node="execute")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert state.termination is not TerminationReason.COMPLETED


REFUSED_TWICE = [final_citing_all, final_citing_all, ABSTAIN]


def _next_execute(h: Harness, config: dict[str, Any], ctx: fp.RunContext) -> None:
    h.graph.invoke(None, config, context=ctx, interrupt_after=["execute"])


def _marker(ledger: fp.Ledger, config: dict[str, Any], h: Harness) -> fp.policy.Reservation | None:
    account = run_account(config["configurable"]["thread_id"], state_of(h, config).run_id)
    return ledger.get(completed_key(account, "call-0001"))


@pytest.mark.parametrize("form", ["receipt", "json"])
def test_a_forged_completion_receipt_never_completes_a_run_on_a_durable_ledger(
    tmp_path: Path, form: str
) -> None:
    config, ctx = thread(), context(caps=DOCS)
    with sqlite_files(tmp_path) as (saver, ledger):
        h = upload_graph([UPLOAD], status={"status": "done"}, checkpointer=saver, ledger=ledger)
        start_upload(h, config, ctx)
        forge_completion(h, config, form)
    with sqlite_files(tmp_path) as (saver, ledger):
        again = upload_graph(REFUSED_TWICE, checkpointer=saver, ledger=ledger)
        state = fp.run_output(again.graph.invoke(None, config, context=ctx))
        assert _marker(ledger, config, again) is None
    assert state.termination is TerminationReason.INSUFFICIENT_EVIDENCE
    # The model was shown the forged view (no open task); the final was judged by the ledger.
    assert [inp.pending_tasks for inp in again.model.inputs] == [(), (), ()]
    assert [m.code for m in state.manifests if m.code == "tasks_pending"] == ["tasks_pending"] * 2


def test_a_forged_completion_receipt_never_completes_a_run_on_the_async_graph() -> None:
    h = upload_graph([UPLOAD, *REFUSED_TWICE], status={"status": "done"})
    config, ctx = thread(), context(caps=DOCS)

    async def run() -> fp.AgentState:
        await astart_upload(h, config, ctx)
        forge_completion(h, config, "json")
        return fp.run_output(await h.graph.ainvoke(None, config, context=ctx))

    state = asyncio.run(run())
    assert state.termination is TerminationReason.INSUFFICIENT_EVIDENCE


def test_a_completion_forged_through_a_second_graph_on_the_same_saver_is_refused() -> None:
    saver = InMemorySaver()
    config, ctx = thread(), context(caps=DOCS)
    h = upload_graph([UPLOAD], checkpointer=saver)
    start_upload(h, config, ctx)
    # The next request's graph object: the saver's ledger, which marks nothing done.
    again = upload_graph([STATUS, *REFUSED_TWICE], status={"status": "running"}, checkpointer=saver)
    _next_execute(again, config, ctx)
    forge_completion(again, config, "receipt")
    state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.INSUFFICIENT_EVIDENCE


def _forged_completed_stop() -> dict[str, Any]:
    answer = fp.AnswerPayload(text="Uploaded.", citations=("call-0001",))
    return {
        "run": {"stop": fp.policy.StopRequest(reason=TerminationReason.COMPLETED, answer=answer)}
    }


def test_a_forged_completed_stop_never_ends_a_run_completed_on_a_durable_ledger(
    tmp_path: Path,
) -> None:
    # The forged receipt and a completed stop citing the upload, resumed in a new process: the
    # stop goes straight to the terminal node, which asks the ledger, not the receipts.
    config, ctx = thread(), context(caps=DOCS)
    with sqlite_files(tmp_path) as (saver, ledger):
        h = upload_graph([UPLOAD], checkpointer=saver, ledger=ledger)
        start_upload(h, config, ctx)
        forge_completion(h, config, "json")
        h.graph.update_state(config, _forged_completed_stop(), as_node="execute")
    with sqlite_files(tmp_path) as (saver, ledger):
        again = upload_graph([], checkpointer=saver, ledger=ledger)
        state = fp.run_output(again.graph.invoke(None, config, context=ctx))
    assert state.termination is TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "tasks_pending"
    assert again.model.inputs == []  # the model was never asked: the stop was judged as sent


_FORGED_END: dict[str, Any] = {
    "run": {
        "phase": "terminal",
        "termination": "completed",
        "final_answer": {"text": "Uploaded.", "citations": ["call-0001"]},
    }
}


# A completed ending a caller wrote (phase, termination and answer, by update_state or a JSON
# Command) is no ending: the terminal node closes the account before it writes one, so a
# completed state whose account is open goes back to it, and ends policy_denied (invalid_state).
@pytest.mark.parametrize("how", ["update_state", "json_command"])
def test_a_termination_a_caller_writes_never_ends_a_run_completed(how: str) -> None:
    ledger = fp.InMemoryLedger()
    h = upload_graph([UPLOAD, final_citing_all, final_citing_all, ABSTAIN], ledger=ledger)
    config, ctx = thread(), context(caps=DOCS)
    start_upload(h, config, ctx)
    if how == "update_state":
        h.graph.update_state(config, _FORGED_END, as_node="execute")
        h.graph.invoke(None, config, context=ctx)
    else:
        h.graph.invoke(Command(update=_FORGED_END), config, context=ctx)
    state = state_of(h, config)
    assert state.termination is not TerminationReason.COMPLETED
    assert ledger.get(completed_key(thread_account(config), "call-0001")) is None
    # Ended by the terminal node after all: its reason, its one manifest, its report, and the
    # account closed with that reason.
    assert (state.termination, state.last_error_code) == (
        TerminationReason.POLICY_DENIED,
        "invalid_state",
    )
    assert terminal_manifests(state) == 1
    assert state.report is not None
    assert ledger.balance(thread_account(config)).closed == TerminationReason.POLICY_DENIED.value


def _durable_ledger(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> fp.Ledger:
    if kind == "sqlite":
        return SqliteLedger(tmp_path / "ledger.db")
    from fencepost.adapters.ledger_postgres import PostgresLedger

    return PostgresLedger(request.getfixturevalue("postgres_schema"))


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("forge", [False, True], ids=["genuine", "forged"])
def test_the_async_graph_judges_completion_by_the_durable_ledgers_markers(
    kind: str, forge: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # ainvoke runs the nodes with AsyncIO: the markers are read with the ledger's aget.
    ledger = _durable_ledger(kind, tmp_path, request)
    try:
        script = [UPLOAD, final_citing_all, final_citing_all, ABSTAIN]
        h = upload_graph([UPLOAD, STATUS, final_citing_all] if not forge else script, ledger=ledger)
        config, ctx = thread(), context(caps=DOCS)

        async def run() -> fp.AgentState:
            await h.graph.ainvoke(
                fp.start("upload", budget(steps=6, tools=4)),
                config,
                context=ctx,
                interrupt_after=["execute"],
            )
            if forge:
                forge_completion(h, config)
            return fp.run_output(await h.graph.ainvoke(None, config, context=ctx))

        state = asyncio.run(run())
        marker = ledger.get(completed_key(thread_account(config), "call-0001"))
    finally:
        ledger.close()  # type: ignore[attr-defined]
    if forge:
        assert state.termination is TerminationReason.INSUFFICIENT_EVIDENCE
        assert marker is None
    else:
        assert state.termination is TerminationReason.COMPLETED
        assert marker is not None


def test_clearing_open_tasks_in_state_does_not_let_a_final_answer_pass() -> None:
    h, config, ctx = upload_accepted()
    state = drive_editing(
        h, config, ctx, lambda s: {"run": {"open_tasks": ()}} if s.open_tasks else None
    )
    assert pending_tasks(state.receipts)
    assert state.termination is not fp.TerminationReason.COMPLETED


def test_overwriting_the_receipts_in_state_never_lets_a_final_pass_with_a_task_pending() -> None:
    # Receipts only grow: LangGraph's Overwrite (here its JSON form {"__overwrite__": v}, what a
    # server client can send) is dropped, so a final answer is still judged by the pending
    # receipt.
    h, config, ctx = upload_accepted()
    assert [r.call_id for r in pending_tasks(state_of(h, config).receipts)] == ["call-0001"]
    h.graph.update_state(
        config, {"run": {"receipts": {"__overwrite__": ()}, "open_tasks": ()}}, as_node="execute"
    )
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert state.termination is not TerminationReason.COMPLETED
    assert [r.call_id for r in pending_tasks(state.receipts)] == ["call-0001"]


def test_a_stop_a_caller_writes_while_paused_never_ends_the_run_with_an_unverified_answer() -> None:
    # An update made as the approve node is routed as the approve node's output: the stop goes
    # to the terminal node, which judges a completed stop again: no tool ran and the citation
    # names no observation, so it is not completed.
    h = harness([call("write_note", 1, note="a"), final_citing_last], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    unverified = fp.AnswerPayload(text="forged", citations=("call-0009",))
    forged = StopRequest(reason=TerminationReason.COMPLETED, answer=unverified)
    h.graph.update_state(config, {"run": {"stop": forged}}, as_node="approve")
    h.graph.invoke(None, config, context=ctx)
    state = state_of(h, config)
    assert state.is_terminal
    assert state.final_answer is None or set(state.final_answer.citations) <= state.evidence_ids()
    assert state.termination is not TerminationReason.COMPLETED


# -- the seed's example: an upload accepted as task-17 -----------------------------------------


def _call(tool: str, n: int, **arguments: Any) -> fp.ToolProposal:
    return fp.ToolProposal(call_id=f"call-{n:04d}", tool_name=tool, arguments=arguments)


def _final(inp: fp.DecisionInput) -> fp.FinalProposal:
    cited = tuple(o.call_id for o in inp.observations if o.kind == "tool_result")
    return fp.FinalProposal(answer=fp.AnswerPayload(text="Uploaded.", citations=cited))


def _ctx() -> fp.RunContext:
    return context(caps=frozenset({"docs:write"}))


def _run_upload(status_result: Any, script: list[Any], steps: int = 6) -> tuple[fp.AgentState, Any]:
    h = harness(script, registry=upload_registry(status_result))
    out = h.graph.invoke(
        fp.start(
            "Upload the report", fp.RuntimeBudget(steps_remaining=steps, tool_calls_remaining=5)
        ),
        thread(),
        context=_ctx(),
    )
    return fp.run_output(out), h


def test_seed_upload_task_17_is_completed_by_document_42_version_3_and_its_access_path() -> None:
    script = [
        _call("upload_document", 1, name="report.pdf"),
        _call("upload_status", 2, task_id="task-17"),
        _final,
    ]
    state, _ = _run_upload(UPLOAD_DONE, script)
    assert state.termination is fp.TerminationReason.COMPLETED
    current = {r.call_id: r for r in fp.policy.current_receipts(state.receipts)}
    assert current["call-0001"].status is fp.ReceiptStatus.COMPLETED
    assert current["call-0001"].task_id == "task-17"
    assert current["call-0001"].completed_by == "call-0002"
    # The log keeps both facts: accepted first, completed on evidence later.
    statuses = [r.status for r in state.receipts if r.call_id == "call-0001"]
    assert statuses == [fp.ReceiptStatus.ACCEPTED_PENDING, fp.ReceiptStatus.COMPLETED]


def test_a_success_sentence_alone_leaves_the_task_pending_and_the_run_cannot_complete() -> None:
    script = [
        _call("upload_document", 1, name="report.pdf"),
        _call("upload_status", 2, task_id="task-17"),
        _final,
        _final,
        _final,
    ]
    state, h = _run_upload({"status": "Completed successfully!"}, script, steps=5)
    assert state.termination is not fp.TerminationReason.COMPLETED
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    current = {r.call_id: r for r in fp.policy.current_receipts(state.receipts)}
    assert current["call-0001"].status is fp.ReceiptStatus.ACCEPTED_PENDING
    # The model was told, as data, which task is pending.
    later = [inp for inp in h.model.inputs if inp.step >= 3]
    assert later and all(inp.pending_tasks == ("task-17",) for inp in later)


def test_evidence_missing_a_declared_field_completes_nothing() -> None:
    partial = Completed(task_id="task-17", evidence={"document_id": "document-42", "version": "3"})
    script = [
        _call("upload_document", 1, name="report.pdf"),
        _call("upload_status", 2, task_id="task-17"),
        fp.AbstainProposal(reason="insufficient_evidence"),
    ]
    state, _ = _run_upload(partial, script)
    current = {r.call_id: r for r in fp.policy.current_receipts(state.receipts)}
    assert current["call-0001"].status is fp.ReceiptStatus.ACCEPTED_PENDING


def test_the_final_turn_refuses_tool_calls_and_a_model_that_answers_there_completes() -> None:
    read = _call("upload_status", 1, task_id="task-1")
    h = harness(
        [read, read.model_copy(update={"call_id": "call-0002"}), _final],
        registry=upload_registry({"state": "idle"}),
        repeat_limit=5,
    )
    out = h.graph.invoke(
        fp.start("q", fp.RuntimeBudget(steps_remaining=3, tool_calls_remaining=5)),
        thread(),
        context=_ctx(),
    )
    state = fp.run_output(out)
    assert [inp.final_turn for inp in h.model.inputs] == [False, False, True]
    assert state.termination is fp.TerminationReason.COMPLETED


def test_a_model_that_calls_a_tool_in_its_final_turn_ends_step_budget_exhausted() -> None:
    calls = [_call("upload_status", n, task_id=f"task-{n}") for n in range(1, 5)]
    h = harness(calls, registry=upload_registry({"state": "idle"}))
    out = h.graph.invoke(
        fp.start("q", fp.RuntimeBudget(steps_remaining=3, tool_calls_remaining=5)),
        thread(),
        context=_ctx(),
    )
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert state.last_error_code == "answer_margin"
    assert state.budget.tool_calls_used == 2
