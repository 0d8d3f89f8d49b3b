"""Invariant 1: every path ends in exactly one TerminationReason, and nothing escapes ``invoke``.

Here: the paths where a tool's own code (its arguments model's validators, its body) does what the
runtime did not expect, and a human's answer no checkpoint can hold. Pydantic wraps a validator's
``ValueError`` and ``AssertionError`` in a ``ValidationError``; a ``KeyError`` or ``TypeError`` it
lets through as it is, its text often quoting the very argument the model sent: that must end as a
typed schema refusal, with none of the text kept. An answer no checkpoint can hold is refused as
data before anything is written.

A terminal state refuses further transitions: a caller who rewrites a finished run's id, phase,
termination or stop, or writes as the terminal node, never reopens it nor gives it a second
ending. Values no checkpoint can hold (an integer past 64 bits, arguments or a result nested past
any limit, call ids of NUL or blank characters), a recursion limit of one, a budget account that
does not exist, a hung model, a tool raising ``SystemExit`` or its own ``CancelledError``, and a
validator or progress predicate that breaks: each ends the run with one reason, and the text of
what raised is never checkpointed.

Over both bindings (the ``binding`` parameter, ``tests/invariants/bindings.py``: fencepost's graph,
and ``create_agent`` with ``fp.FencepostMiddleware``), at the end of this file: a model that never
stops, a reply that is no decision, a finished run called again, a tool raising a
``BaseException``, an unknown budget account. The other tests drive the graph's own state, nodes or
settings (``update_state``, ``Command(update=...)``, channels, ``interrupt_before``, repair, the
approver, token estimates, savers and ledgers by URL), which the middleware binding does not have:
they stay graph-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool as lc_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict, field_validator

import fencepost as fp
from fencepost.adapters import SqliteLedger
from fencepost.policy import (
    Phase,
    StopRequest,
    TerminationReason,
    VerdictCode,
    check_schema,
    gate_proposal,
)
from fencepost.policy.gates import ArgumentsValidatorFailed
from tests.graph.kit import (
    ABSTAIN,
    DOCS,
    LEDGERS,
    STATUS,
    UPLOAD,
    VERDICT_KEY,
    Calls,
    allowed_entry,
    budget,
    call,
    context,
    each_ledger,
    ended_typed,
    final_citing_all,
    final_citing_last,
    harness,
    interrupt_payload,
    make_registry,
    paused_for_approval,
    saver_bytes,
    sqlite_files,
    start_upload,
    state_of,
    terminal_manifests,
    thread,
    thread_account,
    upload_graph,
)
from tests.graph.test_tool_isolation import NoArgs, finishes
from tests.invariants import bindings as bd
from tests.middleware import kit as mw
from tests.policy.factories import make_state, reader

SECRET = "password=hunter2"
"""In what the validators raise, never in what the model sent: it must be nowhere."""
KNOWN = {"checkout": "svc-1"}


class Keyring(dict[str, str]):
    """A lookup whose miss says more than it should, as a config or secrets table's may."""

    def __missing__(self, key: str) -> str:
        raise KeyError(f"{key} not in vault ({SECRET})")


class ByKey(BaseModel):
    """Arguments whose validator looks the model's value up, raising ``KeyError``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    service: str

    @field_validator("service")
    @classmethod
    def known(cls, value: str) -> str:
        return Keyring(KNOWN)[value]


class ByType(BaseModel):
    """Arguments whose validator raises ``TypeError`` quoting the model's value."""

    model_config = ConfigDict(extra="forbid", strict=True)
    service: str

    @field_validator("service")
    @classmethod
    def typed(cls, value: str) -> str:
        if value not in KNOWN:
            raise TypeError(f"no service {value!r} for {SECRET}")
        return value


class ByEscape(BaseModel):
    """Arguments whose validator raises a ``BaseException`` of the application's own."""

    model_config = ConfigDict(extra="forbid", strict=True)
    service: str

    @field_validator("service")
    @classmethod
    def escapes(cls, value: str) -> str:
        raise SystemExit(f"bad {value}: {SECRET}")


def _registry(args_model: type[BaseModel], ran: list[str]) -> fp.ToolRegistry:
    def lookup(args: Any, ctx: fp.ToolContext) -> dict[str, str]:
        ran.append(args.service)
        return {"service": args.service}

    return fp.ToolRegistry(
        [
            fp.ToolSpec(
                name="lookup_service",
                description="Look a service up.",
                args_model=args_model,
                effect=fp.Effect.READ,
                capability="logs:read",
                timeout_seconds=5,
                execute=lookup,
            )
        ]
    )


PROPOSAL = fp.ToolProposal(
    call_id="call-0001", tool_name="lookup_service", arguments={"service": "billing"}
)


@pytest.mark.parametrize("args_model", [ByKey, ByType, ByEscape], ids=lambda m: m.__name__)
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_an_args_validator_raising_what_pydantic_does_not_wrap_ends_as_a_schema_refusal(
    args_model: type[BaseModel], mode: str
) -> None:
    saver, ran = InMemorySaver(), []
    h = harness(
        [PROPOSAL, ABSTAIN],
        registry=_registry(args_model, ran),
        checkpointer=saver,
        repair_attempts=0,  # the refusal is the run's ending, not ABSTAIN's
    )
    request = fp.start(
        "which service?", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=2)
    )
    config, ctx = thread(), context()
    if mode == "invoke":
        out = h.graph.invoke(request, config, context=ctx)
    else:
        out = await h.graph.ainvoke(request, config, context=ctx)
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert [e.verdict.code for e in state.batch] in ([VerdictCode.SCHEMA_VIOLATION], [])
    assert ran == []
    assert SECRET.encode() not in saver_bytes(saver)
    assert SECRET not in repr(out)


@pytest.mark.parametrize("args_model", [ByKey, ByType, ByEscape], ids=lambda m: m.__name__)
def test_the_schema_gate_refuses_a_broken_validator_with_no_text(
    args_model: type[BaseModel],
) -> None:
    registry = _registry(args_model, [])
    spec = registry.get("lookup_service")
    with pytest.raises(ArgumentsValidatorFailed) as raised:
        check_schema(spec, PROPOSAL)
    assert SECRET not in str(raised.value) and raised.value.__cause__ is None
    verdict = gate_proposal(registry, PROPOSAL, make_state(), reader())
    assert verdict.code is VerdictCode.SCHEMA_VIOLATION
    assert verdict.problems == ("*: validator_failed",)


