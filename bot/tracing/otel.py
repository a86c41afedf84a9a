"""The live tracer behind ``bot.tracing.spans``: OpenTelemetry's API over a given provider.

Imported only by ``bot.tracing.setup.configure`` once tracing is switched on.
The provider is held here, not set as OpenTelemetry's global one, so a bench or
a test can install and remove it; the current span still lives in
OpenTelemetry's context, which the log formatter reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import SpanContext, format_span_id, format_trace_id

from bot.tracing.spans import AttributeValue, Carried, Kind, SpanHandle

__all__ = ["OtelBackend", "parse_traceparent"]

_KINDS: Mapping[Kind, SpanKind] = {
    "internal": SpanKind.INTERNAL,
    "client": SpanKind.CLIENT,
    "server": SpanKind.SERVER,
    "producer": SpanKind.PRODUCER,
    "consumer": SpanKind.CONSUMER,
}


def parse_traceparent(value: str | None) -> SpanContext | None:
    """The span a stored W3C ``traceparent`` names (``None`` if it is not one)."""
    if not value:
        return None
    parts = value.strip().split("-")
    if len(parts) != 4 or parts[0] != "00" or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if trace_id == 0 or span_id == 0:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))


class _Handle:
    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)

    def event(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        self._span.add_event(name, dict(attributes or {}))

    def fail(self, error_type: str) -> None:
        self._span.set_attribute("error.type", error_type)
        self._span.set_status(Status(StatusCode.ERROR))

    def end(self) -> None:
        self._span.end()


class OtelBackend:
    """Spans of ``tracer``; ``capture_content``: the operator's opt-in to content."""

    def __init__(self, tracer: trace.Tracer, *, capture_content: bool = False) -> None:
        self._tracer = tracer
        self.capture_content = capture_content

    @staticmethod
    def _context(parent: Carried | None, root: bool) -> otel_context.Context | None:
        """The parent context: none (a new trace), the carried one, or the current one."""
        if root:
            return otel_context.Context()
        return None if parent is None else cast(otel_context.Context, parent)

    def span(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None,
        kind: Kind,
        parent: Carried | None,
        link: str | None,
        root: bool,
        start_ns: int | None,
    ) -> AbstractContextManager[SpanHandle]:
        return self._span(name, attributes, kind, parent, link, root, start_ns)

    @contextmanager
    def _span(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None,
        kind: Kind,
        parent: Carried | None,
        link: str | None,
        root: bool,
        start_ns: int | None,
    ) -> Iterator[SpanHandle]:
        context = self._context(parent, root)
        linked = parse_traceparent(link)
        span = self._tracer.start_span(
            name,
            context=context,
            kind=_KINDS[kind],
            attributes=dict(attributes) if attributes else None,
            links=[Link(linked)] if linked is not None else None,
            start_time=start_ns,
            record_exception=False,
            set_status_on_exception=False,
        )
        handle = _Handle(span)
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            yield handle
        except BaseException as exc:
            # The class only: an exception's message may quote content.
            handle.fail(type(exc).__name__)
            raise
        finally:
            otel_context.detach(token)
            span.end()

    def start(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None,
        parent: Carried | None,
        start_ns: int | None,
    ) -> SpanHandle:
        context = self._context(parent, False)
        span = self._tracer.start_span(
            name,
            context=context,
            attributes=dict(attributes) if attributes else None,
            start_time=start_ns,
            record_exception=False,
            set_status_on_exception=False,
        )
        return _Handle(span)

    def capture(self) -> Carried | None:
        span = trace.get_current_span()
        if not span.get_span_context().is_valid:
            return None
        return cast(Carried, otel_context.get_current())

    def resume(self, carried: Carried) -> AbstractContextManager[object]:
        return self._resume(cast(otel_context.Context, carried))

    def detached(self) -> AbstractContextManager[object]:
        return self._resume(otel_context.Context())

    @contextmanager
    def _resume(self, carried: otel_context.Context) -> Iterator[object]:
        token = otel_context.attach(carried)
        try:
            yield None
        finally:
            otel_context.detach(token)

    def traceparent(self) -> str | None:
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        flags = int(context.trace_flags)
        return (
            f"00-{format_trace_id(context.trace_id)}-{format_span_id(context.span_id)}-{flags:02x}"
        )

    def log_ids(self) -> tuple[str, str] | None:
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        return format_trace_id(context.trace_id), format_span_id(context.span_id)
