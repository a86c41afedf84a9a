"""The exporter process: spans from the bot encoded as OTLP and exported over OTLP/HTTP.

Run by ``bot.tracing.export`` as ``python -P .../child.py EXPORTER ENDPOINT SERVICE
BATCH LOGS`` (as a script, so it imports none of the bot: only the standard library
and OpenTelemetry; ``LOGS``, ``json`` or ``text``, is how the bot writes its log
lines, and so how this process writes its own on the stderr they share). It reads
frames from its stdin (a 4-byte little-endian length, then a ``marshal``-ed list
of ``bot.tracing.recorder.Record`` lists) and exports each frame in batches of at
most BATCH spans (``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``) with the official OTLP/HTTP
exporter, configured by ``OTEL_EXPORTER_OTLP_*``
(or the console's). ``Encoder`` writes a batch as the official encoder would,
byte for byte, at a fraction of its CPU, and the exporter's own transport posts it
(endpoint, headers, compression, timeout, retries); an exporter without that
transport gets the SDK's spans through its ``export``. At the end of its stdin
(the bot stopped, or died) it shuts the exporter down and exits. Ctrl-C's SIGINT
is ignored: the bot's own stop closes the pipe after its last spans.

It runs ``NICENESS`` steps below the bot's priority: encoding and posting (about
5 µs of CPU a span) is background work that must not take the CPU from the bot
when the machine is busy. So that a niced exporter falling behind for a while
never pushes back on the bot (whose queue would drop), a reader thread drains the
pipe as frames arrive into a queue of up to ``BACKLOG`` frames; the main thread
exports them in order, and catches up when the bot is idle.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import marshal
import os
import queue
import signal
import struct
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

if TYPE_CHECKING:
    import requests

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


# The OTLP protobuf schema's wire format (opentelemetry/proto/trace/v1/trace.proto and
# common.proto): each field's tag byte(s), written in field-number order as protobuf
# serialises a message. A value of another type than a span attribute's raises
# ``_Unsupported`` (the batch then takes the official encoder).
_SPAN = b"\x12"  # ScopeSpans.spans
_TRACE_ID = b"\x0a\x10"  # Span.trace_id, 16 bytes
_SPAN_ID = b"\x12\x08"  # Span.span_id, 8 bytes
_PARENT_ID = b"\x22\x08"  # Span.parent_span_id, 8 bytes
_NAME = b"\x2a"  # Span.name
_KIND = b"\x30"  # Span.kind
_START = b"\x39"  # Span.start_time_unix_nano, fixed64
_END = b"\x41"  # Span.end_time_unix_nano, fixed64
_ATTRIBUTE = b"\x4a"  # Span.attributes
_EVENT = b"\x5a"  # Span.events
_LINK = b"\x6a"  # Span.links
_STATUS_UNSET = b"\x7a\x00"  # Span.status: present, UNSET (as the official encoder writes it)
_STATUS_ERROR = b"\x7a\x02\x18" + bytes((StatusCode.ERROR.value,))  # Status.code
# Span.flags (fixed32, field 16): a local parent or none, as ``readable`` makes it.
_SPAN_FLAGS = b"\x85\x01" + int(SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK).to_bytes(
    4, "little"
)
_UNSET_END, _FAILED_END = _STATUS_UNSET + _SPAN_FLAGS, _STATUS_ERROR + _SPAN_FLAGS
# Link.flags (fixed32, field 6): a remote span (a stored traceparent).
_LINK_FLAGS = b"\x35" + int(
    SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK | SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
).to_bytes(4, "little")
_EVENT_TIME = b"\x09"  # Event.time_unix_nano, fixed64
_EVENT_NAME = b"\x12"  # Event.name
_EVENT_ATTRIBUTE = b"\x1a"  # Event.attributes
_KEY = b"\x0a"  # KeyValue.key
_VALUE = b"\x12"  # KeyValue.value
_ARRAY_ITEM = b"\x0a"  # ArrayValue.values
_TRUE, _FALSE = b"\x10\x01", b"\x10\x00"  # AnyValue.bool_value
_INT, _DOUBLE, _ARRAY = b"\x18", b"\x21", b"\x2a"  # AnyValue.int_value, double_value, array
_STRING = b"\x0a"  # AnyValue.string_value
_INT64 = 1 << 63
_UINT64 = (1 << 64) - 1
_FIXED64 = struct.Struct("<Q").pack
_TIMES = struct.Struct("<BQBQ").pack
_DOUBLE_BYTES = struct.Struct("<d").pack
_SMALL = tuple(bytes((n,)) for n in range(128))
_CACHED = 8192
"""Attribute pairs (key and value) kept encoded: the same names, models and outcomes
come back span after span."""


class _Unsupported(Exception):
    """A value the fast path does not encode: the batch takes the official encoder."""


def _varint(value: int) -> bytes:
    if value < 128:
        return _SMALL[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, body: bytes) -> bytes:
    return tag + _varint(len(body)) + body


def _any(value: Any) -> bytes:
    """An ``AnyValue`` (its ``oneof`` is present even when it holds a default)."""
    kind = type(value)  # exact types: bool before int, as the official encoder orders them
    if kind is str:
        return _field(_STRING, value.encode())
    if kind is bool:
        return _TRUE if value else _FALSE
    if kind is int:
        if not -_INT64 <= value < _INT64:
            raise _Unsupported("int64")
        return _INT + _varint(value & _UINT64)
    if kind is float:
        return _DOUBLE + _DOUBLE_BYTES(value)
    if kind is tuple or kind is list:
        return _field(_ARRAY, b"".join(_field(_ARRAY_ITEM, _any(item)) for item in value))
    raise _Unsupported(kind.__name__)


def _all_str(items: tuple[Any, ...]) -> bool:
    return all(type(item) is str for item in items)


def _pair(tag: bytes, key: str, value: Any) -> bytes:
    return _field(tag, _field(_KEY, key.encode()) + _field(_VALUE, _any(value)))


class Encoder:
    """Records as an OTLP/HTTP export request, the same bytes as the official encoder's
    (``encode_spans`` of ``readable`` records; a test holds them equal) at a tenth of
    its CPU: it writes protobuf's wire format for each span, with the encoded
    attribute pairs that come back (an agent's name, a model, an outcome) kept.

    The envelope (resource, scope, schema URLs) is the official encoder's own, made
    once. A record holding a value of another type than a span attribute's
    (``bot.tracing.spans.AttributeValue``) makes ``encode`` answer ``None``: that
    batch takes the official encoder."""

    def __init__(self, resource: Resource) -> None:
        sample = readable(("", 1, 1, 0, 1, 0, 0, 0, {}, (), (), False), resource)
        request = encode_spans([sample])
        resource_spans = request.resource_spans[0]
        scope_spans = resource_spans.scope_spans[0]
        del scope_spans.spans[:]
        # ScopeSpans: scope (1), spans (2), schema_url (3); ResourceSpans: resource (1),
        # scope_spans (2), schema_url (3): the spans go between each one's head and tail.
        self._scope_head, self._scope_tail = _around(scope_spans, "scope")
        self._resource_head, self._resource_tail = _around(resource_spans, "resource")
        # Encoded pairs, a dict for each field they are written as (their tag).
        self._pairs: dict[bytes, dict[tuple[str, type, Any], bytes]] = {
            _ATTRIBUTE: {},
            _EVENT_ATTRIBUTE: {},
        }
        self._names: dict[tuple[str, int], bytes] = {}

    def encode(self, records: Sequence[Sequence[Any]]) -> bytes | None:
        try:
            spans = b"".join([self._span(record) for record in records])
        except (_Unsupported, ValueError, TypeError, OverflowError, AttributeError, struct.error):
            return None  # (a value no span attribute holds, a time beyond 64 bits)
        scope = self._scope_head + spans + self._scope_tail
        resource = self._resource_head + _field(b"\x12", scope) + self._resource_tail
        return _field(b"\x0a", resource)  # ExportTraceServiceRequest.resource_spans

    def _attributes(self, tag: bytes, attributes: dict[str, Any]) -> bytes:
        pairs = self._pairs[tag]
        out = []
        for key, value in attributes.items():
            kind = type(value)
            # Never kept: a float (-0.0 equals 0.0), a list, or a tuple holding anything
            # but str ((1,) equals (True,); ("1",) is kept apart from (1,) by its items).
            if kind is float or kind is list or (kind is tuple and not _all_str(value)):
                out.append(_pair(tag, key, value))
                continue
            cached = pairs.get((key, kind, value))
            if cached is None:
                if len(pairs) >= _CACHED:
                    pairs.clear()
                cached = pairs[key, kind, value] = _pair(tag, key, value)
            out.append(cached)
        return b"".join(out)

    def _span(self, record: Sequence[Any]) -> bytes:
        (name, trace_id, span_id, parent_id, _, kind, start, end) = record[:8]
        attributes, links, events, failed = record[8:12]
        named = self._names.get((name, kind))
        if named is None:
            named = self._names[name, kind] = (
                (_field(_NAME, name.encode()) if name else b"") + _KIND + _varint(kind + 1)
            )
        parts = [
            _TRACE_ID,
            trace_id.to_bytes(16, "big"),
            _SPAN_ID,
            span_id.to_bytes(8, "big"),
            (_PARENT_ID + parent_id.to_bytes(8, "big")) if parent_id else b"",
            named,
            _TIMES(0x39, start, 0x41, end) if start and end else _times(start, end),
            self._attributes(_ATTRIBUTE, attributes) if attributes else b"",
        ]
        for event_name, at, event_attributes in events:
            event = [_EVENT_TIME, _FIXED64(at)] if at else []
            if event_name:
                event.append(_field(_EVENT_NAME, event_name.encode()))
            if event_attributes:
                event.append(self._attributes(_EVENT_ATTRIBUTE, event_attributes))
            parts.append(_field(_EVENT, b"".join(event)))
        for linked_trace, linked_span, _ in links:
            link = _TRACE_ID + linked_trace.to_bytes(16, "big") + _SPAN_ID
            parts.append(_field(_LINK, link + linked_span.to_bytes(8, "big") + _LINK_FLAGS))
        parts.append(_FAILED_END if failed else _UNSET_END)
        body = b"".join(parts)
        size = len(body)
        return _SPAN + (_SMALL[size] if size < 128 else _varint(size)) + body


def _times(start: int, end: int) -> bytes:
    """Start and end (fixed64 each), where one is 0: protobuf leaves a 0 out."""
    return (_START + _FIXED64(start) if start else b"") + (_END + _FIXED64(end) if end else b"")


def _around(message: Any, head: str) -> tuple[bytes, bytes]:
    """The bytes of ``message``'s field 1 (``head``) and of its field 3 (``schema_url``),
    which protobuf writes before and after its repeated field 2."""
    before = _field(b"\x0a", getattr(message, head).SerializeToString())
    after = _field(b"\x1a", message.schema_url.encode()) if message.schema_url else b""
    return (before if message.HasField(head) else b""), after


_CREDENTIAL_PROVIDERS = (
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
)


def _session() -> requests.Session | None:
    """The HTTP session for the official exporter: ``requests``' own, reading the
    environment's proxy and CA settings once per URL instead of on every export (a
    third of a post's CPU: this process's environment never changes). ``None`` where a
    credential provider (``OTEL_PYTHON_EXPORTER_OTLP_HTTP_*CREDENTIAL_PROVIDER``) makes
    the session: the exporter loads it as usual."""
    if any(os.environ.get(name) for name in _CREDENTIAL_PROVIDERS):
        return None
    import requests  # the exporter's own dependency

    class Session(requests.Session):
        def __init__(self) -> None:
            super().__init__()
            self._settings: dict[tuple[Any, ...], dict[str, Any]] = {}

        def merge_environment_settings(
            self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any
        ) -> dict[str, Any]:
            if proxies:  # a request's own proxies (the exporter gives none)
                return dict(super().merge_environment_settings(url, proxies, stream, verify, cert))
            key = (url, stream, verify, cert)
            settings = self._settings.get(key)
            if settings is None:
                settings = self._settings[key] = dict(
                    super().merge_environment_settings(url, {}, stream, verify, cert)
                )
            return {**settings, "proxies": dict(settings["proxies"])}

    return Session()


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


LOG_LINES: Final = Path(__file__).resolve().parent.parent / "log_lines.py"
"""The bot's log line shapes (``bot.log_lines``), loaded by path: this process imports
none of the bot's package."""


def _log_to_stderr(form: str) -> None:
    """Warnings and worse (a collector refusing an export) on stderr, which the bot's
    process shares, in the bot's own shape: JSON lines where it writes JSON, else text."""
    spec = importlib.util.spec_from_file_location("chatflow_log_lines", LOG_LINES)
    assert spec is not None and spec.loader is not None
    lines = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lines)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(lines.JsonLines() if form == "json" else lines.text_lines())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _log_to_stderr(argv[5] if len(argv) > 5 else "text")
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

        exporter = OTLPSpanExporter(endpoint=endpoint, session=_session())
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
