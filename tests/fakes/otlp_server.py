"""A fake OpenTelemetry collector: OTLP/HTTP ``POST /v1/traces``, protobuf decoded.

Each export is decoded with ``opentelemetry-proto`` (the collector's own message
types) into ``ExportedSpan`` records; tests wait on ``wait_for`` (an event set
on every export), never on a sleep.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes.serving import LocalServer

__all__ = ["ExportedSpan", "FakeOtlpServer"]

_PROTOBUF = "application/x-protobuf"


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)


def _attributes(values: Any) -> dict[str, Any]:
    pairs: list[KeyValue] = list(values)
    return {pair.key: _value(pair.value) for pair in pairs}


@dataclass(frozen=True)
class ExportedSpan:
    """One span as the collector received it (ids in lower-case hex)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]
    """``(trace_id, span_id)`` of each linked span."""
    events: tuple[tuple[str, dict[str, Any]], ...]
    resource: dict[str, Any] = field(default_factory=dict)
    start_ns: int = 0
    end_ns: int = 0
    status_code: int = 0

    def values(self) -> Iterator[str]:
        """Every attribute value (events' and the resource's too), as text."""
        for attributes in (self.attributes, self.resource, *(a for _, a in self.events)):
            for value in attributes.values():
                yield from (str(v) for v in value) if isinstance(value, tuple) else (str(value),)


class FakeOtlpServer:
    """Receives OTLP/HTTP trace exports on a free port of 127.0.0.1."""

    def __init__(self) -> None:
        self.spans: list[ExportedSpan] = []
        """Every span received, in arrival order."""
        self.exports = 0
        """Export requests received."""
        self.content_types: set[str] = set()
        self._changed = asyncio.Event()
        self._local = LocalServer(
            Starlette(routes=[Route("/v1/traces", self._export, methods=["POST"])])
        )

    @property
    def endpoint(self) -> str:
        """``OTEL_EXPORTER_OTLP_ENDPOINT`` for a client (the SDK appends ``/v1/traces``)."""
        return f"http://127.0.0.1:{self._local.port}"

    async def _export(self, request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        self.content_types.add(request.headers.get("content-type", ""))
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        for resource_spans in message.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ExportedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=span.kind,
                            attributes=_attributes(span.attributes),
                            links=tuple((ln.trace_id.hex(), ln.span_id.hex()) for ln in span.links),
                            events=tuple((e.name, _attributes(e.attributes)) for e in span.events),
                            resource=resource,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            status_code=span.status.code,
                        )
                    )
        self.exports += 1
        self._changed.set()
        self._changed = asyncio.Event()
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type=_PROTOBUF)

    def traces(self) -> dict[str, list[ExportedSpan]]:
        """The spans received so far, by trace id."""
        found: dict[str, list[ExportedSpan]] = {}
        for span in self.spans:
            found.setdefault(span.trace_id, []).append(span)
        return found

    async def wait_for(
        self, predicate: Callable[[list[ExportedSpan]], bool], within: float = 20.0
    ) -> list[ExportedSpan]:
        """Wait until ``predicate(spans)`` holds after an export; returns the spans."""
        async with asyncio.timeout(within):
            while not predicate(self.spans):
                await self._changed.wait()
        return self.spans

    async def __aenter__(self) -> FakeOtlpServer:
        await self._local.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._local.stop()
