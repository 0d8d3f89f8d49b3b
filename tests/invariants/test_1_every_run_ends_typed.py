"""Invariant 1: every path ends in exactly one TerminationReason, and nothing escapes ``invoke``.

Here: the paths where a tool's own code (its arguments model's validators, its body) does what the
runtime did not expect, and a human's answer no checkpoint can hold. Pydantic wraps a validator's
``ValueError`` and ``AssertionError`` in a ``ValidationError``; a ``KeyError`` or ``TypeError`` it
lets through as it is, its text often quoting the very argument the model sent: that must end as a
typed schema refusal, with none of the text kept. An answer no checkpoint can hold is refused as
data before anything is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict, field_validator

import fencepost as fp
from fencepost.policy import VerdictCode, check_schema, gate_proposal
from fencepost.policy.gates import ArgumentsValidatorFailed
from tests.graph.kit import (
    ABSTAIN,
    LEDGERS,
    VERDICT_KEY,
    allowed_entry,
    call,
    context,
    each_ledger,
    harness,
    interrupt_payload,
    paused_for_approval,
    state_of,
    thread,
    thread_account,
)
from tests.graph.test_hostile_review import _saver_bytes
from tests.graph.test_tool_isolation import NoArgs, finishes
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
    h = harness([PROPOSAL, ABSTAIN], registry=_registry(args_model, ran), checkpointer=saver)
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
    assert SECRET.encode() not in _saver_bytes(saver)
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
    assert SECRET.encode() not in _saver_bytes(saver)
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
    behaviour: str, kind: str, mode: str, gate: threading.Event
) -> None:
    tool = fp.ToolSpec(
        name="hostile",
        description="A hostile tool.",
        args_model=NoArgs,
        effect=fp.Effect.READ,
        capability="logs:read",
        timeout_seconds=0.1,
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
    code = fp.ErrorCode.TIMEOUT if behaviour in BEHAVIOURS[4:] else fp.ErrorCode.INTERNAL_ERROR
    assert [(r.status, r.error_code) for r in state.receipts] == [(fp.ReceiptStatus.FAILED, code)]
    assert SECRET.encode() not in _saver_bytes(saver)


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
