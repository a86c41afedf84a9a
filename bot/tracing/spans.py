"""The span helpers the bot calls: a no-op until ``bot.tracing.setup`` installs a backend.

With tracing off (no ``OTEL_*`` endpoint set) nothing here imports OpenTelemetry:
``span`` hands back one shared do-nothing object, so an instrumented line
costs a function call and a ``with``. ``bot.tracing.setup.configure`` installs
the live backend (``bot.tracing.recorder``) when the environment asks for it.

Carried context: a span started in one task and continued in another (the
receipt and the lane that runs the turn) travels as ``Carried``, an opaque
handle; across processes and restarts it travels as a W3C ``traceparent``
string, stored with the ledger row or the scheduled job, and a later span in a
new trace is *linked* to it (``span(..., link=traceparent)``).

Attributes are names, counts, hashes and outcomes only: never message text,
prompts, tool arguments or results, memories, file names, chat or user ids.
Content goes on a span only through ``content`` when the operator opted in
(``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Final, Literal, Protocol

__all__ = [
    "NO_SPAN",
    "AttributeValue",
    "Backend",
    "Carried",
    "Kind",
    "SpanHandle",
    "capture",
    "capturing_content",
    "content",
    "conversation_id",
    "detached",
    "enabled",
    "install",
    "log_ids",
    "provider_headers",
    "resume",
    "span",
    "start",
    "traceparent",
]

AttributeValue = str | bool | int | float | tuple[str, ...]
Kind = Literal["internal", "client", "server", "producer", "consumer"]


class SpanHandle(Protocol):
    """What instrumented code may do with its span."""

    def set(self, key: str, value: AttributeValue) -> None:
        """Set one attribute (a name, count, hash or outcome: never content)."""
        ...

    def event(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        """Add a timed event (e.g. a flood refusal and its wait)."""
        ...

    def fail(self, error_type: str) -> None:
        """Mark the span failed with ``error.type`` (a class name, never a message)."""
        ...

    def end(self) -> None:
        """End a span from ``start`` (``span``'s end on leaving the ``with``)."""
        ...


class Carried(Protocol):
    """A span's context carried to another task (``capture`` / ``resume``)."""


class _SpanFunction(Protocol):
    def __call__(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None = None,
        *,
        kind: Kind = "internal",
        parent: Carried | None = None,
        link: str | None = None,
        root: bool = False,
    ) -> AbstractContextManager[SpanHandle]: ...


class _StartFunction(Protocol):
    def __call__(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None = None,
        *,
        parent: Carried | None = None,
        start_ns: int | None = None,
    ) -> SpanHandle: ...


class Backend(Protocol):
    """The live tracer ``bot.tracing.recorder.Recorder`` implements: ``install`` makes its
    methods this module's helpers, which have their signatures."""

    capture_content: bool

    @property
    def span(self) -> _SpanFunction: ...

    @property
    def start(self) -> _StartFunction: ...

    def capture(self) -> Carried | None: ...

    def resume(self, carried: Carried | None) -> AbstractContextManager[object]: ...

    def detached(self) -> AbstractContextManager[object]: ...

    def traceparent(self) -> str | None: ...

    def log_ids(self) -> tuple[str, str] | None: ...


class _NoSpan:
    """A span that records nothing, and its own ``with`` block (which changes nothing)."""

    __slots__ = ()

    def set(self, key: str, value: AttributeValue) -> None:
        return None

    def event(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        return None

    def fail(self, error_type: str) -> None:
        return None

    def end(self) -> None:
        return None

    def __enter__(self) -> SpanHandle:
        return self

    def __exit__(self, *_: object) -> None:
        return None


NO_SPAN: Final = _NoSpan()
"""A span that records nothing: what ``span`` and ``start`` give while tracing is off,
and the recorder for a span of a trace that is not sampled."""
_NOTHING: AbstractContextManager[object] = nullcontext(None)
_backend: Backend | None = None


def install(backend: Backend | None) -> None:
    """Make ``backend`` the live tracer (``None``: back to the no-op).

    The helpers below become ``backend``'s own methods, so a span costs one call into
    the recorder with no check on the way (a span is made for every step of every
    message). Hence: call them as ``spans.span(...)``, never imported by name, which
    would keep whatever was installed at the import."""
    global _backend, span, start, capture, resume, detached, traceparent, log_ids
    _backend = backend
    if backend is None:
        span, start, capture, resume = _no_span, _no_start, _no_capture, _no_resume
        detached, traceparent, log_ids = _no_detached, _no_traceparent, _no_log_ids
    else:
        span, start, capture, resume = backend.span, backend.start, backend.capture, backend.resume
        detached, traceparent, log_ids = backend.detached, backend.traceparent, backend.log_ids


def enabled() -> bool:
    """Whether spans are recorded (a backend is installed)."""
    return _backend is not None


def _no_span(*args: object, **kwargs: object) -> AbstractContextManager[SpanHandle]:
    return NO_SPAN


def _no_start(*args: object, **kwargs: object) -> SpanHandle:
    return NO_SPAN


def _no_capture() -> Carried | None:
    return None


def _no_resume(carried: Carried | None) -> AbstractContextManager[object]:
    return _NOTHING


def _no_detached() -> AbstractContextManager[object]:
    return _NOTHING


def _no_traceparent() -> str | None:
    return None


def _no_log_ids() -> tuple[str, str] | None:
    return None


span: _SpanFunction = _no_span
"""``span(name, attributes=None, *, kind="internal", parent=None, link=None, root=False)``:
a span around a ``with`` block, current inside it.

``parent``: a context carried from another task (default: the current one).
``root``: start a new trace; ``link`` (a stored ``traceparent``) links it to the
span that owed this work. An exception leaving the block marks the span failed
with its class name only (its message may quote content)."""

start: _StartFunction = _no_start
"""``start(name, attributes=None, *, parent=None, start_ns=None)``: a span that is not
made current and is ended by ``end()`` (e.g. a queue wait that began at ``start_ns``,
``time.time_ns()``, in another task)."""

capture: Callable[[], Carried | None] = _no_capture
"""The current span's context, to continue its trace in another task."""

resume: Callable[[Carried | None], AbstractContextManager[object]] = _no_resume
"""Make a carried context the current one for the ``with`` block (``None``: no change)."""

detached: Callable[[], AbstractContextManager[object]] = _no_detached
"""No current span for the ``with`` block: work of its own (a queued resend) in a
task that may have been started inside some message's trace."""

traceparent: Callable[[], str | None] = _no_traceparent
"""The current span as a W3C ``traceparent`` (to store with owed work), or None."""

log_ids: Callable[[], tuple[str, str] | None] = _no_log_ids
"""``(trace_id, span_id)`` in hex of the current span, for a log record."""


def provider_headers() -> dict[str, str]:
    """Headers for an outgoing call (a model provider's): ``traceparent``, or none."""
    value = traceparent()
    return {} if value is None else {"traceparent": value}


def capturing_content() -> bool:
    """Whether the operator opted in to message content on spans."""
    backend = _backend
    return backend is not None and backend.capture_content


def content(handle: SpanHandle, key: str, value: str | None) -> None:
    """Put message content on a span, only when the operator opted in."""
    if value is not None and capturing_content():
        handle.set(key, value)


@functools.lru_cache(maxsize=4096)  # the same few conversations, message after message
def conversation_id(session_key: str) -> str:
    """``gen_ai.conversation.id``: a hash of the session key, never a chat id."""
    return hashlib.sha256(("chatflow-conversation:" + session_key).encode()).hexdigest()[:32]
