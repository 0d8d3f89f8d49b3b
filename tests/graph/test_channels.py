"""The graph's channels: what an unwritten channel reads as, and that a copy is independent.

LangGraph copies every channel to route each step and applies the node's writes to the copies;
the record, count, evidence and conversation channels share their value with their copies (a
copy of the value grows with the run), which is only sound if a write to a copy never changes
what the original reads.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import StateGraph

from fencepost.graph.state import GraphState
from fencepost.graph.writes import _UNSET
from fencepost.policy import AgentState

_words = st.text(alphabet="abcdefgh", min_size=1, max_size=4)


def _channels() -> dict[str, Any]:
    # The channels exactly as LangGraph builds them from the state schema.
    return dict(StateGraph(GraphState).channels)


def _first_and_more(name: str, data: st.DataObject) -> tuple[Any, Any]:
    if name in ("observations", "proposals", "receipts", "manifests"):
        return tuple(data.draw(st.lists(_words, max_size=3))), tuple(
            data.draw(st.lists(_words, min_size=1, max_size=3))
        )
    if name == "messages":
        return [HumanMessage(content="q", id="m-0")], [
            AIMessage(content=w, id=f"m-{i + 1}")
            for i, w in enumerate(data.draw(st.lists(_words, min_size=1, max_size=3)))
        ]
    counts = st.dictionaries(_words, st.integers(1, 5) if name == "fingerprints" else _words)
    return data.draw(counts), data.draw(counts.filter(bool))


@given(data=st.data())
def test_a_write_to_a_channel_copy_never_changes_what_the_original_reads(
    data: st.DataObject,
) -> None:
    channels = _channels()
    for name in ("observations", "receipts", "fingerprints", "evidence", "answered", "messages"):
        first, more = _first_and_more(name, data)
        original = channels[name].copy()
        original.update([first])
        seen = list(original.get()) if name == "messages" else original.get()
        snapshot = [m.id for m in seen] if name == "messages" else seen
        routed = original.copy()
        routed.update([more])
        after = original.get()
        assert ([m.id for m in after] if name == "messages" else after) == snapshot, name


def test_a_field_a_new_run_leaves_unwritten_reads_as_its_agent_state_default() -> None:
    channels = _channels()
    assert {"stop", "termination", "report", "batch", "observations", "fingerprints"} <= set(_UNSET)
    for name in _UNSET:
        default = AgentState.model_fields[name].get_default(call_default_factory=True)
        assert channels[name].copy().get() == default, name


@given(first=st.integers(0, 2**62), more=st.integers(0, 2**62))
def test_a_defaulted_channel_copy_reads_what_the_original_holds_and_writes_alone(
    first: int, more: int
) -> None:
    channels = _channels()
    for name in ("step", "repairs", "model_failures"):
        original = channels[name].copy()
        unwritten = original.copy()
        assert unwritten.get() == 0 and not unwritten.update([]), name  # the default, unwritten
        original.update([first])
        routed = original.copy()
        assert routed.get() == first and routed.checkpoint() == first, name
        routed.update([more])
        assert original.get() == first and routed.get() == more, name
        assert channels[name].from_checkpoint(routed.checkpoint()).get() == more, name
