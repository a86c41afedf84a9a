"""``python -m bot knowledge``: add, list, remove and search the knowledge base's sources.

Also ``knowledge_settings_from``: what the bot hands the ``search_knowledge``
tool (the embedder ``EMBEDDING_MODEL`` names, if any).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from bot.config import Settings
from bot.core.documents import DocumentReader
from bot.core.knowledge.index import list_sources, remove_source
from bot.core.knowledge.ingest import FileOutcome, Ingestion
from bot.core.knowledge.service import MAX_LIMIT, KnowledgeBase, KnowledgeSettings
from bot.core.knowledge.vectors import Embedder
from bot.core.stores.base import TransactionalStore
from bot.database import open_store

__all__ = ["ADD_EPILOG", "add_knowledge_parser", "knowledge_command", "knowledge_settings_from"]

_OPENAI: str = "https://api.openai.com/v1"

ADD_EPILOG = (
    "Exit status: 0 when every file was added or found unchanged; 1 when some file "
    "failed (too large, unreadable, not parsable: each is named on standard error with "
    "why, and every other file is still added); 2 for a usage or configuration error. "
    "An unchanged file (same content hash) is skipped; a changed one replaces its "
    "passages. Killed mid-way, the same command again finishes the job, with every "
    "passage exactly once."
)


def knowledge_settings_from(settings: Settings) -> KnowledgeSettings:
    """The knowledge base's settings: an embedder when ``EMBEDDING_MODEL`` is set."""
    if settings.embedding_model is None:
        return KnowledgeSettings()
    key = settings.openai_api_key
    return KnowledgeSettings(
        Embedder(
            model=settings.embedding_model,
            base_url=settings.embedding_base_url or settings.openai_base_url or _OPENAI,
            api_key=key.get_secret_value() if key is not None else None,
            timeout=settings.model_timeout_seconds,
        )
    )


def add_knowledge_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``knowledge`` command and its actions, on ``sub``."""
    knowledge = sub.add_parser(
        "knowledge",
        help="add, list, remove or search the documents agents look things up in",
        description="The knowledge base: files (Markdown, text, HTML, PDF) cut into passages "
        "in the bot's database, searched by agents that have the search_knowledge tool.",
    )
    k_sub = knowledge.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = k_sub.add_parser(
        "add",
        help="add files or folders (changed files replaced, unchanged ones skipped)",
        description="Add files, or every Markdown, text, HTML and PDF file under folders. "
        "A source is named by its path relative to the folder given, or by its file name.",
        epilog=ADD_EPILOG,
    )
    add.add_argument("paths", nargs="+", metavar="PATH", type=Path)
    k_sub.add_parser("list", help="each source, its passage count and when it was added")
    remove = k_sub.add_parser("remove", help="remove a source and its passages")
    remove.add_argument("source", metavar="SOURCE", help="a source as `knowledge list` names it")
    search = k_sub.add_parser("search", help="the passages that answer QUERY best")
    search.add_argument("query", metavar="QUERY")
    search.add_argument("--limit", type=int, default=5, metavar="K", help="passages (1-20)")
    search.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per line, best first: source, heading, score, text",
    )
    knowledge.set_defaults(handler=knowledge_command)


async def knowledge_command(settings: Settings, args: argparse.Namespace) -> int:
    """Run ``knowledge add|list|remove|search``."""
    if args.action == "search" and not 1 <= args.limit <= MAX_LIMIT:
        print(f"chatflow: knowledge: --limit must be 1 to {MAX_LIMIT}", file=sys.stderr)
        return 2
    store = open_store(settings)
    try:
        await store.open()
        base = KnowledgeBase(store, knowledge_settings_from(settings).embedder)
        if args.action == "add":
            return await _add(base, settings, args.paths)
        if args.action == "list":
            return await _list(store)
        if args.action == "remove":
            removed = await remove_source(store, args.source, vectors=await base.vectors_ready())
            if removed is None:
                print(f"chatflow: knowledge: no source {args.source}", file=sys.stderr)
                return 1
            print(f"removed {args.source} ({removed} passages)")
            return 0
        return await _search(base, args.query, args.limit, as_json=args.json)
    finally:
        await store.close()


class _Progress:
    """Prints what became of each file; on a terminal also a running count, rewritten."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out = out
        self.err = err
        self.tty = out.isatty()
        self.done = 0
        self.total = 0
        self.counts: dict[str, int] = {}
        self.chunks = 0

    def __call__(self, outcome: FileOutcome) -> None:
        self.done += 1
        self.counts[outcome.status] = self.counts.get(outcome.status, 0) + 1
        self.chunks += outcome.chunks
        self._clear()
        if outcome.status == "failed":
            print(f"failed: {outcome.source}: {outcome.reason}", file=self.err, flush=True)
        elif outcome.status != "unchanged":
            print(
                f"{outcome.status} {outcome.source} ({outcome.chunks} passages)",
                file=self.out,
                flush=True,
            )
        if self.tty:
            self.out.write(f"\r{self.done}/{self.total} files, {self.chunks} passages")
            self.out.flush()

    def _clear(self) -> None:
        if self.tty:
            self.out.write("\r\x1b[K")

    def summary(self) -> str:
        self._clear()
        parts = [f"{self.counts.get(s, 0)} {s}" for s in ("added", "replaced", "unchanged")]
        failed = self.counts.get("failed", 0)
        if failed:
            parts.append(f"{failed} failed")
        return f"knowledge: {', '.join(parts)} ({self.chunks} passages written)"


async def _add(base: KnowledgeBase, settings: Settings, paths: list[Path]) -> int:
    progress = _Progress(sys.stdout, sys.stderr)
    ingestion = Ingestion(
        base,
        max_file_bytes=settings.max_knowledge_file_bytes,
        reader=DocumentReader(timeout=settings.document_timeout_seconds),
        on_file=progress,
        on_total=lambda total: setattr(progress, "total", total),
    )
    outcomes = await ingestion.add(paths)
    if base.vectors_unavailable:
        print(f"knowledge: no vectors, full-text only: {base.vectors_unavailable}", file=sys.stderr)
    print(progress.summary(), flush=True)
    return 1 if any(o.status == "failed" for o in outcomes) else 0


async def _list(store: TransactionalStore) -> int:
    sources = await list_sources(store)
    if not sources:
        print("The knowledge base is empty: add files with `knowledge add PATH`.")
        return 0
    width = max(len(s.source) for s in sources)
    for info in sources:
        added = info.added_at.strftime("%Y-%m-%d %H:%M UTC")
        print(f"{info.source:<{width}}  {info.chunk_count:>6} passages  added {added}")
    return 0


async def _search(base: KnowledgeBase, query: str, limit: int, *, as_json: bool) -> int:
    hits = await base.search(query, limit)
    for n, hit in enumerate(hits, start=1):
        if as_json:
            record = {"source": hit.source, "heading": hit.heading, "score": hit.score}
            print(json.dumps({**record, "text": hit.text}, ensure_ascii=False))
            continue
        where = f"{hit.source} › {hit.heading}" if hit.heading else hit.source
        text = " ".join(hit.text.split())
        print(f"{n}. {where}  (score {hit.score:.3f})\n   {text[:300]}")
    if not hits and not as_json:
        print("No passage matches.")
    return 0
