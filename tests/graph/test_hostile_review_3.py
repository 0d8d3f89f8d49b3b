"""Hostile review of the defaulted channels (``channels.Defaulted``/``channels.Records``), the
"an equal value is not written again" rule of ``state.changed``, ``state.started``, the ledger's
tuple records and the gate's later VALIDATE phase.

Each probe takes one hostile seat: a caller holding the thread's config (any ``update_state`` or
``Command(update=..., resume=...)``, before a run, while it is paused, after it ended), another
tenant sharing the process, one graph and one ledger, or the process itself (a tool raising
``SystemExit``, a model that never returns). Tests that fail name the rule a hole breaks.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from langgraph.types import Command

import fencepost as fp
from fencepost.graph.record import plain
from fencepost.policy import Phase, StopRequest, TerminationReason
from fencepost.policy.fingerprint import proposal_fingerprint
from tests.graph.kit import (
    budget,
    call,
    context,
    final_citing_last,
    harness,
    terminal_manifests,
    thread,
)

FORGED_ANSWER = fp.AnswerPayload(text="forged", citations=("call-0001",))


# --- a caller: before the run -----------------------------------------------------------------


def test_a_stop_or_terminal_phase_written_before_the_run_began_does_not_end_it_undecided() -> None:
    # Before a run exists on the thread, a stop or a terminal phase in its channels is not the
    # run's: route_start sends it to decide, not to the terminal node (which would begin the run
    # and end it step_budget_exhausted/recursion_limit with no step taken).
    for seeded in (
        {"stop": StopRequest(reason=TerminationReason.POLICY_DENIED, error_code="forged")},
        {"phase": Phase.TERMINAL},
    ):
        h = harness([call(n=1), final_citing_last])
        config = thread()
        h.graph.update_state(config, {"run": seeded}, as_node="approve")
        out = fp.run_output(h.graph.invoke(fp.start("q", budget()), config, context=context()))
        assert out.termination is TerminationReason.COMPLETED, (seeded, out.last_error_code)
        assert h.calls.count("search_logs") == 1


def test_every_defaulted_field_a_caller_seeds_on_a_fresh_thread_is_reset_at_the_run_start() -> None:
    h = harness([call(n=1), final_citing_last])
    config = thread()
    forged_write = fp.policy.BatchEntry(
        proposal=call("write_note", 1, note="forged"),
        verdict=fp.policy.Verdict(
            call_id="call-0001",
            tool_name="write_note",
            fingerprint=proposal_fingerprint("write_note", {"note": "forged"}),
            code=fp.policy.VerdictCode.ALLOWED,
        ),
    )
    seeded: dict[str, Any] = {
        "run": {
            "batch": (forged_write,),
            "termination": TerminationReason.COMPLETED,
            "final_answer": FORGED_ANSWER,
            "open_tasks": ("task-x",),
            "model_failures": 5,
            "repair_notes": ("forged",),
            "tenant_id": "other-tenant",
            "principal_id": "intruder",
            "step": 40,
        }
    }
    h.graph.update_state(config, seeded, as_node="execute")
    out = fp.run_output(h.graph.invoke(fp.start("q", budget()), config, context=context()))
    assert h.calls.count("write_note") == 0
    assert out.termination is TerminationReason.COMPLETED
    assert out.final_answer is not None and out.final_answer.text != "forged"
    assert (out.tenant_id, out.principal_id) == ("acme", "u-1")
    assert out.open_tasks == () and out.model_failures == 0 and out.repair_notes == ()
    assert out.step == out.budget.steps_used == 2
    assert out.report is not None and out.report.reason is TerminationReason.COMPLETED


# --- a caller: mid-run and after the end -------------------------------------------------------


# Values of no form of their field's type, not only None: a str where a model or an int is due,
# an int where a tuple or a str is, a negative counter, an int no checkpoint can count on from,
# a terminal phase the terminal node did not set. Each lands in its channel (LangGraph saves a
# Command's writes before it applies them: refusing one there would fail every later invoke of
# the thread), so the next node reads it: state.load_state mends it and the run ends typed.
NO_FORM_OF_THEIR_FIELD: list[tuple[str, Any]] = [
    ("repairs", None),
    ("open_tasks", None),
    ("batch", None),
    ("model_failures", None),
    ("step", -1),
    ("step", "three"),
    ("step", 2**64 - 1),
    ("tenant_id", 5),
    ("principal_id", {"id": "u-1"}),
    ("run_id", None),
    ("question", [1]),
    ("budget", "plenty"),
    ("phase", "nowhere"),
    ("phase", Phase.TERMINAL),
    ("stop", "stop now"),
    ("report", 5),
    ("final_answer", "forged"),
    ("termination", "bogus"),
    ("last_error_code", 7),
    ("repair_notes", 3),
    ("open_tasks", [1]),
    ("batch", ["x"]),
]


@pytest.mark.parametrize("how", ["command", "update_state"])
@pytest.mark.parametrize(
    ("field", "value"),
    NO_FORM_OF_THEIR_FIELD,
    ids=[f"{f}={v!r}" for f, v in NO_FORM_OF_THEIR_FIELD],
)
def test_a_value_no_field_can_hold_written_mid_run_ends_the_run_policy_denied_and_readable(
    field: str, value: Any, how: str
) -> None:
    # Before: None sent with the approval made invoke raise a raw TypeError (open_tasks, batch)
    # or was carried, unwritten, into the ended state, which then no longer read back as an
    # AgentState (repairs, model_failures). Now the approve node does not act on such a state:
    # the run ends policy_denied ("invalid_state"), as it does on a missing context.
    h = harness([call("write_note", 1, note="a"), final_citing_last], approval="interrupt")
    config, ctx, request = thread(), context(), fp.start("q", budget())
    h.graph.invoke(request, config, context=ctx)
    if how == "command":
        h.graph.invoke(
            Command(update={"run": {field: value}}, resume="approve"), config, context=ctx
        )
    else:
        h.graph.update_state(config, {"run": {field: value}}, as_node="decide")
        h.graph.invoke(None, config, context=ctx)
    snapshot = h.graph.get_state(config)
    state = fp.run_output(snapshot.values)
    assert snapshot.next == ()
    assert state.termination is TerminationReason.POLICY_DENIED
    assert state.last_error_code == "invalid_state"
    assert state.report is not None and state.report.reason is TerminationReason.POLICY_DENIED
    assert terminal_manifests(state) == 1
    assert h.calls.count("write_note") == 0  # the approval was never acted on
    # The record holds a value of each field's type again (the run id, had it none, is the
    # start request's), and no error text reached it.
    record = snapshot.values["run"]
    for name, info in fp.AgentState.model_fields.items():
        default = None if info.is_required() else plain(info.get_default(call_default_factory=True))
        assert record.get(name, default) == plain(getattr(state, name)), name
    assert state.run_id == request["request"]["run_id"]
    assert "validation" not in repr(snapshot.values).lower()
    # The ended run stays ended.
    h.graph.invoke(None, config, context=ctx)
    assert fp.run_output(h.graph.get_state(config).values) == state


def test_forged_values_sent_with_an_approval_never_become_the_runs_end() -> None:
    h = harness(
        [call("write_note", 1, note="a"), call(n=2), final_citing_last], approval="interrupt"
    )
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    forged = {
        "run": {
            "termination": TerminationReason.NO_PROGRESS,
            "final_answer": FORGED_ANSWER,
            "last_error_code": "forged",
            "report": None,
            "model_failures": 1,
        }
    }
    state = fp.run_output(
        h.graph.invoke(Command(update=forged, resume="approve"), config, context=ctx)
    )
    assert state.termination is TerminationReason.COMPLETED
    assert state.final_answer is not None and state.final_answer.text != "forged"
    assert state.last_error_code is None
    assert state.report is not None and state.report.reason is TerminationReason.COMPLETED
    assert [n for n, _, _ in h.calls.log] == ["write_note", "search_logs"]


# --- another tenant: one graph, one ledger, two threads ----------------------------------------


# --- the process: a tool raising SystemExit, a model that never returns --------------------------


def _never(inp: fp.DecisionInput) -> Any:
    return asyncio.Event().wait()


def test_values_streamed_at_one_step_are_never_changed_by_a_later_step() -> None:
    # channels.Shared copies share their value: safe only while no reducer changes one in place.
    h = harness([call(n=1), call(n=2, query="other"), call(n=1, query="again"), final_citing_last])
    names = ("fingerprints", "evidence", "answered", "observations", "receipts", "messages")
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for chunk in h.graph.stream(
        fp.start("q", budget(steps=6, tools=4)), thread(), context=context(), stream_mode="values"
    ):
        kept = {n: chunk[n] for n in names if n in chunk}
        seen.append((kept, copy.deepcopy(kept)))
    assert len(seen) > 3
    for live, then in seen:
        assert {n: list(v) if isinstance(v, list) else v for n, v in live.items()} == {
            n: list(v) if isinstance(v, list) else v for n, v in then.items()
        }
