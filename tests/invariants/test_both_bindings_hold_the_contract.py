"""Invariants 1, 2, 3, 4, 6, 7 and 9, each written once and run against both bindings of the
contract (``tests/invariants/bindings.py``): fencepost's graph and ``create_agent`` with
``fp.FencepostMiddleware``."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from langchain_core.messages import AIMessage

import fencepost as fp
from tests.invariants.bindings import Binding
from tests.middleware.kit import SECRET, call, ctx


def _searches(start: int = 1) -> Iterator[AIMessage]:
    for n in itertools.count(start):
        yield call("search_logs", {"query": f"checkout 500 #{n}"}, n)


def _then_answer(*first: AIMessage) -> Iterator[AIMessage]:
    yield from first
    while True:
        yield AIMessage(content="checkout is down")


def test_1_a_model_that_never_stops_ends_step_budget_exhausted(binding: type[Binding]) -> None:
    b = binding(_searches(), steps=3, tools=50)
    out = b.start(ctx())
    assert out.termination == fp.TerminationReason.STEP_BUDGET_EXHAUSTED.value
    assert len(out.received) == 3


def test_2_an_unknown_tool_never_runs(binding: type[Binding]) -> None:
    b = binding(_then_answer(call("drop_tables", {}, 1)), steps=5, tools=5)
    out = b.start(ctx())
    assert out.bodies == []
    assert out.termination == fp.TerminationReason.INVALID_PROPOSAL.value


def test_2_a_call_the_principal_has_no_capability_for_never_runs(binding: type[Binding]) -> None:
    b = binding(_then_answer(call("write_note", {"note": "x"}, 1)), steps=5, tools=5)
    out = b.start(ctx("logs:read"))
    assert out.bodies == []
    assert out.termination == fp.TerminationReason.POLICY_DENIED.value


def test_2_an_unapproved_write_never_runs_in_terminate_mode(binding: type[Binding]) -> None:
    b = binding(_then_answer(call("write_note", {"note": "x"}, 1)), steps=5, tools=5)
    out = b.start(ctx())
    assert out.bodies == []
    assert out.termination == fp.TerminationReason.APPROVAL_REQUIRED.value


def test_3_with_n_calls_left_exactly_n_run(binding: type[Binding]) -> None:
    b = binding(_searches(), steps=50, tools=3)
    out = b.start(ctx())
    assert len(out.bodies) == 3
    assert out.termination == fp.TerminationReason.TOOL_BUDGET_EXHAUSTED.value


def test_4_the_budget_continues_across_an_approvals_resume(binding: type[Binding]) -> None:
    script = itertools.chain([call("write_note", {"note": "rollback"}, 1)], _searches(2))
    b = binding(script, steps=50, tools=2, approval="interrupt")
    assert b.start(ctx()).paused
    out = b.resume("approve", ctx())
    assert out.bodies == ["write_note:rollback", "search_logs:checkout 500 #2"]
    assert out.termination == fp.TerminationReason.TOOL_BUDGET_EXHAUSTED.value


def test_6_a_tools_exception_text_never_reaches_the_model(binding: type[Binding]) -> None:
    script = _then_answer(call("write_note", {"note": "rollback"}, 1))
    b = binding(script, steps=5, tools=5, approval="interrupt", failing_write=True)
    b.start(ctx())
    out = b.resume("approve", ctx())
    assert out.bodies == ["write_note:rollback"]
    assert all(SECRET not in repr(m) for turn in out.received for m in turn)
    assert out.termination == fp.TerminationReason.COMPLETED.value


def test_7_the_same_call_repeated_past_the_limit_ends_no_progress(binding: type[Binding]) -> None:
    same = (call("search_logs", {"query": "checkout"}, n) for n in itertools.count(1))
    b = binding(same, steps=50, tools=50, repeat_limit=2)
    out = b.start(ctx())
    assert len(out.bodies) == 2
    assert out.termination == fp.TerminationReason.NO_PROGRESS.value


def test_9_an_approved_write_runs_once_however_often_the_answer_is_sent(
    binding: type[Binding],
) -> None:
    b = binding(
        _then_answer(call("write_note", {"note": "pay"}, 1)), steps=5, tools=5, approval="interrupt"
    )
    b.start(ctx())
    b.resume("approve", ctx())
    out = b.resume("approve", ctx())
    assert out.bodies == ["write_note:pay"]
