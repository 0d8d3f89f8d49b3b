"""What a run tells operators as it goes: OpenTelemetry GenAI spans, and the log lines beside them.

**Spans**, when ``opentelemetry-api`` is importable (``pip install "fencepost[otel]"``), on the
global tracer provider: an application that configured OpenTelemetry needs nothing else. Without
the package nothing is imported (it is looked for once, on the first invoke) and each hook below
costs a context-variable read. Names and attributes follow OpenTelemetry's GenAI semantic
conventions (status: development), and carry names, ids, codes and counts only: never an
argument, result, prompt, answer or exception text in a name, attribute, event or status (the
conventions' opt-in content attributes are not emitted).

- ``invoke_agent {agent}``: one per ``invoke``/``ainvoke``/``stream``/``astream`` of a fencepost
  graph, a resume included (the agent is the graph's ``name``, ``"fencepost"`` when none was
  given). ``gen_ai.operation.name``, ``gen_ai.agent.name``, ``gen_ai.conversation.id`` (the
  thread id: a resume in another process is its own trace, found by it), ``fencepost.run_id``,
  ``gen_ai.usage.input_tokens``/``output_tokens`` (what the model reported for this invoke's
  steps), ``fencepost.budget.remaining.<axis>`` for each limited axis as the invoke left it, and,
  once the run has ended, ``fencepost.termination_reason`` and ``fencepost.error_code``. An
  invoke that raised has ``error.type`` (the exception's class) and an error status. Its events:
  ``fencepost.tool_call.refused`` for every call refused (at the gate, by the budget, by a human,
  or by the executor): ``gen_ai.tool.name`` (registered tools only), ``gen_ai.tool.call.id``,
  ``fencepost.verdict`` and ``error.type`` (the safe code), and for a call refused for a
  capability ``fencepost.missing_capability`` (the registered tool's capability the principal
  lacks: trusted configuration, shown to operators, never to the model);
  ``fencepost.approval.requested`` and ``fencepost.approval.answered``, with the tool, the call
  id and the verdict. A refused or approval-requested call that was traced for provenance has
  ``fencepost.provenance.<argument>`` too: the labels of where its values were seen
  (``["tool:call_3", "user"]``), never a value.
- ``execute_tool {tool}``: one per call the executor ran, under the agent span.
  ``gen_ai.operation.name``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
  ``gen_ai.tool.type="function"``, ``fencepost.effect``, ``fencepost.attempt``,
  ``fencepost.receipt_status``, and ``fencepost.provenance.<argument>`` for a traced call (see
  above); on failure ``error.type`` (the safe code) and an error status.
  The tool body runs in a copy of the context with this span current (sync bodies on their
  worker thread too), so what the tool does is traced under it: a child run's ``invoke_agent``
  span included.
- The chat model's own spans are LangChain's instrumentation's business: none here.

The nodes call none of this: they emit the loop's events (:mod:`fencepost.graph.events`), and
:data:`LISTENER` — subscribed by the composition root, ``build_agent_graph`` — turns each into
its span, span event and log line.

**Logs** (:mod:`fencepost.policy.developer_log` has the loggers and the tracebacks): the same
hooks log each refusal, approval, retry, failed call and run ending at INFO (a call that
succeeded at DEBUG), whether tracing is on or not.

The agent span's context is current only while the graph computes (around each step of the
stream it wraps, never while the caller holds a chunk), so a caller's own spans between chunks
are not parented to it.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from fencepost.graph.events import CallSpan, LoopListener
from fencepost.policy import (
    AgentState,
    BudgetAxis,
    Phase,
    RuntimeBudget,
    StepManifest,
    ToolProposal,
    ToolRegistry,
    ToolSpec,
    VerdictCode,
)
from fencepost.policy.batch import BatchEntry
from fencepost.policy.developer_log import APPROVAL, GATE, MODEL, RUN, TOOLS
from fencepost.policy.events import ToolFailed
from fencepost.policy.outcome import CallOutcome

__all__ = [
    "AgentRun",
    "ToolCall",
    "answer_refused",
    "approvals_answered",
    "atraced",
    "batch_refused",
    "budget_refused",
    "calls_ended",
    "gated",
    "recorded",
    "retrying",
    "tool_call",
    "tool_span",
    "traced",
]

T = TypeVar("T")

DEFAULT_AGENT_NAME = "fencepost"
"""``gen_ai.agent.name`` of a graph compiled without a name of its own."""
_LANGGRAPH_DEFAULT_NAME = "LangGraph"

REFUSED = "fencepost.tool_call.refused"
MISSING_CAPABILITY = "fencepost.missing_capability"
"""The refused event's attribute naming the capability a ``capability_denied`` call lacked."""
APPROVAL_REQUESTED = "fencepost.approval.requested"
APPROVAL_ANSWERED = "fencepost.approval.answered"
APPROVAL_REFUSED = "fencepost.approval.refused"


