"""Nodes emit the loop's events to one stream, and whoever subscribes hears them: a step
recorded, calls gated, a call run and its outcome, the run ended — in the order they happen,
with ids and codes (the telemetry adapter is one such listener)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from fencepost.adapters import telemetry
from fencepost.graph.events import EVENTS, CallSpan, LoopListener
from fencepost.policy import AgentState, Phase, StepManifest, ToolSpec
from fencepost.policy.batch import BatchEntry
from fencepost.policy.outcome import CallOutcome
from tests.graph.kit import call, final_citing_last, harness


class Heard(LoopListener):
    """Every event it hears, as (event, what identifies it)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def invoked(self, chunks: Iterator[Any], graph: Any, config: Any) -> Iterator[Any]:
        self.events.append(("invoked", None))
        return chunks

    def recorded(self, state: AgentState, manifests: Sequence[StepManifest]) -> None:
        self.events.append(("recorded", tuple(m.phase for m in manifests)))

    def gated(
        self, run_id: str, batch: Sequence[BatchEntry], specs: Sequence[ToolSpec | None]
    ) -> None:
        self.events.append(("gated", tuple(e.verdict.code.value for e in batch)))

    def tool_call(self, entry: BatchEntry, spec: ToolSpec, attempt: int) -> CallSpan:
        self.events.append(("tool_call", (entry.call_id, spec.name, attempt)))
        return CallSpan()

    def calls_ended(
        self, run_id: str, batch: Sequence[BatchEntry], done: Sequence[CallOutcome]
    ) -> None:
        self.events.append(("calls_ended", tuple(o.status.value for o in done)))


def test_a_subscribed_listener_hears_the_loop_s_events_in_order() -> None:
    heard = Heard()
    EVENTS.subscribe(heard)
    try:
        state = harness([call(), final_citing_last]).run()
    finally:
        EVENTS.unsubscribe(heard)
    assert state.termination is not None and state.termination.value == "completed"
    names = [name for name, _ in heard.events]
    assert names[0] == "invoked"
    assert ("gated", ("allowed",)) in heard.events
    assert ("tool_call", ("call-0001", "search_logs", 1)) in heard.events
    assert ("calls_ended", ("completed",)) in heard.events
    # The call is gated before it runs, and it runs before its outcome is receipted.
    assert names.index("gated") < names.index("tool_call") < names.index("calls_ended")
    # The run ended: the last step recorded is the terminal one.
    recorded = [phases for name, phases in heard.events if name == "recorded"]
    assert recorded[-1] == (Phase.TERMINAL,)


def test_an_unsubscribed_listener_hears_nothing_more() -> None:
    heard = Heard()
    EVENTS.subscribe(heard)
    EVENTS.unsubscribe(heard)
    harness([call(), final_citing_last]).run()
    assert heard.events == []


def test_subscribing_twice_hears_each_event_once() -> None:
    heard = Heard()
    EVENTS.subscribe(heard)
    EVENTS.subscribe(heard)
    try:
        harness([call(), final_citing_last]).run()
    finally:
        EVENTS.unsubscribe(heard)
    assert [name for name, _ in heard.events].count("tool_call") == 1


def test_the_composition_root_subscribes_the_telemetry() -> None:
    import fencepost  # noqa: F401  (importing the package composes it)

    assert telemetry.LISTENER in EVENTS.listeners