class ByEscapeOnUnknown(BaseModel):
    """Arguments whose validator raises a ``BaseException`` for a value it does not know."""

    model_config = ConfigDict(extra="forbid", strict=True)
    service: str

    @field_validator("service")
    @classmethod
    def escapes(cls, value: str) -> str:
        if value not in KNOWN:
            raise SystemExit(f"bad {value}: {SECRET}")
        return value


def _write_registry(args_model: type[BaseModel], ran: list[str]) -> fp.ToolRegistry:
    def restart(args: Any, ctx: fp.ToolContext) -> dict[str, str]:
        ran.append(args.service)
        return {"restarted": args.service}

    return fp.ToolRegistry(
        [
            fp.ToolSpec(
                name="restart_service",
                description="Restart a service.",
                args_model=args_model,
                effect=fp.Effect.WRITE,
                capability="notes:write",
                timeout_seconds=5,
                execute=restart,
            )
        ]
    )


@pytest.mark.parametrize("args_model", [ByKey, ByType, ByEscapeOnUnknown], ids=lambda m: m.__name__)
@pytest.mark.parametrize("form", ["global", "per-call"])
def test_an_edit_its_args_validator_breaks_on_is_asked_again_with_no_text(
    args_model: type[BaseModel], form: str
) -> None:
    # The gate passed the model's arguments (``checkout`` is known); the human's edit is
    # checked against the same schema before any gate, and a validator that breaks on it is a
    # refusal there too: asked again, never an exception out of ``invoke``.
    saver, ran = InMemorySaver(), []
    proposal = fp.ToolProposal(
        call_id="call-0001", tool_name="restart_service", arguments={"service": "checkout"}
    )
    h = harness(
        [proposal, ABSTAIN, ABSTAIN],
        registry=_write_registry(args_model, ran),
        checkpointer=saver,
        approval="interrupt",
    )
    config, ctx = thread(), context()
    request = fp.start("restart it", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=2))
    interrupt_payload(h.graph.invoke(request, config, context=ctx))
    edit: dict[str, Any] = {"decision": "edit", "arguments": {"service": "billing"}}
    answer = {"call-0001": edit} if form == "per-call" else edit
    out = h.graph.invoke(Command(resume=answer), config, context=ctx)
    error = interrupt_payload(out)["error"]
    assert error["code"] == "invalid_arguments"
    assert error["invalid"] == [{"call_id": "call-0001", "problems": ["*: validator_failed"]}]
    assert ran == []
    assert not state_of(h, config).is_terminal
    assert SECRET.encode() not in saver_bytes(saver)
    assert SECRET not in repr(out)
    # Asked again, a clear answer still counts.
    state = fp.run_output(h.graph.invoke(Command(resume="reject"), config, context=ctx))
    assert ran == []
    assert state.receipts[-1].status is fp.ReceiptStatus.DENIED


# -- A body that breaks the process's rules: each is contained, and its run ends typed -----------


class Escape(BaseException):
    """An application's own BaseException."""


def _hostile(kind: str, behaviour: str, gate: threading.Event) -> Callable[..., Any]:
    def raises() -> None:
        raise {
            "SystemExit": SystemExit(SECRET),
            "KeyboardInterrupt": KeyboardInterrupt(SECRET),
            "GeneratorExit": GeneratorExit(SECRET),
            "Escape": Escape(SECRET),
        }[behaviour]

    def sync_body(_: NoArgs, __: fp.ToolContext) -> str:
        if behaviour == "never returns":
            gate.wait(30)
        elif behaviour == "blocks its caller":
            time.sleep(0.3)
        else:
            raises()
        return "late"

    async def async_body(_: NoArgs, __: fp.ToolContext) -> str:
        if behaviour == "never returns":
            while not gate.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.01)
        elif behaviour == "blocks its caller":
            time.sleep(0.3)  # holds the event loop: nothing can interrupt it
        else:
            raises()
        return "late"

    return sync_body if kind == "sync" else async_body


BEHAVIOURS = [
    "SystemExit",
    "KeyboardInterrupt",
    "GeneratorExit",
    "Escape",
    "never returns",
    "blocks its caller",
]


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_a_tool_body_that_breaks_out_is_contained_and_its_run_ends_typed(
    behaviour: str, kind: str, mode: str, gate: threading.Event, on_time_pool: Any
) -> None:
    # The pool starts a sync body before its deadline can be judged, whatever the load (else it
    # is withdrawn, never started: another rule). Only a body that must be cut has a short
    # deadline; one that raises is judged on what it raised, not on how soon a thread came.
    cut = behaviour in BEHAVIOURS[4:]
    tool = fp.ToolSpec(
        name="hostile",
        description="A hostile tool.",
        args_model=NoArgs,
        effect=fp.Effect.READ,
        capability="logs:read",
        timeout_seconds=0.1 if cut else 10,
        execute=_hostile(kind, behaviour, gate),
    )
    saver = InMemorySaver()
    h = harness([call("hostile"), ABSTAIN], registry=fp.ToolRegistry([tool]), checkpointer=saver)
    request = fp.start("q", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=2))
    if mode == "invoke":
        out = finishes(lambda: h.graph.invoke(request, thread(), context=context()), within=20)
    else:
        out = await asyncio.wait_for(
            h.graph.ainvoke(request, thread(), context=context()), timeout=20
        )
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    code = fp.ErrorCode.TIMEOUT if cut else fp.ErrorCode.INTERNAL_ERROR
    assert [(r.status, r.error_code) for r in state.receipts] == [(fp.ReceiptStatus.FAILED, code)]
    assert SECRET.encode() not in saver_bytes(saver)


ledger = pytest.fixture(params=LEDGERS, name="ledger")(each_ledger)


class _Opaque:
    """A value of the caller's own class: no checkpoint serializer writes it."""