# -- OpenTelemetry, looked for once -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Otel:
    """The few OpenTelemetry API names the spans need, imported once."""

    tracer: Any
    attach: Any
    detach: Any
    set_span_in_context: Any
    internal: Any
    error_status: Any


_otel: _Otel | None = None
_looked = False


def _opentelemetry() -> _Otel | None:
    """The OpenTelemetry API when ``opentelemetry-api`` is installed, else None (looked for on
    the first call only: an application without it never imports it)."""
    global _otel, _looked
    if not _looked:
        _otel, _looked = _load(), True
    return _otel


def _load() -> _Otel | None:
    try:
        from opentelemetry import context, trace
    except ImportError:
        return None
    try:
        version: str | None = importlib.metadata.version("fencepost")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return _Otel(
        # A proxy until the application sets its provider; the provider's tracer from then on.
        tracer=trace.get_tracer("fencepost", version),
        attach=context.attach,
        detach=context.detach,
        set_span_in_context=trace.set_span_in_context,
        internal=trace.SpanKind.INTERNAL,
        error_status=trace.Status(trace.StatusCode.ERROR),
    )


def _error_type(exc: BaseException) -> str:
    """The exception's class, as ``error.type`` names one (its text is never read)."""
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


# -- the agent span -------------------------------------------------------------------------------


class AgentRun:
    """One ``invoke_agent`` span and what the nodes report to it while the graph computes."""

    __slots__ = (
        "budget",
        "context",
        "error_code",
        "executed",
        "input_tokens",
        "otel",
        "output_tokens",
        "run_id",
        "span",
        "termination",
    )

    def __init__(self, otel: _Otel, span: Any) -> None:
        self.otel = otel
        self.span = span
        self.context = otel.set_span_in_context(span)
        self.run_id: str | None = None
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.budget: RuntimeBudget | None = None
        self.termination: str | None = None
        self.error_code: str | None = None
        self.executed: set[str] = set()
        """Call ids that got an ``execute_tool`` span in this invoke."""

    def enter(self) -> tuple[object, Token[AgentRun | None]]:
        """Make the span current (for OpenTelemetry and for the hooks below)."""
        return self.otel.attach(self.context), _CURRENT.set(self)

    def leave(self, tokens: tuple[object, Token[AgentRun | None]]) -> None:
        _CURRENT.reset(tokens[1])
        self.otel.detach(tokens[0])

    def saw(self, state: AgentState, manifests: Sequence[StepManifest]) -> None:
        """A node recorded ``manifests`` and left ``state``."""
        self.run_id = state.run_id
        self.budget = state.budget
        for m in manifests:
            if m.input_tokens is not None:
                self.input_tokens = (self.input_tokens or 0) + m.input_tokens
            if m.output_tokens is not None:
                self.output_tokens = (self.output_tokens or 0) + m.output_tokens
        if state.termination is not None:
            # str(): the reason's value (a StrEnum), whatever a caller's state edit left there.
            self.termination = str(state.termination)
            self.error_code = state.last_error_code

    def event(self, name: str, attributes: dict[str, Any]) -> None:
        self.span.add_event(name, attributes)

    def failed(self, exc: BaseException) -> None:
        self.span.set_attribute("error.type", _error_type(exc))
        self.span.set_status(self.otel.error_status)

    def end(self) -> None:
        attributes: dict[str, Any] = {}
        if self.run_id is not None:
            attributes["fencepost.run_id"] = self.run_id
        if self.input_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = self.input_tokens
        if self.output_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = self.output_tokens
        if self.budget is not None:
            for axis in BudgetAxis:
                left = self.budget.remaining(axis)
                if left is not None:
                    attributes[f"fencepost.budget.remaining.{axis.value}"] = left
        if self.termination is not None:
            attributes["fencepost.termination_reason"] = self.termination
            if self.error_code is not None:
                attributes["fencepost.error_code"] = self.error_code
        self.span.set_attributes(attributes)
        self.span.end()


