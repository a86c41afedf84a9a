"""The knowledge base: the business's documents, cut into passages, searched by the agents.

``schema`` (tables), ``text`` (passages from Markdown, text, HTML), ``index``
(rows and full-text search), ``vectors`` (embeddings in sqlite-vec or pgvector),
``service`` (``KnowledgeBase``: full-text or hybrid search) and ``ingest``
(adding files, resumable and bounded). The ``search_knowledge`` tool is in
``bot.knowledge_tools``; the commands in ``bot.knowledge_cli``.
"""

from bot.core.knowledge.index import Hit, SourceInfo, list_sources, remove_source
from bot.core.knowledge.ingest import DEFAULT_MAX_FILE_BYTES, FileOutcome, Ingestion
from bot.core.knowledge.service import KNOWLEDGE, KnowledgeBase, KnowledgeSettings
from bot.core.knowledge.vectors import Embedder

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "KNOWLEDGE",
    "Embedder",
    "FileOutcome",
    "Hit",
    "Ingestion",
    "KnowledgeBase",
    "KnowledgeSettings",
    "SourceInfo",
    "list_sources",
    "remove_source",
]
