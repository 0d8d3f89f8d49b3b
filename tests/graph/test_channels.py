"""The graph's channels: few of them, what an unwritten one reads as, and that a copy is
independent.

LangGraph copies every channel to route each step and applies the node's writes to the copies;
the run record and the conversation share their value with their copies (a copy of the value
grows with the run), which is only sound if a write to a copy never changes what the original
reads. A caller's write to the record only adds to its records and raises its repeat counts.
"""

from __future__ import annotations

import copy
import json
from typing import Any, get_type_hints

from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, StateGraph
from langgraph.types import Overwrite

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.graph.record import (
    APPENDED,
    COUNTED,
    LATEST,
    REPLACED,
    RunRecord,
    caller_write,
    fold,
    plain,
    unrepresentable,
)
from fencepost.graph.state import GraphState
from fencepost.policy import (
    AgentState,
    ErrorCode,
    Observation,
    StopRequest,
    TerminationReason,
)
from tests.graph.kit import (
    budget,
    call,
    context,
    final_citing_last,
    harness,
    thread,
    upload_graph,
)

_words = st.text(alphabet="abcdefgh", min_size=1, max_size=4)


def _channels() -> dict[str, Any]:
    # The channels exactly as LangGraph builds them from the state schema.
    return dict(StateGraph(GraphState).channels)


def _observation(n: int) -> dict[str, Any]:
    return plain(
        Observation(
            call_id=f"call-{n:04d}",
            tool_name="search_logs",
            sequence=n,
            kind="tool_error",
            error_code=ErrorCode.NOT_FOUND,
        )
    )


def test_a_run_is_three_channels_the_request_the_record_and_the_conversation() -> None:
    # ``turn`` only names the ended run that new input on the thread follows; ``fork`` the
    # checkpoint the thread's latest branch was forked from.
    written = {n for n, c in _channels().items() if type(c).__name__ != "RetiredChannel"}
    assert written == {"request", "run", "messages", "turn", "fork"}


def test_a_route_after_a_node_reads_the_run_record_alone() -> None:
    # A conditional edge reads its channels afresh after every node (a copy of each with the
    # node's writes applied): a channel it reads and never looks at is paid for at every step.
    graph = fp.build_agent_graph(fp.ToolRegistry([]), ScriptedDecisionModel([]))
    read = {
        source: {name: list(get_type_hints(spec.input_schema)) for name, spec in by.items()}
        for source, by in graph.branches.items()
    }
    for node in ("decide", "approve", "execute", "terminal"):
        assert list(read[node].values()) == [["run"]], node
    # Only the entry route reads more: the superstep budget, and the layout and turn of a
    # thread's input.
    assert [sorted(names) for names in read[START].values()] == [
        ["remaining_steps", "run", "run_id", "turn"]
    ]


def test_every_agent_state_field_has_one_way_to_be_written() -> None:
    assert set(AgentState.model_fields) == APPENDED | COUNTED | LATEST | REPLACED
    assert len(APPENDED) + len(COUNTED) + len(LATEST) + len(REPLACED) == len(
        AgentState.model_fields
    )


@given(data=st.data())
def test_a_write_to_a_channel_copy_never_changes_what_the_original_reads(
    data: st.DataObject,
) -> None:
    channels = _channels()
    record = channels["run"].copy()
    first = data.draw(st.lists(st.integers(1, 50), max_size=3))
    record.update([{"observations": [_observation(n) for n in first], "step": len(first)}])
    snapshot = dict(record.get())
    routed = record.copy()
    more = data.draw(st.lists(st.integers(51, 99), min_size=1, max_size=3))
    routed.update([{"observations": [_observation(n) for n in more], "step": 99}])
    assert dict(record.get()) == snapshot
    assert len(routed.get()["observations"]) == len(first) + len(more)

    conversation = channels["messages"].copy()
    conversation.update([[HumanMessage(content="q", id="m-0")]])
    ids = [m.id for m in conversation.get()]
    copy = conversation.copy()
    words = data.draw(st.lists(_words, min_size=1, max_size=3))
    copy.update([[AIMessage(content=w, id=f"m-{i + 1}") for i, w in enumerate(words)]])
    assert [m.id for m in conversation.get()] == ids


