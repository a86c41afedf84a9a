"""The live tracer behind ``bot.tracing.spans``: light span records, no SDK in this process.

A span here is a list: random ids, ``time.time_ns()`` at its start and end, a
dict of attributes, its links, events and whether it failed. The current span
lives in a ``ContextVar``, so it follows tasks as asyncio copies contexts
(``capture`` hands it to another task); ``traceparent`` and the log formatter's
ids are read from it. An ended span that was sampled is handed, as it is, to
``sink`` as a ``Record`` (``bot.tracing.export``'s queue to the exporter process,
or a test's list): building OpenTelemetry's objects and encoding OTLP happen
elsewhere, never on this process's GIL.

Sampling follows ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` as the SDK
reads them (``parentbased_always_on`` by default).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar, Token
from random import getrandbits
from time import time_ns
from types import TracebackType
from typing import Any, Final, NamedTuple, cast

from bot.tracing.spans import NO_SPAN, AttributeValue, Carried, Kind, SpanHandle, _NoSpan

__all__ = [
    "EVERY_TRACE",
    "KINDS",
    "RECORD_FIELDS",
    "Record",
    "Recorder",
    "Sampler",
    "SpanContext",
    "parse_traceparent",
    "sampler_from",
]

logger = logging.getLogger(__name__)

KINDS: Final[Mapping[Kind, int]] = {
    "internal": 0,
    "server": 1,
    "client": 2,
    "producer": 3,
    "consumer": 4,
}
"""``SpanKind``'s values in OpenTelemetry (and OTLP's, less one)."""

Record = Sequence[Any]
"""An ended span, in this order: name; trace id; span id; parent span id (0 for a
root); trace flags; kind (``KINDS``); start and end (ns since the epoch); attributes
(a dict); links ((trace id, span id, flags) each); events ((name, time, attributes)
each); failed (status ERROR). Items past ``RECORD_FIELDS`` are the recorder's own;
the first ``RECORD_FIELDS``, as a plain list, cross to the exporter (``marshal``)."""
RECORD_FIELDS: Final = 12
"""How many items of a ``Record`` are the span's (past them: the recorder's own)."""

# Where a span (``_Span``, a list) keeps what it holds: the record's items, then its own.
_TRACE_ID: Final = 1
_SPAN_ID: Final = 2
_FLAGS: Final = 4
_END: Final = 7
_ATTRIBUTES: Final = 8
_EVENTS: Final = 10
_FAILED: Final = 11
_SINK: Final = 12
_TOKEN: Final = 13


class SpanContext(NamedTuple):
    """A span's identity: what is current, carried to another task, or stored."""

    trace_id: int
    span_id: int
    flags: int
    remote: bool = False


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
    if trace_id == 0 or span_id == 0 or not 0 <= flags <= 0xFF:
        return None
    return SpanContext(trace_id, span_id, flags, remote=True)


_SAMPLED: Final = 1
_RATIO_MASK: Final = (1 << 64) - 1


class Sampler(NamedTuple):
    """Which new spans are recorded: ``parent_based`` follows a parent's flag; a root
    (or, not parent-based, every span) is kept when its trace id falls under ``ratio``."""

    parent_based: bool
    ratio: float

    def keeps(self, trace_id: int) -> bool:
        """Whether a trace of its own (not following a parent) is recorded."""
        if self.ratio >= 1.0:
            return True
        if self.ratio <= 0.0:
            return False
        # The SDK's TraceIdRatioBased rule: the lower 64 bits under ratio * 2**64.
        return (trace_id & _RATIO_MASK) < round(self.ratio * (1 << 64))


EVERY_TRACE: Final = Sampler(parent_based=True, ratio=1.0)
"""The default (``parentbased_always_on``)."""


