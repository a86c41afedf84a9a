"""Console sign-ins recorded server-side, so signing out ends one everywhere.

A signed cookie alone stays valid until it expires, whoever copied it. Each
sign-in therefore adds a row to ``chatflow_console_sessions`` and every cookie
request looks its row up; "Sign out" deletes the row, so the same cookie value
is refused from then on, by every process of a PostgreSQL installation at
once (the table is the shared truth, no copy is cached). Rows hold a SHA-256
of the session id, never the id itself, and expired rows are pruned at each
sign-in. Changing ``CONSOLE_TOKEN`` still signs everyone out (the cookie's key
changes).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from bot.core.sql import Transaction, ensure_schema
from bot.core.stores.base import TransactionalStore, require_transactional

__all__ = ["SESSIONS_TABLE", "ConsoleSessions"]

logger = logging.getLogger(__name__)

SESSIONS_TABLE: Final = "chatflow_console_sessions"
"""One row per console sign-in that is neither signed out nor expired."""

_COMPONENT: Final = "console_sessions"
_MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {SESSIONS_TABLE} ("
        "session_hash TEXT PRIMARY KEY NOT NULL, "
        "expires_at REAL NOT NULL)",
    ),
}


def _key(session: str) -> str:
    # A database reader learns nothing that would rebuild a cookie or a CSRF token.
    return hashlib.sha256(session.encode("utf-8")).hexdigest()


class ConsoleSessions:
    """The server-side record of console sign-ins (table ``chatflow_console_sessions``)."""

    def __init__(
        self, store: TransactionalStore, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._store = require_transactional(store, "the operator console")
        self._clock = clock
        self._opened = False

    async def open(self) -> None:
        """Create or migrate the table; idempotent (also done on first use)."""
        if not self._opened:
            async with self._store.transaction() as tx:
                await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
            self._opened = True

    async def add(self, session: str, lifetime: float) -> None:
        """Record a sign-in valid for ``lifetime`` seconds; drop expired ones."""
        await self.open()
        now = self._clock()

        async def body(tx: Transaction) -> None:
            await tx.execute(f"DELETE FROM {SESSIONS_TABLE} WHERE expires_at <= ?", (now,))
            await tx.execute(
                f"INSERT INTO {SESSIONS_TABLE} (session_hash, expires_at) VALUES (?, ?)",
                (_key(session), now + lifetime),
            )

        await self._store.run(body)

    async def active(self, session: str) -> bool:
        """Whether ``session`` was signed in and neither signed out nor expired."""
        await self.open()
        now = self._clock()

        async def body(tx: Transaction) -> tuple[Any, ...] | None:
            return await tx.fetchone(
                f"SELECT 1 FROM {SESSIONS_TABLE} WHERE session_hash = ? AND expires_at > ?",
                (_key(session), now),
            )

        return await self._store.run(body, write=False) is not None

    async def revoke(self, session: str) -> bool:
        """End ``session`` for good; ``False`` if it was not active."""
        await self.open()

        async def body(tx: Transaction) -> int:
            return await tx.execute(
                f"DELETE FROM {SESSIONS_TABLE} WHERE session_hash = ?", (_key(session),)
            )

        ended = await self._store.run(body) == 1
        if ended:
            logger.info("console sign-out: the session is revoked")
        return ended
