"""``SQLiteSessionStore`` under its DESIGN.md path (the code: ``bot.core.stores.sqlite``)."""

from bot.core.stores.sqlite import BUSY_TIMEOUT_MS, SCHEMA_VERSION, SQLiteSessionStore

__all__ = ["BUSY_TIMEOUT_MS", "SCHEMA_VERSION", "SQLiteSessionStore"]