_CURRENT: ContextVar[AgentRun | None] = ContextVar("fencepost_agent_run", default=None)
"""The agent span the running graph reports to (set only while it computes)."""


def agent_name(graph: Any) -> str:
    """``gen_ai.agent.name`` of a compiled graph: its ``name``, unless LangGraph's default."""
    name = getattr(graph, "name", None)
    if not isinstance(name, str) or not name or name == _LANGGRAPH_DEFAULT_NAME:
        return DEFAULT_AGENT_NAME
    return name


def _thread_id(config: Mapping[str, Any] | None) -> str | None:
    configurable = (config or {}).get("configurable") or {}
    thread = configurable.get("thread_id") if isinstance(configurable, Mapping) else None
    return None if thread is None else str(thread)


def _start(agent: str, config: Mapping[str, Any] | None) -> AgentRun | None:
    """Start the ``invoke_agent`` span, as a child of whatever span is current; None when the
    tracer does not record it (no provider configured, or sampled out): then nothing is done."""
    otel = _opentelemetry()
    if otel is None:
        return None
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent,
    }
    thread = _thread_id(config)
    if thread is not None:
        attributes["gen_ai.conversation.id"] = thread
    span = otel.tracer.start_span(
        f"invoke_agent {agent}",
        kind=otel.internal,
        attributes=attributes,
        # Either would write the exception's text into the span.
        record_exception=False,
        set_status_on_exception=False,
    )
    if not span.is_recording():
        return None
    return AgentRun(otel, span)


def traced(chunks: Iterator[T], graph: Any, config: Mapping[str, Any] | None) -> Iterator[T]:
    """``chunks`` (a graph's stream) inside an ``invoke_agent`` span: ``chunks`` itself when
    OpenTelemetry is not installed."""
    if _opentelemetry() is None:
        return chunks
    return _traced(chunks, agent_name(graph), config)


def _traced(chunks: Iterator[T], agent: str, config: Mapping[str, Any] | None) -> Iterator[T]:
    run = _start(agent, config)  # on the first ``next``: when the invoke starts
    if run is None:
        yield from chunks
        return
    try:
        while True:
            tokens = run.enter()
            try:
                chunk = next(chunks)
            except StopIteration:
                return
            finally:
                run.leave(tokens)
            yield chunk
    except GeneratorExit:
        raise  # the caller stopped reading: not a failure
    except BaseException as exc:
        run.failed(exc)
        raise
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            tokens = run.enter()
            try:
                close()
            finally:
                run.leave(tokens)
        run.end()


def atraced(
    chunks: AsyncIterator[T], graph: Any, config: Mapping[str, Any] | None
) -> AsyncIterator[T]:
    """:func:`traced` for ``astream``."""
    if _opentelemetry() is None:
        return chunks
    return _atraced(chunks, agent_name(graph), config)


async def _atraced(
    chunks: AsyncIterator[T], agent: str, config: Mapping[str, Any] | None
) -> AsyncIterator[T]:
    run = _start(agent, config)
    try:
        while True:
            tokens = run.enter() if run is not None else None
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            finally:
                if run is not None and tokens is not None:
                    run.leave(tokens)
            yield chunk
    except GeneratorExit:
        raise
    except BaseException as exc:
        if run is not None:
            run.failed(exc)
        raise
    finally:
        aclose = getattr(chunks, "aclose", None)
        try:
            if aclose is not None:
                await aclose()
        finally:
            if run is not None:
                run.end()


# -- hooks the nodes call -------------------------------------------------------------------------


