"""The operator's view of the ledger: read obligations, count them, re-queue or give one up.

Used by ``chatflow ledger`` (``bot.cli``) and by tests; the gateway never calls
these, so they raise ``StorageError`` instead of being best effort. Each one
flushes the buffered delivered marks first, so it sees every send made so far.
"""

from __future__ import annotations

from typing import Any

from bot.gateway.ledger.core import LedgerCore, logger
from bot.gateway.ledger.obligations import (
    COLUMNS,
    NOBODY,
    STATES,
    TABLE,
    Obligation,
    ObligationState,
    clip_error,
    decode_row,
)

__all__ = ["LedgerAdmin"]


class LedgerAdmin(LedgerCore):
    """Operator queries and actions (part of ``DeliveryLedger``); errors propagate."""

    async def get(self, obligation_id: str) -> Obligation | None:
        """One obligation as stored (``needs_marker`` mirrors ``maybe_delivered``)."""
        await self.flush()
        async with self._tx() as tx:
            rows = await tx.fetchall(
                f"SELECT {COLUMNS} FROM {TABLE} WHERE obligation_id = ?", (obligation_id,)
            )
        return decode_row(rows[0]).obligation if rows else None

    async def status(self) -> dict[str, int]:
        """Number of obligations per state (every state present, zero included)."""
        await self.flush()
        counts: dict[str, int] = dict.fromkeys(STATES, 0)
        async with self._tx() as tx:
            rows = await tx.fetchall(f"SELECT state, COUNT(*) FROM {TABLE} GROUP BY state", ())
        for state, count in rows:
            counts[str(state)] = int(count)
        return counts

    async def list_obligations(
        self, state: ObligationState | None = None, limit: int = 50
    ) -> list[Obligation]:
        """Obligations, newest first, optionally of one state."""
        if state is not None and state not in STATES:
            raise ValueError(f"unknown obligation state {state!r}")
        sql = f"SELECT {COLUMNS} FROM {TABLE}"
        params: tuple[Any, ...] = ()
        if state is not None:
            sql += " WHERE state = ?"
            params = (state,)
        sql += " ORDER BY created_at DESC, obligation_id LIMIT ?"
        await self.flush()
        async with self._tx() as tx:
            rows = await tx.fetchall(sql, (*params, max(int(limit), 0)))
        return [decode_row(r).obligation for r in rows]

    async def retry(self, obligation_id: str) -> bool:
        """Operator: put an ``abandoned``/``failed`` row back to ``pending``.

        Attempts and the staleness clock restart, and the row belongs to
        ``NOBODY``, so the next ``due_retries`` poll of a running gateway (or
        the sweep of the next start) sends it, with the marker if an earlier
        attempt may have arrived. Returns whether the row was re-queued.
        """
        await self.flush()
        now = self._now()
        async with self._tx() as tx:
            changed = await tx.execute(
                f"UPDATE {TABLE} SET state = 'pending', attempts = 0, next_attempt_at = NULL, "
                "owner_pid = ?, owner_instance = ?, owner_started = NULL, fresh_since = ?, "
                "updated_at = ? WHERE obligation_id = ? AND state IN ('abandoned', 'failed')",
                (NOBODY.pid, NOBODY.instance_id, now, now, obligation_id),
            )
        if changed:
            logger.info("obligation %s re-queued by the operator", obligation_id)
        return changed == 1

    async def abandon(self, obligation_id: str, reason: str) -> bool:
        """Operator: give up an undelivered row with ``reason``. Returns whether it changed."""
        await self.flush()  # a reply sent meanwhile is delivered, not abandoned
        now = self._now()
        async with self._tx() as tx:
            changed = await tx.execute(
                f"UPDATE {TABLE} SET state = 'abandoned', last_error = ?, "
                "next_attempt_at = NULL, updated_at = ? "
                "WHERE obligation_id = ? AND state IN ('pending', 'attempting', 'failed')",
                (clip_error(reason), now, obligation_id),
            )
        if changed:
            logger.warning("obligation %s abandoned by the operator: %s", obligation_id, reason)
        return changed == 1
