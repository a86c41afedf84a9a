"""The exporter process: spans from the bot encoded as OTLP and exported over OTLP/HTTP.

Run by ``bot.tracing.export`` as ``python -P .../child.py EXPORTER ENDPOINT SERVICE
BATCH`` (as a script, so it imports none of the bot: only the standard library and
OpenTelemetry). It reads frames from its stdin (a 4-byte little-endian length,
then a ``marshal``-ed list of ``bot.tracing.recorder.Record`` lists) and exports
each frame in batches of at most BATCH spans (``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``)
with the official OTLP/HTTP exporter, configured by ``OTEL_EXPORTER_OTLP_*``
(or the console's). ``Encoder`` writes a batch as the official encoder would,
byte for byte, at a fraction of its CPU, and the exporter's own transport posts it
(endpoint, headers, compression, timeout, retries); an exporter without that
transport gets the SDK's spans through its ``export``. At the end of its stdin
(the bot stopped, or died) it shuts the exporter down and exits. Ctrl-C's SIGINT
is ignored: the bot's own stop closes the pipe after its last spans.

It runs ``NICENESS`` steps below the bot's priority: encoding and posting (about
10 µs of CPU a span) is background work that must not take the CPU from the bot
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

__all__ = [
    "BACKLOG",
    "NICENESS",
    "SCOPE",
    "Encoder",
    "export",
    "frames",
    "main",
    "payloads",
    "poster",
    "readable",
]

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


_HAS_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_STATUS_ERROR = StatusCode.ERROR.value


class _Unsupported(Exception):
    """A value the fast path does not encode: the batch takes the official encoder."""


def _value(target: AnyValue, value: Any) -> None:
    kind = type(value)  # exact types: bool before int, as the official encoder orders them
    if kind is str:
        target.string_value = value
    elif kind is bool:
        target.bool_value = value
    elif kind is int:
        target.int_value = value
    elif kind is float:
        target.double_value = value
    elif kind is tuple or kind is list:
        array = target.array_value
        array.SetInParent()  # present even when empty, as the official encoder makes it
        for item in value:
            _value(array.values.add(), item)
    else:
        raise _Unsupported(kind.__name__)


def _attributes(target: Any, attributes: dict[str, Any]) -> None:
    for key, value in attributes.items():
        pair: KeyValue = target.add(key=key)
        _value(pair.value, value)


class Encoder:
    """Records as an OTLP/HTTP export request, the same bytes as the official encoder's
    (``encode_spans`` of ``readable`` records; a test holds them equal) at a sixth of
    its CPU: it fills the official protobuf messages field by field instead of building
    an SDK span, then a message per field, for each record.

    The envelope (resource, scope, schema URLs) is the official encoder's own, made
    once. A record holding a value of another type than a span attribute's
    (``bot.tracing.spans.AttributeValue``) makes ``encode`` answer ``None``: that
    batch takes the official encoder."""

    def __init__(self, resource: Resource) -> None:
        sample = readable(("", 1, 1, 0, 1, 0, 0, 0, {}, (), (), False), resource)
        self._envelope = encode_spans([sample])
        del self._envelope.resource_spans[0].scope_spans[0].spans[:]

    def encode(self, records: Sequence[Sequence[Any]]) -> bytes | None:
        request = ExportTraceServiceRequest()
        request.CopyFrom(self._envelope)
        out = request.resource_spans[0].scope_spans[0].spans
        try:
            for record in records:
                self._span(out, record)
        except (_Unsupported, ValueError, TypeError, OverflowError):
            return None
        encoded: bytes = request.SerializePartialToString()
        return encoded

    @staticmethod
    def _span(out: Any, record: Sequence[Any]) -> None:
        (name, trace_id, span_id, parent_id, _, kind, start, end) = record[:8]
        attributes, links, events, failed = record[8:12]
        span = out.add(
            trace_id=trace_id.to_bytes(16, "big"),
            span_id=span_id.to_bytes(8, "big"),
            parent_span_id=parent_id.to_bytes(8, "big") if parent_id else b"",
            name=name,
            kind=kind + 1,  # OTLP's SpanKind counts from UNSPECIFIED = 0
            start_time_unix_nano=start,
            end_time_unix_nano=end,
            flags=_HAS_IS_REMOTE,  # a local parent (or none), as ``readable`` makes it
        )
        if attributes:
            _attributes(span.attributes, attributes)
        for event_name, at, event_attributes in events:
            event = span.events.add(name=event_name, time_unix_nano=at)
            _attributes(event.attributes, event_attributes)
        for linked_trace, linked_span, _ in links:
            span.links.add(
                trace_id=linked_trace.to_bytes(16, "big"),
                span_id=linked_span.to_bytes(8, "big"),
                flags=_HAS_IS_REMOTE | _IS_REMOTE,
            )
        if failed:
            span.status.code = _STATUS_ERROR
        else:
            span.status.SetInParent()  # UNSET, present: as the official encoder writes it


def poster(exporter: SpanExporter) -> Callable[[bytes], object] | None:
    """The official OTLP/HTTP exporter's own transport for an encoded request (its
    endpoint, headers, compression, timeout and retries, all from ``OTEL_EXPORTER_OTLP_*``),
    where the installed version has one; else ``None`` (its ``export`` is used)."""
    client = getattr(exporter, "_client", None)
    post = getattr(client, "export", None)
    return post if callable(post) else None


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


def export(
    records: Iterable[list[Sequence[Any]]], exporter: SpanExporter, resource: Resource, batch: int
) -> None:
    """Export each frame of ``records`` in batches of at most ``batch``: encoded here and
    posted by the exporter's own transport where it has one, else through its
    ``export`` (the SDK's spans, the official encoder)."""
    post = poster(exporter)
    encoder = Encoder(resource) if post is not None else None
    for frame in records:
        for at in range(0, len(frame), batch):
            chunk = frame[at : at + batch]
            encoded = None if encoder is None else encoder.encode(chunk)
            if post is not None and encoded is not None:
                post(encoded)
            else:
                exporter.export([readable(record, resource) for record in chunk])


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
        export(frames(_backlog(ahead)), exporter, resource, batch)
    finally:
        exporter.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
