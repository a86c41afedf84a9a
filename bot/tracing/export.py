"""Ended spans on their way to the exporter process (``bot.tracing.child``), off the hot path.

``ChildExporter.submit`` (the recorder's sink) appends a record to a bounded
queue (``OTEL_BSP_MAX_QUEUE_SIZE``) and returns: when the queue is full, or the
exporter process is gone, the span is dropped and counted, never waited for. A
thread of this process wakes every ``OTEL_BSP_SCHEDULE_DELAY``, or as soon as half
the queue is waiting, takes what is queued as one frame, ``marshal``-s it and
writes it to the child's stdin; the child exports it in batches of at most
``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``, as the SDK's batch processor would. The frames
are larger than the batches because each wake of this thread takes this
process's GIL from the event loop (a frame of half the default queue, 1,024
spans, every 80 ms at 1,800 messages a second). The protobuf encoding and the
HTTP posts happen in the child, on its own GIL.

The child is owned: ``shutdown`` sends what is queued, closes the pipe (the
child then exports the last batch and exits) and waits for it up to a timeout,
then kills it. If the bot itself dies, the pipe closes with it and the child
exits on its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import marshal
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from bot.tracing.recorder import RECORD_FIELDS, Record

__all__ = ["DEFAULT_BATCH", "DEFAULT_DELAY_MS", "DEFAULT_QUEUE", "ChildExporter"]

logger = logging.getLogger(__name__)

DEFAULT_BATCH: Final = 512
"""Spans an export holds at most (``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``)."""
DEFAULT_DELAY_MS: Final = 5000
"""How long a span may wait for its batch (``OTEL_BSP_SCHEDULE_DELAY``)."""
DEFAULT_QUEUE: Final = 2048
"""Records waiting at most (``OTEL_BSP_MAX_QUEUE_SIZE``)."""
PIPE_BYTES: Final = 1 << 20
"""The pipe to the exporter holds this much (Linux's default ``pipe-max-size``)."""
CHILD: Final = Path(__file__).with_name("child.py")


def _setting(env: Mapping[str, str], name: str, default: int) -> int:
    """A positive whole number of the ``OTEL_BSP_*`` family, as the SDK's defaults."""
    try:
        value = int(env.get(name) or default)
    except ValueError:
        return default
    return value if value > 0 else default


def _marshallable(record: Sequence[Any]) -> bool:
    try:
        marshal.dumps(record)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


class ChildExporter:
    """The exporter process, and the queue and thread that feed it."""

    def __init__(
        self,
        exporter: str,
        endpoint: str | None,
        service_name: str,
        env: Mapping[str, str],
        *,
        flush_seconds: float | None = None,
        json_logs: bool = False,
        python: str = sys.executable,
    ) -> None:
        self.dropped = 0
        """Spans not exported: the queue was full, or the exporter process was gone."""
        self._queue: deque[Record] = deque()
        self._limit = _setting(env, "OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_QUEUE)
        batch = min(_setting(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_BATCH), self._limit)
        self._frame = max(batch, self._limit // 2)
        delay = _setting(env, "OTEL_BSP_SCHEDULE_DELAY", DEFAULT_DELAY_MS) / 1000
        self._flush_seconds = delay if flush_seconds is None else flush_seconds
        self._wake = threading.Event()
        self._closing = False
        self._dead = False
        # -P: the script's folder (bot/tracing) must not shadow the standard library.
        self._process = subprocess.Popen(
            [
                python,
                "-P",
                str(CHILD),
                exporter,
                endpoint or "",
                service_name,
                str(batch),
                "json" if json_logs else "text",
            ],
            stdin=subprocess.PIPE,
            env={**os.environ, **env},
            close_fds=True,
        )
        if self._process.stdin is not None and hasattr(fcntl, "F_SETPIPE_SZ"):
            # A deeper pipe (Linux: 64 KiB by default) rides out a moment the exporter
            # is not scheduled on a busy machine, before the queue has to drop.
            with contextlib.suppress(OSError):
                fcntl.fcntl(self._process.stdin.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self._thread = threading.Thread(target=self._send, name="tracing-export", daemon=True)
        self._thread.start()

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The exporter process (ended by ``shutdown``)."""
        return self._process

    def submit(self, record: Record) -> None:
        """Queue an ended span (the hot path: an append, or a drop when full or closed)."""
        queue = self._queue
        if self._dead or self._closing or len(queue) >= self._limit:
            self.dropped += 1
            return
        queue.append(record)
        if len(queue) == self._frame:
            self._wake.set()

    def _take(self) -> list[Record]:
        queue = self._queue
        frame: list[Record] = []
        with contextlib.suppress(IndexError):  # emptied meanwhile
            for _ in range(min(len(queue), self._frame)):
                frame.append(queue.popleft())
        return frame

    def _send(self) -> None:
        pipe = self._process.stdin
        assert pipe is not None
        while True:
            self._wake.wait(self._flush_seconds)
            self._wake.clear()
            closing = self._closing  # read after the wake: what shutdown queued is sent
            while frame := self._take():
                if self._dead:
                    self.dropped += len(frame)
                    continue
                payload = self._encode(frame)
                if payload is None:
                    continue
                try:
                    pipe.write(len(payload).to_bytes(4, "little") + payload)
                    pipe.flush()
                except (OSError, ValueError) as exc:
                    self._dead = True
                    self.dropped += len(frame)
                    logger.warning(
                        "tracing: the exporter process is gone (%s, exit code %s); spans "
                        "are dropped from now on",
                        type(exc).__name__,
                        self._process.poll(),
                    )
            if closing:
                return

    def _encode(self, frame: list[Record]) -> bytes | None:
        """``frame``'s records, as plain lists, ``marshal``-ed; a record ``marshal``
        cannot carry (an attribute that is an enum or another subclass of ``str``/``int``)
        is dropped and counted, never left to end this thread and, with it, every
        later export."""
        plain = [record[:RECORD_FIELDS] for record in frame]
        try:
            return marshal.dumps(plain)
        except ValueError:
            kept = [record for record in plain if _marshallable(record)]
        self.dropped += len(frame) - len(kept)
        logger.warning(
            "tracing: %d spans dropped: an attribute is not a plain str, int, float, bool "
            "or tuple of str",
            len(frame) - len(kept),
        )
        return marshal.dumps(kept) if kept else None

    def shutdown(self, timeout: float) -> bool:
        """Send what is queued, let the child flush and exit; True if it did in time.

        Blocking (call it off the event loop); a child still running after
        ``timeout`` seconds is killed (its unsent spans are lost)."""
        self._closing = True
        self._wake.set()
        deadline = time.monotonic() + timeout
        self._thread.join(timeout)
        if not self._thread.is_alive():  # all sent: the end of the pipe tells it to flush
            with contextlib.suppress(OSError, ValueError):
                assert self._process.stdin is not None
                self._process.stdin.close()
        clean = False
        try:
            self._process.wait(max(deadline - time.monotonic(), 0.0))
            clean = self._process.returncode == 0
        except subprocess.TimeoutExpired:
            logger.warning("tracing: the exporter process did not finish in %.0f s", timeout)
            self._process.kill()
            self._process.wait()
            self._thread.join(1.0)  # its write fails now the child is gone
        if self.dropped:
            logger.warning("tracing: %d spans were dropped", self.dropped)
        return clean
