"""Adding files to the knowledge base: one transaction per file, skipped when unchanged.

``ingest`` walks the paths it is given (a folder: every Markdown, text, HTML
and PDF file under it, hidden ones left out; a file: itself) and for each
file, in order:

- refuses it when it is larger than ``max_file_bytes`` (``MAX_KNOWLEDGE_FILE_BYTES``);
- compares its content hash (and the embedding model, when vectors are on)
  with the one it was added with: an unchanged file is skipped;
- reads it (PDFs through the capped child process of ``bot.core.documents``),
  cuts it into passages, embeds them when vectors are on;
- replaces the source's chunks in one transaction.

A file that fails is one ``FileOutcome`` naming it and why, and the rest goes
on. Since each file commits whole or not at all, a run killed at any point
and run again ends with every chunk exactly once: the committed files are
found unchanged, the one that was cut off is written anew.

A source is named by its path relative to the folder that was given (POSIX
separators), or by its file name when a file was given.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from bot.core.documents import DocumentReader
from bot.core.knowledge.index import chunk_ids_in, replace_source_in, source_hash
from bot.core.knowledge.schema import ensure_knowledge_schema_in
from bot.core.knowledge.service import KnowledgeBase
from bot.core.knowledge.text import Passage, html_to_text, split_passages
from bot.core.knowledge.vectors import VECTORS, ensure_vector_table_in, write_vectors_in
from bot.core.sql import Transaction
from bot.errors import MediaError, ModelError

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "SUFFIXES",
    "FileOutcome",
    "Ingestion",
    "KnowledgeFile",
    "find_files",
]

DEFAULT_MAX_FILE_BYTES: Final = 20 * 1024 * 1024
"""Default ``MAX_KNOWLEDGE_FILE_BYTES``: a larger file is refused, named, and skipped."""
SUFFIXES: Final = (".md", ".markdown", ".txt", ".text", ".html", ".htm", ".pdf")
"""The file types a folder is searched for (case-insensitive)."""
_PDF_CHARS: Final = 4_000_000
"""Characters of a PDF's text kept (the child process also stops at its page cap)."""

Status = Literal["added", "replaced", "unchanged", "failed"]


@dataclass(frozen=True, slots=True)
class KnowledgeFile:
    """A file to add and the source name it goes under."""

    path: Path
    source: str


@dataclass(frozen=True, slots=True)
class FileOutcome:
    """What became of one file."""

    source: str
    status: Status
    chunks: int = 0
    reason: str = ""
    """Why it failed (one line, no file content)."""


def find_files(paths: Iterable[Path]) -> tuple[list[KnowledgeFile], list[FileOutcome]]:
    """The files to add under ``paths``, sorted per folder, and a failure for each path that
    is missing or not a file type the base reads. Blocking: run it in a thread."""
    files: list[KnowledgeFile] = []
    missing: list[FileOutcome] = []
    for path in paths:
        if path.is_dir():
            found = []
            for folder, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in names:
                    if not name.startswith(".") and name.lower().endswith(SUFFIXES):
                        full = Path(folder, name)
                        found.append(KnowledgeFile(full, full.relative_to(path).as_posix()))
            files.extend(sorted(found, key=lambda f: f.source))
        elif path.is_file():
            if path.name.lower().endswith(SUFFIXES):
                files.append(KnowledgeFile(path, path.name))
            else:
                missing.append(
                    FileOutcome(
                        path.name, "failed", reason="not a Markdown, text, HTML or PDF file"
                    )
                )
        else:
            missing.append(FileOutcome(str(path), "failed", reason="no such file or folder"))
    return files, missing


