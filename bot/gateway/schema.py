"""Schema versions of the gateway's own tables (inbox, ledger, aliases, instances).

The SQLite store versions its tables with ``PRAGMA user_version``; that
single number belongs to the store, so each gateway component records its own
version in ``chatflow_schema_versions(component, version)`` and migrates
forward inside one transaction.

Migrations are written once, in SQLite's types; ``portable_ddl`` adapts them to
the transaction's dialect. On PostgreSQL every migration (and every read of a
version) first takes a transaction-scoped advisory lock, so several processes
starting at once migrate one after the other and never collide on
``CREATE TABLE``; the later ones find the work done.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from bot.core.memory import Transaction
from bot.core.sql import MIGRATION_LOCK_KEY, portable_ddl
from bot.errors import SchemaVersionError

__all__ = ["VERSIONS_TABLE", "ensure_schema", "lock_migrations_in", "schema_version_in"]

logger = logging.getLogger(__name__)

VERSIONS_TABLE = "chatflow_schema_versions"
"""Table holding one row per gateway component: its schema version."""

_CREATE_VERSIONS = (
    f"CREATE TABLE IF NOT EXISTS {VERSIONS_TABLE} ("
    "component TEXT PRIMARY KEY NOT NULL, "
    "version INTEGER NOT NULL)"
)


async def lock_migrations_in(tx: Transaction) -> None:
    """On PostgreSQL, wait for the migration lock (held until ``tx`` ends); no-op on SQLite.

    SQLite needs none: its write transactions already exclude each other.
    """
    if tx.dialect == "postgres":
        await tx.fetchall("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK_KEY,))


async def schema_version_in(tx: Transaction, component: str) -> int:
    """The recorded schema version of ``component`` (0 when it has none yet)."""
    await lock_migrations_in(tx)
    await tx.execute(_CREATE_VERSIONS, ())
    rows = await tx.fetchall(
        f"SELECT version FROM {VERSIONS_TABLE} WHERE component = ?", (component,)
    )
    return int(rows[0][0]) if rows else 0


async def ensure_schema(
    tx: Transaction, component: str, migrations: Mapping[int, Sequence[str]]
) -> int:
    """Bring ``component``'s tables to the newest version in ``migrations``.

    ``migrations[v]`` holds the statements that move version ``v - 1`` to ``v``;
    versions run from 1 upwards without gaps. Everything happens in ``tx``, so
    a failed migration leaves the old schema. Raises ``SchemaVersionError`` when
    the database was written by a newer version than this code knows.
    """
    target = max(migrations, default=0)
    if sorted(migrations) != list(range(1, target + 1)):
        raise ValueError(f"migrations of {component} must be numbered 1..{target}")
    current = await schema_version_in(tx, component)
    if current > target:
        raise SchemaVersionError(
            f"the {component} tables are at schema version {current}, "
            f"newer than this Chatflow knows ({target}); upgrade Chatflow"
        )
    for version in range(current + 1, target + 1):
        for statement in migrations[version]:
            await tx.execute(portable_ddl(statement, tx.dialect), ())
    if current != target:
        await tx.execute(
            f"INSERT INTO {VERSIONS_TABLE} (component, version) VALUES (?, ?) "
            "ON CONFLICT(component) DO UPDATE SET version = excluded.version",
            (component, target),
        )
        logger.info("%s schema migrated from version %d to %d", component, current, target)
    return target
