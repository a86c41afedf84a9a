"""The exporter process: spans from the bot rebuilt as the SDK's and exported over OTLP/HTTP.

Run by ``bot.tracing.export`` as ``python -P .../child.py EXPORTER ENDPOINT SERVICE
BATCH`` (as a script, so it imports none of the bot: only the standard library and
OpenTelemetry). It reads frames from its stdin (a 4-byte little-endian length,
then a ``marshal``-ed list of ``bot.tracing.recorder.Record`` lists), turns each
record into an ``opentelemetry.sdk.trace.ReadableSpan`` and exports a frame in
batches of at most BATCH spans (``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``) with the
official exporter (OTLP/HTTP protobuf, configured by
``OTEL_EXPORTER_OTLP_*``, or the console's). At the end of its stdin (the bot
stopped, or died) it shuts the exporter down and exits. Ctrl-C's SIGINT is
ignored: the bot's own stop closes the pipe after its last spans.

It runs ``NICENESS`` steps below the bot's priority: encoding and posting (about
30 µs of CPU a span) is background work that must not take the CPU from the bot
when the machine is busy. So that a niced exporter falling behind for a while
never pushes back on the bot (whose queue would drop), a reader thread drains the
pipe as frames arrive into a queue of up to ``BACKLOG`` frames; the main thread
exports them in order, and catches up when the bot is idle.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import queue
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import IO, Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

__all__ = ["BACKLOG", "NICENESS", "SCOPE", "frames", "main", "payloads", "readable"]

NICENESS = 19
"""Steps below the bot's priority (``os.nice``; 19, the lowest): the bot's work, and the
rest of the machine's, come first; the exporter catches up when they pause."""
BACKLOG = 64
"""Frames (exports of up to ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` spans) read ahead of
the exporter at most; beyond it the pipe, then the bot's queue, fill."""

SCOPE = InstrumentationScope("chatflow")
_UNSET = Status(StatusCode.UNSET)
_ERROR = Status(StatusCode.ERROR)
_KINDS = tuple(SpanKind)
_FLAGS = (TraceFlags(0), TraceFlags(1))


class _Resource(Resource):
    """The process's one resource, its hash computed once: the exporter groups every
    span by resource, and ``Resource``'s own hash serialises it to JSON each time."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other)


def readable(record: Sequence[Any], resource: Resource) -> ReadableSpan:
    """One ``Record`` as the SDK's finished span (what its exporters take)."""
    (name, trace_id, span_id, parent_id, flags, kind, start, end) = record[:8]
    attributes, links, events, failed = record[8:12]
    trace_flags = _FLAGS[flags] if flags < 2 else TraceFlags(flags)
    parent = (
        SpanContext(trace_id, parent_id, is_remote=False, trace_flags=trace_flags)
        if parent_id
        else None
    )
    return ReadableSpan(
        name=name,
        context=SpanContext(trace_id, span_id, is_remote=False, trace_flags=trace_flags),
        parent=parent,
        resource=resource,
        attributes=attributes,
        events=[Event(e_name, e_attributes, timestamp=at) for e_name, at, e_attributes in events]
        if events
        else (),
        links=[
            Link(SpanContext(t, s, is_remote=True, trace_flags=TraceFlags(f))) for t, s, f in links
        ]
        if links
        else (),
        kind=_KINDS[kind],
        status=_ERROR if failed else _UNSET,
        start_time=start,
        end_time=end,
        instrumentation_scope=SCOPE,
    )


def payloads(stream: IO[bytes]) -> Iterator[bytes]:
    """The frames' payloads on ``stream``, until it ends (or a frame is cut short)."""
    while True:
        header = stream.read(4)
        if len(header) < 4:
            return
        size = int.from_bytes(header, "little")
        payload = stream.read(size)
        if len(payload) < size:
            return
        yield payload


def frames(payloads: Iterator[bytes]) -> Iterator[list[Sequence[Any]]]:
    """The lists of records ``payloads`` hold."""
    for payload in payloads:
        frame = marshal.loads(payload)
        if isinstance(frame, list):
            yield frame


def _read_ahead(stream: IO[bytes], into: queue.Queue[bytes | None]) -> None:
    try:
        for payload in payloads(stream):
            into.put(payload)
    finally:
        into.put(None)


def _backlog(ahead: queue.Queue[bytes | None]) -> Iterator[bytes]:
    while (payload := ahead.get()) is not None:
        yield payload


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Reading starts first: the pipe drains while OpenTelemetry is still importing.
    # Payloads wait as bytes (about 180 a span), made into records when exported.
    ahead: queue.Queue[bytes | None] = queue.Queue(BACKLOG)
    reader = threading.Thread(
        target=_read_ahead, args=(sys.stdin.buffer, ahead), name="read", daemon=True
    )
    reader.start()
    kind, endpoint, service, batch_size = argv[1:5]
    batch = max(int(batch_size), 1)
    exporter: SpanExporter
    if kind == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint)
    resource = _Resource(Resource.create({"service.name": service}))
    # Niced once started (imported at the bot's priority: a starved start would delay
    # even the first export by seconds on a busy machine).
    with contextlib.suppress(OSError):  # not allowed here: it runs at the bot's priority
        os.nice(NICENESS)
    try:
        # Exports in order, a frame in batches; a slow collector (or an exporter starved of
        # CPU) fills the backlog, then the pipe, then the bot's queue, which drops
        # and counts.
        for frame in frames(_backlog(ahead)):
            for at in range(0, len(frame), batch):
                exporter.export([readable(record, resource) for record in frame[at : at + batch]])
    finally:
        exporter.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
