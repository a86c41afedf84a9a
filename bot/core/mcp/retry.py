"""How an MCP connection's failures are told and retried.

``Backoff`` spaces reconnects (and re-listens): 0.5 s doubling to 30 s, back
to 0.5 s only after a connection has stayed up ``STABLE_AFTER`` seconds, so a
server that crashes right after it starts is restarted ever more slowly
instead of every second for ever. ``reason`` is the one line a log or an
error shows for an exception; ``connection_gone`` tells a lost transport from
an error the server answered.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "BACKOFF_FIRST",
    "BACKOFF_MAX",
    "STABLE_AFTER",
    "Backoff",
    "connection_gone",
    "is_connection_closed",
    "reason",
]

STABLE_AFTER = 60.0
"""Seconds a connection must stay up before the reconnect backoff starts again."""
BACKOFF_FIRST = 0.5
"""The first wait before a reconnect, in seconds."""
BACKOFF_MAX = 30.0
"""The longest wait before a reconnect, in seconds."""

_MAX_REASON = 200


@dataclass
class Backoff:
    """Waits between attempts: ``first`` doubling to ``limit``, back to ``first`` only
    after a success that lasted ``stable_after`` seconds on ``clock``."""

    first: float = BACKOFF_FIRST
    limit: float = BACKOFF_MAX
    stable_after: float = STABLE_AFTER
    clock: Callable[[], float] = time.monotonic
    _next: float | None = field(default=None, init=False)
    _up_since: float | None = field(default=None, init=False)

    def up(self) -> None:
        """The connection (or stream) is up from now."""
        self._up_since = self.clock()

    def delay(self) -> float:
        """It went down (or an attempt failed): how long to wait before the next one."""
        if self._next is None or (
            self._up_since is not None and self.clock() - self._up_since >= self.stable_after
        ):
            self._next = self.first
        self._up_since = None
        wait, self._next = self._next, min(self._next * 2, self.limit)
        return wait


def reason(exc: BaseException) -> str:
    """One short line for an exception (the first leaf of an exception group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= _MAX_REASON else line[: _MAX_REASON - 1] + "…"


def is_connection_closed(exc: BaseException) -> bool:
    """Whether ``exc`` is the SDK's "connection closed" error."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    return isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED


def connection_gone(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the transport is gone."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if is_connection_closed(current):
            return True
        seen.add(id(current))
        current = current.__cause__
    return False
