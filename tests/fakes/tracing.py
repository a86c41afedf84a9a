"""Tracing on, in-process: the SDK with an in-memory exporter behind ``bot.tracing.spans``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bot.tracing import spans
from bot.tracing.otel import OtelBackend

__all__ = ["Recorded", "recording_spans"]


class Recorded:
    """The spans ended so far (``SimpleSpanProcessor``: each as it ends)."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self._exporter = exporter

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self._exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name == name]

    def in_trace(self, trace_id: int) -> list[ReadableSpan]:
        return [s for s in self.spans if s.context is not None and s.context.trace_id == trace_id]


@contextmanager
def recording_spans(*, capture_content: bool = False) -> Iterator[Recorded]:
    """Tracing on for the block, every span kept in memory; off again afterwards."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans.install(OtelBackend(provider.get_tracer("test"), capture_content=capture_content))
    try:
        yield Recorded(exporter)
    finally:
        spans.install(None)
        provider.shutdown()
