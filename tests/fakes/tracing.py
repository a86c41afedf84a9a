"""Tracing on, in-process: the bot's recorder, each ended span rebuilt as the SDK's.

The records go through ``bot.tracing.child.readable``, the very conversion the
exporter process applies before its OTLP exporter, so a test reads the spans as
an OpenTelemetry backend would get them (``ReadableSpan``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from bot.tracing import spans
from bot.tracing.child import readable
from bot.tracing.recorder import Record, Recorder

__all__ = ["Recorded", "recording_spans"]

_RESOURCE = Resource({"service.name": "test"})


class Recorded:
    """The spans ended so far, each as it ended."""

    def __init__(self) -> None:
        self._spans: list[ReadableSpan] = []

    def add(self, record: Record) -> None:
        self._spans.append(readable(record, _RESOURCE))

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self._spans)

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name == name]

    def in_trace(self, trace_id: int) -> list[ReadableSpan]:
        return [s for s in self.spans if s.context is not None and s.context.trace_id == trace_id]


@contextmanager
def recording_spans(*, capture_content: bool = False) -> Iterator[Recorded]:
    """Tracing on for the block, every span kept in memory; off again afterwards."""
    recorded = Recorded()
    spans.install(Recorder(recorded.add, capture_content=capture_content))
    try:
        yield recorded
    finally:
        spans.install(None)
