"""Per-session FIFO work queues: sessions run in parallel, one session's turns in order.

A handler holds one of ``max_concurrent`` slots until it returns, or until it
calls ``release_slot()`` (a turn does once its reply is committed): the rest
of the handler (sending the reply) still runs in the session's lane, so the
session's order holds, but no longer counts against the limit.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from bot.errors import ChatflowError

__all__ = ["DispatcherBusyError", "SessionDispatcher", "release_slot"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class DispatcherBusyError(ChatflowError):
    """Too many messages are waiting; the platform should redeliver later.

    Raised by the gateway, which bounds the waiting turns itself (``MAX_QUEUED_MESSAGES``).
    """

    retryable = True


class _Slot:
    """One held slot of the dispatcher's semaphore, released at most once."""

    __slots__ = ("_held", "_slots")

    def __init__(self, slots: asyncio.Semaphore) -> None:
        self._slots = slots
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots.release()


_current_slot: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar(
    "chatflow_dispatcher_slot", default=None
)


def release_slot() -> None:
    """Give back the running handler's slot early (no-op outside a dispatcher handler,
    or when already given back); the handler goes on in its lane."""
    slot = _current_slot.get()
    if slot is not None:
        slot.release()


@dataclass
class _Lane(Generic[T]):
    items: deque[tuple[str, T]] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


class SessionDispatcher(Generic[T]):
    """Runs ``handler(item)`` for submitted items, FIFO per session, sessions in parallel.

    At most ``max_concurrent`` handlers run at once. The queue is unbounded: the
    caller decides what may wait (the gateway refuses messages before tx 1 past
    ``MAX_QUEUED_MESSAGES``, so the platform keeps them). Submitting a key that is
    already queued or running is a no-op, so recovery and live traffic can both
    offer the same inbound message safely.
    """

    def __init__(self, handler: Callable[[T], Awaitable[None]], *, max_concurrent: int) -> None:
        if max_concurrent <= 0:
            raise ValueError("max_concurrent must be positive")
        self._handler = handler
        self._slots = asyncio.Semaphore(max_concurrent)
        self._lanes: dict[str, _Lane[T]] = {}
        self._keys: set[str] = set()
        self._queued = 0
        self._paused = True
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def queued(self) -> int:
        """Items waiting for a worker (not counting the ones running)."""
        return self._queued

    @property
    def in_flight(self) -> int:
        """Items submitted and not finished."""
        return len(self._keys)

    def holds(self, key: str) -> bool:
        """Whether an item under ``key`` is queued or running."""
        return key in self._keys

    def submit(self, session_id: str, key: str, item: T) -> bool:
        """Queue ``item`` behind earlier items of ``session_id``; False if ``key`` is known,
        or once ``cancel`` ran (the item stays wherever it came from, e.g. the inbox)."""
        if key in self._keys or self._closed:
            return False
        self._keys.add(key)
        self._queued += 1
        self._idle.clear()
        lane = self._lanes.setdefault(session_id, _Lane())
        lane.items.append((key, item))
        if not self._paused:
            self._wake(session_id, lane)
        return True

    def resume(self) -> None:
        """Start running queued items (the gateway holds them until recovery is done)."""
        self._paused = False
        for session_id, lane in list(self._lanes.items()):
            self._wake(session_id, lane)

    def _wake(self, session_id: str, lane: _Lane[T]) -> None:
        if lane.task is None:
            lane.task = asyncio.create_task(self._run_lane(session_id, lane))

    async def _run_lane(self, session_id: str, lane: _Lane[T]) -> None:
        try:
            while lane.items:
                key, item = lane.items[0]
                await self._slots.acquire()
                slot = _Slot(self._slots)
                token = _current_slot.set(slot)
                try:
                    lane.items.popleft()
                    self._queued -= 1
                    await self._handler(item)
                except Exception:
                    # The handler owns error reporting; a lane must outlive one bad item.
                    logger.exception("unhandled error in a turn of session %s", session_id)
                finally:
                    _current_slot.reset(token)
                    slot.release()
                    self._keys.discard(key)
        finally:
            lane.task = None
            if not lane.items:
                self._lanes.pop(session_id, None)
            if not self._keys:
                self._idle.set()

    async def drain(self, within: float) -> bool:
        """Wait until nothing is queued or running; False if ``within`` seconds passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), within)
        except TimeoutError:
            return False
        return True

    async def cancel(self) -> None:
        """Cancel every running lane and refuse new items; queued items stay in the inbox."""
        self._closed = True
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._lanes.clear()
        self._keys.clear()
        self._queued = 0
        self._idle.set()
