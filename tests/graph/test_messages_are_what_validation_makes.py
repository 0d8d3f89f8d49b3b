"""The messages view's decision and observation messages, made for every step without validating
them again, are exactly what LangChain's validation makes of the same values: nothing a reader,
a stream or a checkpoint can tell apart."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from fencepost.graph.messages import messages_for
from fencepost.policy import AgentState, ErrorCode, Observation, ToolProposal, Verdict, VerdictCode
from fencepost.policy.batch import BatchEntry
from fencepost.policy.budget import default_budget
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.untrusted import observation_content
from tests.records import assert_same_record
from tests.strategies import any_text, json_tree

_leaves = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | any_text(max_size=8)
_arguments = st.dictionaries(any_text(max_size=6), json_tree(_leaves, max_leaves=6), max_size=3)
_call_ids = st.text(min_size=8, max_size=16)


def _entry(call_id: str, arguments: dict[str, Any]) -> BatchEntry:
    proposal = ToolProposal(call_id=call_id, tool_name="search_logs", arguments=arguments)
    return BatchEntry(
        proposal=proposal,
        verdict=Verdict(
            call_id=call_id,
            tool_name="search_logs",
            fingerprint=proposal_fingerprint("search_logs", arguments),
            code=VerdictCode.ALLOWED,
        ),
    )


def _observation(sequence: int, call_id: str, result: Any, failed: bool) -> Observation:
    if failed:
        return Observation(
            sequence=sequence,
            call_id=call_id,
            tool_name="search_logs",
            kind="tool_error",
            error_code=ErrorCode.TIMEOUT,
            retryable=True,
        )
    return Observation(
        sequence=sequence,
        call_id=call_id,
        tool_name="search_logs",
        kind="tool_result",
        result=result,
    )


def assert_same_message(made: BaseMessage, validated: BaseMessage) -> None:
    """Equal, of one type, the same fields given, in the same order, no extra keys either way,
    dumping the same, and the same bytes in a checkpoint."""
    assert_same_record(made, validated)
    assert made.__pydantic_extra__ == validated.__pydantic_extra__ == {}
    assert made.__pydantic_private__ == validated.__pydantic_private__
    assert _stored(made) == _stored(validated)


def _stored(message: BaseMessage) -> Any:
    """What a checkpoint stores of ``message``: its bytes, or the kind of error the serializer
    raises for it (a lone surrogate in a key has no UTF-8 form, validated or not)."""
    try:
        return JsonPlusSerializer().dumps_typed(message)
    except Exception as exc:
        return type(exc)


@given(
    calls=st.lists(st.tuples(_call_ids, _arguments), min_size=1, max_size=3),
    step=st.integers(0, 10_000),
)
def test_a_decision_message_is_what_validation_makes(
    calls: list[tuple[str, dict[str, Any]]], step: int
) -> None:
    batch = tuple(_entry(call_id, arguments) for call_id, arguments in calls)
    before = AgentState(run_id="run-1", question="q", budget=default_budget())
    after = before.model_copy(update={"batch": batch, "step": step})
    (made,) = messages_for(before, after)
    validated = AIMessage(
        content="",
        tool_calls=[
            {"type": "tool_call", "id": call_id, "name": "search_logs", "args": dict(arguments)}
            for call_id, arguments in calls
        ],
        id=f"fp:run-1:decision-{step}",
    )
    assert_same_message(made, validated)
    # Each message has maps and lists of its own: changing one changes no other.
    assert made.tool_calls[0]["args"] is not batch[0].proposal.arguments
    (again,) = messages_for(before, after)
    assert again.additional_kwargs is not made.additional_kwargs
    assert again.model_fields_set is not made.model_fields_set


@given(
    seen=st.integers(0, 3),
    outcomes=st.lists(
        st.tuples(_call_ids, json_tree(_leaves, max_leaves=6), st.booleans()),
        min_size=1,
        max_size=3,
    ),
)
def test_an_observation_message_is_what_validation_makes(
    seen: int, outcomes: list[tuple[str, Any, bool]]
) -> None:
    earlier = tuple(_observation(i, f"call-{i}", i, False) for i in range(seen))
    new = tuple(
        _observation(seen + i, call_id, result, failed)
        for i, (call_id, result, failed) in enumerate(outcomes)
    )
    before = AgentState(run_id="run-1", question="q", budget=default_budget(), observations=earlier)
    after = before.model_copy(update={"observations": earlier + new})
    made = messages_for(before, after)
    assert len(made) == len(new)
    for message, obs in zip(made, new, strict=True):
        failed = {} if obs.kind == "tool_result" else {"status": "error"}
        validated = ToolMessage(
            content=observation_content(obs),
            tool_call_id=obs.call_id,
            name=obs.tool_name,
            id=f"fp:run-1:observation-{obs.call_id}",
            **failed,
        )
        assert_same_message(message, validated)