def _looped() -> list[Any]:
    """A list that holds itself: no serializer ends writing it."""
    value: list[Any] = []
    value.append(value)
    return value


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"note": "x"}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("depth", [64, 200, 253, 254, 2_000])
@pytest.mark.parametrize("form", ["global", "per-call"])
@pytest.mark.parametrize("key", [None, VERDICT_KEY], ids=["no-key", "key"])
def test_an_edit_nested_past_what_a_checkpoint_holds_is_asked_again_before_anything_closes(
    depth: int, form: str, key: bytes | None, ledger: fp.Ledger
) -> None:
    h, config, ctx = paused_for_approval(ledger=ledger, verdict_key=key)
    edit: dict[str, Any] = {"decision": "edit", "arguments": _nested(depth)}
    if form == "per-call":
        edit = {"call-0001": edit}
    out = h.graph.invoke(Command(resume=edit), config, context=ctx)
    # Too deep for its tool, or for any checkpoint at all: either way asked again.
    code = interrupt_payload(out)["error"]["code"]
    assert code in ("invalid_arguments", "unrepresentable_answer")
    assert h.calls.log == []
    assert ledger.balance(thread_account(config)).closed is None
    assert not state_of(h, config).is_terminal
    # The run goes on from the same pause, and ends with a reason.
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.log == [("write_note", {"note": "a"}, "call-0001")]


@pytest.mark.parametrize(
    "answer",
    [
        {"decision": "edit", "arguments": {"note": 2**70}},
        {"call-0001": {"decision": "edit", "arguments": {"note": -(2**64)}}},
        {"decision": _nested(2_000)},
        1j,
        {"call-0001": {"decision": "edit", "arguments": {"note": _Opaque()}}},
    ],
    ids=["int-past-64-bits", "per-call-negative-int", "deep-decision", "complex", "own-class"],
)
@pytest.mark.parametrize("by", ["value", "interrupt-id"])
def test_a_resume_value_no_checkpoint_holds_is_asked_again_and_nothing_escapes_invoke(
    answer: Any, by: str, ledger: fp.Ledger
) -> None:
    h, config, ctx = paused_for_approval(ledger=ledger)
    if by == "interrupt-id":
        (pending,) = h.graph.get_state(config).interrupts
        answer = {pending.id: answer}
    out = h.graph.invoke(Command(resume=answer), config, context=ctx)
    assert interrupt_payload(out)["error"]["code"] == "unrepresentable_answer"
    assert h.calls.log == []
    assert ledger.balance(thread_account(config)).closed is None
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED


@pytest.mark.parametrize("twin", ["same", "other-arguments"])
def test_a_batch_written_with_one_call_id_twice_ends_typed_and_runs_nothing(
    twin: str, ledger: fp.Ledger
) -> None:
    h, config, ctx = paused_for_approval(ledger=ledger)
    entry = allowed_entry(call(n=5))
    other = entry if twin == "same" else allowed_entry(call(n=5, query="other"))
    h.graph.update_state(config, {"run": {"batch": (entry, other)}}, as_node="approve")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert h.calls.log == []
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "executor_refused"
    assert [r.call_id for r in state.receipts] == ["call-0005"]


@pytest.mark.parametrize("key", [None, VERDICT_KEY], ids=["no-key", "key"])
def test_a_waiting_call_written_twice_is_never_asked_about_nor_run(
    key: bytes | None, ledger: fp.Ledger
) -> None:
    h, config, ctx = paused_for_approval(ledger=ledger, verdict_key=key)
    genuine = state_of(h, config).batch[0]
    twin = fp.policy.BatchEntry(
        proposal=genuine.proposal.model_copy(update={"arguments": {"note": "other"}}),
        verdict=genuine.verdict.model_copy(
            update={"fingerprint": fp.policy.proposal_fingerprint("write_note", {"note": "other"})}
        ),
    )
    out = h.graph.invoke(
        Command(update={"run": {"batch": (genuine, twin)}}, resume="approve"), config, context=ctx
    )
    assert "__interrupt__" not in out
    assert h.calls.log == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_second_update_of_the_record_beside_an_answer_asked_again_is_taken_with_it(
    mode: str,
) -> None:
    # The first update is still pending at the pause (its answer was asked again): the second
    # writes the run record in the same step, and the record takes both writes in order (one
    # channel that merges, where a channel per field had two writers and raised).
    h, config, ctx = paused_for_approval()
    batch = state_of(h, config).batch
    first = h.graph.invoke(
        Command(update={"run": {"batch": batch}}, resume="yes"), config, context=ctx
    )
    assert interrupt_payload(first)["error"]["code"] == "unrecognized_answer"
    second = Command(update={"run": {"batch": batch}}, resume="approve")
    if mode == "sync":
        out = h.graph.invoke(second, config, context=ctx)
    else:
        out = asyncio.run(h.graph.ainvoke(second, config, context=ctx))
    assert fp.run_output(out).termination is fp.TerminationReason.COMPLETED
    assert h.calls.log == [("write_note", {"note": "a"}, "call-0001")]


# -- one terminal node is the only way out -----------------------------------------------------


def test_a_finished_run_keeps_its_ending_resuming_it_calls_nothing_and_new_input_is_the_next_run() -> (
    None
):
    h = harness([call(), final_citing_last, call(n=2)])
    config, ctx = thread(), context()
    first = fp.run_output(h.graph.invoke(fp.start("q", budget()), config, context=ctx))
    model_calls, tool_calls = h.model.calls, len(h.calls.log)
    again = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert first.termination is fp.TerminationReason.COMPLETED
    assert again == first
    assert (h.model.calls, len(h.calls.log)) == (model_calls, tool_calls)
    # New input is the thread's next run; the finished run's ending is not touched.
    out = h.graph.invoke(fp.start("another q", budget()), config, context=ctx)
    restarted = fp.run_output(out)
    assert restarted.run_id != first.run_id and restarted.question == "another q"
    kept = fp.run_output(out, run_id=first.run_id)
    assert (kept.termination, kept.final_answer, kept.receipts, kept.report, kept.budget) == (
        first.termination,
        first.final_answer,
        first.receipts,
        first.report,
        first.budget,
    )


