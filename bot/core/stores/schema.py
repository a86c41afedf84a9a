"""The session tables (DESIGN §3.3): their DDL, written once for both databases, and migrations.

The tables are created and migrated by ``ensure_schema`` (``bot.core.sql``),
the mechanism the gateway's tables use, as component ``session_store`` in
``chatflow_schema_versions``. The DDL is SQLite's; ``portable_ddl`` adapts it
to PostgreSQL.

Databases from before this mechanism
    SQLite files written by earlier Chatflow versions hold the session tables
    and ``PRAGMA user_version = 1`` but no ``session_store`` row. That marker
    says the tables are ours: their columns are checked, and migration 1 (all
    ``IF NOT EXISTS``) adds only what is missing. Chatflow tables with neither
    marker are someone else's and are refused, as is a ``user_version`` newer
    than this code knows. On SQLite the version is also written to
    ``user_version``, so an older Chatflow (which reads only that) refuses a
    newer file instead of misreading it. PostgreSQL always used the versions
    table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from bot.core.sql import Transaction, ensure_schema, schema_version_in
from bot.errors import SchemaVersionError

__all__ = ["COMPONENT", "MIGRATIONS", "SCHEMA_VERSION", "ensure_session_schema_in"]

COMPONENT: Final = "session_store"
"""The session tables' row in ``chatflow_schema_versions``."""

MIGRATIONS: Final[Mapping[int, tuple[str, ...]]] = {
    # 1: the initial schema. IF NOT EXISTS everywhere: it also completes older files.
    1: (
        """CREATE TABLE IF NOT EXISTS chatflow_sessions (
            session_id TEXT PRIMARY KEY NOT NULL,
            active_agent_name TEXT NOT NULL,
            metadata_json TEXT NOT NULL DEFAULT '{}',
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS chatflow_messages (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL
                REFERENCES chatflow_sessions (session_id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            message_json TEXT NOT NULL,
            created_at TEXT NOT NULL
        )""",
        "CREATE UNIQUE INDEX IF NOT EXISTS chatflow_messages_session_seq "
        "ON chatflow_messages (session_id, seq)",
        """CREATE TABLE IF NOT EXISTS chatflow_processed_messages (
            message_id TEXT PRIMARY KEY NOT NULL,
            processed_at REAL NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS chatflow_processed_messages_processed_at "
        "ON chatflow_processed_messages (processed_at)",
        # list_sessions orders by it.
        "CREATE INDEX IF NOT EXISTS chatflow_sessions_updated_at ON chatflow_sessions (updated_at)",
    ),
    # 2: a version per session, for the stores' session caches. Saves bump it; a
    # trigger (``_VERSION_TRIGGERS``, created with it) bumps it on hand-made message edits.
    2: ("ALTER TABLE chatflow_sessions ADD COLUMN version INTEGER NOT NULL DEFAULT 0",),
    # 3: compaction (``bot.core.compactor``) keeps summarised messages, marked, for the
    # console and audits; loads read only the others. They go with their session.
    3: ("ALTER TABLE chatflow_messages ADD COLUMN compacted INTEGER NOT NULL DEFAULT 0",),
}
"""``MIGRATIONS[v]`` moves the session tables from version ``v - 1`` to ``v`` (SQLite DDL)."""

SCHEMA_VERSION: Final = max(MIGRATIONS)
"""The ``session_store`` version this code writes and understands."""

# An UPDATE of a message row (an operator's hand edit, an older tool) bumps its
# session's ``version``; saves bump it themselves and never update a message row,
# so they fire no trigger. What else a hand edit can change, the caches' freshness
# read compares itself: the session's message-row count (an insert or a delete),
# its agent and its metadata (``bot.core.stores.cache.VERSION_SQL``).
_VERSION_TRIGGERS: Final[Mapping[str, tuple[str, ...]]] = {
    "sqlite": (
        "CREATE TRIGGER chatflow_messages_update_version AFTER UPDATE ON chatflow_messages "
        "BEGIN UPDATE chatflow_sessions SET version = version + 1 "
        "WHERE session_id IN (OLD.session_id, NEW.session_id); END",
    ),
    "postgres": (
        """CREATE OR REPLACE FUNCTION chatflow_messages_version() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE chatflow_sessions SET version = version + 1
            WHERE session_id IN (OLD.session_id, NEW.session_id);
            RETURN NULL;
        END $$""",
        "CREATE TRIGGER chatflow_messages_version AFTER UPDATE "
        "ON chatflow_messages FOR EACH ROW EXECUTE FUNCTION chatflow_messages_version()",
    ),
}

_REQUIRED_COLUMNS: Final[Mapping[str, frozenset[str]]] = {
    "chatflow_sessions": frozenset(
        {"session_id", "active_agent_name", "metadata_json", "created_at", "updated_at"}
    ),
    "chatflow_messages": frozenset(
        {"id", "session_id", "seq", "role", "message_json", "created_at"}
    ),
    "chatflow_processed_messages": frozenset({"message_id", "processed_at"}),
}

# A table's column names; no rows for a table that does not exist.
_COLUMNS_SQL: Final = {
    "sqlite": "SELECT name FROM pragma_table_info(?)",
    "postgres": "SELECT column_name FROM information_schema.columns "
    "WHERE table_schema = current_schema() AND table_name = ?",
}


async def ensure_session_schema_in(tx: Transaction) -> int:
    """Create or migrate the session tables inside ``tx``; return their schema version.

    Raises ``SchemaVersionError`` for tables of a newer Chatflow or of another program.
    """
    legacy = 0
    if tx.dialect == "sqlite":
        row = await tx.fetchone("PRAGMA user_version")
        legacy = int(row[0]) if row else 0
    if legacy > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"the session database is at schema version {legacy}, newer than this "
            f"Chatflow knows ({SCHEMA_VERSION}); upgrade Chatflow or use another file"
        )
    before = await schema_version_in(tx, COMPONENT)
    if before == 0:
        present = {t: c for t, c in (await _columns_in(tx)).items() if c}
        if present and not legacy:
            raise SchemaVersionError(
                "the database already holds chatflow tables without a schema version "
                "(written by another program?); Chatflow cannot migrate them: use a new "
                "database file or schema"
            )
        _check_columns(present)  # before migration 1 completes them
    version = await ensure_schema(tx, COMPONENT, MIGRATIONS)
    _check_columns(await _columns_in(tx))
    if before < 2 <= version:  # migration 2 just ran: its triggers are dialect-specific
        for statement in _VERSION_TRIGGERS[tx.dialect]:
            await tx.execute(statement)
    if tx.dialect == "sqlite" and legacy != version:
        await tx.execute(f"PRAGMA user_version = {int(version)}")
    return version


async def _columns_in(tx: Transaction) -> dict[str, set[str]]:
    sql = _COLUMNS_SQL[tx.dialect]
    return {
        table: {str(row[0]) for row in await tx.fetchall(sql, (table,))}
        for table in _REQUIRED_COLUMNS
    }


def _check_columns(columns: Mapping[str, set[str]]) -> None:
    for table, found in columns.items():
        missing = _REQUIRED_COLUMNS[table] - found
        if missing:
            raise SchemaVersionError(
                f"table {table} lacks columns {sorted(missing)}: the database was written "
                "by another program (e.g. chatflow-agent); use a new database file or schema"
            )
