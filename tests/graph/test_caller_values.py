"""What a caller writes into a paused run's channels, and what the next node reads of it.

A caller holding the thread's config can write any value to any channel (``update_state``, or
``Command(update=...)`` with the approval). ``state.load_state`` checks each value against its
field's type at every step (``type(v) is X``, no pydantic) and validates only when a check fails:

- a value of the field's type, or its JSON form (a server client's mapping, a string for an
  enum), is read as that type and written back typed; the run goes on;
- a value of no form of its field's type ends the run ``policy_denied`` (``invalid_state``), and
  the ended state reads back as an AgentState (pinned field by field below);
- a record (observations, receipts, repeat counts...) only grows, and only by values of its
  type: any other write is dropped, as an ``Overwrite`` is.

None of them raises out of ``invoke``, and no error text reaches state. Values a caller writes to
a fresh thread before its run begins (a stop, a terminal phase, any defaulted field) are reset at
the run's start; forged values sent with an approval never become the run's end.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import BaseMessage, RemoveMessage
from langgraph.types import Command, Send

import fencepost as fp
from fencepost.graph.record import StepWrite, plain
from fencepost.graph.state import MendedState, load_state
from fencepost.policy import Phase, StopReport, StopRequest, TerminationReason
from fencepost.policy.fingerprint import proposal_fingerprint
from tests.graph.kit import (
    budget,
    call,
    context,
    final_citing_last,
    harness,
    paused_for_approval,
    state_of,
    terminal_manifests,
    thread,
)
from tests.strategies import any_text, json_tree


def test_a_step_of_a_run_no_caller_wrote_to_reads_its_state_without_validating() -> None:
    # A checkpoint's record is validated once, as a whole, and the typed view kept with it.
    h, config, _ = paused_for_approval()
    values = h.graph.get_state(config).values
    state = load_state(values)
    assert type(state) is fp.AgentState
    # run_output adds the paused run's report (derived on the way out, never stored).
    assert state == fp.run_output(values).model_copy(update={"report": None})


def test_a_json_stop_a_server_client_writes_is_read_as_a_stop_and_written_back_typed() -> None:
    h, config, ctx = paused_for_approval()
    stop = {"reason": "cancelled", "error_code": "operator"}
    h.graph.update_state(config, {"run": {"stop": stop}}, as_node="decide")
    h.graph.invoke(None, config, context=ctx)
    values = h.graph.get_state(config).values
    state = fp.run_output(values)
    assert state.termination is TerminationReason.CANCELLED
    assert state.last_error_code == "operator"
    assert values["run"]["stop"] == {"reason": "cancelled", "error_code": "operator"}
    assert h.calls.count("write_note") == 0


def test_a_json_batch_is_routed_as_a_batch_and_the_approval_still_runs_it_once() -> None:
    # The routers read the batch before any node does, as the plain data the record holds.
    h, config, ctx = paused_for_approval()
    sent = [e.model_dump(mode="json") for e in state_of(h, config).batch]
    h.graph.update_state(config, {"run": {"batch": sent}}, as_node="decide")
    assert h.graph.get_state(config).values["run"]["batch"] == sent
    assert h.graph.get_state(config).next == ("approve",)
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1


def test_a_json_value_is_read_as_its_type_and_a_value_of_no_form_of_it_is_mended() -> None:
    h, config, ctx = paused_for_approval()
    values = dict(h.graph.get_state(config).values)
    values["run"] = {**values["run"], "phase": "decide", "repair_notes": ["note"]}
    state = load_state(values)
    assert type(state) is fp.AgentState
    assert (state.phase, state.repair_notes) == (Phase.DECIDE, ("note",))
    values["run"] = {**values["run"], "repairs": "2"}  # strict: a string is no count
    mended = load_state(values)
    assert isinstance(mended, MendedState) and mended.invalid
    assert mended.rewrite == ("repairs", "stop")
    assert mended.stop == StopRequest(
        reason=TerminationReason.POLICY_DENIED, error_code="invalid_state"
    )
    # Through the graph: the approve node refuses it, and the run ends typed, the value mended.
    h.graph.invoke(Command(update={"run": {"repairs": "2"}}, resume="approve"), config, context=ctx)
    assert h.graph.get_state(config).values["run"]["repairs"] == 0
    assert state_of(h, config).termination is TerminationReason.POLICY_DENIED
    assert h.calls.count("write_note") == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("observations", None),
        ("observations", "x"),
        ("observations", [1]),
        ("receipts", [{"call_id": "call-0001"}]),
        ("manifests", 5),
        ("proposals", {"a": 1}),
        ("fingerprints", None),
        ("fingerprints", {"k": "v"}),
        ("fingerprints", {"k": 2**64 - 1}),
        ("evidence", {"k": 1}),
        ("answered", [1]),
    ],
)
@pytest.mark.parametrize("how", ["command", "update_state"])
def test_a_write_a_record_cannot_hold_is_dropped_and_the_run_goes_on(
    field: str, value: Any, how: str
) -> None:
    # Taken as it is, each would raise out of the reducer (and, sent through a Command, out of
    # every later invoke of the thread), or be kept for the next node to raise on.
    untouched, config, ctx = paused_for_approval()
    expected = fp.run_output(untouched.graph.invoke(Command(resume="approve"), config, context=ctx))
    h, config, ctx = paused_for_approval()
    if how == "command":
        h.graph.invoke(
            Command(update={"run": {field: value}}, resume="approve"), config, context=ctx
        )
    else:
        h.graph.update_state(config, {"run": {field: value}}, as_node="decide")
        h.graph.invoke(Command(resume="approve"), config, context=ctx)
    state = state_of(h, config)
    assert state.termination is TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1
    # The record holds what the run made of it, nothing of the write.
    record, made = getattr(state, field), getattr(expected, field)
    if isinstance(made, dict):
        assert record.keys() == made.keys()
    else:
        assert len(record) == len(made)


@pytest.mark.parametrize("write", [{"repairs": None}, {"batch": "x"}, {"open_tasks": 5}])
async def test_the_async_graph_ends_a_run_given_an_invalid_value_the_same_way(
    write: dict[str, Any],
) -> None:
    h = harness([call("write_note", 1, note="a"), final_citing_last], approval="interrupt")
    config, ctx = thread(), context()
    await h.graph.ainvoke(fp.start("q", budget()), config, context=ctx)
    await h.graph.ainvoke(Command(update={"run": write}, resume="approve"), config, context=ctx)
    state = fp.run_output((await h.graph.aget_state(config)).values)
    assert state.termination is TerminationReason.POLICY_DENIED
    assert state.last_error_code == "invalid_state"
    assert h.calls.log == []


def test_an_invalid_batch_written_while_paused_ends_the_run_typed_and_a_goto_beside_is_refused() -> (
    None
):
    # A goto would run execute beside the approve node still waiting (two writers of one field
    # in one step): refused whole, nothing saved (graph.compiled). The update alone reaches the
    # approve node, which finds the batch invalid, does not act, and ends the run.
    h, config, ctx = paused_for_approval()
    with pytest.raises(fp.CommandRefused):
        h.graph.invoke(Command(update={"run": {"batch": "x"}}, goto="execute"), config, context=ctx)
    assert state_of(h, config).batch  # the paused batch, untouched
    h.graph.invoke(Command(update={"run": {"batch": "x"}}), config, context=ctx)
    state = state_of(h, config)
    assert state.termination is TerminationReason.POLICY_DENIED
    assert state.last_error_code == "invalid_state"
    assert h.calls.log == []


# -- any JSON a client can send, over any field --------------------------------------------------


def _answer_writing(h: Any, config: Any, ctx: fp.RunContext, update: dict[str, Any]) -> None:
    """Approve the paused call with ``update`` written beside the answer. An answer may not
    rewrite whose run it is (tests/features/test_approval_by_people.py): such an answer is
    refused with nothing saved, and its update then goes in as a command of its own, followed
    by the answer, so the run still meets the written values."""
    before = h.graph.get_state(config)
    try:
        h.graph.invoke(Command(update=update, resume="approve"), config, context=ctx)
    except fp.CommandRefused as refused:
        assert "whose run it is" in refused.why
        assert h.graph.get_state(config).config == before.config
        h.graph.invoke(Command(update=update), config, context=ctx)
        if h.graph.get_state(config).next == ("approve",):
            h.graph.invoke(Command(resume="approve"), config, context=ctx)


_json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | any_text(max_size=8)
    | st.sampled_from(["terminal", "decide", "completed", "cancelled", "call-0001", ""])
)
_json = json_tree(_json_leaf, max_leaves=6, keys=any_text(max_size=8))
_writes = st.dictionaries(
    st.sampled_from(sorted(fp.AgentState.model_fields)), _json, min_size=1, max_size=3
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(writes=_writes, how=st.sampled_from(["command", "update_state"]))
def test_any_json_written_over_any_fields_mid_run_ends_the_run_typed_and_readable(
    writes: dict[str, Any], how: str
) -> None:
    h, config, ctx = paused_for_approval()
    if how == "command":
        _answer_writing(h, config, ctx, {"run": writes})
    else:
        h.graph.update_state(config, {"run": writes}, as_node="decide")
        h.graph.invoke(None, config, context=ctx)
        if h.graph.get_state(config).next == ("approve",):
            h.graph.invoke(Command(resume="approve"), config, context=ctx)
    snapshot = h.graph.get_state(config)
    state = fp.run_output(snapshot.values)
    assert snapshot.next == ()
    assert state.is_terminal and state.termination is not None
    assert sum(1 for m in state.manifests if m.phase is Phase.TERMINAL) == 1
    assert h.calls.count("write_note") <= 1
    assert "validation" not in repr(snapshot.values).lower()


@pytest.mark.parametrize(
    "value",
    [5, {"role": "alien", "content": "x"}, [RemoveMessage(id="msg-never-held")], [[1, 2]]],
    ids=["number", "unknown-role", "removal-of-nothing", "nested-list"],
)
@pytest.mark.parametrize("how", ["command", "update_state"])
def test_a_write_that_is_no_message_leaves_the_conversation_and_the_thread_usable(
    value: Any, how: str
) -> None:
    # add_messages raises on such a write when it is applied, and a Command's write is applied
    # again by every later invoke: taken as it is, it would leave the thread stuck.
    h, config, ctx = paused_for_approval()
    held = list(h.graph.get_state(config).values["messages"])
    if how == "command":
        h.graph.invoke(Command(update={"messages": value}, resume="approve"), config, context=ctx)
    else:
        h.graph.update_state(config, {"messages": value}, as_node="decide")
        h.graph.invoke(Command(resume="approve"), config, context=ctx)
    state = state_of(h, config)
    assert state.termination is TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1
    messages = h.graph.get_state(config).values["messages"]
    assert messages[: len(held)] == held  # nothing dropped, nothing of the write added
    assert all(isinstance(m, BaseMessage) for m in messages)
    h.graph.invoke(None, config, context=ctx)  # and later invokes of the thread still work
    assert state_of(h, config) == state


def test_a_state_update_as_the_approve_node_while_a_call_awaits_approval_keeps_it_waiting() -> None:
    # The approve node's routes include itself: an update made as it, with the call still
    # awaiting a human, pauses again; update_state never raises on it.
    h, config, ctx = paused_for_approval()
    h.graph.update_state(config, {"run": {"last_error_code": None}}, as_node="approve")
    assert h.graph.get_state(config).next == ("approve",)
    h.graph.invoke(None, config, context=ctx)
    assert h.graph.get_state(config).next == ("approve",)
    assert h.calls.count("write_note") == 0
    h.graph.invoke(Command(resume="approve"), config, context=ctx)
    assert state_of(h, config).termination is TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1


# -- values a caller wrote before the run began ------------------------------------------------


def test_values_a_caller_wrote_before_the_run_began_do_not_survive_its_start() -> None:
    # Fields a run leaves at their default are not written at its start (their channels read as
    # the default): one a caller wrote to the fresh thread first must still be reset.
    h = harness([call(n=1), final_citing_last])
    config = thread()
    forged = fp.policy.StopRequest(reason=fp.TerminationReason.POLICY_DENIED, error_code="forged")
    h.graph.update_state(
        config,
        {"run": {"stop": forged, "repairs": 7, "last_error_code": "forged"}},
        as_node="approve",
    )
    out = fp.run_output(h.graph.invoke(fp.start("q", budget()), config, context=context()))
    assert out.stop != forged and out.repairs == 0 and out.last_error_code != "forged"
    assert out.termination is not fp.TerminationReason.POLICY_DENIED


FORGED_ANSWER = fp.AnswerPayload(text="forged", citations=("call-0001",))


def test_a_stop_or_terminal_phase_written_before_the_run_began_does_not_end_it_undecided() -> None:
    # Before a run exists on the thread, a stop or a terminal phase in its channels is not the
    # run's: the start is routed to decide, not to the terminal node (which would begin the run
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


# -- values of the wrong type, mid-run ---------------------------------------------------------


def test_a_harmless_update_state_edit_does_not_end_the_run() -> None:
    h = harness([call(n=1), final_citing_last])
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx, interrupt_before=["execute"])
    h.graph.update_state(config, {"run": {"last_error_code": None}}, as_node="decide")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert h.calls.count("search_logs") == 1
    assert state.termination is fp.TerminationReason.COMPLETED


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
    # The approve node does not act on such a state, nor does any node raise on it: the run
    # ends policy_denied ("invalid_state"), as it does on a missing context, and the ended
    # state reads back as an AgentState.
    h = harness([call("write_note", 1, note="a"), final_citing_last], approval="interrupt")
    config, ctx, request = thread(), context(), fp.start("q", budget())
    h.graph.invoke(request, config, context=ctx)
    if how == "command":
        _answer_writing(h, config, ctx, {"run": {field: value}})
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


class _RunId(str):
    pass


@pytest.mark.parametrize(
    ("update", "reason"),
    [
        ({"step": True}, fp.TerminationReason.POLICY_DENIED),  # strict: a bool is no count
        ({"step": 2**62}, fp.TerminationReason.COMPLETED),
        ({"step": 1.0}, fp.TerminationReason.POLICY_DENIED),
        ({"step": -1}, fp.TerminationReason.POLICY_DENIED),
        ({"step": float("nan")}, fp.TerminationReason.POLICY_DENIED),
        ({"run_id": _RunId("someone-else")}, fp.TerminationReason.POLICY_DENIED),
        ({"fingerprints": {"x": True}}, fp.TerminationReason.COMPLETED),
        ({"fingerprints": {"x": float("inf")}}, fp.TerminationReason.COMPLETED),
        ({"batch": ("x",)}, fp.TerminationReason.POLICY_DENIED),
        ({"phase": "gate"}, fp.TerminationReason.POLICY_DENIED),
        (
            {"budget": fp.RuntimeBudget(steps_remaining=2**62, tool_calls_remaining=2**62)},
            fp.TerminationReason.COMPLETED,
        ),
    ],
    ids=repr,
)
def test_an_update_of_the_wrong_type_at_resume_ends_the_run_with_a_typed_reason(
    update: dict[str, Any], reason: fp.TerminationReason
) -> None:
    # A value is read as its field's type in its plain (JSON) form, strictly: one of another
    # type ends the run typed; the write ran at most once.
    h, config, ctx = paused_for_approval()
    h.graph.invoke(Command(resume="approve", update={"run": update}), config, context=ctx)
    assert state_of(h, config).termination is reason
    assert h.calls.count("write_note") <= 1


# A record made without validation (``model_construct``) is recorded as its plain form and judged
# by it: a str where a count belongs ends the run typed; a bool pydantic's serializer writes as
# the int it stands for (1) is a count, and the run goes on (the ledger holds the budget).
@pytest.mark.parametrize(
    ("budget", "reason"),
    [
        (
            fp.RuntimeBudget.model_construct(steps_remaining="5", tool_calls_remaining=4),
            fp.TerminationReason.POLICY_DENIED,
        ),
        (
            fp.RuntimeBudget.model_construct(steps_remaining=True, tool_calls_remaining=4),
            fp.TerminationReason.COMPLETED,
        ),
    ],
    ids=["str", "bool"],
)
def test_a_budget_view_written_whole_with_fields_of_another_type_ends_the_run_typed(
    budget: fp.RuntimeBudget, reason: fp.TerminationReason
) -> None:
    h, config, ctx = paused_for_approval()
    h.graph.invoke(
        Command(resume="approve", update={"run": {"budget": budget}}), config, context=ctx
    )
    assert state_of(h, config).termination is reason
    assert h.calls.count("write_note") == (1 if reason is fp.TerminationReason.COMPLETED else 0)


@pytest.mark.parametrize(
    "written",
    [
        {
            "run": {
                "stop": StopRequest.model_construct(reason="completed", error_code=5, answer=None)
            }
        },
        {"run": {"report": StopReport.model_construct(reason=7)}},
    ],
    ids=["stop", "report"],
)
def test_a_record_written_whole_with_fields_of_another_type_ends_the_run_typed(
    written: dict[str, Any],
) -> None:
    h, config, ctx = paused_for_approval()
    h.graph.invoke(Command(resume="approve", update=written), config, context=ctx)
    assert state_of(h, config).termination is fp.TerminationReason.POLICY_DENIED
    assert h.calls.count("write_note") == 0


# -- updates in forms the command checks could not read ------------------------------------------


class _AnnotatedUpdate:
    """An update LangGraph reads by its class's annotations: here a channel that is a goto."""

    __annotations__ = {"branch:to:execute": object}