def test_terminal_state_is_only_made_by_the_terminal_node() -> None:
    h = harness([call(), final_citing_last])
    config = thread()
    for chunk in h.graph.stream(
        fp.start("q", budget()), config, context=context(), stream_mode="updates"
    ):
        for node, update in chunk.items():
            if update and update.get("phase") is fp.policy.Phase.TERMINAL:
                assert node == "terminal"
    history = list(h.graph.get_state_history(config))
    terminal_writes = [
        s for s in history if s.metadata and "terminal" in (s.metadata.get("writes") or {})
    ]
    assert h.graph.get_state(config).next == ()
    assert len(terminal_writes) <= 1


def test_terminate_refuses_a_terminal_state() -> None:
    h = harness([fp.AbstainProposal(reason="insufficient_evidence")])
    state = h.run()
    try:
        fp.policy.terminate(state, fp.TerminationReason.FAILED)
    except fp.policy.TerminalStateError:
        pass
    else:  # pragma: no cover - the assertion is the point
        raise AssertionError("terminate accepted a terminal state")


def test_clearing_the_termination_does_not_reopen_a_finished_run() -> None:
    h = harness([call(n=1), ABSTAIN, call(n=2), call(n=3)])
    config, ctx = thread(), context()
    done = fp.run_output(h.graph.invoke(fp.start("q", budget()), config, context=ctx))
    assert done.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    ran = h.calls.count("search_logs")
    reopened = {"run": {"phase": fp.policy.Phase.OBSERVE, "termination": None, "stop": None}}
    h.graph.update_state(config, reopened, as_node="execute")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert h.calls.count("search_logs") == ran
    assert state.is_terminal
    assert state.last_error_code == "run_closed"


# -- a finished run stays finished, whatever a caller writes -----------------------------------


def _finish(h: Any, ctx: fp.RunContext) -> dict[str, Any]:
    config = thread()
    done = fp.run_output(
        h.graph.invoke(fp.start("q", budget(steps=6, tools=2)), config, context=ctx)
    )
    assert done.is_terminal
    return config


REOPEN = {
    "run": {
        "run_id": "run-reborn",
        "phase": fp.policy.Phase.OBSERVE,
        "termination": None,
        "stop": None,
        "budget": fp.RuntimeBudget(steps_remaining=50, tool_calls_remaining=50),
    }
}


def test_rewriting_the_run_id_does_not_reopen_a_finished_run_on_the_default_ledger() -> None:
    h = harness([call(n=1), ABSTAIN, *(call(n=i) for i in range(2, 12))])
    ctx = context()
    config = _finish(h, ctx)
    ran = h.calls.count("search_logs")
    h.graph.update_state(config, REOPEN, as_node="execute")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert h.calls.count("search_logs") == ran
    assert state.is_terminal


def test_rewriting_the_run_id_does_not_reopen_a_finished_run_on_a_durable_ledger(
    tmp_path: Path,
) -> None:
    ledger = SqliteLedger(str(tmp_path / "ledger.db"))
    h = harness([call(n=1), ABSTAIN, *(call(n=i) for i in range(2, 12))], ledger=ledger)
    ctx = context()
    config = _finish(h, ctx)
    ran = h.calls.count("search_logs")
    h.graph.update_state(config, REOPEN, as_node="execute")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert h.calls.count("search_logs") == ran
    assert state.termination is fp.TerminationReason.POLICY_DENIED


FORGED_ANSWER = fp.AnswerPayload(text="forged", citations=("call-0001",))


def test_a_plain_string_phase_a_caller_wrote_is_replaced_so_an_ended_run_stays_ended() -> None:
    # A caller writes the phase "terminal" before the run has ended: a terminal phase without
    # the terminal node's termination is no ending, so the terminal node ends the run with its
    # own stop, and a later invoke cannot end it a second time with whatever stop the caller
    # writes then.
    h = harness([call(n=1), ABSTAIN])
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx, interrupt_after=["execute"])
    h.graph.invoke(None, config, context=ctx, interrupt_after=["decide"])
    assert state_of(h, config).stop is not None  # the run's own abstain, not yet terminal
    h.graph.update_state(config, {"run": {"phase": "terminal"}}, as_node="decide")
    h.graph.invoke(None, config, context=ctx)
    assert h.graph.get_state(config).values["run"]["phase"] == Phase.TERMINAL.value
    forged = StopRequest(reason=TerminationReason.COMPLETED, answer=FORGED_ANSWER)
    h.graph.update_state(config, {"run": {"stop": forged}}, as_node="execute")
    h.graph.invoke(None, config, context=ctx)
    state = state_of(h, config)
    assert state.termination is TerminationReason.INSUFFICIENT_EVIDENCE
    assert state.final_answer is None
    assert terminal_manifests(state) == 1


# An update made as the terminal node is not the terminal node's output: the terminal node routes
# through itself until the run has ended (with a report, the account closed), and a stop-less
# arrival with supersteps left is a caller's doing, not the recursion limit.
@pytest.mark.parametrize("update", [{"run": {"last_error_code": None}}, {"run": {"repairs": None}}])
def test_a_state_update_made_as_the_terminal_node_still_ends_the_run_with_a_reason(
    update: dict[str, Any],
) -> None:
    h, config, ctx = paused_for_approval()
    h.graph.update_state(config, update, as_node="terminal")
    h.graph.invoke(None, config, context=ctx)
    state = ended_typed(h, config, ctx)
    assert state.report is not None
    assert state.termination is TerminationReason.POLICY_DENIED
    assert state.last_error_code == "invalid_state"
    assert h.calls.count("write_note") == 0


_FORGED_COMPLETED: dict[str, Any] = {
    "run": {
        "phase": "terminal",
        "termination": "completed",
        "stop": None,
        "last_error_code": None,
        "final_answer": {"text": "Uploaded.", "citations": ["call-0001"]},
    }
}


