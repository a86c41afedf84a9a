"""``KeyedLocks``: per-key asyncio locks that exist only while held or awaited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager

__all__ = ["KeyedLocks"]


class _LockEntry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class KeyedLocks:
    """Per-key asyncio locks that exist only while someone holds or waits for them."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, _LockEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        """Hold the lock for ``key`` for the duration of the ``async with`` block."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _LockEntry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]
