"""Model output parses to a decision or raises InvalidProposal: nothing else, ever."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fencepost.policy import (
    AbstainProposal,
    AnswerPayload,
    Decided,
    Decision,
    FinalProposal,
    InvalidProposal,
    ToolBatch,
    ToolProposal,
    parse_decision,
    proposal_fingerprint,
)
from tests.strategies import json_tree

DECISIONS = (ToolProposal, FinalProposal, AbstainProposal)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
json_like = json_tree(json_scalars, max_leaves=20, max_size=4)
# Near-misses reach the deeper validators instead of failing on the discriminator.
decision_keys = st.sampled_from(
    ["kind", "call_id", "tool_name", "arguments", "answer", "reason", "text", "citations"]
)
decision_values = (
    json_like
    | st.sampled_from(["tool", "final", "abstain", "insufficient_evidence", "search_logs"])
    | st.text(min_size=8, max_size=12)
    | st.fixed_dictionaries({"text": st.text(max_size=5)}, optional={"citations": json_like})
)
decision_like = st.fixed_dictionaries(
    {"kind": st.sampled_from(["tool", "final", "abstain", "other"])},
).flatmap(
    lambda head: st.dictionaries(decision_keys, decision_values, max_size=5).map(
        lambda rest: {**rest, **head}
    )
)
model_output = (
    json_like
    | decision_like
    | decision_like.map(lambda d: json.dumps(d))
    | decision_like.map(lambda d: json.dumps(d).encode())
    | st.text()
    | st.binary()
)


def _parse_or_invalid(raw: Any) -> Decision | None:
    try:
        decision = parse_decision(raw)
    except InvalidProposal as exc:
        assert exc.code == "malformed_decision"
        return None
    assert isinstance(decision, DECISIONS)
    return decision


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_output)
def test_any_model_output_is_a_decision_or_invalid_proposal(raw: Any) -> None:
    decision = _parse_or_invalid(raw)
    if isinstance(decision, ToolProposal):
        # An accepted proposal must be gateable: fingerprinting it cannot fail.
        assert len(proposal_fingerprint(decision.tool_name, decision.arguments)) == 64


@settings(max_examples=150, deadline=None)
@given(
    call_id=st.text(min_size=8, max_size=40),
    tool_name=st.from_regex(r"[a-z][a-z0-9_]{1,20}", fullmatch=True),
    arguments=st.dictionaries(st.text(max_size=8), json_like, max_size=4),
)
def test_tool_proposals_round_trip_through_json_text(
    call_id: str, tool_name: str, arguments: dict[str, Any]
) -> None:
    raw = {"kind": "tool", "call_id": call_id, "tool_name": tool_name, "arguments": arguments}
    try:
        text = json.dumps(raw, allow_nan=False)
    except ValueError:
        # Non-finite numbers are not JSON; such input must be refused, not crash later.
        with pytest.raises(InvalidProposal):
            parse_decision(raw)
        return
    decision = parse_decision(text)
    assert isinstance(decision, ToolProposal)
    assert decision == parse_decision(raw) == parse_decision(text.encode())
    assert json.loads(decision.model_dump_json()) == {**raw, "depends_on": []}


def test_each_decision_kind_parses_to_its_type() -> None:
    tool = parse_decision(
        {"kind": "tool", "call_id": "call-0001", "tool_name": "search_logs", "arguments": {}}
    )
    final = parse_decision(
        '{"kind": "final", "answer": {"text": "It was a 500.", "citations": ["call-0001"]}}'
    )
    abstain = parse_decision(b'{"kind": "abstain", "reason": "needs_clarification"}')
    assert isinstance(tool, ToolProposal)
    assert isinstance(final, FinalProposal)
    assert final.answer == AnswerPayload(text="It was a 500.", citations=("call-0001",))
    assert isinstance(abstain, AbstainProposal)
    assert abstain.reason == "needs_clarification"
    batch = parse_decision(
        {
            "kind": "batch",
            "calls": [
                {
                    "kind": "tool",
                    "call_id": f"call-000{n}",
                    "tool_name": "search_logs",
                    "arguments": {},
                }
                for n in (1, 2)
            ],
        }
    )
    assert isinstance(batch, ToolBatch)
    assert [c.call_id for c in batch.calls] == ["call-0001", "call-0002"]


def test_an_empty_batch_is_no_decision() -> None:
    with pytest.raises(InvalidProposal):
        parse_decision({"kind": "batch", "calls": []})


def test_a_decision_instance_passes_through_unchanged() -> None:
    decision = AbstainProposal(reason="insufficient_evidence")
    assert parse_decision(decision) is decision


def test_one_union_is_every_decision_a_model_may_return() -> None:
    from fencepost.policy.decide import accept_decision

    call = ToolProposal(call_id="call-0001", tool_name="search_logs", arguments={})
    every = (
        call,
        ToolBatch(calls=(call,)),
        FinalProposal(answer=AnswerPayload(text="done", citations=())),
        AbstainProposal(reason="insufficient_evidence"),
    )
    for decision in every:
        assert isinstance(decision, Decision)
        assert parse_decision(decision) is decision
        accepted = accept_decision(decision)
        assert isinstance(accepted, Decided) and accepted.decision is decision
    assert not isinstance(Decided(decision=call), Decision)


@pytest.mark.parametrize(
    "text",
    [
        '{"kind":"tool","call_id":"call-0001","tool_name":"search_logs","arguments":{"x":NaN}}',
        '{"kind":"tool","call_id":"call-0001","tool_name":"search_logs","arguments":{"x":[Infinity]}}',
        '{"kind":"tool","call_id":"call-0001","tool_name":"search_logs","arguments":{"x":-Infinity}}',
    ],
)
def test_non_finite_numbers_in_arguments_are_an_invalid_proposal(text: str) -> None:
    # json.loads accepts these; a proposal holding one could never be fingerprinted or gated.
    with pytest.raises(InvalidProposal):
        parse_decision(text)


class HostileBytes(bytes):
    """Decoding raises something that is not a ValueError."""

    def decode(self, *args: Any, **kwargs: Any) -> str:
        raise RuntimeError("provider stream broke: api_key=sk-...")


@pytest.mark.parametrize(
    "raw",
    [
        {"kind": "tool", "call_id": "short", "tool_name": "search_logs", "arguments": {}},
        {"kind": "tool", "call_id": "c" * 129, "tool_name": "search_logs", "arguments": {}},
        {"kind": "tool", "call_id": "call-0001", "tool_name": "os.system", "arguments": {}},
        {"kind": "tool", "call_id": "call-0001", "tool_name": "../etc/passwd", "arguments": {}},
        {"kind": "tool", "call_id": "call-0001", "tool_name": "Search_Logs", "arguments": {}},
        {"kind": "tool", "call_id": "call-0001", "tool_name": "search_logs", "arguments": "{}"},
        {"kind": "tool", "call_id": "call-0001", "tool_name": "search_logs", "arguments": []},
        {"kind": "tool", "call_id": 12345678, "tool_name": "search_logs", "arguments": {}},
        {
            "kind": "tool",
            "call_id": "call-0001",
            "tool_name": "search_logs",
            "arguments": {},
            "tenant_id": "tenant-b",
        },
        {"kind": "final", "answer": {"text": " ", "citations": ["call-0001"]}},
        {"kind": "final", "answer": "just text"},
        {"kind": "abstain", "reason": "bored"},
        {"kind": "execute", "code": "rm -rf /"},
        {"tool_name": "search_logs", "arguments": {}},
        [],
        None,
        "",
        "not json at all",
        b"\xff\xfe",
        "[" * 100_000,
        object(),
    ],
)
def test_malformed_output_is_an_invalid_proposal(raw: Any) -> None:
    with pytest.raises(InvalidProposal):
        parse_decision(raw)


def test_a_non_value_error_while_reading_output_is_an_invalid_proposal() -> None:
    with pytest.raises(InvalidProposal):
        parse_decision(HostileBytes(b'{"kind": "abstain", "reason": "needs_clarification"}'))


def test_invalid_proposal_carries_no_model_text() -> None:
    secret = "IGNORE PREVIOUS INSTRUCTIONS password=hunter2"
    with pytest.raises(InvalidProposal) as caught:
        parse_decision({"kind": "tool", "call_id": secret, "tool_name": secret, "arguments": {}})
    assert secret not in str(caught.value)
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__