# A completed ending the terminal node did not write is sent back to it, whether the run's account
# is still open or was closed with another reason (fp.cancel, insufficient_evidence): the run ends
# with the ledger's reason.
@pytest.mark.parametrize(
    "ending",
    [
        "cancelled",
        "abstained",
        "abstained-default-ledger",
    ],
)
def test_a_caller_never_rewrites_an_ended_run_to_completed(ending: str) -> None:
    ledger = None if ending.endswith("default-ledger") else fp.InMemoryLedger()
    h = upload_graph(
        [UPLOAD, final_citing_all, final_citing_all, ABSTAIN, ABSTAIN],
        **({"ledger": ledger} if ledger is not None else {}),
    )
    config, ctx = thread(), context(caps=DOCS)
    if ending == "cancelled":
        start_upload(h, config, ctx)
        fp.cancel(h.graph, config, context=ctx)
        h.graph.invoke(Command(update=_FORGED_COMPLETED, goto="decide"), config, context=ctx)
    else:
        h.graph.invoke(fp.start("upload", budget()), config, context=ctx)
        genuine = state_of(h, config).termination
        assert genuine is TerminationReason.INSUFFICIENT_EVIDENCE
        h.graph.update_state(config, _FORGED_COMPLETED, as_node="execute")
        h.graph.invoke(None, config, context=ctx)
    state = state_of(h, config)
    assert state.termination is not TerminationReason.COMPLETED
    if ledger is not None:
        assert ledger.balance(thread_account(config)).closed == state.termination.value


@pytest.mark.parametrize("where", ["default-ledger", "durable-ledger-fresh-graph"])
def test_a_genuine_ending_is_never_rewritten_when_the_thread_is_invoked_again(
    where: str, tmp_path: Path
) -> None:
    # A genuine completed is left alone, whether the graph's own ledger forgot its account or a
    # new process's graph reads a durable ledger that closed it.
    config, ctx = thread(), context(caps=DOCS)
    with sqlite_files(tmp_path) as (saver, ledger):
        durable = where.startswith("durable")
        kw: dict[str, Any] = {"checkpointer": saver, "ledger": ledger} if durable else {}
        h = upload_graph([UPLOAD, STATUS, final_citing_all], **kw)
        assert h.run(ctx=ctx, config=config).termination is TerminationReason.COMPLETED
        again = upload_graph([ABSTAIN], **kw) if durable else h
        again.graph.invoke(Command(goto="decide"), config, context=ctx)
        state = state_of(again, config)
    assert state.termination is TerminationReason.COMPLETED
    assert terminal_manifests(state) == 1


# -- values no checkpoint can hold, and values nested past any limit ---------------------------


def test_a_proposal_with_an_integer_no_checkpoint_can_hold_ends_with_a_typed_reason() -> None:
    # msgpack holds 64-bit integers; JSON has no limit. Raw model output with a bigger one must
    # end the run as data, not as a serializer TypeError escaping invoke.
    too_big = {
        "kind": "tool",
        "call_id": "call-0001",
        "tool_name": "search_logs",
        "arguments": {"query": 2**64},
    }
    h = harness([too_big])
    state = h.run()
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert h.calls.log == []


def test_a_tool_result_no_checkpoint_can_hold_is_an_unserializable_result() -> None:
    h = harness([call(n=1), ABSTAIN], search_result={"count": -(2**63) - 1})
    state = h.run()
    assert state.observations[0].error_code is fp.ErrorCode.UNSERIALIZABLE_RESULT
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE


CANARY = "canary-s3cr3t-7f1e"


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    note: str


def _spec(name: str, execute: Any, **extra: Any) -> fp.ToolSpec:
    return fp.ToolSpec(
        name=name,
        description="A hostile tool.",
        args_model=NoteArgs,
        effect=fp.Effect.READ,
        capability="logs:read",
        timeout_seconds=extra.pop("timeout_seconds", 10),
        execute=execute,
        **extra,
    )


def _note(name: str, n: int = 1, note: str = "x") -> fp.ToolProposal:
    return fp.ToolProposal(call_id=f"call-{n:04d}", tool_name=name, arguments={"note": note})


def _run_hostile(
    spec: fp.ToolSpec, script: list[Any], mode: str = "sync"
) -> tuple[fp.AgentState, InMemorySaver]:
    saver = InMemorySaver()
    h = harness(script, registry=fp.ToolRegistry([spec]), checkpointer=saver)
    inp, config, ctx = fp.start("q", budget()), thread(), context()
    if mode == "sync":
        out = h.graph.invoke(inp, config, context=ctx)
    else:
        out = asyncio.run(h.graph.ainvoke(inp, config, context=ctx))
    return fp.run_output(out), saver


def _nested_value(depth: int, leaf: Any = "x") -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("depth", [120, 1_000, 20_000])
def test_arguments_nested_past_any_limit_end_typed(depth: int) -> None:
    raw = {
        "kind": "tool",
        "call_id": "call-0001",
        "tool_name": "search_logs",
        "arguments": {"query": _nested_value(depth)},
    }
    saver = InMemorySaver()
    h = harness([lambda _: raw, ABSTAIN], checkpointer=saver)
    state = fp.run_output(h.graph.invoke(fp.start("q", budget()), thread(), context=context()))
    assert state.is_terminal
    assert h.calls.count("search_logs") == 0


@pytest.mark.parametrize("depth", [120, 1_000, 20_000])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_result_nested_past_any_limit_ends_typed(depth: int, mode: str) -> None:
    spec = _spec("deep", lambda args, ctx: _nested_value(depth, CANARY))
    state, _ = _run_hostile(spec, [_note("deep"), ABSTAIN], mode)
    assert state.is_terminal
    assert state.receipts[0].status in (
        fp.policy.ReceiptStatus.COMPLETED,
        fp.policy.ReceiptStatus.FAILED,
    )


@pytest.mark.parametrize(
    "call_id", ["\x00\x00\x00\x00\x00\x00", "        ", "\t\n\r\x0b\x0c ", "call-\x00-1\u2028"]
)
def test_call_ids_of_nul_blank_or_separator_characters_end_typed_and_run_at_most_once(
    call_id: str, tmp_path: Path
) -> None:
    ledger = SqliteLedger(str(tmp_path / "ledger.db"))
    raw = {
        "kind": "tool",
        "call_id": call_id,
        "tool_name": "search_logs",
        "arguments": {"query": "q"},
    }
    h = harness([lambda _: raw, ABSTAIN], ledger=ledger)
    state = fp.run_output(h.graph.invoke(fp.start("q", budget()), thread(), context=context()))
    assert state.is_terminal
    assert h.calls.count("search_logs") <= 1


