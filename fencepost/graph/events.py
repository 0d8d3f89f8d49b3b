"""The loop's event stream: what the nodes tell whoever listens, and nothing else.

Nodes emit the loop's events to :data:`EVENTS` — a step recorded (a model step reserved and
decided, a run ended: its manifests), calls gated, a batch or call refused, an approval asked
and answered, a call run and its outcome, a crashed attempt retried — and an invoke of a
compiled graph is one :meth:`LoopListener.invoked` stream. A listener subclasses
:class:`LoopListener` (every method a no-op until overridden) and is added with
:func:`subscribe`. The graph binding imports no listener: the composition root
(``build_agent_graph``) subscribes fencepost's telemetry (OpenTelemetry spans and the
developer logs on the ``fencepost`` logger), so ``graph`` never imports an adapter.

A listener gets names, ids, codes and the run's typed view; what it does with them must not
raise (an exception from a listener is the node's) and must not write payload text anywhere.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import ExitStack
from types import TracebackType
from typing import Any, TypeVar

from fencepost.policy import AgentState, StepManifest, ToolProposal, ToolRegistry, ToolSpec
from fencepost.policy.batch import BatchEntry
from fencepost.policy.outcome import CallOutcome

T = TypeVar("T")


class CallSpan:
    """One call's run, as a listener follows it: entered before the tool starts, told its
    outcome (:meth:`ended`), exited when the call is done. This one follows nothing."""

    __slots__ = ()

    def __enter__(self) -> CallSpan:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def ended(self, outcome: CallOutcome) -> None:
        """The call's outcome, before the call's span is left."""


NO_CALL_SPAN = CallSpan()


class LoopListener:
    """What a listener of the loop's events hears; each method is one event, a no-op here."""

    def invoked(
        self, chunks: Iterator[T], graph: Any, config: Mapping[str, Any] | None
    ) -> Iterator[T]:
        """An invoke, stream or resume of ``graph``: ``chunks`` are its stream, returned (or
        wrapped, to follow the invoke while the graph computes)."""
        return chunks

    def ainvoked(
        self, chunks: AsyncIterator[T], graph: Any, config: Mapping[str, Any] | None
    ) -> AsyncIterator[T]:
        """:meth:`invoked` for ``astream``/``ainvoke``."""
        return chunks

    def recorded(self, state: AgentState, manifests: Sequence[StepManifest]) -> None:
        """A node recorded ``manifests`` (a step reserved and decided, a call batch run, a run
        ended) and left ``state``."""

    def gated(
        self, run_id: str, batch: Sequence[BatchEntry], specs: Sequence[ToolSpec | None]
    ) -> None:
        """The gate judged ``batch`` (``specs``: each call's registered tool, or ``None``)."""

    def batch_refused(
        self, run_id: str, calls: Sequence[ToolProposal], registry: ToolRegistry, code: str
    ) -> None:
        """A whole batch refused before its calls were judged one by one (``code``: why)."""

    def budget_refused(
        self,
        run_id: str,
        entries: Sequence[BatchEntry],
        refused: Mapping[str, Any],
        registry: ToolRegistry,
    ) -> None:
        """Calls of a batch the budget could not cover (``refused``: by call id)."""

    def approver_answered(
        self,
        run_id: str,
        asked: Sequence[BatchEntry],
        batch: Sequence[BatchEntry],
        registry: ToolRegistry,
    ) -> None:
        """The graph's approver policy answered the calls ``asked`` about (``batch``: their new
        verdicts)."""

    def approvals_answered(
        self,
        run_id: str,
        asked: Sequence[BatchEntry],
        batch: Sequence[BatchEntry],
        registry: ToolRegistry,
        *,
        by: str | None = None,
    ) -> None:
        """A person (``by``) answered the calls ``asked`` about (``batch``: their new
        verdicts)."""

    def answer_refused(self, run_id: str, asked: Sequence[BatchEntry], code: str) -> None:
        """An answer to the calls ``asked`` about was not taken (``code``); the run waits."""

    def retrying(self, run_id: str, entry: BatchEntry, spec: ToolSpec, attempt: int) -> None:
        """Attempt ``attempt`` of a call started and never reported (a crash); it is retried."""

    def tool_call(self, entry: BatchEntry, spec: ToolSpec, attempt: int) -> CallSpan:
        """Attempt ``attempt`` of a call is about to run, inside the returned span."""
        return NO_CALL_SPAN

    def calls_ended(
        self, run_id: str, batch: Sequence[BatchEntry], done: Sequence[CallOutcome]
    ) -> None:
        """The executor receipted ``done`` (each call of ``batch`` it ran or refused)."""


