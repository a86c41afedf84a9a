"""The knowledge base's tables: sources, their chunks, and the full-text index over them.

One schema component (``knowledge``) in ``chatflow_schema_versions``. The
sources and chunks tables are written once for both databases; the full-text
index is each database's own: an FTS5 table kept by triggers on SQLite (BM25
ranking, Porter stemming), a generated ``tsvector`` column with a GIN index on
PostgreSQL (``ts_rank``). The vector tables exist only where ``EMBEDDING_MODEL``
is set, since their width is the model's (``bot.core.knowledge.vectors``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from bot.core.sql import VERSIONS_TABLE, Transaction, ensure_schema

__all__ = [
    "CHUNKS",
    "COMPONENT",
    "FTS",
    "SOURCES",
    "ensure_knowledge_schema_in",
    "knowledge_schema_current_in",
]

SOURCES: Final = "chatflow_knowledge_sources"
"""One row per source file: its name, content hash, chunk count and when it was added."""
CHUNKS: Final = "chatflow_knowledge_chunks"
"""One row per passage of a source."""
FTS: Final = "chatflow_knowledge_fts"
"""SQLite's FTS5 index over the chunks (external content: the chunks table)."""
COMPONENT: Final = "knowledge"
"""The knowledge tables' row in ``chatflow_schema_versions``."""

_COMMON: Final = (
    f"CREATE TABLE IF NOT EXISTS {SOURCES} ("
    "source TEXT PRIMARY KEY NOT NULL, "
    "content_hash TEXT NOT NULL, "
    "chunk_count INTEGER NOT NULL, "
    "added_at REAL NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {CHUNKS} ("
    "id INTEGER PRIMARY KEY, "
    f"source TEXT NOT NULL REFERENCES {SOURCES} (source) ON DELETE CASCADE, "
    "position INTEGER NOT NULL, "
    "heading TEXT NOT NULL, "
    "text TEXT NOT NULL)",
    f"CREATE UNIQUE INDEX IF NOT EXISTS {CHUNKS}_position ON {CHUNKS} (source, position)",
)

_SQLITE: Final[Mapping[int, tuple[str, ...]]] = {
    1: (
        *_COMMON,
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {FTS} USING fts5("
        f"heading, text, content='{CHUNKS}', content_rowid='id', "
        "tokenize='porter unicode61')",
        f"CREATE TRIGGER IF NOT EXISTS {CHUNKS}_ai AFTER INSERT ON {CHUNKS} BEGIN "
        f"INSERT INTO {FTS} (rowid, heading, text) VALUES (new.id, new.heading, new.text); END",
        f"CREATE TRIGGER IF NOT EXISTS {CHUNKS}_ad AFTER DELETE ON {CHUNKS} BEGIN "
        f"INSERT INTO {FTS} ({FTS}, rowid, heading, text) "
        "VALUES ('delete', old.id, old.heading, old.text); END",
    ),
}
_POSTGRES: Final[Mapping[int, tuple[str, ...]]] = {
    1: (
        *_COMMON,
        f"ALTER TABLE {CHUNKS} ADD COLUMN IF NOT EXISTS tsv tsvector GENERATED ALWAYS AS "
        "(setweight(to_tsvector('english', heading), 'A') || "
        "to_tsvector('english', text)) STORED",
        f"CREATE INDEX IF NOT EXISTS {CHUNKS}_tsv ON {CHUNKS} USING GIN (tsv)",
    ),
}
_TARGET: Final = max(_SQLITE)


async def knowledge_schema_current_in(tx: Transaction) -> bool:
    """Whether the knowledge tables exist at this code's version (one small read)."""
    try:
        row = await tx.fetchone(
            f"SELECT version FROM {VERSIONS_TABLE} WHERE component = ?", (COMPONENT,)
        )
    except Exception:  # no versions table yet (PostgreSQL aborts the tx: re-raised)
        if tx.dialect == "postgres":
            raise
        row = None
    return row is not None and int(row[0]) == _TARGET


async def ensure_knowledge_schema_in(tx: Transaction) -> None:
    """Create or migrate the knowledge tables inside ``tx`` (a version read when current)."""
    if not await knowledge_schema_current_in(tx):
        await ensure_schema(tx, COMPONENT, _POSTGRES if tx.dialect == "postgres" else _SQLITE)
