"""The gate step's records are what validation would make: its manifests are assembled from
checked values (never from a value of another type), and a batch reserved call by call leaves
the budget view of its last reservation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import ValidationError

import fencepost as fp
from fencepost.graph.account import open_run
from fencepost.graph.gate import gate
from fencepost.graph.node_io import SyncIO, drive
from fencepost.graph.record import plain
from fencepost.graph.trace import checked_manifest, manifest
from fencepost.policy import Phase, StepManifest, VerdictCode
from fencepost.policy.effect import Effect
from tests.graph.kit import (
    context,
    loop_settings,
    mid_run_state,
)
from tests.records import assert_same_record

fields = st.fixed_dictionaries(
    {},
    optional={
        "decision_kind": st.sampled_from(["tool", "final", "abstain", "invalid", None]),
        "tool_name": st.none() | st.text(max_size=8),
        "effect": st.none() | st.sampled_from(list(Effect)),
        "verdict": st.none() | st.sampled_from(list(VerdictCode)),
        "code": st.none() | st.text(max_size=8),
        "input_tokens": st.none() | st.integers(0, 10**6),
        "output_tokens": st.none() | st.integers(0, 10**6),
    },
)


CFG = loop_settings()


@settings(max_examples=200, deadline=None)
@given(
    given_fields=fields,
    step=st.integers(0, 50),
    phase=st.sampled_from(list(Phase)),
    outcome=st.sampled_from(["allowed", "denied", "approval_pending"]),
    deadline=st.booleans(),
)
def test_a_gate_manifest_is_what_validation_makes(
    given_fields: dict[str, Any], step: int, phase: Phase, outcome: str, deadline: bool
) -> None:
    ctx = context(seconds=30 if deadline else None)
    state = mid_run_state(step)
    ours = checked_manifest(state, CFG, ctx, phase=phase, outcome=outcome, **given_fields)
    theirs = manifest(state, CFG, ctx, phase=phase, outcome=outcome, **given_fields)
    if ours.deadline_remaining_ms is not None:  # the clock moved between the two
        theirs = StepManifest.model_validate(
            theirs.model_dump(exclude_unset=True)
            | {"deadline_remaining_ms": ours.deadline_remaining_ms}
        )
    assert_same_record(ours, theirs)


@pytest.mark.parametrize(
    "state",
    [
        # A budget view a caller wrote whole (a channel checks only its type), and a state whose
        # step is no count: the manifest is still validated, and refuses them.
        mid_run_state().model_copy(
            update={
                "budget": fp.RuntimeBudget.model_construct(
                    steps_remaining="5", tool_calls_remaining=4
                )
            }
        ),
        mid_run_state().model_copy(
            update={"budget": mid_run_state().budget.model_copy(update={"tokens_used": 1.5})}
        ),
        mid_run_state().model_copy(update={"step": -1}),
        mid_run_state().model_copy(update={"run_id": 7}),
    ],
)
def test_a_gate_manifest_of_a_value_of_another_type_is_refused(state: fp.AgentState) -> None:
    with pytest.raises(ValidationError):
        checked_manifest(state, CFG, context(), phase=Phase.VALIDATE, outcome="allowed")


def test_a_gate_manifest_refuses_a_key_no_manifest_has() -> None:
    with pytest.raises(ValidationError):
        checked_manifest(
            mid_run_state(), CFG, context(), phase=Phase.VALIDATE, outcome="allowed", prompt="x"
        )
    with pytest.raises(ValidationError):
        checked_manifest(mid_run_state(), CFG, context(), phase=Phase.VALIDATE, outcome="nonsense")


@pytest.mark.parametrize("calls", [1, 2, 3, 5])
def test_a_reserved_batch_leaves_the_budget_of_its_last_reservation(calls: int) -> None:
    cfg = loop_settings()
    io, ctx = SyncIO(cfg), context()
    opened = drive(open_run(io, mid_run_state(step=1, tool_calls_remaining=3), ctx))
    assert isinstance(opened, fp.AgentState)
    batch = tuple(
        fp.ToolProposal(
            call_id=f"call-{n:04d}", tool_name="search_logs", arguments={"query": f"q {n}"}
        )
        for n in range(calls)
    )
    state, manifests = drive(gate(io, opened, ctx, batch, {}))
    assert len(manifests) == calls
    from fencepost.graph.account import account_of

    held = cfg.ledger.balance(account_of(state))
    assert held.held.get("tool_calls", 0.0) == min(calls, 3)
    assert state.budget.tool_calls_used == min(calls, 3)
    assert state.budget.tool_calls_remaining == 3 - min(calls, 3)
    codes = [e.verdict.code for e in state.batch]
    assert codes.count(VerdictCode.ALLOWED) == min(calls, 3)
    assert codes.count(VerdictCode.BUDGET_EXHAUSTED) == max(0, calls - 3)


def test_a_batch_refused_by_a_closed_account_still_records_the_gated_batch() -> None:
    # The reservation's stop returns the state the gate made: its batch, phase and counts.
    from fencepost.graph.account import account_of

    cfg = loop_settings()
    io, ctx = SyncIO(cfg), context()
    opened = drive(open_run(io, mid_run_state(step=1), ctx))
    assert isinstance(opened, fp.AgentState)
    cfg.ledger.close_account(account_of(opened), "cancelled")
    proposal = fp.ToolProposal(
        call_id="call-0001", tool_name="search_logs", arguments={"query": "q"}
    )
    state, _ = drive(gate(io, opened, ctx, (proposal,), {}))
    assert state.stop is not None and state.stop.reason is fp.TerminationReason.CANCELLED
    assert state.phase is Phase.VALIDATE
    assert [e.call_id for e in state.batch] == ["call-0001"]
    assert sum(state.fingerprints.values()) == 1
    assert state.budget == opened.budget


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
    # A DecisionModel's records are not validated again (the decision is taken as the instance
    # it is): a manifest assembled from it must still hold a plain str, never the subclass (its
    # repr, its attributes) in the trace record.
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
