"""Session tables made by ``ensure_schema``: databases of the earlier layout open and keep their
rows, and the one DDL gives each database the tables the two hand-written copies gave."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import asyncpg
import pytest

from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.stores.postgres import PostgresSessionStore
from bot.core.stores.schema import SCHEMA_VERSION
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import SchemaVersionError
from tests.pgtest import fresh_schema, pg_dsn

__all__ = ["pg_dsn"]  # the fixture, imported for this module's tests

# The DDL the stores wrote before the session tables moved to ensure_schema, frozen here.
OLD_SQLITE_DDL = (
    """CREATE TABLE chatflow_sessions (
        session_id TEXT PRIMARY KEY NOT NULL,
        active_agent_name TEXT NOT NULL,
        metadata_json TEXT NOT NULL DEFAULT '{}',
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    """CREATE TABLE chatflow_messages (
        id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL
            REFERENCES chatflow_sessions (session_id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        role TEXT NOT NULL,
        message_json TEXT NOT NULL,
        created_at TEXT NOT NULL
    )""",
    "CREATE UNIQUE INDEX chatflow_messages_session_seq ON chatflow_messages (session_id, seq)",
    """CREATE TABLE chatflow_processed_messages (
        message_id TEXT PRIMARY KEY NOT NULL,
        processed_at REAL NOT NULL
    )""",
    "CREATE INDEX chatflow_processed_messages_processed_at "
    "ON chatflow_processed_messages (processed_at)",
)
OLD_POSTGRES_DDL = (
    OLD_SQLITE_DDL[0],
    """CREATE TABLE chatflow_messages (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session_id TEXT NOT NULL
            REFERENCES chatflow_sessions (session_id) ON DELETE CASCADE,
        seq BIGINT NOT NULL,
        role TEXT NOT NULL,
        message_json TEXT NOT NULL,
        created_at TEXT NOT NULL
    )""",
    OLD_SQLITE_DDL[2],
    """CREATE TABLE chatflow_processed_messages (
        message_id TEXT PRIMARY KEY NOT NULL,
        processed_at DOUBLE PRECISION NOT NULL
    )""",
    OLD_SQLITE_DDL[4],
    "CREATE INDEX chatflow_sessions_updated_at ON chatflow_sessions (updated_at)",
)
OLD_VERSIONS_DDL = (
    "CREATE TABLE chatflow_schema_versions ("
    "component TEXT PRIMARY KEY NOT NULL, version INTEGER NOT NULL)"
)
TABLES = ("chatflow_sessions", "chatflow_messages", "chatflow_processed_messages")
STAMP = "2026-11-30T10:00:00.000000+00:00"


def old_rows() -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """A session of two messages (seqs 3 and 4: older turns were pruned), as the old store wrote."""
    session = ("s", "Support", '{"lang": "es"}', STAMP, STAMP)
    messages: list[tuple[object, ...]] = [
        (
            "s",
            seq,
            message.role.value,
            message.model_dump_json(),
            message.created_at.isoformat(),
        )
        for seq, message in (
            (3, Message(role=Role.USER, content="hola")),
            (4, Message(role=Role.MODEL, content="¿en qué ayudo?")),
        )
    ]
    return [session], messages


_INSERT_SESSION = "INSERT INTO chatflow_sessions VALUES (?, ?, ?, ?, ?)"
_INSERT_MESSAGE = (
    "INSERT INTO chatflow_messages (session_id, seq, role, message_json, created_at) "
    "VALUES (?, ?, ?, ?, ?)"
)
_INSERT_CLAIM = "INSERT INTO chatflow_processed_messages VALUES (?, ?)"


def write_old_sqlite(path: Path, *, gateway_tables: bool) -> None:
    sessions, messages = old_rows()
    with sqlite3.connect(path) as conn:
        for statement in OLD_SQLITE_DDL:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        conn.executemany(_INSERT_SESSION, sessions)
        conn.executemany(_INSERT_MESSAGE, messages)
        conn.execute(_INSERT_CLAIM, ("wamid.old", time.time()))
        if gateway_tables:  # the gateway versioned its own tables already
            conn.execute(OLD_VERSIONS_DDL)
            conn.execute("INSERT INTO chatflow_schema_versions VALUES ('inbox', 2)")
    conn.close()


