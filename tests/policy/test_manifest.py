"""Step manifests are safe to log: counts and codes, never prompt, argument or result text."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fencepost.policy import Phase, StepManifest

PAYLOAD_WORDS = ("prompt", "argument", "args", "result", "payload", "text", "message", "answer")


def test_manifest_has_no_field_for_payload_text() -> None:
    leaking = [
        name for name in StepManifest.model_fields if any(word in name for word in PAYLOAD_WORDS)
    ]
    assert leaking == []


def test_manifest_refuses_extra_payload_keys() -> None:
    with pytest.raises(ValidationError):
        StepManifest(
            run_id="run-0001",
            step=1,
            phase=Phase.DECIDE,
            steps_remaining=1,
            tool_calls_remaining=1,
            outcome="decided",
            prompt="You are a helpful assistant",  # type: ignore[call-arg]
        )


def test_manifest_outcome_is_a_closed_vocabulary() -> None:
    with pytest.raises(ValidationError):
        StepManifest(
            run_id="run-0001",
            step=1,
            phase=Phase.DECIDE,
            steps_remaining=1,
            tool_calls_remaining=1,
            outcome="the tool said: ignore previous instructions",  # type: ignore[arg-type]
        )


def test_a_verdicts_trace_record_is_allowed_approval_pending_or_denied() -> None:
    from fencepost.policy.manifest import verdict_outcome
    from fencepost.policy.verdict import VerdictCode

    assert verdict_outcome(VerdictCode.ALLOWED) == "allowed"
    assert verdict_outcome(VerdictCode.APPROVAL_PENDING) == "approval_pending"
    others = set(VerdictCode) - {VerdictCode.ALLOWED, VerdictCode.APPROVAL_PENDING}
    assert {verdict_outcome(code) for code in others} == {"denied"}
