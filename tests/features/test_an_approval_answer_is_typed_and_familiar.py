"""An approval answer is typed and familiar (DESIGN, "Approvals and provenance"): the request is
a typed LangGraph interrupt whose ``response_schema`` is the JSON schema of every accepted
answer; LangChain's HITL response (``{"decisions": [...]}``, what Agent Chat UI sends) is taken
beside fencepost's own forms, one decision per waiting call in the order of the request's
``action_requests``; and an answer of any other shape (``"yes"``, ``True``) changes nothing: the
run waits again with a typed problem, also logged on ``fencepost.approval``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.types import Command

import fencepost as fp
from tests.graph.kit import (
    ABSTAIN,
    budget,
    call,
    context,
    harness,
    interrupt_payload,
    state_of,
    thread,
)

NOTE = call("write_note", 1, note="draft")
SECOND = call("write_note", 2, note="second")


def paused(*calls: fp.ToolProposal) -> tuple[Any, dict[str, Any], fp.RunContext, Any]:
    """A run paused on ``calls`` (one batch), and the interrupt it paused on."""
    proposal = calls[0] if len(calls) == 1 else fp.ToolBatch(calls=calls)
    h = harness([proposal, ABSTAIN, ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    out = h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    (pause,) = out["__interrupt__"]
    return h, config, ctx, pause


def resume(h: Any, config: dict[str, Any], ctx: fp.RunContext, answer: Any) -> dict[str, Any]:
    out: dict[str, Any] = h.graph.invoke(Command(resume=answer), config, context=ctx)
    return out


def test_the_request_carries_the_json_schema_of_every_accepted_answer() -> None:
    _, _, _, pause = paused(NOTE, SECOND)
    schema = pause.response_schema
    assert isinstance(schema, dict)
    jsonschema.Draft202012Validator.check_schema(schema)
    valid = [
        "approve",
        {"decision": "reject"},
        {"call-0001": "approve", "call-0002": {"decision": "edit", "arguments": {"note": "x"}}},
        {"decisions": [{"type": "approve"}, {"type": "reject", "message": "not now"}]},
        {
            "decisions": [
                {"type": "edit", "edited_action": {"name": "write_note", "args": {"note": "x"}}},
                {"type": "approve"},
            ]
        },
    ]
    invalid = [
        "yes",
        True,
        {"decisions": [{"type": "approve"}]},
        {"call-0001": {"decision": "edit", "arguments": {"note": 1}}},
        {
            "decisions": [
                {"type": "edit", "edited_action": {"name": "explode", "args": {}}},
                {"type": "approve"},
            ]
        },
    ]
    check = jsonschema.Draft202012Validator(schema)
    assert [check.is_valid(a) for a in valid] == [True] * len(valid)
    assert [check.is_valid(a) for a in invalid] == [False] * len(invalid)


def test_the_request_is_also_langchains_hitl_request_in_call_order() -> None:
    _, _, _, pause = paused(NOTE, SECOND)
    value = pause.value
    assert [a["name"] for a in value["action_requests"]] == ["write_note", "write_note"]
    assert [a["args"] for a in value["action_requests"]] == [{"note": "draft"}, {"note": "second"}]
    assert [r["allowed_decisions"] for r in value["review_configs"]] == [
        ["approve", "edit", "reject"]
    ] * 2


def test_a_hitl_approval_runs_the_call_once() -> None:
    h, config, ctx, _ = paused(NOTE)
    out = resume(h, config, ctx, {"decisions": [{"type": "approve"}]})
    assert "__interrupt__" not in out
    assert h.calls.log == [("write_note", {"note": "draft"}, "call-0001")]


def test_hitl_decisions_answer_the_waiting_calls_in_request_order() -> None:
    h, config, ctx, _ = paused(NOTE, SECOND)
    resume(
        h,
        config,
        ctx,
        {"decisions": [{"type": "reject", "message": "SECRET-REASON"}, {"type": "approve"}]},
    )
    assert h.calls.log == [("write_note", {"note": "second"}, "call-0002")]
    state = fp.run_output(h.graph.get_state(config).values)
    first = next(r for r in state.receipts if r.call_id == "call-0001")
    assert first.status is fp.ReceiptStatus.DENIED
    # A person's reason is never kept: the model is told permission_denied, as for any rejection.
    assert "SECRET-REASON" not in json.dumps(h.graph.get_state(config).values, default=str)


def test_a_hitl_edit_runs_with_the_edited_arguments_and_never_changes_the_tool() -> None:
    h, config, ctx, _ = paused(NOTE)
    other = {"type": "edit", "edited_action": {"name": "admin_reset", "args": {}}}
    out = resume(h, config, ctx, {"decisions": [other]})
    assert h.calls.log == []
    assert interrupt_payload(out)["error"]["code"] == "unrecognized_answer"
    edit = {"type": "edit", "edited_action": {"name": "write_note", "args": {"note": "final"}}}
    resume(h, config, ctx, {"decisions": [edit]})
    assert h.calls.log == [("write_note", {"note": "final"}, "call-0001")]


def test_a_decision_count_other_than_the_waiting_calls_is_a_typed_problem_and_loses_nothing() -> (
    None
):
    h, config, ctx, _ = paused(NOTE, SECOND)
    out = resume(h, config, ctx, {"decisions": [{"type": "approve"}]})
    error = interrupt_payload(out)["error"]
    assert (error["code"], error["expected_decisions"]) == ("decision_count_mismatch", 2)
    assert h.calls.log == []
    assert not state_of(h, config).is_terminal
    resume(h, config, ctx, {"decisions": [{"type": "approve"}, {"type": "approve"}]})
    assert [c[2] for c in h.calls.log] == ["call-0001", "call-0002"]


@pytest.mark.parametrize("answer", ["yes", True, "Approve", 1, {"decisions": "approve"}])
def test_a_truthy_answer_is_refused_typed_in_the_request_and_in_the_log(
    answer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    h, config, ctx, _ = paused(NOTE)
    with caplog.at_level(logging.WARNING, logger="fencepost.approval"):
        out = resume(h, config, ctx, answer)
    assert h.calls.log == []
    assert interrupt_payload(out)["error"]["code"] == "unrecognized_answer"
    refused = [r for r in caplog.records if getattr(r, "code", None) == "unrecognized_answer"]
    assert len(refused) == 1 and refused[0].name == "fencepost.approval"
    # The right answer still goes through, and the earlier refusal is not logged again.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fencepost.approval"):
        resume(h, config, ctx, "approve")
    assert h.calls.log == [("write_note", {"note": "draft"}, "call-0001")]
    assert not [r for r in caplog.records if getattr(r, "code", None) == "unrecognized_answer"]


# An approval of call-0001 in every form fencepost takes (an edit is not an approval of the
# call as proposed, and runs only with the edited arguments: pinned above).
APPROVALS: list[Any] = [
    "approve",
    {"decision": "approve"},
    {"type": "approve"},
    {"call-0001": "approve"},
    {"call-0001": {"decision": "approve"}},
    {"call-0001": {"type": "approve"}},
    {"decisions": [{"type": "approve"}]},
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["decision", "type", "decisions", "call-0001", "arguments", "message"])
            | st.text(max_size=8),
            inner,
            max_size=3,
        )
    ),
    max_leaves=8,
)
near_misses = st.sampled_from(
    [
        "yes",
        True,
        "approved",
        ["approve"],
        {"decisions": [{"decision": "approve"}]},
        {"decisions": ["approve"]},
        {"decisions": [{"type": "approve"}, {"type": "approve"}]},
        {"decisions": [{"type": "respond", "message": "done"}]},
        {"decision": "approve", "type": "approve"},
        {"call-0001": "approve", "decision": "approve"},
        {"type": "approve", "message": "ok"},
    ]
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# ``Command(resume=None)`` is no resume to LangGraph (not an answer): left out here.
@given(
    answer=json_values.filter(lambda v: v is not None) | near_misses | st.sampled_from(APPROVALS)
)
def test_any_json_resume_runs_the_write_only_when_it_is_an_approval_of_that_call(
    answer: Any,
) -> None:
    h, config, ctx, _ = paused(NOTE)
    resume(h, config, ctx, answer)
    if h.calls.log:
        assert answer in APPROVALS
        assert h.calls.log == [("write_note", {"note": "draft"}, "call-0001")]
    elif answer in APPROVALS:
        pytest.fail(f"an approval did not run the call: {answer!r}")
