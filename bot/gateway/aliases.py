"""Chat aliases: a chat that replaced another keeps the other's conversations.

Telegram turns a group into a supergroup with a new chat id. The session key is
built from the chat id, so without an alias the conversation would restart. The
gateway records ``new -> old`` once and builds keys from the old id from then
on; replies still go to the new chat id carried by each event.

With several processes on one database, an alias recorded by one reaches the
others when they ``reload`` (the gateway does so every few seconds).
"""

from __future__ import annotations

import logging

from bot.core.sql import ensure_schema
from bot.core.stores.base import TransactionalStore, require_transactional

__all__ = ["ChatAliases"]

logger = logging.getLogger(__name__)

_COMPONENT = "chat_aliases"
_MIGRATIONS = {
    1: (
        """CREATE TABLE IF NOT EXISTS chatflow_chat_aliases (
            platform TEXT NOT NULL,
            chat_id TEXT NOT NULL,
            alias_of TEXT NOT NULL,
            PRIMARY KEY (platform, chat_id)
        )""",
    ),
}


class ChatAliases:
    """Maps a platform chat id to the chat id its sessions are keyed by."""

    def __init__(self, store: TransactionalStore) -> None:
        self._store = require_transactional(store, "the chat aliases")
        self._cache: dict[tuple[str, str], str] = {}

    async def open(self) -> None:
        """Create the table and load every alias (there are few: one per migrated group)."""
        async with self._store.transaction() as tx:
            await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
        await self.reload()

    async def reload(self) -> None:
        """Read every alias again (other processes may have recorded some)."""
        async with self._store.transaction() as tx:
            rows = await tx.fetchall(
                "SELECT platform, chat_id, alias_of FROM chatflow_chat_aliases"
            )
        self._cache = {(str(p), str(c)): str(a) for p, c, a in rows}

    def resolve(self, platform: str, chat_id: str) -> str:
        """The chat id whose sessions ``chat_id`` continues (itself if none)."""
        return self._cache.get((platform, chat_id), chat_id)

    async def record(self, platform: str, new_chat_id: str, old_chat_id: str) -> None:
        """Remember that ``new_chat_id`` continues ``old_chat_id`` (chains collapse)."""
        target = self.resolve(platform, old_chat_id)
        if new_chat_id == target:
            return
        async with self._store.transaction() as tx:
            await tx.execute(
                "INSERT INTO chatflow_chat_aliases (platform, chat_id, alias_of) VALUES (?, ?, ?) "
                "ON CONFLICT (platform, chat_id) DO UPDATE SET alias_of = excluded.alias_of",
                (platform, new_chat_id, target),
            )
        self._cache[(platform, new_chat_id)] = target
        logger.info("%s chat migrated; its conversations continue under the new chat", platform)
