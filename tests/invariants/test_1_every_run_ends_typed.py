"""Invariant 1: every path ends in exactly one TerminationReason, and nothing escapes ``invoke``.
Here: a human's answer no checkpoint can hold is refused as data before anything is written."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.types import Command

import fencepost as fp
from tests.graph.kit import (
    LEDGERS,
    VERDICT_KEY,
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
