"""The session stores: one contract (``base``) and its backends.

- ``base``: ``BaseSessionStore``, the contract, and ``TransactionalStore``, the SQL capability;
- ``in_memory``: ``SessionStore``, for tests and scripts;
- ``sql``: what the SQL stores share (one body per transaction, the session tables);
- ``sqlite`` with ``sqlite_writer`` (the database thread), and ``postgres`` (asyncpg);
- ``cache`` (sessions kept between turns) and ``schema`` (the session tables' migrations).

``PostgresSessionStore`` loads lazily: importing this package does not import asyncpg.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bot.core.stores.base import BaseSessionStore, TransactionalStore, require_transactional
from bot.core.stores.in_memory import SessionStore
from bot.core.stores.sqlite import SQLiteSessionStore

if TYPE_CHECKING:
    from bot.core.stores.postgres import PostgresSessionStore

__all__ = [
    "BaseSessionStore",
    "PostgresSessionStore",
    "SQLiteSessionStore",
    "SessionStore",
    "TransactionalStore",
    "require_transactional",
]


def __getattr__(name: str) -> Any:
    if name == "PostgresSessionStore":
        from bot.core.stores.postgres import PostgresSessionStore

        return PostgresSessionStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