# -- the recursion limit, a budget account that does not exist ---------------------------------


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_recursion_limit_of_one_ends_the_run_with_a_reason_instead_of_raising(mode: str) -> None:
    h = harness([call(n=1)])
    config = {**thread(), "recursion_limit": 1}
    inp, ctx = fp.start("q", budget()), context()
    if mode == "invoke":
        out = h.graph.invoke(inp, config, context=ctx)
    else:
        out = asyncio.run(h.graph.ainvoke(inp, config, context=ctx))
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert state.last_error_code == "recursion_limit"
    assert h.calls.log == []
    # Invoking the ended thread again returns it, still ended, and raises nothing.
    again = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert again.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED


@pytest.mark.parametrize("limit", [2, 3, 4, 5])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_tiny_recursion_limit_ends_with_a_reason(limit: int, mode: str) -> None:
    h = harness([call(n=1), call(n=2), ABSTAIN])
    inp, config, ctx = fp.start("q", budget()), thread(), context()
    cfg = {**config, "recursion_limit": limit}
    if mode == "sync":
        out = h.graph.invoke(inp, cfg, context=ctx)
    else:
        out = asyncio.run(h.graph.ainvoke(inp, cfg, context=ctx))
    assert fp.run_output(out).termination is not None


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_unknown_budget_account_ends_typed_never_as_an_exception(mode: str) -> None:
    h = harness([call(n=1), ABSTAIN])
    ctx = context().model_copy(update={"budget_account": "no-such-pool"})
    inp = fp.start("q", budget())
    if mode == "sync":
        out = h.graph.invoke(inp, thread(), context=ctx)
    else:
        out = asyncio.run(h.graph.ainvoke(inp, thread(), context=ctx))
    state = fp.run_output(out)
    assert h.calls.count("search_logs") == 0
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "unknown_budget_account"


# -- validators and predicates that break, a hung model, a tool's own CancelledError ----------


def _araise(exc: BaseException) -> Any:
    async def body(args: NoteArgs, ctx: fp.ToolContext) -> Any:
        raise exc

    return body


def test_an_async_tool_raising_cancelled_error_itself_is_that_calls_failure() -> None:
    body = _araise(asyncio.CancelledError(CANARY))
    state, saver = _run_hostile(_spec("boom", body), [_note("boom"), ABSTAIN], "async")
    assert state.is_terminal
    assert CANARY.encode() not in saver_bytes(saver)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("hook", ["semantic_validator", "progress_predicate"])
@pytest.mark.parametrize(
    "exc", [RuntimeError(CANARY), RecursionError(CANARY)], ids=["RuntimeError", "RecursionError"]
)
def test_a_breaking_validator_or_predicate_ends_typed_and_its_text_never_checkpointed(
    mode: str, hook: str, exc: BaseException
) -> None:
    def broken(*_: Any) -> Any:
        raise exc

    spec = _spec("note", lambda args, ctx: {"ok": True}, **{hook: broken})
    script = [_note("note", n) for n in range(1, 6)] + [ABSTAIN]
    state, saver = _run_hostile(spec, script, mode)
    assert state.is_terminal
    assert CANARY.encode() not in saver_bytes(saver)


@pytest.mark.parametrize("hook", ["semantic_validator", "progress_predicate"])
def test_a_validator_or_predicate_raising_a_base_exception_ends_typed(hook: str) -> None:
    def broken(*_: Any) -> Any:
        raise SystemExit(CANARY)

    spec = _spec("note", lambda args, ctx: {"ok": True}, **{hook: broken})
    state, saver = _run_hostile(spec, [_note("note", n) for n in range(1, 6)] + [ABSTAIN])
    assert state.is_terminal
    assert CANARY.encode() not in saver_bytes(saver)


CONTROL_FLOW = {
    "CancelledError": asyncio.CancelledError,
    "GeneratorExit": GeneratorExit,
    "KeyboardInterrupt": KeyboardInterrupt,
    "SystemExit": SystemExit,
}


def _args_raising(exc_type: type[BaseException]) -> type[BaseModel]:
    class Breaks(NoteArgs):
        @field_validator("note")
        @classmethod
        def breaks(cls, value: str) -> str:
            raise exc_type(CANARY)

    return Breaks


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("hook", ["semantic_validator", "progress_predicate", "args_model"])
@pytest.mark.parametrize("raised", sorted(CONTROL_FLOW))
def test_an_application_callable_raising_control_flow_is_that_calls_failure(
    caplog: pytest.LogCaptureFixture, mode: str, hook: str, raised: str
) -> None:
    # Nobody cancelled the run: a CancelledError or GeneratorExit a validator or a predicate
    # raises is its own failure, as any exception it raises is (and as a tool body's is): the
    # run ends typed, the traceback is logged, and nothing escapes invoke.
    exc_type = CONTROL_FLOW[raised]

    def broken(*_: Any) -> Any:
        raise exc_type(CANARY)

    ran: list[str] = []
    extra: dict[str, Any] = (
        {"args_model": _args_raising(exc_type)} if hook == "args_model" else {hook: broken}
    )
    spec = fp.ToolSpec(
        name="note",
        description="A tool whose own callables break.",
        args_model=extra.pop("args_model", NoteArgs),
        effect=fp.Effect.READ,
        capability="logs:read",
        timeout_seconds=10,
        execute=lambda args, ctx: ran.append(args.note) or {"ok": True},
        **extra,
    )
    with caplog.at_level(logging.WARNING, logger="fencepost"):
        state, saver = _run_hostile(spec, [_note("note", n) for n in range(1, 6)] + [ABSTAIN], mode)
    assert state.is_terminal
    assert CANARY.encode() not in saver_bytes(saver)
    if hook != "progress_predicate":  # a predicate that breaks shows no progress; the call runs
        assert ran == []
    logged = [r.exc_info[0] for r in caplog.records if r.name == "fencepost.gate" and r.exc_info]
    assert logged and set(logged) == {exc_type}


def _never(inp: fp.DecisionInput) -> Any:
    return asyncio.Event().wait()


