"""Invariant 6: tool output is untrusted data, and no raw exception text reaches the checkpoint.

A tool's ``Accepted``/``Completed`` is a claim like any other value it returns: one built with
``model_copy(update=...)`` skips pydantic's validation and may hold anything. It must end as
that call's failure with a safe code, not as an exception out of ``invoke`` quoting the value.

What a tool, the decision model, a validator or a predicate raised goes to the developer's log,
with its traceback, and nowhere else: the canary sweep below looks for its text in every
checkpoint blob (an InMemorySaver's and a SQLite file's), every chunk of every stream mode,
every input the decision model was given and every span, event and attribute. A step manifest
holds no argument or result text either.

Over both bindings (the ``binding`` parameter, ``tests/invariants/bindings.py``: fencepost's graph,
and ``create_agent`` with ``fp.FencepostMiddleware``), at the end of this file: a tool's exception
text, a ``ToolException``'s own message. The other tests drive the graph's own state, nodes or
settings (``update_state``, ``Command(update=...)``, channels, ``interrupt_before``, repair, the
approver, token estimates, savers and ledgers by URL), which the middleware binding does not have:
they stay graph-only.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool as lc_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, ConfigDict, field_validator

import fencepost as fp
from fencepost.adapters.chat_model import ChatModelDecider
from fencepost.policy.outcome import MalformedMarker, checked_marker
from tests.adapters.fakes import FakeToolChatModel, ai_call, ai_final
from tests.graph.kit import (
    DOCS,
    STATUS,
    budget,
    call,
    context,
    harness,
    saver_bytes,
    thread,
    upload_registry,
)
from tests.invariants import bindings as bd
from tests.middleware import kit as mw
from tests.telemetry_kit import assert_only_in_one_traceback, every_text

SECRET = "password=hunter2"
ACCEPTED = fp.Accepted(task_id="task-17")
DONE = fp.Completed(
    task_id="task-17",
    evidence={"document_id": "document-42", "version": "3", "access_path": "/docs/42/v3"},
)
MALFORMED = {
    "accepted, task id an int": ACCEPTED.model_copy(update={"task_id": 17}),
    "accepted, task id a list": ACCEPTED.model_copy(update={"task_id": [SECRET]}),
    "accepted, task id None": ACCEPTED.model_copy(update={"task_id": None}),
    "accepted, detail not text": ACCEPTED.model_copy(update={"detail": {SECRET: 5}}),
    "completed, task id an int": DONE.model_copy(update={"task_id": 17}),
    "completed, evidence an int": DONE.model_copy(
        update={"evidence": {**DONE.evidence, "document_id": 42, SECRET: 1}}
    ),
    "completed, evidence None": DONE.model_copy(
        update={"evidence": {**DONE.evidence, "version": None, SECRET: None}}
    ),
    "completed, no evidence dict": DONE.model_copy(update={"evidence": None}),
    "completed, evidence a list": DONE.model_copy(update={"evidence": [SECRET]}),
}


def _final(inp: fp.DecisionInput) -> fp.FinalProposal:
    return fp.FinalProposal(answer=fp.AnswerPayload(text="Checked.", citations=()))


@pytest.mark.parametrize("value", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_accepted_or_completed_is_the_calls_failure_with_a_safe_code(
    value: Any,
) -> None:
    saver = InMemorySaver()
    h = harness(
        [STATUS, fp.AbstainProposal(reason="insufficient_evidence")],
        registry=upload_registry(value),
        checkpointer=saver,
    )
    config, ctx = thread(), context(caps=DOCS)
    out = h.graph.invoke(
        fp.start("Is it done?", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=3)),
        config,
        context=ctx,
    )
    state = fp.run_output(out)
    assert [(r.status, r.error_code) for r in state.receipts] == [
        (fp.ReceiptStatus.FAILED, fp.ErrorCode.UNSERIALIZABLE_RESULT)
    ]
    assert state.observations[0].kind == "tool_error"
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    assert state.open_tasks == ()
    # The thread is finished: invoking it again runs nothing and charges nothing more.
    again = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert again.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    assert again.budget.tool_calls_used == 1
    assert SECRET.encode() not in saver_bytes(saver)
    assert SECRET not in repr(out)


async def test_a_malformed_accepted_is_the_calls_failure_under_ainvoke_too() -> None:
    saver = InMemorySaver()
    h = harness(
        [STATUS, fp.AbstainProposal(reason="insufficient_evidence")],
        registry=upload_registry(MALFORMED["accepted, task id a list"]),
        checkpointer=saver,
    )
    out = await h.graph.ainvoke(
        fp.start("Is it done?", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=3)),
        thread(),
        context=context(caps=DOCS),
    )
    state = fp.run_output(out)
    assert [(r.status, r.error_code) for r in state.receipts] == [
        (fp.ReceiptStatus.FAILED, fp.ErrorCode.UNSERIALIZABLE_RESULT)
    ]
    assert SECRET.encode() not in saver_bytes(saver)


def test_a_well_formed_marker_passes_the_check_and_anything_else_is_no_marker() -> None:
    assert checked_marker(DONE) == DONE
    assert checked_marker(ACCEPTED) == ACCEPTED
    assert checked_marker({"task_id": 17}) is None  # a dict claims nothing
    for value in MALFORMED.values():
        with pytest.raises(MalformedMarker) as raised:
            checked_marker(value)
        assert SECRET not in str(raised.value) and raised.value.__cause__ is None


# -- the canary sweep: an exception's text is in the developer's log and nowhere else --------------

CANARY = "canary-7d41b0 password=hunter2"
STREAM_MODES = ["values", "updates", "custom", "messages", "debug", "tasks", "checkpoints"]


class OrderArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    order_id: str


class CheckedOrderArgs(OrderArgs):
    @field_validator("order_id")
    @classmethod
    def known(cls, value: str) -> str:
        raise LookupError(CANARY)  # not a ValueError: pydantic does not wrap it


def _raise(*_: Any) -> Any:
    raise RuntimeError(CANARY)


async def _araise(*_: Any) -> Any:
    raise ConnectionError(CANARY)


@lc_tool
def lc_order(order_id: str) -> str:
    """Look an order up (a LangChain tool)."""
    raise ValueError(CANARY)


def _order(execute: Any = None, args_model: type[BaseModel] = OrderArgs, **hooks: Any) -> Any:
    return fp.ToolSpec(
        name="order",
        description="Look an order up.",
        args_model=args_model,
        effect=fp.Effect.READ,
        capability="logs:read",
        execute=execute or (lambda args, ctx: {"status": "shipped"}),
        **hooks,
    )


ORDER = {"order_id": "A-1001"}
SOURCES: dict[str, tuple[Any, list[Any], str]] = {
    # source: (the tool, what the chat model says, the logger the traceback goes to)
    "sync tool": (_order(_raise), [ai_call("order", ORDER, "call-0001")], "fencepost.tools"),
    "async tool": (_order(_araise), [ai_call("order", ORDER, "call-0001")], "fencepost.tools"),
    "LangChain tool": (
        fp.tool(lc_order, effect="read", capability="logs:read", name="order"),
        [ai_call("order", ORDER, "call-0001")],
        "fencepost.tools",
    ),
    "args validator": (
        _order(args_model=CheckedOrderArgs),
        [ai_call("order", ORDER, "call-0001")],
        "fencepost.gate",
    ),
    "semantic validator": (
        _order(semantic_validator=_raise),
        [ai_call("order", ORDER, "call-0001")],
        "fencepost.gate",
    ),
    "progress predicate": (
        _order(progress_predicate=_raise),
        [ai_call("order", ORDER, "call-0001"), ai_call("order", ORDER, "call-0002")],
        "fencepost.gate",
    ),
    "decision model": (_order(), [RuntimeError(CANARY)], "fencepost.model"),
    "approver": (
        _order().model_copy(update={"effect": fp.Effect.WRITE}),
        [ai_call("order", ORDER, "call-0001")],
        "fencepost.approval",
    ),
}
OPTIONS: dict[str, dict[str, Any]] = {"approver": {"approver": _raise}}
"""The agent settings a source needs beyond the tool (the approver is the graph's)."""


class RecordingDecider:
    """The chat-model decider, keeping every ``DecisionInput`` it was given."""

    def __init__(self, chat: FakeToolChatModel) -> None:
        self.inner = ChatModelDecider(chat)
        self.inputs: list[fp.DecisionInput] = []

    async def decide(self, input: fp.DecisionInput, *, deadline: fp.Deadline) -> Any:
        self.inputs.append(input)
        return await self.inner.decide(input, deadline=deadline)


@pytest.mark.parametrize("saver_kind", ["InMemorySaver", "SqliteSaver"])
@pytest.mark.parametrize("source", list(SOURCES))
def test_an_exceptions_text_is_in_one_log_traceback_and_in_no_checkpoint_stream_model_input_or_span(
    source: str,
    saver_kind: str,
    tmp_path: Path,
    spans: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tool, says, logger = SOURCES[source]
    chat = FakeToolChatModel(messages=iter([*says, ai_final("nothing to report")]))
    decider = RecordingDecider(chat)
    path = tmp_path / "checkpoints.db"
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = InMemorySaver() if saver_kind == "InMemorySaver" else SqliteSaver(conn)
    graph = fp.create_agent(
        decider,
        [tool],
        checkpointer=saver,
        repeat_limit=1,
        model_retries=0,
        **OPTIONS.get(source, {}),
    )
    caplog.set_level("DEBUG", logger="fencepost")
    config = thread()
    chunks = list(
        graph.stream(
            fp.start("where is order A-1001?"), config, context=context(), stream_mode=STREAM_MODES
        )
    )
    state = fp.run_output(graph.get_state(config).values)
    assert state.is_terminal

    # The developer's log has it, once, in a WARNING's traceback...
    assert_only_in_one_traceback(caplog.records, CANARY, logger)
    # ...and nothing else does: no checkpoint blob,
    if isinstance(saver, InMemorySaver):
        assert CANARY.encode() not in saver_bytes(saver)
    conn.close()
    stored = b"".join(
        p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("checkpoints")
    )
    assert CANARY.encode() not in stored
    # no chunk of any stream mode (the manifests of the custom mode among them),
    assert {mode for mode, _ in chunks} >= {"values", "updates", "custom", "checkpoints"}
    assert CANARY not in repr(chunks)
    assert CANARY not in repr(state)
    # no input of the decision model, as fencepost built it or as the chat model got it,
    assert decider.inputs and CANARY not in repr(decider.inputs)
    assert CANARY not in repr(chat.received)
    # no span, event, attribute or status.
    found = spans.get_finished_spans()
    assert any(s.name.startswith("invoke_agent") for s in found)
    assert CANARY not in every_text(found)


# -- what a tool raised reaches no model input, manifest or checkpoint file; a manifest holds no payload ---


TOOL_SECRET = "hunter2"


def test_tool_exception_text_never_reaches_model_manifests_or_checkpoint(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    conn = sqlite3.connect(db, check_same_thread=False)
    saver = SqliteSaver(conn)
    h = harness(
        [call("explode", 1), fp.AbstainProposal(reason="insufficient_evidence")], checkpointer=saver
    )
    config = thread()
    state = fp.run_output(h.graph.invoke(fp.start("q", budget()), config, context=context()))
    conn.commit()
    assert state.observations[0].error_code is fp.ErrorCode.INTERNAL_ERROR
    next_input = h.model.inputs[-1]
    assert TOOL_SECRET not in next_input.model_dump_json()
    assert all(TOOL_SECRET not in m.model_dump_json() for m in state.manifests)
    conn.close()
    assert TOOL_SECRET.encode() not in db.read_bytes()
    wal = db.with_name(db.name + "-wal")
    assert not wal.exists() or TOOL_SECRET.encode() not in wal.read_bytes()


def test_manifests_hold_no_arguments_or_results() -> None:
    marker = "ARGUMENT-TEXT-XYZ"
    h = harness(
        [call(n=1, query=marker), fp.AbstainProposal(reason="insufficient_evidence")],
        search_result={"hits": ["RESULT-TEXT-XYZ"]},
    )
    state = h.run()
    for m in state.manifests:
        dumped = m.model_dump_json()
        assert marker not in dumped and "RESULT-TEXT-XYZ" not in dumped


# -- over both bindings: fencepost's graph, and create_agent + FencepostMiddleware -------------


def test_a_tools_exception_text_never_reaches_the_model(binding: type[bd.Binding]) -> None:
    b = bd.waiting_write(binding, "rollback", failing_write=True)
    out = b.resume("approve", mw.ctx())
    assert out.bodies == ["write_note:rollback"]
    assert all(mw.SECRET not in repr(m) for turn in out.received for m in turn)
    assert out.termination == fp.TerminationReason.COMPLETED.value


def test_a_tool_exceptions_own_message_never_reaches_the_model(binding: type[bd.Binding]) -> None:
    from langchain_core.tools import ToolException

    @lc_tool
    def lookup(query: str) -> str:
        """Look a record up."""
        raise ToolException(mw.SECRET)

    b = binding(
        bd.then_answer(bd.call("lookup", {"query": "x"}, 1)),
        steps=4,
        tools=4,
        extra_tools=[(lookup, bd.READ)],
    )
    out = b.start(mw.ctx())
    assert out.termination == fp.TerminationReason.COMPLETED.value
    assert all(mw.SECRET not in repr(m) for turn in out.received for m in turn)
