"""The memories table: its DDL (SQLite's, adapted to PostgreSQL by ``portable_ddl``).

One row per remembered fact. The row keeps where and by whom it was remembered,
as hashes only (``user_<12hex>``, ``chat_<12hex>``, the same keyed hashes as the
session keys): that is all the visibility rule (``bot.core.long_memory.scope``)
needs, and all ``forget-user`` needs to find a person's rows.
"""

from __future__ import annotations

from typing import Final

from bot.core.sql import Transaction, ensure_schema

__all__ = ["COMPONENT", "MIGRATIONS", "TABLE", "ensure_memory_schema_in"]

TABLE: Final = "chatflow_memories"
"""One row per remembered fact."""
COMPONENT: Final = "memories"
"""The memories table's row in ``chatflow_schema_versions``."""
MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {TABLE} ("
        "id TEXT PRIMARY KEY NOT NULL, "
        "about TEXT NOT NULL, "  # 'me' (the person who said it) or 'chat' (the chat, topic)
        "platform TEXT NOT NULL, "
        "person TEXT NOT NULL, "  # hashed sender id of who remembered it
        "chat TEXT NOT NULL, "  # hashed chat id where it was remembered
        "thread TEXT NOT NULL DEFAULT '', "  # forum topic ('' for none)
        "private INTEGER NOT NULL DEFAULT 0, "  # remembered in a private chat
        "text TEXT NOT NULL, "
        "session_id TEXT NOT NULL, "
        "created_at REAL NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_person ON {TABLE} (platform, person)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_chat ON {TABLE} (platform, chat, thread)",
    ),
}
"""``MIGRATIONS[v]`` moves the memories table from version ``v - 1`` to ``v``."""


async def ensure_memory_schema_in(tx: Transaction) -> None:
    """Create or migrate the memories table inside ``tx``."""
    await ensure_schema(tx, COMPONENT, MIGRATIONS)
