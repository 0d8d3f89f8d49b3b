"""Shared kit for the tests of what fencepost tells developers (logs) and operators (spans).

OpenTelemetry's global tracer provider can be set once per process, so :func:`span_recorder`
sets one the first time it is asked, with a sampler that drops every span unless a test turned
recording on: the rest of the suite runs with tracing installed but sampling nothing (the
"configured, not recording" path), and only a test holding the ``spans`` fixture records.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult


class _Switch(Sampler):
    """Samples everything while ``on``, nothing otherwise."""

    def __init__(self) -> None:
        self.on = False

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        # A sampled span starts with the attributes the sampler hands back: all of them.
        if self.on:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
        return SamplingResult(Decision.DROP)

    def get_description(self) -> str:
        return "fencepost-tests-switch"


class SpanRecorder:
    """The process's test tracer provider: spans end up in ``exporter`` while recording."""

    def __init__(self) -> None:
        self.switch = _Switch()
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(sampler=self.switch)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.lock = threading.Lock()

    @contextmanager
    def recording(self) -> Iterator[InMemorySpanExporter]:
        """Record every span started inside the block (one test at a time)."""
        with self.lock:
            self.exporter.clear()
            self.switch.on = True
            try:
                yield self.exporter
            finally:
                self.switch.on = False


_recorder: SpanRecorder | None = None


def span_recorder() -> SpanRecorder:
    """The recorder, installed as the global tracer provider on first use."""
    global _recorder
    if _recorder is None:
        recorder = SpanRecorder()
        trace.set_tracer_provider(recorder.provider)
        if trace.get_tracer_provider() is not recorder.provider:
            raise RuntimeError("another global tracer provider was set first in this process")
        _recorder = recorder
    return _recorder


# -- reading spans -------------------------------------------------------------------------------


def by_name(spans: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def events(span: ReadableSpan, name: str | None = None) -> list[dict[str, Any]]:
    """The span's events (those named ``name``), each as its attributes plus ``"name"``."""
    return [
        {"name": e.name, **dict(e.attributes or {})}
        for e in span.events
        if name is None or e.name == name
    ]


def every_text(spans: Sequence[ReadableSpan]) -> str:
    """Everything a span exporter could send: names, attributes, events, links, status,
    resource, as one string (to search for a canary)."""
    return "\n".join(s.to_json() for s in spans)


# -- reading log records -------------------------------------------------------------------------


def traceback_of(record: logging.LogRecord) -> str:
    """The traceback a handler prints for ``record`` ("" without one)."""
    if not record.exc_info:
        return ""
    return logging.Formatter().formatException(record.exc_info)


def assert_only_in_one_traceback(
    records: Sequence[logging.LogRecord], secret: str, logger: str
) -> logging.LogRecord:
    """``secret`` (an exception's text) is in exactly one record's traceback, a WARNING on
    ``logger``, and in no record's message: the developer sees it once, where tracebacks go."""
    assert not [r for r in records if secret in r.getMessage()]
    carrying = [r for r in records if secret in traceback_of(r)]
    assert len(carrying) == 1, [(r.name, r.levelname, r.getMessage()) for r in carrying]
    (record,) = carrying
    assert record.name == logger
    assert record.levelno == logging.WARNING
    return record
