"""``KeyedLocks``: per-key asyncio locks that exist only while held or awaited."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from types import TracebackType

__all__ = ["KeyedLocks"]


class _LockEntry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class _Held:
    """``async with`` one key's lock (a class, not a generator: every turn takes two)."""

    __slots__ = ("_entries", "_entry", "_key")

    def __init__(self, entries: dict[Hashable, _LockEntry], key: Hashable) -> None:
        self._entries = entries
        self._key = key
        self._entry: _LockEntry | None = None

    async def __aenter__(self) -> None:
        entry = self._entries.get(self._key)
        if entry is None:
            entry = self._entries[self._key] = _LockEntry()
        entry.users += 1
        try:
            await entry.lock.acquire()
        except BaseException:
            self._leave(entry)
            raise
        self._entry = entry

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        entry, self._entry = self._entry, None
        assert entry is not None, "released a lock that was not held"
        entry.lock.release()
        self._leave(entry)

    def _leave(self, entry: _LockEntry) -> None:
        entry.users -= 1
        if entry.users == 0:
            del self._entries[self._key]


class KeyedLocks:
    """Per-key asyncio locks that exist only while someone holds or waits for them."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, _LockEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def hold(self, key: Hashable) -> _Held:
        """Hold the lock for ``key`` for the duration of the ``async with`` block."""
        return _Held(self._entries, key)