def _read(path: Path, max_bytes: int, model: str | None) -> tuple[bytes, str]:
    """The file's bytes and its content hash (with the embedding ``model`` when vectors are
    on). Blocking, hashing included (up to ``max_bytes``): run it in a thread."""
    with path.open("rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise _Refused(f"larger than MAX_KNOWLEDGE_FILE_BYTES ({max_bytes} bytes)")
    digest = hashlib.sha256(data)
    if model is not None:
        digest.update(b"\x00embedding:" + model.encode())
    return data, digest.hexdigest()


class _Refused(Exception):
    """A file the base does not take; the message is its one-line reason."""


def _text_passages(data: bytes, suffix: str) -> list[Passage]:
    if b"\x00" in data[:8192]:
        raise _Refused("not a text file (it holds binary data)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _Refused(f"not UTF-8 text (byte {exc.start})") from None
    if suffix in (".html", ".htm"):
        text = html_to_text(text)
    return split_passages(text)


class Ingestion:
    """Adds files to ``base``; ``on_total`` hears how many files there are, ``on_file`` of
    each once it is done."""

    def __init__(
        self,
        base: KnowledgeBase,
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        reader: DocumentReader | None = None,
        on_file: Callable[[FileOutcome], None] | None = None,
        on_total: Callable[[int], None] | None = None,
    ) -> None:
        self.base = base
        self.max_file_bytes = max_file_bytes
        self.reader = reader or DocumentReader()
        self.on_file = on_file
        self.on_total = on_total

    async def add(self, paths: Sequence[Path]) -> list[FileOutcome]:
        """Add every file under ``paths``; one outcome per file (and per bad path)."""
        files, outcomes = await asyncio.to_thread(find_files, paths)
        if self.on_total is not None:
            self.on_total(len(files) + len(outcomes))
        for outcome in outcomes:
            self._tell(outcome)
        vectors = await self.base.vectors_ready()
        await self.base.store.run(ensure_knowledge_schema_in)
        for file in files:
            outcome = await self._add_one(file, vectors)
            outcomes.append(outcome)
            self._tell(outcome)
        return outcomes

    def _tell(self, outcome: FileOutcome) -> None:
        if self.on_file is not None:
            self.on_file(outcome)

    async def _add_one(self, file: KnowledgeFile, vectors: bool) -> FileOutcome:
        model = None
        if vectors:
            assert self.base.embedder is not None
            model = self.base.embedder.model
        try:
            data, content_hash = await asyncio.to_thread(
                _read, file.path, self.max_file_bytes, model
            )
        except _Refused as exc:
            return FileOutcome(file.source, "failed", reason=str(exc))
        except OSError as exc:
            return FileOutcome(file.source, "failed", reason=f"cannot read it ({exc.strerror})")
        known = await source_hash(self.base.store, file.source)
        if known == content_hash:
            return FileOutcome(file.source, "unchanged")
        try:
            passages = await self._passages(file, data)
            if not passages:
                raise _Refused("no text found in it")
            embedded = await self._embed(passages) if vectors else None
        except (_Refused, MediaError, ModelError) as exc:
            return FileOutcome(file.source, "failed", reason=str(exc))

        async def write(tx: Transaction) -> None:
            if embedded is not None:
                await ensure_vector_table_in(tx, len(embedded[0]))
                if tx.dialect == "sqlite":  # vec0 rows do not follow their chunk by themselves
                    old = await chunk_ids_in(tx, file.source)
                    await tx.executemany(
                        f"DELETE FROM {VECTORS} WHERE rowid = ?", [(i,) for i in old]
                    )
            await replace_source_in(tx, file.source, content_hash, passages, time.time())
            if embedded is not None:
                await write_vectors_in(tx, await chunk_ids_in(tx, file.source), embedded)

        await self.base.store.run(write)
        return FileOutcome(file.source, "added" if known is None else "replaced", len(passages))

    async def _passages(self, file: KnowledgeFile, data: bytes) -> list[Passage]:
        suffix = file.path.suffix.lower()
        if suffix != ".pdf":
            return await asyncio.to_thread(_text_passages, data, suffix)
        read = await self.reader.read(data, "application/pdf", file.path.name, max_chars=_PDF_CHARS)
        return await asyncio.to_thread(split_passages, read.text)

    async def _embed(self, passages: Sequence[Passage]) -> list[list[float]]:
        assert self.base.embedder is not None
        texts = [f"{p.heading}\n{p.text}" if p.heading else p.text for p in passages]
        return await self.base.embedder.embed(texts)
