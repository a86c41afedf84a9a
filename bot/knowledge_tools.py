"""``search_knowledge``: the tool that lets an agent look things up in the knowledge base.

Give it to an agent (``Agent(..., tools=[search_knowledge])``) and tell it, in
its instructions, to cite the ``source`` of what it uses. The passages come
from the files an operator added with ``python -m bot knowledge add`` (in the
bot's database, so every process sees the same base); the search is full text,
or hybrid when ``EMBEDDING_MODEL`` is set (the host hands the tool its
``KnowledgeSettings`` in ``ToolContext.services``).
"""

from __future__ import annotations

import json

from bot.core.knowledge.service import KNOWLEDGE, MAX_LIMIT, KnowledgeSettings
from bot.core.stores.base import TransactionalStore
from bot.core.tools import FunctionTool, ToolContext, error_result, tool

__all__ = ["search_knowledge"]

_NO_STORE = "the knowledge base needs the bot's SQL database (SQLite or PostgreSQL)"


@tool(name="search_knowledge")
async def _search_knowledge(ctx: ToolContext, query: str, limit: int = 5) -> str:
    """Search the business's documents (policies, FAQ, prices) for passages that answer
    a question. Cite the source of each passage you use in your answer.

    Args:
        query: What to look for, in a few words or as the user's question.
        limit: How many passages to return (1 to 20).
    """
    if not query.strip():
        return error_result("query is empty: say what to look for")
    if not 1 <= limit <= MAX_LIMIT:
        return error_result(f"limit must be between 1 and {MAX_LIMIT}")
    store = ctx.store
    if not isinstance(store, TransactionalStore):
        return error_result(_NO_STORE)
    settings = ctx.services.get(KNOWLEDGE)
    if not isinstance(settings, KnowledgeSettings):
        settings = _DEFAULT
    hits = await settings.base(store).search(query, limit)
    passages = [
        {"source": h.source, "heading": h.heading, "score": round(h.score, 6), "text": h.text}
        for h in hits
    ]
    if not passages:
        return json.dumps({"passages": [], "note": "nothing in the knowledge base matches"})
    return json.dumps({"passages": passages}, ensure_ascii=False)


_DEFAULT = KnowledgeSettings()
search_knowledge: FunctionTool = _search_knowledge
"""Searches the knowledge base; returns passages with their ``source`` to cite."""