def sampler_from(env: Mapping[str, str]) -> Sampler:
    """``OTEL_TRACES_SAMPLER`` (and its ``_ARG``), read as the SDK reads them."""
    name = (env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower()
    ratio = 1.0
    if name.endswith("traceidratio"):
        try:
            ratio = float(env.get("OTEL_TRACES_SAMPLER_ARG") or "1.0")
        except ValueError:
            logger.warning("OTEL_TRACES_SAMPLER_ARG is not a number: sampling every trace")
        if not 0.0 <= ratio <= 1.0:
            ratio = 1.0
    elif name.endswith("always_off"):
        ratio = 0.0
    elif not name.endswith("always_on"):
        logger.warning("OTEL_TRACES_SAMPLER=%s is not supported: sampling every trace", name)
        name = "parentbased_always_on"
    return Sampler(name.startswith("parentbased_"), ratio)


class _Span(list):  # type: ignore[type-arg]
    """One span being recorded: its ``SpanHandle``, the ``with`` block that makes it
    current, and (in the context) what its children and ``traceparent`` read.

    A list laid out as a ``Record`` (its first ``RECORD_FIELDS`` items), then the sink
    (``None``: not sampled, nothing is kept) and the context token of its ``with``
    block: made in one call with no ``__init__`` to run, and once ended it is its own
    record. A span is made for every step of every message (about seven), so what
    it costs is paid thousands of times a second on a busy bot.
    """

    __slots__ = ()

    def set(self, key: str, value: AttributeValue) -> None:
        self[_ATTRIBUTES][key] = value

    def event(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        if self[_SINK] is None:
            return
        if not self[_EVENTS]:
            self[_EVENTS] = []
        self[_EVENTS].append((name, time_ns(), dict(attributes) if attributes else {}))

    def fail(self, error_type: str) -> None:
        self[_ATTRIBUTES]["error.type"] = error_type
        self[_FAILED] = True

    def end(self) -> None:
        if self[_END]:
            return
        self[_END] = time_ns()
        sink = self[_SINK]
        if sink is not None:
            sink(self)

    def __enter__(self) -> SpanHandle:
        self[_TOKEN] = _CURRENT.set(self)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        token = self[_TOKEN]
        self[_TOKEN] = None  # the token holds the context holding this span: no cycle left
        try:
            _CURRENT.reset(token)
        except ValueError:  # left in another context
            _restore(token)
        if kind is not None:
            # The class only: an exception's message may quote content.
            self.fail(kind.__name__)
        self.end()


_CURRENT: ContextVar[_Span | None] = ContextVar("chatflow_span", default=None)
_NOTHING: AbstractContextManager[object] = nullcontext(None)


class _Resumed:
    """``with spans.resume(...)`` / ``detached()``: another span current inside."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: _Span | None) -> None:
        self._span = span
        self._token: Token[_Span | None] | None = None

    def __enter__(self) -> object:
        self._token = _CURRENT.set(self._span)
        return None

    def __exit__(self, *_: object) -> None:
        _restore(self._token)


def _restore(token: Token[_Span | None] | None) -> None:
    """Put back what ``token`` replaced, even from another context than its own (an
    async generator closed elsewhere)."""
    if token is None:
        return
    try:
        _CURRENT.reset(token)
    except ValueError:
        old = token.old_value
        _CURRENT.set(None if old is Token.MISSING else old)


class Recorder:
    """Spans recorded in this process, ended ones handed to ``sink`` (``spans.Backend``).

    Its methods have the signatures of ``bot.tracing.spans``' helpers: ``spans.install``
    makes them those helpers, so an instrumented line calls the recorder directly.
    """

    def __init__(
        self,
        sink: Callable[[Record], None],
        sampler: Sampler = EVERY_TRACE,
        *,
        capture_content: bool = False,
    ) -> None:
        self._sink = sink
        self._sampler = sampler
        self._every = sampler.parent_based and sampler.ratio >= 1.0
        self.capture_content = capture_content

    def span(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None = None,
        *,
        kind: Kind = "internal",
        parent: Carried | None = None,
        link: str | None = None,
        root: bool = False,
        start_ns: int | None = None,
    ) -> _Span | _NoSpan:
        up: _Span | None = None if root else (parent or _CURRENT.get())  # type: ignore[assignment]
        if up is None:
            trace_id = getrandbits(128) or 1
            sampled = self._every or self._sampler.keeps(trace_id)
            parent_id = 0
        else:
            trace_id = up[_TRACE_ID]
            parent_id = up[_SPAN_ID]
            if self._sampler.parent_based:
                sampled = up[_FLAGS] & _SAMPLED
                if not sampled:
                    # Nothing will be recorded, so nothing is made: the parent stays
                    # current (its traceparent, sampled flag off, is all a later hop
                    # reads), and a trace not sampled costs little more than its root.
                    return NO_SPAN
            else:
                sampled = self._sampler.keeps(trace_id)
        links: tuple[tuple[int, int, int], ...] = ()
        if link is not None and (linked := parse_traceparent(link)) is not None:
            links = ((linked.trace_id, linked.span_id, linked.flags),)
        return _Span(
            (
                name,
                trace_id,
                getrandbits(64) or 1,
                parent_id,
                _SAMPLED if sampled else 0,
                KINDS[kind],
                time_ns() if start_ns is None else start_ns,
                0,  # the end, set once
                dict(attributes) if attributes else {},
                links,
                (),  # events: a list once there is one
                False,  # failed
                self._sink if sampled else None,
                None,  # the token of its `with` block
            )
        )

    def start(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None = None,
        *,
        parent: Carried | None = None,
        start_ns: int | None = None,
    ) -> SpanHandle:
        return self.span(name, attributes, parent=parent, start_ns=start_ns)

    def capture(self) -> Carried | None:
        return _CURRENT.get()

    def resume(self, carried: Carried | None) -> AbstractContextManager[object]:
        return _NOTHING if carried is None else _Resumed(cast(_Span, carried))

    def detached(self) -> AbstractContextManager[object]:
        return _Resumed(None)

    def traceparent(self) -> str | None:
        current = _CURRENT.get()
        if current is None:
            return None
        return f"00-{current[_TRACE_ID]:032x}-{current[_SPAN_ID]:016x}-{current[_FLAGS]:02x}"

    def log_ids(self) -> tuple[str, str] | None:
        current = _CURRENT.get()
        if current is None:
            return None
        return f"{current[_TRACE_ID]:032x}", f"{current[_SPAN_ID]:016x}"