def recorded(state: AgentState, manifests: Sequence[StepManifest]) -> None:
    """A node recorded ``manifests`` (streamed and kept in state) and left ``state``: the agent
    span learns the run id, the tokens, the budget left and how the run ended; a model step's
    failure and a run's end are logged."""
    run = _CURRENT.get()
    if run is not None:
        run.saw(state, manifests)
    for m in manifests:
        if m.phase is Phase.TERMINAL:
            code = state.last_error_code
            _info(
                RUN,
                "run %s ended %s" + (" (%s)" if code else ""),
                state.run_id,
                m.code,
                *((code,) if code else ()),
                run_id=state.run_id,
                code=code or m.code,
            )
        elif m.phase is Phase.DECIDE and m.outcome == "error":
            _info(
                MODEL,
                "run %s step %d: the decision model failed with %s; %s",
                state.run_id,
                m.step,
                m.code,
                "ending the run" if state.stop is not None else "asking it again",
                run_id=state.run_id,
                code=m.code,
            )


PROVENANCE = "fencepost.provenance."
"""The prefix of a call's provenance attributes: ``fencepost.provenance.<argument>`` = the
labels of the sources its values were seen in (``["tool:call_3", "user"]``), never a value."""


def provenance_attributes(entry: BatchEntry) -> dict[str, tuple[str, ...]]:
    """A traced call's provenance as span attributes (empty: not traced). The argument names
    are the registered tool's own (the gate traces no other)."""
    recorded = entry.verdict.provenance
    if not recorded:
        return {}
    return {PROVENANCE + name: labels for name, labels in recorded.items() if labels}


def _verdict(entry: BatchEntry) -> str:
    return str(entry.verdict.code.value)


