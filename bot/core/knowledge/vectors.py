"""Embeddings for the knowledge base: the ``/embeddings`` client and the vector tables.

With ``EMBEDDING_MODEL`` set, every chunk is embedded when it is added, through
the OpenAI-compatible ``POST {base}/embeddings`` endpoint (OpenAI, Ollama,
vLLM...), and its vector is written beside it in the same transaction. The
vectors live in the database's own vector extension: sqlite-vec's ``vec0``
table on SQLite (loaded into the store's connection), pgvector's ``vector``
column (HNSW index, cosine distance) on PostgreSQL. Neither is hand-written
here: nearest neighbours are the extension's query.

Where the extension cannot be had (a Python whose ``sqlite3`` cannot load
extensions, a PostgreSQL server without pgvector) ``VectorsUnavailable`` says
why; callers fall back to full-text search and say so once.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx

from bot.core.knowledge.schema import CHUNKS
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.errors import ModelError

__all__ = [
    "VECTORS",
    "Embedder",
    "VectorsUnavailable",
    "enable_vectors",
    "ensure_vector_table_in",
    "nearest_chunks",
    "write_vectors_in",
]

logger = logging.getLogger(__name__)

VECTORS: Final = "chatflow_knowledge_vectors"
"""One vector per chunk (its id): a sqlite-vec ``vec0`` table or a pgvector table."""
_BATCH: Final = 64
"""Texts per ``/embeddings`` request."""


class VectorsUnavailable(Exception):
    """The database cannot hold vectors here; the message says why."""


@dataclass(frozen=True)
class Embedder:
    """Calls ``POST {base_url}/embeddings`` with ``model``; one ``httpx`` client per call."""

    model: str
    base_url: str
    api_key: str | None = None
    timeout: float = 60.0
    transport: httpx.AsyncBaseTransport | None = None
    """For tests only (respx or an in-process app)."""

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order; ``ModelError`` when the endpoint fails or answers
        something else than one vector per text."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        vectors: list[list[float]] = []
        url = self.base_url.rstrip("/") + "/embeddings"
        async with httpx.AsyncClient(
            timeout=self.timeout, headers=headers, transport=self.transport
        ) as client:
            for start in range(0, len(texts), _BATCH):
                batch = list(texts[start : start + _BATCH])
                try:
                    response = await client.post(url, json={"model": self.model, "input": batch})
                except httpx.HTTPError as exc:
                    raise ModelError(f"embeddings request failed: {type(exc).__name__}") from exc
                if response.status_code != 200:
                    raise ModelError(f"embeddings endpoint answered {response.status_code}")
                try:
                    vectors.extend(_vectors_of(response.json(), len(batch)))
                except (ValueError, TypeError, AttributeError) as exc:  # not JSON, odd items
                    raise ModelError("embeddings endpoint answered an unexpected shape") from exc
        return vectors


def _vectors_of(body: Any, expected: int) -> list[list[float]]:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or len(data) != expected:
        raise ModelError("embeddings endpoint answered an unexpected shape")
    ordered = sorted(data, key=lambda item: int(item.get("index", 0)))
    vectors = []
    for item in ordered:
        vector = item.get("embedding")
        if not isinstance(vector, list) or not vector:
            raise ModelError("embeddings endpoint answered an empty vector")
        floats = [float(x) for x in vector]
        if not all(math.isfinite(x) for x in floats):
            raise ModelError("embeddings endpoint answered a vector that is not finite")
        vectors.append(floats)
    if len({len(v) for v in vectors}) != 1:
        raise ModelError("embeddings endpoint answered vectors of different widths")
    return vectors


async def enable_vectors(store: TransactionalStore) -> None:
    """Make the store's connection able to hold vectors; ``VectorsUnavailable`` if it cannot.

    SQLite: loads sqlite-vec into the store's connection. PostgreSQL: creates the
    ``vector`` extension (``CREATE EXTENSION IF NOT EXISTS``) in its own transaction.
    """
    if store.dialect == "postgres":

        async def create(tx: Transaction) -> None:
            available = await tx.fetchone(
                "SELECT 1 FROM pg_available_extensions WHERE name = 'vector'"
            )
            if available is None:
                raise VectorsUnavailable(
                    "the PostgreSQL server has no pgvector extension (Debian: "
                    "apt-get install postgresql-<version>-pgvector)"
                )
            await tx.execute("CREATE EXTENSION IF NOT EXISTS vector")

        await store.run(create)
        return
    if not hasattr(sqlite3.Connection, "enable_load_extension"):
        raise VectorsUnavailable(
            "this Python's sqlite3 cannot load extensions (built without "
            "--enable-loadable-sqlite-extensions), so sqlite-vec cannot be used"
        )
    import sqlite_vec  # type: ignore[import-untyped]

    load_extension = getattr(store, "load_extension", None)
    if load_extension is None:
        raise VectorsUnavailable(f"{type(store).__name__} cannot load SQLite extensions")
    try:
        await load_extension(sqlite_vec.load)
    except sqlite3.Error as exc:
        raise VectorsUnavailable(f"sqlite-vec could not be loaded: {exc}") from exc


async def ensure_vector_table_in(tx: Transaction, dimension: int) -> None:
    """Create the vector table for ``dimension``-wide vectors if it is missing; a table of
    another width (the model changed) is dropped with its vectors and made anew."""
    if tx.dialect == "postgres":
        row = await tx.fetchone(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = to_regclass(?) "
            "AND attname = 'embedding'",
            (VECTORS,),
        )
        if row is not None and int(row[0]) != dimension:
            await tx.execute(f"DROP TABLE {VECTORS}")
        await tx.execute(
            f"CREATE TABLE IF NOT EXISTS {VECTORS} ("
            f"chunk_id BIGINT PRIMARY KEY REFERENCES {CHUNKS} (id) ON DELETE CASCADE, "
            f"embedding vector({dimension}) NOT NULL)"
        )
        await tx.execute(
            f"CREATE INDEX IF NOT EXISTS {VECTORS}_hnsw ON {VECTORS} "
            "USING hnsw (embedding vector_cosine_ops)"
        )
        return
    row = await tx.fetchone("SELECT sql FROM sqlite_master WHERE name = ?", (VECTORS,))
    if row is not None and f"float[{dimension}]" not in str(row[0]):
        await tx.execute(f"DROP TABLE {VECTORS}")
    await tx.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {VECTORS} USING vec0("
        f"embedding float[{dimension}] distance_metric=cosine)"
    )


def _literal(vector: Sequence[float], dialect: str) -> Any:
    if dialect == "postgres":
        from pgvector import Vector

        return Vector(list(vector)).to_text()
    import sqlite_vec

    return sqlite_vec.serialize_float32(list(vector))


async def write_vectors_in(
    tx: Transaction, chunk_ids: Sequence[int], vectors: Sequence[Sequence[float]]
) -> None:
    """Store one vector per chunk id, in ``tx`` (the chunks' own transaction)."""
    if not vectors:
        return
    await ensure_vector_table_in(tx, len(vectors[0]))
    if tx.dialect == "sqlite":
        # A vec0 table takes no foreign key: rows of chunks removed while vectors were
        # off may hold a reused id.
        await tx.executemany(f"DELETE FROM {VECTORS} WHERE rowid = ?", [(c,) for c in chunk_ids])
    cast = "?::vector" if tx.dialect == "postgres" else "?"
    column = "chunk_id" if tx.dialect == "postgres" else "rowid"
    await tx.executemany(
        f"INSERT INTO {VECTORS} ({column}, embedding) VALUES (?, {cast})",
        [(cid, _literal(v, tx.dialect)) for cid, v in zip(chunk_ids, vectors, strict=True)],
    )


async def nearest_chunks(
    store: TransactionalStore, vector: Sequence[float], limit: int
) -> list[int]:
    """The ids of the ``limit`` chunks nearest ``vector`` (cosine), nearest first; none when
    no vector of that width is stored."""

    async def body(tx: Transaction) -> list[int]:
        if tx.dialect == "postgres":
            width = await tx.fetchone(
                "SELECT atttypmod FROM pg_attribute WHERE attrelid = to_regclass(?) "
                "AND attname = 'embedding'",
                (VECTORS,),
            )
            if width is None or int(width[0]) != len(vector):
                return []
            rows = await tx.fetchall(
                f"SELECT chunk_id FROM {VECTORS} ORDER BY embedding <=> ?::vector LIMIT ?",
                (_literal(vector, "postgres"), limit),
            )
        else:
            found = await tx.fetchone("SELECT sql FROM sqlite_master WHERE name = ?", (VECTORS,))
            if found is None or f"float[{len(vector)}]" not in str(found[0]):
                return []
            rows = await tx.fetchall(
                f"SELECT v.rowid FROM {VECTORS} v JOIN {CHUNKS} c ON c.id = v.rowid "
                "WHERE v.embedding MATCH ? AND k = ? ORDER BY v.distance",
                (_literal(vector, "sqlite"), limit),
            )
        return [int(row[0]) for row in rows]

    return await store.run(body, write=False)
