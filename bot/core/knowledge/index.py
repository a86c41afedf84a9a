"""The knowledge base's rows: a source's chunks replaced in one transaction, full-text search.

``replace_source_in`` writes a source and all its chunks in the caller's
transaction (the old chunks go first), so a source is in the base whole or
not at all: an ingestion killed mid-way leaves every committed file complete
and nothing of the one it was writing. ``fulltext_search`` ranks with SQLite
FTS5's BM25 or PostgreSQL's ``ts_rank``: a query's words are OR-ed (most
common English function words dropped), so a question finds the passages
that share the most of its rarer words.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, TypeVar, cast

from bot.core.knowledge.schema import (
    CHUNKS,
    FTS,
    SOURCES,
    ensure_knowledge_schema_in,
    knowledge_schema_current_in,
)
from bot.core.knowledge.text import Passage
from bot.core.knowledge.vectors import VECTORS
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore, TransactionBody

__all__ = [
    "Hit",
    "SourceInfo",
    "chunk_ids_in",
    "chunks_by_id",
    "fulltext_search",
    "list_sources",
    "query_terms",
    "remove_source",
    "replace_source_in",
    "source_hash",
]

_MAX_TERMS: Final = 32
_STOPWORDS_TEXT: Final = (
    "a an and are as at be by can do does did for from has have how i if in is it its me my "
    "of on or our so than that the their there these this to was we were what when where "
    "which who why will with you your"
)
_STOPWORDS: Final = frozenset(_STOPWORDS_TEXT.split())


@dataclass(frozen=True, slots=True)
class Hit:
    """One passage found: where it comes from, its heading and text, and its score."""

    chunk_id: int
    source: str
    heading: str
    text: str
    score: float
    """Higher is better (BM25 negated on SQLite, ``ts_rank`` on PostgreSQL, fused score in
    hybrid mode)."""


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """One source in the base."""

    source: str
    chunk_count: int
    added_at: datetime


async def source_hash(store: TransactionalStore, source: str) -> str | None:
    """The content hash ``source`` was added with, or ``None`` if it is not in the base."""

    async def body(tx: Transaction) -> str | None:
        row = await tx.fetchone(f"SELECT content_hash FROM {SOURCES} WHERE source = ?", (source,))
        return None if row is None else str(row[0])

    return await _read(store, body)


async def replace_source_in(
    tx: Transaction, source: str, content_hash: str, passages: Sequence[Passage], added_at: float
) -> None:
    """``source`` with exactly ``passages`` as its chunks (positions 0..n-1), in ``tx``."""
    await ensure_knowledge_schema_in(tx)
    await tx.execute(f"DELETE FROM {CHUNKS} WHERE source = ?", (source,))
    await tx.execute(
        f"INSERT INTO {SOURCES} (source, content_hash, chunk_count, added_at) "
        "VALUES (?, ?, ?, ?) ON CONFLICT (source) DO UPDATE SET "
        "content_hash = excluded.content_hash, chunk_count = excluded.chunk_count, "
        "added_at = excluded.added_at",
        (source, content_hash, len(passages), added_at),
    )
    await tx.executemany(
        f"INSERT INTO {CHUNKS} (source, position, heading, text) VALUES (?, ?, ?, ?)",
        [(source, n, p.heading, p.text) for n, p in enumerate(passages)],
    )


async def chunk_ids_in(tx: Transaction, source: str) -> list[int]:
    """The ids of ``source``'s chunks in position order."""
    rows = await tx.fetchall(
        f"SELECT id FROM {CHUNKS} WHERE source = ? ORDER BY position", (source,)
    )
    return [int(row[0]) for row in rows]


async def remove_source(
    store: TransactionalStore, source: str, *, vectors: bool = False
) -> int | None:
    """Remove ``source`` and its chunks (and, with ``vectors`` on SQLite, their sqlite-vec
    rows, which take no foreign key); the number of chunks removed, ``None`` if unknown."""

    async def body(tx: Transaction) -> int | None:
        await ensure_knowledge_schema_in(tx)
        row = await tx.fetchone(f"SELECT chunk_count FROM {SOURCES} WHERE source = ?", (source,))
        if row is None:
            return None
        vec_table = "SELECT 1 FROM sqlite_master WHERE name = ?"
        if vectors and tx.dialect == "sqlite" and await tx.fetchone(vec_table, (VECTORS,)):
            ids = await chunk_ids_in(tx, source)
            await tx.executemany(f"DELETE FROM {VECTORS} WHERE rowid = ?", [(i,) for i in ids])
        # Chunks first: the FTS triggers follow them one by one.
        await tx.execute(f"DELETE FROM {CHUNKS} WHERE source = ?", (source,))
        await tx.execute(f"DELETE FROM {SOURCES} WHERE source = ?", (source,))
        return int(row[0])

    return await store.run(body)