class _CallSpans(CallSpan):
    """The spans of every listener, entered in subscription order and left in reverse."""

    __slots__ = ("_spans", "_stack")

    def __init__(self, spans: tuple[CallSpan, ...]) -> None:
        self._spans = spans
        self._stack = ExitStack()

    def __enter__(self) -> CallSpan:
        for span in self._spans:
            self._stack.enter_context(span)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.__exit__(kind, exc, tb)

    def ended(self, outcome: CallOutcome) -> None:
        for span in self._spans:
            span.ended(outcome)


class EventStream(LoopListener):
    """The loop's one event stream: every event emitted to it goes to each listener
    subscribed, in subscription order."""

    def __init__(self) -> None:
        self._listeners: tuple[LoopListener, ...] = ()
        self._lock = threading.Lock()

    @property
    def listeners(self) -> tuple[LoopListener, ...]:
        """The listeners subscribed, in subscription order."""
        return self._listeners

    def subscribe(self, listener: LoopListener) -> None:
        """Add ``listener`` (once: subscribing it again changes nothing)."""
        with self._lock:
            if not any(kept is listener for kept in self._listeners):
                self._listeners = (*self._listeners, listener)

    def unsubscribe(self, listener: LoopListener) -> None:
        """Remove ``listener``, if it was subscribed."""
        with self._lock:
            self._listeners = tuple(kept for kept in self._listeners if kept is not listener)

    def invoked(
        self, chunks: Iterator[T], graph: Any, config: Mapping[str, Any] | None
    ) -> Iterator[T]:
        for listener in self._listeners:
            chunks = listener.invoked(chunks, graph, config)
        return chunks

    def ainvoked(
        self, chunks: AsyncIterator[T], graph: Any, config: Mapping[str, Any] | None
    ) -> AsyncIterator[T]:
        for listener in self._listeners:
            chunks = listener.ainvoked(chunks, graph, config)
        return chunks

    def recorded(self, state: AgentState, manifests: Sequence[StepManifest]) -> None:
        for listener in self._listeners:
            listener.recorded(state, manifests)

    def gated(
        self, run_id: str, batch: Sequence[BatchEntry], specs: Sequence[ToolSpec | None]
    ) -> None:
        for listener in self._listeners:
            listener.gated(run_id, batch, specs)

    def batch_refused(
        self, run_id: str, calls: Sequence[ToolProposal], registry: ToolRegistry, code: str
    ) -> None:
        for listener in self._listeners:
            listener.batch_refused(run_id, calls, registry, code)

    def budget_refused(
        self,
        run_id: str,
        entries: Sequence[BatchEntry],
        refused: Mapping[str, Any],
        registry: ToolRegistry,
    ) -> None:
        for listener in self._listeners:
            listener.budget_refused(run_id, entries, refused, registry)

    def approver_answered(
        self,
        run_id: str,
        asked: Sequence[BatchEntry],
        batch: Sequence[BatchEntry],
        registry: ToolRegistry,
    ) -> None:
        for listener in self._listeners:
            listener.approver_answered(run_id, asked, batch, registry)

    def approvals_answered(
        self,
        run_id: str,
        asked: Sequence[BatchEntry],
        batch: Sequence[BatchEntry],
        registry: ToolRegistry,
        *,
        by: str | None = None,
    ) -> None:
        for listener in self._listeners:
            listener.approvals_answered(run_id, asked, batch, registry, by=by)

    def answer_refused(self, run_id: str, asked: Sequence[BatchEntry], code: str) -> None:
        for listener in self._listeners:
            listener.answer_refused(run_id, asked, code)

    def retrying(self, run_id: str, entry: BatchEntry, spec: ToolSpec, attempt: int) -> None:
        for listener in self._listeners:
            listener.retrying(run_id, entry, spec, attempt)

    def tool_call(self, entry: BatchEntry, spec: ToolSpec, attempt: int) -> CallSpan:
        listeners = self._listeners
        if len(listeners) == 1:  # the usual case: no wrapper around the one span
            return listeners[0].tool_call(entry, spec, attempt)
        if not listeners:
            return NO_CALL_SPAN
        return _CallSpans(tuple(kept.tool_call(entry, spec, attempt) for kept in listeners))

    def calls_ended(
        self, run_id: str, batch: Sequence[BatchEntry], done: Sequence[CallOutcome]
    ) -> None:
        for listener in self._listeners:
            listener.calls_ended(run_id, batch, done)


EVENTS = EventStream()
"""The stream every node emits to (one per process: its listeners are fencepost's own edges,
spans and logs, never keyed by anything a caller or a model names)."""


def subscribe(listener: LoopListener) -> None:
    """Add ``listener`` to the loop's event stream (once)."""
    EVENTS.subscribe(listener)