def test_the_record_reads_empty_before_a_run_and_an_unwritten_field_as_its_default() -> None:
    record = _channels()["run"].copy()
    assert record.get() == {} and record.is_available()
    record.update([{"run_id": "run-1", "question": "q", "budget": {"steps_remaining": 1}}])
    assert set(record.get()) == set(AgentState.model_fields)
    assert record.get()["stop"] is None and record.get()["observations"] == []
    assert record.get()["budget"] == {"steps_remaining": 1}


@given(counts=st.dictionaries(_words, st.integers(1, 5), min_size=1), lower=st.integers(0, 4))
def test_a_callers_write_never_lowers_a_repeat_count_nor_takes_back_a_record(
    counts: dict[str, int], lower: int
) -> None:
    start = fold({}, [{"fingerprints": counts, "observations": [_observation(1)]}])
    after = fold(
        start,
        [
            {"fingerprints": {k: min(lower, v) for k, v in counts.items()}},
            Overwrite({"observations": []}),
            {"__overwrite__": {"observations": []}},
            {"observations": []},
        ],
    )
    assert after["fingerprints"] == counts
    assert len(after["observations"]) == 1


def test_a_callers_record_item_that_does_not_validate_is_dropped_whole() -> None:
    start = fold({}, [{"observations": [_observation(1)]}])
    after = fold(start, [{"observations": [_observation(2), {"call_id": 5}]}])
    assert after["observations"] == start["observations"]
    assert isinstance(after, RunRecord)


def test_a_write_of_no_field_is_dropped_and_a_value_with_no_plain_form_is_marked() -> None:
    after = fold({}, [{"chain_of_thought": "x", "last_error_code": object()}])
    assert "chain_of_thought" not in after
    assert after["last_error_code"] == {"__unrepresentable__": True}


def _channel_pairs() -> list[tuple[str, Any, Any]]:
    stop = StopRequest(reason=TerminationReason.CANCELLED, error_code="cancelled")
    receipt = fp.Receipt(call_id="call-0001", tool_name="t", status="completed")
    return [
        ("run", {"stop": None}, {"stop": stop}),
        (
            "run",
            {"receipts": (receipt,)},
            {"receipts": (receipt.model_copy(update={"call_id": "call-0002"}),)},
        ),
        ("run", {"answered": {"call-0001": 1}}, {"answered": {"call-0002": 2}}),
        ("run", {"fingerprints": {"f": 1}}, {"fingerprints": {"f": 3, "g": 1}}),
        ("messages", [HumanMessage("q", id="m-1")], [AIMessage("a", id="m-2")]),
    ]


def test_a_write_to_a_routed_copy_of_a_channel_never_changes_the_original_or_its_other_copy() -> (
    None
):
    # The fast copies share the value (object.__new__, slots set directly): sound only while
    # every reducer makes a new value. A write to one copy must not show in the original, in a
    # second copy, or in a channel restored from the same checkpoint.
    h = upload_graph([])
    for name, first, second in _channel_pairs():
        original = h.graph.channels[name].from_checkpoint(None)
        assert original.update([first])
        before = original.get()
        snapshot = json.dumps(before, default=repr) if name != "messages" else len(before)
        routed, sibling = original.copy(), original.copy()
        assert routed.update([second]) is True
        assert routed.get() is not before
        after = original.get()
        assert after is before, name
        assert (json.dumps(after, default=repr) if name != "messages" else len(after)) == snapshot
        assert sibling.get() is before, name
        assert routed.update([]) is False
        assert type(routed) is type(original) and routed.key == original.key


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


def test_a_stored_write_of_none_is_no_nodes_own() -> None:
    # A miss of the identity map of node writes is None too: None was taken for a node's write.
    # A caller's None is stored as {} (caller_write); a stored one was edited in by hand, and
    # is read as a stop no run can hold (test_a_record_write_no_map_ends_invalid_state).
    start = fold({}, [{"run_id": "run-1", "observations": [_observation(1)]}])
    after = fold(start, [None])
    assert after == {**start, "stop": unrepresentable()}
    assert caller_write(None) == {}
