"""Invariant 1: every path ends in exactly one TerminationReason, and nothing escapes ``invoke``.
Here: a human's answer no checkpoint can hold is refused as data before anything is written."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph.types import Command

import fencepost as fp
from tests.graph.kit import (
    LEDGERS,
    VERDICT_KEY,
    allowed_entry,
    call,
    each_ledger,
    interrupt_payload,
    paused_for_approval,
    state_of,
    thread_account,
)

ledger = pytest.fixture(params=LEDGERS, name="ledger")(each_ledger)


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
    ],
    ids=["int-past-64-bits", "per-call-negative-int", "deep-decision"],
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
    h.graph.update_state(config, {"batch": (entry, other)}, as_node="approve")
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
        Command(update={"batch": (genuine, twin)}, resume="approve"), config, context=ctx
    )
    assert "__interrupt__" not in out
    assert h.calls.log == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_second_update_of_a_field_beside_an_answer_asked_again_is_refused_unsaved(
    mode: str,
) -> None:
    # The first update is still pending at the pause (its answer was asked again): a second
    # write of the same field in the next step would have two writers.
    h, config, ctx = paused_for_approval()
    batch = state_of(h, config).batch
    first = h.graph.invoke(Command(update={"batch": batch}, resume="yes"), config, context=ctx)
    assert interrupt_payload(first)["error"]["code"] == "unrecognized_answer"
    second = Command(update={"batch": batch}, resume="approve")
    with pytest.raises(fp.CommandRefused):
        if mode == "sync":
            h.graph.invoke(second, config, context=ctx)
        else:
            asyncio.run(h.graph.ainvoke(second, config, context=ctx))
    assert h.calls.log == []
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert h.calls.log == [("write_note", {"note": "a"}, "call-0001")]
