"""Per-sender message counts in the database: how many messages a sender sent this window.

A window opens with a sender's first message and lasts ``window_seconds``; the
next message after it ends opens a new one (a fixed window per sender, not one
aligned to the clock, so no boundary lets a sender in twice as fast). Each
message adds one to its sender's count in one upsert that returns the new
count, so processes sharing a PostgreSQL database count together, and a
restart keeps the counts. The message that goes one past the limit is the one
that earns the sender's notice: exactly one per window, decided by the same
atomic statement.

Senders are stored as an HMAC of ``platform:sender id`` keyed by the
installation secret; group messages count against their sender, not the group.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from bot.core.sql import Transaction, ensure_schema
from bot.core.stores.base import TransactionalStore, require_transactional
from bot.gateway.instances import to_epoch

__all__ = ["PRUNE_INTERVAL_SECONDS", "RateLimits", "RateVerdict", "sender_digest"]

logger = logging.getLogger(__name__)

_COMPONENT = "rate_limits"
_TABLE = "chatflow_rate_limits"
_PRUNE_BATCH = 500
PRUNE_INTERVAL_SECONDS: Final = 3600.0
"""How often ``hit_in`` also deletes one batch of ended windows."""
_MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {_TABLE} ("
        "sender TEXT PRIMARY KEY NOT NULL, "
        "window_start REAL NOT NULL, "
        "count INTEGER NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {_TABLE}_window ON {_TABLE} (window_start)",
    ),
}


@functools.lru_cache(maxsize=4096)  # the same senders, message after message
def sender_digest(platform: str, sender_id: str, secret: bytes) -> str:
    """HMAC-SHA256 (hex) of ``platform:sender_id`` keyed by the installation secret: how
    access control stores a sender (no raw id, the same in every process)."""
    return hmac.new(secret, f"{platform}:{sender_id}".encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class RateVerdict:
    """What one message's count says."""

    allowed: bool
    """Within the limit: the message may start a turn."""
    notice: bool
    """The first message over the limit in this window: the sender is told, once."""
    retry_in: float
    """Seconds until the sender's window ends."""


class RateLimits:
    """Counts messages per sender per window in the store's database."""

    def __init__(
        self,
        store: TransactionalStore,
        *,
        limit: int,
        window_seconds: float,
        secret: bytes,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        if limit <= 0 or window_seconds <= 0:
            raise ValueError("limit and window_seconds must be positive")
        self._store = store = require_transactional(store, "the rate limits")
        self._clock = clock or store.now
        self.limit = limit
        self.window_seconds = window_seconds
        self._secret = secret
        self._opened = False
        self._next_prune = 0.0

    async def open(self) -> None:
        """Create or migrate the table; idempotent."""
        async with self._store.transaction() as tx:
            await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
        self._opened = True

    async def hit_in(self, tx: Transaction, platform: str, sender_id: str) -> RateVerdict:
        """Count one message of the sender inside ``tx`` and judge it.

        The caller's transaction decides: if it rolls back, the message was not
        counted (the inbox hands it back and it is counted when it runs).
        """
        if not self._opened:
            await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
        now = to_epoch(self._clock())
        cutoff = now - self.window_seconds
        if time.monotonic() >= self._next_prune:
            # Ended windows of senders who went quiet: one batch now and then, here
            # rather than on a timer of its own.
            self._next_prune = time.monotonic() + PRUNE_INTERVAL_SECONDS
            await self._prune_in(tx, cutoff)
        # Both sides of each CASE read the row as it was: the window either goes on
        # (count + 1) or restarts now with this message as its first.
        row = await tx.fetchone(
            f"INSERT INTO {_TABLE} (sender, window_start, count) VALUES (?, ?, 1) "
            "ON CONFLICT(sender) DO UPDATE SET "
            f"count = CASE WHEN {_TABLE}.window_start > ? THEN {_TABLE}.count + 1 ELSE 1 END, "
            f"window_start = CASE WHEN {_TABLE}.window_start > ? "
            f"THEN {_TABLE}.window_start ELSE excluded.window_start END "
            "RETURNING count, window_start",
            (sender_digest(platform, sender_id, self._secret), now, cutoff, cutoff),
        )
        assert row is not None  # an upsert with RETURNING always returns its row
        count, window_start = int(row[0]), float(row[1])
        retry_in = max(0.0, window_start + self.window_seconds - now)
        return RateVerdict(
            allowed=count <= self.limit, notice=count == self.limit + 1, retry_in=retry_in
        )

    async def count(self, platform: str, sender_id: str) -> int:
        """Messages the sender sent in the current window (0 once it ended)."""
        cutoff = to_epoch(self._clock()) - self.window_seconds
        async with self._store.transaction() as tx:
            if not self._opened:
                await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
            row = await tx.fetchone(
                f"SELECT count FROM {_TABLE} WHERE sender = ? AND window_start > ?",
                (sender_digest(platform, sender_id, self._secret), cutoff),
            )
        return 0 if row is None else int(row[0])

    async def prune(self) -> int:
        """Delete the rows of windows that ended (in batches); returns how many went."""
        cutoff = to_epoch(self._clock()) - self.window_seconds
        total = 0
        while True:
            async with self._store.transaction() as tx:
                if not self._opened:
                    await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
                deleted = await self._prune_in(tx, cutoff)
            total += deleted
            if deleted < _PRUNE_BATCH:
                break
        if total:
            logger.debug("pruned %d ended rate-limit window(s)", total)
        return total

    async def _prune_in(self, tx: Transaction, cutoff: float) -> int:
        deleted = await tx.execute(
            f"DELETE FROM {_TABLE} WHERE sender IN (SELECT sender FROM {_TABLE} "
            "WHERE window_start <= ? LIMIT ?)",
            (cutoff, _PRUNE_BATCH),
        )
        return max(deleted, 0)