setattr(_AnnotatedUpdate, "branch:to:execute", None)


class _TwoFaced(dict[str, Any]):
    """A map whose keys name the record, and whose ``items`` (what LangGraph reads) a goto."""

    def items(self) -> Any:
        return [("branch:to:execute", None)]


@pytest.mark.parametrize("update", [_AnnotatedUpdate(), "run"], ids=["annotated-object", "bare"])
@pytest.mark.parametrize("how", ["command", "update_state"])
def test_an_update_in_a_form_the_checks_cannot_read_is_refused_before_anything_is_saved(
    update: Any, how: str
) -> None:
    # Before: taken. The annotated one scheduled execute beside the waiting approval: the two
    # ran in one step, then decide beside execute, and the approved write never ran (the run
    # ended ``failed``).
    h, config, ctx = paused_for_approval()
    before = h.graph.get_state(config)
    with pytest.raises(fp.CommandRefused):
        if how == "command":
            h.graph.invoke(Command(update=update), config, context=ctx)
        else:
            h.graph.update_state(config, update, as_node="decide")
    assert h.graph.get_state(config).config == before.config
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED
    assert h.calls.log == [("write_note", {"note": "a"}, "call-0001")]


def test_a_map_whose_items_name_other_channels_than_its_keys_is_taken_as_the_map_it_holds() -> None:
    h, config, ctx = paused_for_approval()
    command = Command(update=_TwoFaced(run={}), resume="approve")
    state = fp.run_output(h.graph.invoke(command, config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED
    assert h.calls.log == [("write_note", {"note": "a"}, "call-0001")]


@pytest.mark.parametrize(
    "goto", ["execute", "terminal", Send("execute", {})], ids=["execute", "terminal", "send"]
)
def test_a_state_update_carrying_a_command_is_checked_as_one_given_to_invoke(goto: Any) -> None:
    # Before: taken. A goto ran its node beside the waiting approval; a Send fed execute an
    # input of its own, and every later invoke of the thread raised RuntimeError.
    h, config, ctx = paused_for_approval()
    before = h.graph.get_state(config)
    with pytest.raises(fp.CommandRefused):
        h.graph.update_state(config, Command(goto=goto))
    assert h.graph.get_state(config).config == before.config
    state = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert state.termination is TerminationReason.COMPLETED
    assert h.calls.log == [("write_note", {"note": "a"}, "call-0001")]


@pytest.mark.parametrize("how", ["command", "update_state"])
def test_a_nodes_write_handed_back_by_a_stream_is_judged_as_a_callers(how: str) -> None:
    # ``stream_mode="updates"`` hands the caller each node's own write (a StepWrite, still
    # alive, so still "own" by identity): edited and written back, it was applied unchecked,
    # a repeat count of text raised TypeError out of the reducer and a malformed observation
    # stayed in the record for good.
    h = harness([call("write_note", 1, note="a"), final_citing_last], approval="interrupt")
    config, ctx = thread(), context()
    writes = [
        update["run"]
        for chunk in h.graph.stream(
            fp.start("q", budget()), config, context=ctx, stream_mode="updates"
        )
        for update in chunk.values()
        if isinstance(update, dict) and isinstance(update.get("run"), StepWrite)
    ]
    handed = writes[0]
    handed["fingerprints"] = {"a-repeat": "many"}
    handed["observations"] = [{"call_id": 5}]
    if how == "command":
        h.graph.invoke(Command(update={"run": handed}, resume="approve"), config, context=ctx)
    else:
        h.graph.update_state(config, {"run": handed}, as_node="decide")
        h.graph.invoke(Command(resume="approve"), config, context=ctx)
    state = state_of(h, config)
    assert state.termination is TerminationReason.COMPLETED
    assert "a-repeat" not in state.fingerprints
    assert [o.call_id for o in state.observations] == ["call-0001"]
    assert h.calls.log == [("write_note", {"note": "a"}, "call-0001")]


def test_records_a_caller_wrote_before_the_run_began_do_not_survive_its_start() -> None:
    # Its replaced fields were reset at the start, its records were not: an observation planted
    # on the fresh thread stayed in the run, the first result of the call id the model then
    # used, read by a call that depended on it.
    h = harness([call("search_logs", 1), final_citing_last])
    config = thread()
    planted = fp.policy.Observation(
        sequence=0, call_id="call-0001", tool_name="search_logs", kind="tool_result", result="x"
    )
    receipt = fp.Receipt(
        call_id="call-0009", tool_name="search_logs", status=fp.ReceiptStatus.COMPLETED
    )
    written = {
        "observations": (planted,),
        "receipts": (receipt,),
        "fingerprints": {"a-repeat": 3},
        "answered": {"call-0001": 1},
        "evidence": {"call-0001": "planted"},
    }
    h.graph.update_state(config, {"run": written}, as_node="decide")
    state = fp.run_output(h.graph.invoke(fp.start("q", budget()), config, context=context()))
    assert state.termination is TerminationReason.COMPLETED
    assert h.calls.count("search_logs") == 1  # not skipped as answered
    assert [o.result for o in state.observations] != ["x"]
    assert [o.call_id for o in state.observations] == ["call-0001"]
    assert [r.call_id for r in state.receipts] == ["call-0001"]
    assert "a-repeat" not in state.fingerprints
    assert state.evidence.get("call-0001") != "planted"
