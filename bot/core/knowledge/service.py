"""A knowledge base on a store: search (full text, or hybrid with embeddings) and its settings.

``KnowledgeBase(store, embedder)`` is what the CLI, the console and the
``search_knowledge`` tool use. Without an embedder it ranks by full text only.
With one it also embeds the query, asks the vector extension for the nearest
chunks and fuses both rankings by reciprocal rank (``RRF_K``): a passage
high in either list comes first, one high in both before it. If the vector
extension is not there, or the embeddings endpoint fails for a query, the
search is full text and a warning says so (without the query).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Final

from bot.core.knowledge.index import Hit, chunks_by_id, fulltext_search
from bot.core.knowledge.vectors import Embedder, VectorsUnavailable, enable_vectors, nearest_chunks
from bot.core.stores.base import TransactionalStore
from bot.errors import ModelError, StorageError

__all__ = ["KNOWLEDGE", "MAX_LIMIT", "RRF_K", "KnowledgeBase", "KnowledgeSettings"]

logger = logging.getLogger(__name__)

RRF_K: Final = 60
"""The reciprocal-rank-fusion constant: a passage at rank r of a list scores 1 / (RRF_K + r)."""
MAX_LIMIT: Final = 20
"""The most passages one search returns."""
KNOWLEDGE: Final = "knowledge"
"""Key of the ``KnowledgeSettings`` in ``ToolContext.services``."""


@dataclass
class KnowledgeSettings:
    """What the host hands the ``search_knowledge`` tool: the embedder, if any, and one
    ``KnowledgeBase`` per store (vectors are enabled on a store once)."""

    embedder: Embedder | None = None
    _bases: dict[int, KnowledgeBase] = field(default_factory=dict, repr=False)

    def base(self, store: TransactionalStore) -> KnowledgeBase:
        """The knowledge base on ``store``."""
        known = self._bases.get(id(store))
        if known is None or known.store is not store:
            known = self._bases[id(store)] = KnowledgeBase(store, self.embedder)
        return known


class KnowledgeBase:
    """Search over the chunks in ``store``; hybrid when ``embedder`` is given."""

    def __init__(self, store: TransactionalStore, embedder: Embedder | None = None) -> None:
        self.store = store
        self.embedder = embedder
        self._vectors: bool | None = None
        self.vectors_unavailable: str | None = None
        """Why vectors are off although an embedder is set (after ``vectors_ready``)."""

    async def vectors_ready(self) -> bool:
        """Whether vectors are in use: an embedder is set and the database can hold them
        (checked once; a refusal is logged as a warning once)."""
        if self.embedder is None:
            return False
        if self._vectors is None:
            try:
                await enable_vectors(self.store)
                self._vectors = True
            except VectorsUnavailable as exc:
                self._vectors = False
                self.vectors_unavailable = str(exc)
                logger.warning("knowledge base: full-text search only: %s", exc)
        return self._vectors

    async def search(self, query: str, limit: int = 5) -> list[Hit]:
        """The ``limit`` best passages for ``query`` (1..``MAX_LIMIT``), best first."""
        limit = max(1, min(limit, MAX_LIMIT))
        if not await self.vectors_ready():
            return await fulltext_search(self.store, query, limit)
        assert self.embedder is not None
        pool = max(limit * 4, 20)
        text_hits = await fulltext_search(self.store, query, pool)
        try:
            vector = (await self.embedder.embed([query]))[0]
            near = await nearest_chunks(self.store, vector, pool)
        except (ModelError, StorageError) as exc:
            logger.warning("knowledge search fell back to full text: %s", type(exc).__name__)
            return text_hits[:limit]
        return await self._fuse(text_hits, near, limit)

    async def _fuse(self, text_hits: list[Hit], near: list[int], limit: int) -> list[Hit]:
        scores: dict[int, float] = {}
        for rank, hit in enumerate(text_hits, start=1):
            scores[hit.chunk_id] = scores.get(hit.chunk_id, 0.0) + 1.0 / (RRF_K + rank)
        for rank, chunk_id in enumerate(near, start=1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + 1.0 / (RRF_K + rank)
        best = sorted(scores, key=lambda cid: (-scores[cid], cid))[:limit]
        known = {hit.chunk_id: hit for hit in text_hits}
        known.update(await chunks_by_id(self.store, [c for c in best if c not in known]))
        return [
            Hit(cid, known[cid].source, known[cid].heading, known[cid].text, scores[cid])
            for cid in best
            if cid in known
        ]