def _refusal(
    run: AgentRun | None,
    call_id: str,
    tool: str | None,
    verdict: str | None,
    code: str,
    capability: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    if run is None:
        return
    attributes: dict[str, Any] = {"gen_ai.tool.call.id": call_id, "error.type": code}
    if extra:
        attributes.update(extra)
    if tool is not None:
        attributes["gen_ai.tool.name"] = tool
    if verdict is not None:
        attributes["fencepost.verdict"] = verdict
    if capability is not None:
        attributes[MISSING_CAPABILITY] = capability
    run.event(REFUSED, attributes)


def _approval(
    run: AgentRun | None,
    name: str,
    call_id: str,
    tool: str | None,
    verdict: str,
    *,
    who: str | None = None,
    human: bool | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    if run is None:
        return
    attributes: dict[str, Any] = {"gen_ai.tool.call.id": call_id, "fencepost.verdict": verdict}
    if extra:
        attributes.update(extra)
    if human is not None:
        attributes["fencepost.approval.kind"] = "human" if human else "approver"
    if who is not None:
        attributes["fencepost.approval.by"] = who
    if tool is not None:
        attributes["gen_ai.tool.name"] = tool
    run.event(name, attributes)


def gated(run_id: str, batch: Sequence[BatchEntry], specs: Sequence[ToolSpec | None]) -> None:
    """The gate judged ``batch``: each refused call, and each one left waiting for a human."""
    run = _CURRENT.get()
    for entry, spec in zip(batch, specs, strict=True):
        code = entry.verdict.code
        if code is VerdictCode.ALLOWED:
            continue
        tool = spec.name if spec is not None else None
        if code is VerdictCode.APPROVAL_PENDING:
            _approval(
                run,
                APPROVAL_REQUESTED,
                entry.call_id,
                tool,
                code.value,
                extra=provenance_attributes(entry),
            )
            _info(
                APPROVAL,
                "run %s call %s (%s) waits for approval",
                run_id,
                entry.call_id,
                tool,
                run_id=run_id,
                call_id=entry.call_id,
                code=code.value,
            )
            continue
        missing = entry.verdict.missing_capability if spec is not None else None
        _refused(
            run,
            run_id,
            entry.call_id,
            tool,
            code.value,
            code.value,
            missing,
            provenance_attributes(entry),
        )


def _refused(
    run: AgentRun | None,
    run_id: str,
    call_id: str,
    tool: str | None,
    verdict: str | None,
    code: str,
    capability: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    _refusal(run, call_id, tool, verdict, code, capability, extra)
    if capability is None:
        _info(
            GATE,
            "run %s call %s (%s) refused: %s",
            run_id,
            call_id,
            tool or "an unregistered tool",
            code,
            run_id=run_id,
            call_id=call_id,
            code=code,
        )
        return
    if GATE.isEnabledFor(logging.INFO):
        GATE.info(
            "run %s call %s (%s) refused: %s (the principal lacks the capability %r)",
            run_id,
            call_id,
            tool,
            code,
            capability,
            extra={"run_id": run_id, "call_id": call_id, "code": code, "capability": capability},
        )


def batch_refused(
    run_id: str, calls: Sequence[ToolProposal], registry: ToolRegistry, code: str
) -> None:
    """A whole batch refused before its calls were judged one by one (``code``: why)."""
    run = _CURRENT.get()
    for call in calls:
        name = call.tool_name
        tool = registry.get(name).name if name in registry else None
        _refused(run, run_id, call.call_id, tool, None, code)


def budget_refused(
    run_id: str, entries: Sequence[BatchEntry], refused: Mapping[str, Any], registry: ToolRegistry
) -> None:
    """Calls of a batch the budget could not cover (``refused``: by call id)."""
    if not refused:
        return
    run = _CURRENT.get()
    for entry in entries:
        if entry.call_id in refused:
            name = entry.proposal.tool_name
            tool = registry.get(name).name if name in registry else None
            code = VerdictCode.BUDGET_EXHAUSTED.value
            _refused(run, run_id, entry.call_id, tool, code, code)


def approvals_answered(
    run_id: str,
    asked: Sequence[BatchEntry],
    batch: Sequence[BatchEntry],
    registry: ToolRegistry,
    *,
    by: str | None = None,
) -> None:
    """A human answered the calls ``asked`` about; ``batch`` holds their new verdicts; ``by``
    is the principal who answered (on the span event as ``fencepost.approval.by``, with
    ``fencepost.approval.kind="human"``)."""
    _answered(run_id, asked, batch, registry, by=f" by {by}" if by else "", refusals=True, who=by)


def answer_refused(run_id: str, asked: Sequence[BatchEntry], code: str) -> None:
    """An answer to the calls ``asked`` about was not taken from whoever gave it (``code``):
    the run waits again. A span event ``fencepost.approval.refused`` per call, and a log."""
    run = _CURRENT.get()
    for entry in asked:
        if run is not None:
            run.event(APPROVAL_REFUSED, {"gen_ai.tool.call.id": entry.call_id, "error.type": code})
        _info(
            APPROVAL,
            "run %s call %s: an answer was not taken (%s); it still waits",
            run_id,
            entry.call_id,
            code,
            run_id=run_id,
            call_id=entry.call_id,
            code=code,
        )


def approver_answered(
    run_id: str,
    asked: Sequence[BatchEntry],
    batch: Sequence[BatchEntry],
    registry: ToolRegistry,
) -> None:
    """The graph's approver policy answered the calls ``asked`` about (``batch`` holds their
    new verdicts). A rejection is reported as a refusal by :func:`gated`, with the batch."""
    _answered(run_id, asked, batch, registry, by=" by the approver", refusals=False, who=None)


def _answered(
    run_id: str,
    asked: Sequence[BatchEntry],
    batch: Sequence[BatchEntry],
    registry: ToolRegistry,
    *,
    by: str,
    refusals: bool,
    who: str | None,
) -> None:
    run = _CURRENT.get()
    now = {e.call_id: e for e in batch}
    for entry in asked:
        answered = now.get(entry.call_id, entry)
        name = answered.proposal.tool_name
        tool = registry.get(name).name if name in registry else None
        verdict = _verdict(answered)
        _approval(run, APPROVAL_ANSWERED, entry.call_id, tool, verdict, who=who, human=refusals)
        _info(
            APPROVAL,
            "run %s call %s (%s) answered%s: %s",
            run_id,
            entry.call_id,
            tool or "an unregistered tool",
            by,
            verdict,
            run_id=run_id,
            call_id=entry.call_id,
            code=verdict,
        )
        if refusals and not answered.verdict.allowed:
            _refused(run, run_id, entry.call_id, tool, verdict, verdict)


def retrying(run_id: str, entry: BatchEntry, spec: ToolSpec, attempt: int) -> None:
    """Attempt ``attempt`` of a call started and never reported (a crash); it is retried."""
    _info(
        RUN,
        "run %s call %s (%s): attempt %d started and never reported; retrying as attempt %d",
        run_id,
        entry.call_id,
        spec.name,
        attempt,
        attempt + 1,
        run_id=run_id,
        call_id=entry.call_id,
        code="retry",
    )


class ToolCall(CallSpan):
    """One ``execute_tool`` span, current while the call runs (a no-op when not tracing)."""

    __slots__ = ("_run", "_span", "_tokens")

    def __init__(self, run: AgentRun | _Parent | None, span: Any) -> None:
        self._run = run
        self._span = span
        self._tokens: object = None

    def __enter__(self) -> ToolCall:
        if self._run is not None:
            self._tokens = self._run.otel.attach(self._run.otel.set_span_in_context(self._span))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        run = self._run
        if run is None:
            return
        run.otel.detach(self._tokens)
        if exc is not None:
            self._span.set_attribute("error.type", _error_type(exc))
            self._span.set_status(run.otel.error_status)
        self._span.end()

    def ended(self, outcome: CallOutcome) -> None:
        """The call's outcome, before the span ends."""
        if self._run is None:
            return
        span = self._span
        event = outcome.event
        if isinstance(event, ToolFailed):
            span.set_attributes(
                {
                    "fencepost.receipt_status": outcome.status.value,
                    "error.type": event.error_code.value,
                }
            )
            span.set_status(self._run.otel.error_status)
        else:
            span.set_attribute("fencepost.receipt_status", outcome.status.value)

    def settled(self, status: str, error_code: str | None) -> None:
        """:meth:`ended` for a binding that has no :class:`CallOutcome`: the receipt status
        and, for a failure, its safe code."""
        if self._run is None:
            return
        self._span.set_attribute("fencepost.receipt_status", status)
        if error_code is not None:
            self._span.set_attribute("error.type", error_code)
            self._span.set_status(self._run.otel.error_status)


_NOT_TRACED = ToolCall(None, None)


class _Parent:
    """What a :class:`ToolCall` needs of its agent run when no ``invoke_agent`` span is open
    (the middleware binding: LangChain's graph runs the invoke): the OpenTelemetry names."""

    __slots__ = ("otel",)

    def __init__(self, otel: _Otel) -> None:
        self.otel = otel


def tool_span(call_id: str, spec: ToolSpec, attempt: int) -> ToolCall:
    """The ``execute_tool`` span of a call the middleware binding is about to run: as
    :func:`tool_call` (the same name and attributes), under the ``invoke_agent`` span when one
    is open, else under whatever span is current (the application's, or none)."""
    run = _CURRENT.get()
    otel = run.otel if run is not None else _opentelemetry()
    if otel is None:
        return _NOT_TRACED
    span = otel.tracer.start_span(
        f"execute_tool {spec.name}",
        **({"context": run.context} if run is not None else {}),
        kind=otel.internal,
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": spec.name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
            "fencepost.effect": spec.effect.value,
            "fencepost.attempt": attempt,
        },
        record_exception=False,
        set_status_on_exception=False,
    )
    if not span.is_recording():
        return _NOT_TRACED
    if run is not None:
        run.executed.add(call_id)
        return ToolCall(run, span)
    return ToolCall(_Parent(otel), span)


def tool_call(entry: BatchEntry, spec: ToolSpec, attempt: int) -> ToolCall:
    """The ``execute_tool`` span of attempt ``attempt`` of a call about to run, as a context
    manager: the tool runs inside it, and :meth:`ToolCall.ended` gives it the outcome."""
    run = _CURRENT.get()
    if run is None:
        return _NOT_TRACED
    run.executed.add(entry.call_id)
    otel = run.otel
    span = otel.tracer.start_span(
        f"execute_tool {spec.name}",
        context=run.context,
        kind=otel.internal,
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": spec.name,
            "gen_ai.tool.call.id": entry.call_id,
            "gen_ai.tool.type": "function",
            "fencepost.effect": spec.effect.value,
            "fencepost.attempt": attempt,
            **provenance_attributes(entry),
        },
        record_exception=False,
        set_status_on_exception=False,
    )
    return ToolCall(run, span)


def calls_ended(run_id: str, batch: Sequence[BatchEntry], done: Sequence[CallOutcome]) -> None:
    """The executor receipted ``done``: each call that did not succeed is logged (INFO; a
    success at DEBUG), and one that never ran in this invoke is a refusal on the agent span."""
    run = _CURRENT.get()
    verdicts = {e.call_id: e for e in batch}
    for outcome in done:
        # isinstance, not getattr: a model's missing attribute costs an AttributeError.
        event = outcome.event
        error = event.error_code if isinstance(event, ToolFailed) else None
        status = outcome.status
        tool = event.tool_name if outcome.effect is not None else None
        if error is None:
            if TOOLS.isEnabledFor(logging.DEBUG):
                TOOLS.debug(
                    "run %s call %s (%s) %s",
                    run_id,
                    outcome.call_id,
                    tool,
                    status.value,
                    extra={"run_id": run_id, "call_id": outcome.call_id, "code": status.value},
                )
            continue
        _info(
            TOOLS,
            "run %s call %s (%s) %s: %s",
            run_id,
            outcome.call_id,
            tool or "an unregistered tool",
            status.value,
            error.value,
            run_id=run_id,
            call_id=outcome.call_id,
            code=error.value,
        )
        if run is not None and outcome.call_id not in run.executed:
            # Never run in this invoke: refused by the executor (its own checks, the budget, a
            # dependency that failed), or not run again after a crash (``uncertain``).
            entry = verdicts.get(outcome.call_id)
            verdict = _verdict(entry) if entry is not None else None
            _refusal(run, outcome.call_id, tool, verdict, error.value, outcome.missing_capability)


def _info(
    logger: logging.Logger,
    message: str,
    *args: Any,
    run_id: str,
    call_id: str | None = None,
    code: str | None,
) -> None:
    if logger.isEnabledFor(logging.INFO):
        logger.info(message, *args, extra={"run_id": run_id, "call_id": call_id, "code": code})


class Telemetry(LoopListener):
    """The loop's events as OpenTelemetry spans and developer logs: each event is the hook of
    this module of the same name (the invoke is :func:`traced` / :func:`atraced`)."""

    def invoked(
        self, chunks: Iterator[T], graph: Any, config: Mapping[str, Any] | None
    ) -> Iterator[T]:
        return traced(chunks, graph, config)

    def ainvoked(
        self, chunks: AsyncIterator[T], graph: Any, config: Mapping[str, Any] | None
    ) -> AsyncIterator[T]:
        return atraced(chunks, graph, config)

    def recorded(self, state: AgentState, manifests: Sequence[StepManifest]) -> None:
        recorded(state, manifests)

    def gated(
        self, run_id: str, batch: Sequence[BatchEntry], specs: Sequence[ToolSpec | None]
    ) -> None:
        gated(run_id, batch, specs)

    def batch_refused(
        self, run_id: str, calls: Sequence[ToolProposal], registry: ToolRegistry, code: str
    ) -> None:
        batch_refused(run_id, calls, registry, code)

    def budget_refused(
        self,
        run_id: str,
        entries: Sequence[BatchEntry],
        refused: Mapping[str, Any],
        registry: ToolRegistry,
    ) -> None:
        budget_refused(run_id, entries, refused, registry)

    def approver_answered(
        self,
        run_id: str,
        asked: Sequence[BatchEntry],
        batch: Sequence[BatchEntry],
        registry: ToolRegistry,
    ) -> None:
        approver_answered(run_id, asked, batch, registry)

    def approvals_answered(
        self,
        run_id: str,
        asked: Sequence[BatchEntry],
        batch: Sequence[BatchEntry],
        registry: ToolRegistry,
        *,
        by: str | None = None,
    ) -> None:
        approvals_answered(run_id, asked, batch, registry, by=by)

    def answer_refused(self, run_id: str, asked: Sequence[BatchEntry], code: str) -> None:
        answer_refused(run_id, asked, code)

    def retrying(self, run_id: str, entry: BatchEntry, spec: ToolSpec, attempt: int) -> None:
        retrying(run_id, entry, spec, attempt)

    def tool_call(self, entry: BatchEntry, spec: ToolSpec, attempt: int) -> CallSpan:
        return tool_call(entry, spec, attempt)

    def calls_ended(
        self, run_id: str, batch: Sequence[BatchEntry], done: Sequence[CallOutcome]
    ) -> None:
        calls_ended(run_id, batch, done)


LISTENER = Telemetry()
"""The one telemetry listener the composition root subscribes to the loop's event stream."""
