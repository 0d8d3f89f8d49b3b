"""A step's manifests, assembled from the base the step shares (``manifest_base``), are exactly
what validating the same values makes; a base holding a value of another type (a state a caller
wrote) or a field no manifest has is judged by validation, and refused."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fencepost.policy import RuntimeBudget, StepManifest, VerdictCode
from fencepost.policy.effect import Effect
from fencepost.policy.manifest import ManifestBase, call_manifest, manifest_base, step_manifest
from fencepost.policy.phase import Phase
from fencepost.policy.state import AgentState
from tests.policy.factories import make_spec, make_state
from tests.records import assert_same_record

optional_fields = st.fixed_dictionaries(
    {},
    optional={
        "decision_kind": st.sampled_from(["tool", "final", "abstain", "invalid", None]),
        "code": st.none() | st.text(max_size=8),
        "input_tokens": st.none() | st.integers(0, 10**6),
        "output_tokens": st.none() | st.integers(0, 10**6),
        "approval": st.none() | st.sampled_from(["approver", "human"]),
        "provenance": st.none() | st.just({"query": ("user",)}),
    },
)
outcomes = st.sampled_from(["allowed", "denied", "approval_pending", "error", "terminal"])


def _state(step: int, tokens_used: int) -> AgentState:
    state = make_state()
    budget = state.budget.model_copy(update={"tokens_used": tokens_used})
    return state.model_copy(update={"step": step, "budget": budget})


def _base(state: AgentState) -> ManifestBase:
    return manifest_base(state.run_id, state.step, state.budget, Phase.VALIDATE, None)


def _shared(state: AgentState, phase: Phase, left: int | None) -> dict[str, Any]:
    budget = state.budget
    return {
        "run_id": state.run_id,
        "step": state.step,
        "phase": phase,
        "steps_remaining": budget.steps_remaining,
        "tool_calls_remaining": budget.tool_calls_remaining,
        "tokens_used": budget.tokens_used,
        "deadline_remaining_ms": left,
    }


@given(
    fields=optional_fields,
    outcome=outcomes,
    phase=st.sampled_from(list(Phase)),
    step=st.integers(0, 50),
    tokens_used=st.integers(0, 10**6),
    left=st.none() | st.integers(0, 10**7),
)
def test_a_steps_manifest_is_what_validation_makes(
    fields: dict[str, Any],
    outcome: str,
    phase: Phase,
    step: int,
    tokens_used: int,
    left: int | None,
) -> None:
    state = _state(step, tokens_used)
    base = manifest_base(state.run_id, state.step, state.budget, phase, left)
    made = step_manifest(base, outcome, fields)  # type: ignore[arg-type]
    validated = StepManifest(**_shared(state, phase, left), outcome=outcome, **fields)
    assert_same_record(made, validated)
    again = step_manifest(base, outcome, fields)  # type: ignore[arg-type]
    assert_same_record(again, validated)  # the base is shared, never changed


@given(
    fields=optional_fields,
    outcome=outcomes,
    verdict=st.sampled_from(list(VerdictCode)),
    effect=st.none() | st.sampled_from(list(Effect)),
)
def test_a_gated_calls_manifest_is_what_validation_makes(
    fields: dict[str, Any], outcome: str, verdict: VerdictCode, effect: Effect | None
) -> None:
    fields.pop("decision_kind", None)
    state = make_state()
    spec = None if effect is None else make_spec(effect=effect)
    base = manifest_base(state.run_id, state.step, state.budget, Phase.VALIDATE, None)
    name, kind = (None, None) if spec is None else (spec.name, spec.effect)
    made = call_manifest(base, outcome, name, kind, verdict, fields)  # type: ignore[arg-type]
    validated = StepManifest(
        **_shared(state, Phase.VALIDATE, None),
        outcome=outcome,
        decision_kind="tool",
        tool_name=None if spec is None else spec.name,
        effect=None if spec is None else spec.effect,
        verdict=verdict,
        **fields,
    )
    assert_same_record(made, validated)


@pytest.mark.parametrize(
    "state",
    [
        # A budget view a caller wrote whole, and a step that is no count: the manifests of
        # such a step are still validated, and refused.
        make_state().model_copy(
            update={
                "budget": RuntimeBudget.model_construct(
                    steps_remaining="5", tool_calls_remaining=4, tokens_used=0
                )
            }
        ),
        make_state().model_copy(
            update={"budget": make_state().budget.model_copy(update={"tokens_used": 1.5})}
        ),
        make_state().model_copy(update={"step": -1}),
        make_state().model_copy(update={"run_id": 7}),
    ],
)
def test_a_manifest_of_a_base_of_another_type_is_refused(state: AgentState) -> None:
    base = _base(state)
    with pytest.raises(ValidationError):
        step_manifest(base, "allowed", {})
    with pytest.raises(ValidationError):
        call_manifest(base, "allowed", "search_logs", Effect.READ, VerdictCode.ALLOWED, {})


def test_a_manifest_refuses_a_field_no_manifest_has_and_an_outcome_it_has_not() -> None:
    base = _base(make_state())
    with pytest.raises(ValidationError):
        step_manifest(base, "allowed", {"prompt": "x"})
    with pytest.raises(ValidationError):
        call_manifest(
            base, "allowed", "search_logs", Effect.READ, VerdictCode.ALLOWED, {"prompt": "x"}
        )
    with pytest.raises(ValidationError):
        step_manifest(base, "nonsense", {})  # type: ignore[arg-type]
