"""Reading and writing remembered facts: the rows, the turn's requests, the ranking.

A tool never writes a row: it leaves a ``RememberRequest`` or ``ForgetRequest`` on
the turn (``ToolContext.effects``) and the host applies them in the turn's own
transaction (``apply_memory_in``), with the scope of the message that started
the turn. So a fact exists if and only if the answer that confirms it was
committed, and a forget is checked against the visibility rule once more there.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from bot.core.long_memory.schema import TABLE, ensure_memory_schema_in
from bot.core.long_memory.scope import MemoryScope, visible_sql
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore

__all__ = [
    "ForgetRequest",
    "Memory",
    "RememberRequest",
    "apply_memory_in",
    "count_remembered_by",
    "delete_memory",
    "list_memories",
    "rank",
    "visible_memories",
]

_COLUMNS: Final = "id, about, platform, person, chat, thread, private, text, session_id, created_at"
_READ_LIMIT: Final = 5000
"""Visible rows read at most per turn (oldest first); beyond it ``recall`` sees the oldest."""


@dataclass(frozen=True, slots=True)
class Memory:
    """One remembered fact and where it was remembered (hashes only)."""

    memory_id: str
    about: str
    platform: str
    person: str
    chat: str
    thread: str
    private: bool
    text: str
    session_id: str
    created_at: float

    @property
    def date(self) -> str:
        """The UTC day it was remembered (``2026-12-07``)."""
        return datetime.fromtimestamp(self.created_at, UTC).date().isoformat()


@dataclass(frozen=True, slots=True)
class RememberRequest:
    """A fact a tool asked to keep, written at the turn's commit."""

    memory_id: str
    text: str
    about: str


@dataclass(frozen=True, slots=True)
class ForgetRequest:
    """A visible memory a tool removed, deleted at the turn's commit (if still visible)."""

    memory_id: str


def _memory(row: Sequence[Any]) -> Memory:
    return Memory(
        memory_id=str(row[0]),
        about=str(row[1]),
        platform=str(row[2]),
        person=str(row[3]),
        chat=str(row[4]),
        thread=str(row[5]),
        private=bool(row[6]),
        text=str(row[7]),
        session_id=str(row[8]),
        created_at=float(row[9]),
    )


async def _exists(tx: Transaction) -> bool:
    """Whether the table was made (reads run in read-only transactions: no DDL there)."""
    if tx.dialect == "sqlite":
        row = await tx.fetchone(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
        )
        return row is not None
    row = await tx.fetchone("SELECT to_regclass(?) IS NOT NULL", (TABLE,))
    return bool(row and row[0])


async def visible_memories(store: TransactionalStore, scope: MemoryScope) -> list[Memory]:
    """The memories visible in ``scope``, oldest first (a stable order); read-only (every
    turn of a memory agent reads them)."""

    async def body(tx: Transaction) -> list[Memory]:
        if not await _exists(tx):
            return []  # nothing was ever remembered here
        where, params = visible_sql(scope)
        rows = await tx.fetchall(
            f"SELECT {_COLUMNS} FROM {TABLE} WHERE {where} ORDER BY created_at, id LIMIT ?",
            (*params, _READ_LIMIT),
        )
        return [_memory(row) for row in rows]

    return await store.run(body, write=False)


async def count_remembered_by(store: TransactionalStore, platform: str, person: str) -> int:
    """How many memories ``person`` made (both kinds): what ``MAX_MEMORIES_PER_PERSON`` counts."""

    async def body(tx: Transaction) -> int:
        if not await _exists(tx):
            return 0
        row = await tx.fetchone(
            f"SELECT COUNT(*) FROM {TABLE} WHERE platform = ? AND person = ?", (platform, person)
        )
        return int(row[0]) if row else 0

    return await store.run(body, write=False)


async def apply_memory_in(
    tx: Transaction,
    effects: Sequence[object],
    scope: MemoryScope | None,
    session_id: str,
    now: float,
) -> tuple[int, int]:
    """Write a turn's memory requests in its transaction; ``(remembered, forgotten)``.

    Without a scope (a turn nobody's message started) nothing is written: the tools
    refused such requests already.
    """
    requests = [e for e in effects if isinstance(e, RememberRequest | ForgetRequest)]
    if not requests or scope is None:
        return 0, 0
    await ensure_memory_schema_in(tx)
    remembered = forgotten = 0
    where, params = visible_sql(scope)
    for request in requests:
        if isinstance(request, RememberRequest):
            if request.about == "me" and scope.person is None:
                continue
            remembered += await tx.execute(
                f"INSERT INTO {TABLE} ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(id) DO NOTHING",
                (
                    request.memory_id,
                    request.about,
                    scope.platform,
                    scope.person or "",
                    scope.chat,
                    scope.thread,
                    1 if scope.private else 0,
                    request.text,
                    session_id,
                    now,
                ),
            )
        else:
            forgotten += await tx.execute(
                f"DELETE FROM {TABLE} WHERE id = ? AND {where}", (request.memory_id, *params)
            )
    return remembered, forgotten


async def list_memories(
    store: TransactionalStore, platform: str | None = None, person: str | None = None
) -> list[Memory]:
    """Every memory (the operator's view), or those ``person`` made on ``platform``."""

    async def body(tx: Transaction) -> list[Memory]:
        await ensure_memory_schema_in(tx)
        if platform is None or person is None:
            rows = await tx.fetchall(f"SELECT {_COLUMNS} FROM {TABLE} ORDER BY created_at, id")
        else:
            rows = await tx.fetchall(
                f"SELECT {_COLUMNS} FROM {TABLE} WHERE platform = ? AND person = ? "
                "ORDER BY created_at, id",
                (platform, person),
            )
        return [_memory(row) for row in rows]

    return await store.run(body)


async def delete_memory(store: TransactionalStore, memory_id: str) -> bool:
    """Remove one memory by id (the operator's command); whether it existed."""

    async def body(tx: Transaction) -> int:
        await ensure_memory_schema_in(tx)
        return await tx.execute(f"DELETE FROM {TABLE} WHERE id = ?", (memory_id,))

    return await store.run(body) > 0


_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    return {word.casefold() for word in _WORD.findall(text)}


def rank(memories: Sequence[Memory], query: str, limit: int = 10) -> list[Memory]:
    """The memories matching ``query``, best first (most query words, then newest).

    A query without words (``""``, ``"*"``) matches every memory given, newest first:
    callers give only visible ones.
    """
    wanted = _words(query)
    scored: list[tuple[int, float, str, Memory]] = []
    for memory in memories:
        if wanted:
            have = _words(memory.text)
            score = sum(
                1
                for word in wanted
                if word in have or (len(word) >= 4 and any(h.startswith(word) for h in have))
            )
            if score == 0:
                continue
        else:
            score = 0
        scored.append((-score, -memory.created_at, memory.memory_id, memory))
    scored.sort(key=lambda item: item[:3])
    return [item[3] for item in scored[:limit]]