def sqlite_layout(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Columns (name, type, not null, default, pk) of every session table."""
    with sqlite3.connect(path) as conn:
        layout = {
            table: [tuple(r[1:]) for r in conn.execute(f"PRAGMA table_info({table})")]
            for table in TABLES
        }
    conn.close()
    return layout


# What migration 2 adds to the old layout: the sessions' version column (and triggers);
# migration 3: the messages' compacted mark.
SQLITE_VERSION_COLUMN = ("version", "INTEGER", 1, "0", 0)
POSTGRES_VERSION_COLUMN = ("chatflow_sessions", "version", "bigint", "NO", "0", "NO", None)
SQLITE_COMPACTED_COLUMN = ("compacted", "INTEGER", 1, "0", 0)
POSTGRES_COMPACTED_COLUMN = ("chatflow_messages", "compacted", "bigint", "NO", "0", "NO", None)


def with_sqlite_version(
    layout: dict[str, list[tuple[object, ...]]],
) -> dict[str, list[tuple[object, ...]]]:
    return {
        **layout,
        "chatflow_sessions": [*layout["chatflow_sessions"], SQLITE_VERSION_COLUMN],
        "chatflow_messages": [*layout["chatflow_messages"], SQLITE_COMPACTED_COLUMN],
    }


def with_postgres_version(
    layout: tuple[list[tuple[object, ...]], list[tuple[object, ...]]],
) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    columns, indexes = layout
    for table, added in (
        ("chatflow_messages", POSTGRES_COMPACTED_COLUMN),
        ("chatflow_sessions", POSTGRES_VERSION_COLUMN),
    ):
        last = max(i for i, column in enumerate(columns) if column[0] == table)
        columns = [*columns[: last + 1], added, *columns[last + 1 :]]
    return columns, indexes


def sqlite_scalar(path: Path, sql: str) -> object:
    with sqlite3.connect(path) as conn:
        row = conn.execute(sql).fetchone()
    conn.close()
    return None if row is None else row[0]


@pytest.mark.parametrize("gateway_tables", [False, True], ids=["store-only", "with-gateway"])
async def test_an_old_sqlite_file_opens_and_keeps_its_rows(
    tmp_path: Path, agent: Agent, gateway_tables: bool
) -> None:
    path = tmp_path / "old.db"
    await asyncio.to_thread(write_old_sqlite, path, gateway_tables=gateway_tables)
    layout_before = await asyncio.to_thread(sqlite_layout, path)

    async with SQLiteSessionStore(path) as store:
        loaded = await store.get("s")
        assert loaded is not None
        assert [m.content for m in loaded.history] == ["hola", "¿en qué ayudo?"]
        assert loaded.metadata == {"lang": "es"}
        assert loaded.active_agent.name == "Support"
        assert await store.is_message_processed("wamid.old")
        assert not await store.claim_message("wamid.old")
        # Seqs go on after the stored ones: the next save appends, it does not collide.
        loaded.add_message(Message(role=Role.USER, content="otra"))
        await store.save(loaded)
        async with store.transaction() as tx:
            versions = await tx.fetchall("SELECT component, version FROM chatflow_schema_versions")
            assert await tx.fetchone("PRAGMA user_version") == (SCHEMA_VERSION,)

    expected = {("session_store", SCHEMA_VERSION)} | ({("inbox", 2)} if gateway_tables else set())
    assert set(versions) == expected
    # Migration 1 only filled in what the old layout lacked (the updated_at index);
    # migration 2 added the version column.
    assert await asyncio.to_thread(sqlite_layout, path) == with_sqlite_version(layout_before)
    index = "SELECT name FROM sqlite_master WHERE name = 'chatflow_sessions_updated_at'"
    assert await asyncio.to_thread(sqlite_scalar, path, index) == "chatflow_sessions_updated_at"

    async with SQLiteSessionStore(path) as again:  # the second open finds nothing to do
        reloaded = await again.get("s")
        assert reloaded is not None
        assert [m.content for m in reloaded.history] == ["hola", "¿en qué ayudo?", "otra"]


async def test_new_sqlite_tables_match_the_old_layout(tmp_path: Path, agent: Agent) -> None:
    old, new = tmp_path / "old.db", tmp_path / "new.db"
    await asyncio.to_thread(write_old_sqlite, old, gateway_tables=False)
    async with SQLiteSessionStore(new) as store:
        await store.get_or_create("s", agent)
    assert await asyncio.to_thread(sqlite_layout, new) == with_sqlite_version(
        await asyncio.to_thread(sqlite_layout, old)
    )


async def test_an_old_file_of_another_layout_is_still_refused(tmp_path: Path) -> None:
    # user_version 1 says "ours", but a table lacks a column: nothing is created or recorded.
    path = tmp_path / "odd.db"

    def write() -> None:
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE chatflow_sessions (session_id TEXT PRIMARY KEY)")
            conn.execute("PRAGMA user_version = 1")
        conn.close()

    await asyncio.to_thread(write)
    store = SQLiteSessionStore(path)
    with pytest.raises(SchemaVersionError, match="lacks columns"):
        await store.open()
    await store.close()
    versions = "SELECT name FROM sqlite_master WHERE name = 'chatflow_schema_versions'"
    assert await asyncio.to_thread(sqlite_scalar, path, versions) is None


# -- PostgreSQL --------------------------------------------------------------------------


async def write_old_postgres(dsn: str) -> None:
    sessions, messages = old_rows()
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            for statement in OLD_POSTGRES_DDL:
                await conn.execute(statement)
            await conn.execute(OLD_VERSIONS_DDL)
            await conn.execute("INSERT INTO chatflow_schema_versions VALUES ('session_store', 1)")
            for row in sessions:
                await conn.execute(
                    "INSERT INTO chatflow_sessions VALUES ($1, $2, $3, $4, $5)", *row
                )
            for row in messages:
                await conn.execute(
                    "INSERT INTO chatflow_messages (session_id, seq, role, message_json, "
                    "created_at) VALUES ($1, $2, $3, $4, $5)",
                    *row,
                )
            await conn.execute(
                "INSERT INTO chatflow_processed_messages VALUES ($1, $2)", "wamid.old", time.time()
            )
    finally:
        await conn.close()


async def postgres_layout(dsn: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """Columns and indexes of the session tables in the DSN's schema."""
    conn = await asyncpg.connect(dsn)
    try:
        columns = await conn.fetch(
            "SELECT table_name, column_name, data_type, is_nullable, column_default, "
            "is_identity, identity_generation FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = ANY($1::text[]) "
            "ORDER BY table_name, ordinal_position",
            list(TABLES),
        )
        indexes = await conn.fetch(
            "SELECT tablename, indexname, replace(indexdef, current_schema() || '.', '') "
            "FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = ANY($1::text[]) ORDER BY indexname",
            list(TABLES),
        )
    finally:
        await conn.close()
    return [tuple(r) for r in columns], [tuple(r) for r in indexes]


async def test_an_old_postgres_schema_opens_and_keeps_its_rows(pg_dsn: str) -> None:
    await write_old_postgres(pg_dsn)
    before = await postgres_layout(pg_dsn)
    async with PostgresSessionStore(pg_dsn) as store:
        loaded = await store.get("s")
        assert loaded is not None
        assert [m.content for m in loaded.history] == ["hola", "¿en qué ayudo?"]
        assert loaded.metadata == {"lang": "es"}
        assert await store.is_message_processed("wamid.old")
        loaded.add_message(Message(role=Role.USER, content="otra"))
        await store.save(loaded)
        reloaded = await store.get("s")
        assert reloaded is not None and len(reloaded.history) == 3
    assert await postgres_layout(pg_dsn) == with_postgres_version(before)


async def test_new_postgres_tables_match_the_old_layout(pg_dsn: str, agent: Agent) -> None:
    await write_old_postgres(pg_dsn)
    async with fresh_schema() as new_dsn:
        async with PostgresSessionStore(new_dsn) as store:
            await store.get_or_create("s", agent)
        new_layout = await postgres_layout(new_dsn)
    assert new_layout == with_postgres_version(await postgres_layout(pg_dsn))


# -- migration 2: the session version ----------------------------------------------------


async def test_migration_2_versions_old_rows_and_bumps_on_message_edits(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    await asyncio.to_thread(write_old_sqlite, path, gateway_tables=False)
    async with SQLiteSessionStore(path) as store:
        await store.open()
    version_sql = "SELECT version FROM chatflow_sessions WHERE session_id = 's'"
    assert await asyncio.to_thread(sqlite_scalar, path, version_sql) == 0

    def hand_edits() -> None:
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE chatflow_messages SET role = role WHERE seq = 3")
            # Inserts, deletes and session-row edits leave it (the caches compare those).
            conn.execute("UPDATE chatflow_sessions SET metadata_json = '{}'")
            conn.execute("DELETE FROM chatflow_messages WHERE seq = 4")
            conn.execute(_INSERT_MESSAGE, ("s", 5, "user", "{}", STAMP))
        conn.close()

    await asyncio.to_thread(hand_edits)
    assert await asyncio.to_thread(sqlite_scalar, path, version_sql) == 1


async def test_migration_2_on_postgres_versions_rows_and_bumps_on_message_edits(
    pg_dsn: str,
) -> None:
    await write_old_postgres(pg_dsn)
    async with PostgresSessionStore(pg_dsn) as store:
        await store.open()
    conn = await asyncpg.connect(pg_dsn)
    try:
        version_sql = "SELECT version FROM chatflow_sessions WHERE session_id = 's'"
        assert await conn.fetchval(version_sql) == 0
        await conn.execute("UPDATE chatflow_messages SET role = role WHERE seq = 3")
        await conn.execute("UPDATE chatflow_sessions SET metadata_json = '{}'")
        await conn.execute("DELETE FROM chatflow_messages WHERE seq = 4")
        assert await conn.fetchval(version_sql) == 1
    finally:
        await conn.close()