async def list_sources(store: TransactionalStore) -> list[SourceInfo]:
    """Every source, by name."""

    async def body(tx: Transaction) -> list[SourceInfo]:
        rows = await tx.fetchall(
            f"SELECT source, chunk_count, added_at FROM {SOURCES} ORDER BY source"
        )
        return [
            SourceInfo(str(r[0]), int(r[1]), datetime.fromtimestamp(float(r[2]), UTC)) for r in rows
        ]

    return await _read(store, body)


_T = TypeVar("_T")


async def _read(store: TransactionalStore, body: TransactionBody[_T]) -> _T:
    """``body`` in a read transaction (a search never waits on, nor blocks, a writer such as
    an ingestion's long transaction); the tables are created first when missing."""

    async def checked(tx: Transaction) -> tuple[bool, _T | None]:
        if not await knowledge_schema_current_in(tx):
            return False, None
        return True, await body(tx)

    ready, result = await store.run(checked, write=False)
    if not ready:
        await store.run(ensure_knowledge_schema_in)
        ready, result = await store.run(checked, write=False)
    return cast(_T, result)


def query_terms(query: str) -> list[str]:
    """The words of ``query`` searched for: lower-cased, deduplicated, function words dropped
    (all kept if nothing else is left), at most 32."""
    words = list(dict.fromkeys(re.findall(r"\w+", query.lower())))
    kept = [w for w in words if w not in _STOPWORDS] or words
    return kept[:_MAX_TERMS]


async def fulltext_search(store: TransactionalStore, query: str, limit: int) -> list[Hit]:
    """The ``limit`` passages that match ``query`` best by full-text rank, best first."""
    terms = query_terms(query)
    if not terms or limit < 1:
        return []

    async def body(tx: Transaction) -> list[Hit]:
        if tx.dialect == "postgres":
            return await _postgres_search(tx, terms, limit)
        match = " OR ".join(f'"{term}"' for term in terms)
        rows = await tx.fetchall(
            f"SELECT c.id, c.source, c.heading, c.text, f.rank FROM "
            f"(SELECT rowid, bm25({FTS}, 2.0, 1.0) AS rank FROM {FTS} "
            f"WHERE {FTS} MATCH ? ORDER BY rank LIMIT ?) f "
            f"JOIN {CHUNKS} c ON c.id = f.rowid ORDER BY f.rank, c.id",
            (match, limit),
        )
        return [Hit(int(r[0]), r[1], r[2], r[3], -float(r[4])) for r in rows]

    return await _read(store, body)


async def chunks_by_id(store: TransactionalStore, ids: Sequence[int]) -> dict[int, Hit]:
    """The chunks with these ids (score 0), by id; ids no longer there are left out."""
    if not ids:
        return {}

    async def body(tx: Transaction) -> dict[int, Hit]:
        marks = ", ".join("?" for _ in ids)
        rows = await tx.fetchall(
            f"SELECT id, source, heading, text FROM {CHUNKS} WHERE id IN ({marks})", list(ids)
        )
        return {int(r[0]): Hit(int(r[0]), r[1], r[2], r[3], 0.0) for r in rows}

    return await store.run(body, write=False)


_PG_RANK: Final = "ts_rank('{0.1, 0.1, 0.1, 0.15}', c.tsv, to_tsquery('english', ?), 1)"
"""One term's weight in a passage: its frequency, the heading (A) counting 1.5 times the text
(D), divided by 1 + log(length), as BM25 normalises for length."""


async def _postgres_search(tx: Transaction, terms: list[str], limit: int) -> list[Hit]:
    """BM25's shape on PostgreSQL: ``ts_rank`` has no inverse document frequency (a common
    word would rank as high as a rare one), so each term's rank is weighted by its IDF,
    counted on the GIN index; terms in no passage (or stop words) are left out."""
    row = await tx.fetchone(f"SELECT count(*) FROM {CHUNKS}")
    total = int(row[0]) if row is not None else 0
    weighted: list[tuple[str, float]] = []
    for term in terms:
        found = await tx.fetchone(
            f"SELECT count(*) FROM {CHUNKS} WHERE tsv @@ to_tsquery('english', ?)", (term,)
        )
        df = int(found[0]) if found is not None else 0
        if df:
            weighted.append((term, math.log((total - df + 0.5) / (df + 0.5) + 1.0)))
    if not weighted:
        return []
    score = " + ".join(f"?::float8 * {_PG_RANK}" for _ in weighted)
    params: list[object] = [value for term, idf in weighted for value in (idf, term)]
    rows = await tx.fetchall(
        f"SELECT c.id, c.source, c.heading, c.text, {score} AS rank FROM {CHUNKS} c "
        "WHERE c.tsv @@ to_tsquery('english', ?) ORDER BY rank DESC, c.id LIMIT ?",
        (*params, " | ".join(term for term, _ in weighted), limit),
    )
    return [Hit(int(r[0]), r[1], r[2], r[3], float(r[4])) for r in rows]