def test_a_hung_model_and_a_system_exit_tool_end_typed_and_a_new_graph_reads_every_field_back(
    tmp_path: Path,
) -> None:
    @fp.tool(effect=fp.Effect.READ, capability="logs:read", timeout_seconds=5)
    def exits(ctx: fp.ToolContext) -> Any:
        """Ends the process, if it can."""
        raise SystemExit(3)

    script = [
        _never,
        fp.ToolProposal(call_id="call-0001", tool_name="exits", arguments={}),
        call("write_note", 2, note="x"),
        call(n=3),
        final_citing_last,
    ]
    db = tmp_path / "runs.db"
    conn = sqlite3.connect(db, check_same_thread=False)
    calls = Calls()
    registry = make_registry(calls, extra=(exits,))
    h = harness(
        script,
        checkpointer=SqliteSaver(conn),
        registry=registry,
        calls=calls,
        approval="interrupt",
        model_timeout_seconds=0.3,
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget(steps=8, tools=5)), config, context=ctx)
    paused = h.graph.get_state(config)
    assert paused.next == ("approve",)
    seen = fp.run_output(paused.values)
    conn.close()

    conn2 = sqlite3.connect(db, check_same_thread=False)
    again = harness(
        script[3:],
        checkpointer=SqliteSaver(conn2),
        registry=registry,
        calls=calls,
        approval="interrupt",
    )
    read_back = fp.run_output(again.graph.get_state(config).values)
    assert read_back == seen
    assert read_back.receipts[0].error_code is fp.ErrorCode.INTERNAL_ERROR
    assert read_back.model_failures == 0 and read_back.step == 3
    state = fp.run_output(again.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED
    assert [n for n, _, _ in calls.log] == ["write_note", "search_logs"]
    assert fp.run_output(again.graph.get_state(config).values) == state
    conn2.close()


@pytest.mark.parametrize("how", ["command", "update_state"])
def test_a_record_write_of_null_is_dropped_and_the_thread_still_runs(how: str) -> None:
    # ``{"run": null}`` (a server client's JSON too) was taken for a node's own write (a miss of
    # the identity map is None) and raised AttributeError out of invoke; through a Command it was
    # saved first, and every later invoke and get_state of the thread raised it again.
    h, config, ctx = paused_for_approval()
    if how == "command":
        h.graph.invoke(Command(update={"run": None}, resume="approve"), config, context=ctx)
    else:
        h.graph.update_state(config, {"run": None}, as_node="decide")
        h.graph.invoke(Command(resume="approve"), config, context=ctx)
    state = state_of(h, config)
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.log == [("write_note", {"note": "a"}, "call-0001")]


@pytest.mark.parametrize(
    "write",
    [
        {"question": 1j},
        {"step": 2**70},
        {"stop": _Opaque()},
        {"observations": _looped()},
        {"batch": [{"a": _nested(300)}]},
    ],
    ids=["complex", "int-past-64-bits", "own-class", "self-holding", "deep"],
)
@pytest.mark.parametrize("how", ["command", "update_state"])
def test_a_record_value_no_checkpoint_can_store_never_escapes_and_the_run_ends_typed(
    write: dict[str, Any], how: str
) -> None:
    # Before: the serializer's TypeError escaped invoke (or update_state); through a Command,
    # after the approved write had run and before the step that ran it was saved.
    h, config, ctx = paused_for_approval()
    if how == "command":
        h.graph.invoke(Command(update={"run": write}, resume="approve"), config, context=ctx)
    else:
        h.graph.update_state(config, {"run": write}, as_node="decide")
        h.graph.invoke(None, config, context=ctx)
        if h.graph.get_state(config).next == ("approve",):
            h.graph.invoke(Command(resume="approve"), config, context=ctx)
    snapshot = h.graph.get_state(config)
    state = fp.run_output(snapshot.values)
    assert snapshot.next == ()
    assert state.termination is not None
    assert h.calls.count("write_note") <= 1


@pytest.mark.parametrize(
    "update",
    [
        {"request": _Opaque()},
        {"request": _looped()},
        {"messages": _looped()},
        {"messages": [{"role": "user", "content": "x", "extra": 1j}]},
    ],
    ids=["request-own-class", "request-self-holding", "messages-self-holding", "message-complex"],
)
@pytest.mark.parametrize("how", ["command", "update_state"])
def test_a_channel_value_no_checkpoint_can_store_is_refused_before_anything_is_saved(
    update: dict[str, Any], how: str
) -> None:
    h, config, ctx = paused_for_approval()
    before = h.graph.get_state(config)
    with pytest.raises(fp.CommandRefused, match="no checkpoint can store"):
        if how == "command":
            h.graph.invoke(Command(update=update, resume="approve"), config, context=ctx)
        else:
            h.graph.update_state(config, update, as_node="decide")
    after = h.graph.get_state(config)
    assert after.config == before.config and after.next == ("approve",)
    assert h.calls.log == []
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED


def test_a_terminal_phase_written_without_a_reason_is_ended_by_the_terminal_node() -> None:
    # Written as the terminal node, the bare phase routed the thread out of the graph: nothing
    # left to run, and a run with no reason (its account still open).
    h, config, ctx = paused_for_approval()
    h.graph.update_state(config, {"run": {"phase": "terminal"}}, as_node="terminal")
    h.graph.invoke(None, config, context=ctx)
    snapshot = h.graph.get_state(config)
    state = fp.run_output(snapshot.values)
    assert snapshot.next == ()
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "invalid_state"
    assert h.calls.log == []


@pytest.mark.parametrize(
    "given",
    ["approve", ["approve"], {"request": {"question": 1j}}],
    ids=["text", "list", "complex"],
)
def test_an_input_that_is_no_map_of_storable_values_is_refused_and_the_paused_run_goes_on(
    given: Any,
) -> None:
    # Before: LangGraph saved a text or list input, then raised InvalidUpdateError at that
    # invoke and at every later one of the thread (stuck at ``__start__``); a value its
    # serializer does not write raised TypeError.
    h, config, ctx = paused_for_approval()
    with pytest.raises(fp.CommandRefused):
        h.graph.invoke(given, config, context=ctx)
    assert h.graph.get_state(config).next == ("approve",)
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.log == [("write_note", {"note": "a"}, "call-0001")]


# -- over both bindings: fencepost's graph, and create_agent + FencepostMiddleware -------------


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_model_that_never_stops_ends_step_budget_exhausted(
    binding: type[bd.Binding], mode: str
) -> None:
    b = binding(bd.searches(), steps=3, tools=50, mode=mode)
    out = b.start(mw.ctx())
    assert out.termination == fp.TerminationReason.STEP_BUDGET_EXHAUSTED.value
    assert len(out.received) == 3


def test_a_finished_run_called_again_calls_nothing_and_new_input_is_the_next_run(
    binding: type[bd.Binding],
) -> None:
    b = binding(bd.then_answer(bd.call("search_logs", {"query": "checkout"}, 1)), steps=5, tools=5)
    first = b.start(mw.ctx())
    run_id, model_calls, bodies = b.run_id(), len(first.received), list(first.bodies)
    assert first.termination == fp.TerminationReason.COMPLETED.value
    again = b.go_on(mw.ctx())
    assert again.termination == first.termination
    assert (len(again.received), again.bodies) == (model_calls, bodies)
    b.start(mw.ctx(), question="and the api?")
    assert b.run_id() != run_id


@pytest.mark.parametrize("raised", ["SystemExit", "KeyboardInterrupt", "Escape"])
def test_a_tool_raising_a_base_exception_is_contained_and_its_run_ends_typed(
    binding: type[bd.Binding], raised: str
) -> None:
    @lc_tool
    def hostile(query: str) -> str:
        """A tool whose body breaks out."""
        exc = {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}.get(raised, Escape)
        raise exc(SECRET)

    b = binding(
        bd.then_answer(bd.call("hostile", {"query": "x"}, 1)),
        steps=4,
        tools=2,
        extra_tools=[(hostile, bd.READ)],
    )
    out = b.start(mw.ctx())
    assert out.termination == fp.TerminationReason.COMPLETED.value
    assert all(SECRET not in repr(m) for turn in out.received for m in turn)
    shown = [m for m in out.received[-1] if getattr(m, "tool_call_id", None) == "call-0001"]
    assert "internal_error" in repr(shown)


def test_an_unknown_budget_account_ends_the_run_typed_and_runs_nothing(
    binding: type[bd.Binding],
) -> None:
    b = binding(bd.then_answer(bd.call("search_logs", {"query": "x"}, 1)), steps=4, tools=2)
    out = b.start(mw.ctx().model_copy(update={"budget_account": "no-such-pool"}))
    assert out.bodies == []
    assert (out.termination, out.error_code) == (
        fp.TerminationReason.POLICY_DENIED.value,
        "unknown_budget_account",
    )


_NO_DECISION = {
    "empty_response": AIMessage(content=""),
    "truncated_output": AIMessage(
        content="",
        tool_calls=[{"name": "search_logs", "args": {"query": "chec"}, "id": "call-0001"}],
        response_metadata={"finish_reason": "length"},
    ),
    "model_refusal": AIMessage(content="no", additional_kwargs={"refusal": "I can't help"}),
    "invalid_tool_calls": AIMessage(
        content="",
        invalid_tool_calls=[
            {"name": "search_logs", "args": '{"query": ', "id": "call-0001", "error": None}
        ],
    ),
}


@pytest.mark.parametrize("code", list(_NO_DECISION))
def test_a_reply_that_is_no_decision_ends_invalid_proposal_never_completed_and_runs_nothing(
    binding: type[bd.Binding], code: str
) -> None:
    b = binding(bd.then_answer(_NO_DECISION[code]), steps=4, tools=4)
    out = b.start(mw.ctx())
    assert out.bodies == []
    assert (out.termination, out.error_code) == (
        fp.TerminationReason.INVALID_PROPOSAL.value,
        code,
    )


def assert_the_model_fails_its_run_in_containment(
    model: Any, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Run ``model`` once (``invoke`` or ``ainvoke``): the run ends ``failed``/``internal_error``,
    nothing escapes, the model's text (``SECRET``) never reaches the checkpoint and is logged,
    with its traceback, on ``fencepost.model`` only."""
    caplog.set_level(logging.DEBUG)
    saver = InMemorySaver()
    graph = fp.build_agent_graph(make_registry(Calls()), model, model_retries=0).compile(
        checkpointer=saver
    )

    def run() -> Any:
        if mode == "invoke":
            return graph.invoke(fp.start("q", budget()), thread(), context=context())
        return asyncio.run(graph.ainvoke(fp.start("q", budget()), thread(), context=context()))

    state = fp.run_output(finishes(run))
    assert state.termination is TerminationReason.FAILED
    assert state.last_error_code == "internal_error"
    assert SECRET.encode() not in saver_bytes(saver)
    assert any(SECRET in (r.exc_text or "") for r in caplog.records if r.name == "fencepost.model")


class _BreaksWhenRead:
    """A model's reply that raises ``SystemExit`` as soon as the runtime asks what it is."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise SystemExit(f"read me: {SECRET}")


class _DefReplyBreaks:
    def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:
        return _BreaksWhenRead()


class _AsyncReplyBreaks:
    async def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:
        return _BreaksWhenRead()


@pytest.mark.parametrize("model", [_DefReplyBreaks, _AsyncReplyBreaks], ids=["def", "async"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_model_reply_that_raises_when_read_ends_its_run_typed_and_nothing_escapes_invoke(
    model: type[Any], mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert_the_model_fails_its_run_in_containment(model(), mode, caplog)


class _DecideBreaksWhenLooked:
    """A model whose ``decide`` is a property: looked up once as the graph is built, it
    raises ``SystemExit`` when a step looks it up again."""

    def __init__(self) -> None:
        self.looked = 0

    @property
    def decide(self) -> Any:
        self.looked += 1
        if self.looked > 1:
            raise SystemExit(f"looked up: {SECRET}")

        async def decide(input: fp.DecisionInput, *, deadline: fp.Deadline) -> fp.Decision:
            return ABSTAIN

        return decide


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_model_whose_decide_raises_when_looked_up_ends_its_run_typed(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    model = _DecideBreaksWhenLooked()
    assert_the_model_fails_its_run_in_containment(model, mode, caplog)
    assert model.looked > 1
