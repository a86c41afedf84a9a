"""A stdio MCP server's stderr: passed through to ours, its last lines kept.

A server that dies while starting (a missing module, a wrong path) explains
itself on stderr, while the protocol only sees "Connection closed". The child
writes into a pipe we read: every line goes on to the bot's stderr as before
(what the server prints is the operator's to see), and the last one becomes
the reason start-up gives.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections import deque
from typing import TextIO, cast

__all__ = ["ChildStderr"]

_KEPT_LINES = 20
_LINE_CHARS = 300
"""A reason is one line: a longer last word is cut."""


class ChildStderr:
    """One pipe per child process: ``file`` is its stderr; ``last_line()`` its last words."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        self.file = cast(TextIO, os.fdopen(write_fd, "w", encoding="utf-8", errors="replace"))
        self._read = os.fdopen(read_fd, "rb")
        self._lines: deque[str] = deque(maxlen=_KEPT_LINES)
        self._pump: asyncio.Task[None] | None = None
        self._transport: asyncio.ReadTransport | None = None

    async def start(self) -> None:
        """Begin reading (before the child is spawned: it may die at once)."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=64 * 1024)
        self._transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), self._read
        )
        self._pump = asyncio.create_task(self._copy(reader))

    async def _copy(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # a line over the limit: keep going with the rest
                continue
            if not line:
                return
            text = line.decode("utf-8", errors="replace").rstrip()
            if text.strip():
                self._lines.append(text.strip()[:_LINE_CHARS])
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(text + "\n")

    async def close(self, within: float = 1.0) -> None:
        """Stop writing on our side and read what the child left (at most ``within`` s)."""
        with contextlib.suppress(OSError):
            self.file.close()  # the child's copy closed when it exited: the pipe ends
        if self._pump is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._pump), within)
            self._pump.cancel()
        if self._transport is not None:
            self._transport.close()
        else:
            self._read.close()

    def last_line(self) -> str | None:
        """The last non-empty line the child wrote, if any."""
        return self._lines[-1] if self._lines else None
