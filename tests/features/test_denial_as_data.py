"""Per graph, a capability or semantic denial ends the run (the default) or is data: the denied
call gets an observation with a safe code and a ``denied`` receipt, never runs, reserves
nothing, and the run goes on; the same call denied past its repeat limit is no progress."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.types import Command

import fencepost as fp
from fencepost.policy import VerdictCode
from tests.graph.kit import budget, call, context, final_citing_last, harness, thread

ABSTAIN = fp.AbstainProposal(reason="insufficient_evidence")


def _denied_then_search() -> list[Any]:
    return [call("admin_reset", n=1), call(n=2), final_citing_last]


def test_a_capability_denial_ends_the_run_by_default_and_nothing_runs() -> None:
    h = harness(_denied_then_search())
    state = h.run()
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert h.calls.log == []


def test_a_capability_denial_is_an_observation_and_the_run_goes_on_when_denials_are_data() -> None:
    h = harness(_denied_then_search(), denial="observe")
    state = h.run()
    assert state.termination is fp.TerminationReason.COMPLETED
    assert [name for name, _, _ in h.calls.log] == ["search_logs"]
    denied = state.observations[0]
    assert (denied.call_id, denied.kind) == ("call-0001", "tool_error")
    assert denied.error_code is fp.ErrorCode.PERMISSION_DENIED
    receipt = state.receipts[0]
    assert (receipt.status, receipt.rule) == (fp.ReceiptStatus.DENIED, "capability_denied")
    assert receipt.attempts == 0
    assert state.budget.tool_calls_used == 1  # the denied call reserved nothing
    [gated] = [m for m in state.manifests if m.verdict is VerdictCode.CAPABILITY_DENIED]
    assert (gated.outcome, gated.code) == ("denied", "capability_denied")


def test_a_semantic_denial_is_an_observation_naming_the_rule() -> None:
    h = harness([call(n=1, query="*"), call(n=2), final_citing_last], denial="observe")
    state = h.run()
    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.observations[0].error_code is fp.ErrorCode.INVALID_ARGUMENT
    assert state.receipts[0].rule == "empty_query"
    assert h.calls.count("search_logs") == 1


def test_in_a_batch_the_denied_call_is_observed_and_the_others_run() -> None:
    batch = fp.ToolBatch(calls=(call("admin_reset", n=1), call(n=2)))
    h = harness([batch, final_citing_last], denial="observe")
    state = h.run()
    assert state.termination is fp.TerminationReason.COMPLETED
    assert [name for name, _, _ in h.calls.log] == ["search_logs"]
    assert {r.call_id: r.status for r in state.receipts} == {
        "call-0001": fp.ReceiptStatus.DENIED,
        "call-0002": fp.ReceiptStatus.COMPLETED,
    }


def test_a_call_that_depends_on_a_denied_call_never_runs() -> None:
    dependent = fp.ToolProposal(
        call_id="call-0002",
        tool_name="search_logs",
        arguments={"query": "after reset"},
        depends_on=("call-0001",),
    )
    batch = fp.ToolBatch(calls=(call("admin_reset", n=1), dependent))
    h = harness([batch, ABSTAIN], denial="observe")
    state = h.run()
    assert h.calls.log == []
    assert {r.call_id: r.error_code for r in state.receipts} == {
        "call-0001": fp.ErrorCode.PERMISSION_DENIED,
        "call-0002": fp.ErrorCode.DEPENDENCY_FAILED,
    }


def test_the_same_call_denied_past_its_repeat_limit_ends_no_progress_before_any_spend() -> None:
    script = [call("admin_reset", n=n) for n in range(1, 5)]
    h = harness(script, denial="observe", repeat_limit=2)
    state = h.run(steps=8)
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    assert h.calls.log == []
    assert len(state.observations) == 2  # two denials observed, the third is no progress
    assert state.budget.tool_calls_used == 0


def test_a_denial_beside_a_write_waiting_for_a_human_is_observed_and_the_write_still_waits() -> (
    None
):
    batch = fp.ToolBatch(calls=(call("admin_reset", n=1), call("write_note", n=2, note="x")))
    h = harness([batch, ABSTAIN], denial="observe", approval="interrupt")
    config = thread()
    paused = h.graph.invoke(fp.start("q", budget()), config, context=context())
    assert "__interrupt__" in paused
    assert [o.call_id for o in fp.run_output(paused).observations] == ["call-0001"]
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=context()))
    assert [name for name, _, _ in h.calls.log] == ["write_note"]
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE


KINDS = ("ok", "no_capability", "empty_query")


def _proposal(kind: str, n: int) -> fp.ToolProposal:
    if kind == "ok":
        return call(n=n, query=f"checkout {n % 3}")
    if kind == "no_capability":
        return call("admin_reset", n=n)
    return call(n=n, query="")


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=30)
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=6))
def test_with_denials_as_data_a_denied_call_never_runs_and_every_run_ends_typed(
    kinds: list[str],
) -> None:
    script: list[Any] = [_proposal(k, n) for n, k in enumerate(kinds, start=1)]
    script.append(ABSTAIN)
    h = harness(script, denial="observe")
    state = h.run(steps=len(script) + 2, tools=len(script))
    assert state.termination is not None
    assert h.calls.count("admin_reset") == 0
    assert all(args["query"] not in ("", "*") for _, args, _ in h.calls.log)
    assert state.budget.tool_calls_used == len(h.calls.log)
    # Each denial observed is receipted denied, never as run.
    for r in state.receipts:
        if r.tool_name == "admin_reset":
            assert r.status is fp.ReceiptStatus.DENIED and r.attempts == 0
