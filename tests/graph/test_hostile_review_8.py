"""Hostile review of bf590b9..d7f8990 (graph half): the gate step's manifests assembled without
validation (``checked_manifest``), the batch reserved with the gate's fields written once, and
what a caller's ``Command(update=...)`` of the wrong type does to a run.

Seats: a caller who can send any update (values of the wrong type, a budget view written whole,
a bool where an int is, a str-subclass run id, NaN, huge ints); the process itself (a decision
model handing over records it built without validation). The policy half is
tests/policy/test_hostile_review_8.py, the adapter half tests/adapters/test_hostile_review_8.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Command

import fencepost as fp
from fencepost.graph.account import open_run
from fencepost.graph.gate import gate
from fencepost.graph.node_io import SyncIO, drive
from fencepost.graph.record import plain
from fencepost.policy import StepManifest, StopReport, StopRequest
from tests.graph.kit import (
    context,
    loop_settings,
    mid_run_state,
    paused_for_approval,
    state_of,
)


class _Name(str):
    """A tool name a decision model built without validation: equal to a registered name."""

    def __repr__(self) -> str:
        return "lie"


def _gated(*calls: fp.ToolProposal) -> tuple[fp.AgentState, list[StepManifest]]:
    cfg = loop_settings()
    io, ctx = SyncIO(cfg), context()
    opened = drive(open_run(io, mid_run_state(step=1), ctx))
    assert isinstance(opened, fp.AgentState)
    out: tuple[fp.AgentState, list[StepManifest]] = drive(gate(io, opened, ctx, calls, {}))
    return out


def _validated(m: StepManifest) -> StepManifest:
    return StepManifest.model_validate(m.model_dump(exclude_unset=True))


def test_a_gate_manifest_names_its_tool_as_a_plain_str_whatever_the_model_handed_in() -> None:
    # A DecisionModel's records are not validated again (accept_decision takes the instance):
    # bf590b9's validated manifest turned a str-subclass name into a str; the assembled one
    # kept the subclass (its repr, its attributes) in the trace record.
    proposal = fp.ToolProposal.model_construct(
        call_id="call-0001", tool_name=_Name("search_logs"), arguments={"query": "q"}
    )
    _, manifests = _gated(proposal)
    assert [type(m.tool_name) for m in manifests] == [str]
    assert manifests[0].tool_name == "search_logs"


@pytest.mark.parametrize(
    "calls",
    [
        (("search_logs", {"query": "q"}),),
        (("search_logs", {"query": "q"}), ("search_logs", {"query": "q"})),  # a repeat
        (("nope", {}),),  # unknown
        (("search_logs", {"query": 5}),),  # schema
        (("search_logs", {"query": "a"}), ("write_note", {"note": "n"})),  # needs approval
        tuple(("search_logs", {"query": f"q{n}"}) for n in range(6)),  # past the budget
    ],
    ids=["one", "repeat", "unknown", "schema", "approval", "over-budget"],
)
def test_the_gate_steps_records_are_what_validation_makes_and_survive_a_checkpoint(
    calls: tuple[tuple[str, dict[str, Any]], ...],
) -> None:
    batch = tuple(
        fp.ToolProposal(call_id=f"call-{n:04d}", tool_name=t, arguments=a)
        for n, (t, a) in enumerate(calls)
    )
    state, manifests = _gated(*batch)
    serde = JsonPlusSerializer()
    for m in manifests:
        again = _validated(m)
        assert m == again and m.model_fields_set == again.model_fields_set
        assert list(m.__dict__) == list(again.__dict__)
        revived = StepManifest.model_validate(serde.loads_typed(serde.dumps_typed(plain(m))))
        assert revived == m and type(revived) is StepManifest
    whole = fp.AgentState.model_validate(state.model_dump())
    assert whole == state
    revived_state = fp.AgentState.model_validate(serde.loads_typed(serde.dumps_typed(plain(state))))
    assert revived_state == state


# === a caller's update of the wrong type =========================================================


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
