"""``forget-user``: remove everything the bot holds about one person.

The person is named as the operator knows them (``telegram:<user id>``,
``whatsapp:<number>``); every table keys them by a hash of that id, so each
hash is computed here the way its table does. In one transaction:

- their memories (``bot.core.long_memory``), made in any chat;
- their own sessions: the private chat and, in groups where each person has
  a session of their own, theirs. Everything of those sessions goes with them:
  journal (inbox) rows, dedup ids, replies owed or sent (ledger) and their
  buttons, scheduled jobs, approvals, takeovers, usage rows;
- in sessions shared with others (forum topics, groups with one session), the
  text of each of their messages is replaced by ``REDACTED`` (matched through
  the journal's copy of what they wrote), and the journal rows, dedup ids and
  replies to those messages are removed;
- records keyed by them: approvals they asked for, usage and budget rows, rate
  limits, pairing codes and approvals, the private chat's contact window and
  voice refusal;

then the media files of all that (files they sent, files sent to them, and
the notes that name them). On SQLite ``secure_delete`` zeroes what was deleted
and a checkpoint empties the WAL, so no file under ``DATA_DIR`` keeps their text;
on PostgreSQL the rows are deleted (the server reclaims the space on VACUUM).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from bot.core.long_memory.schema import TABLE as MEMORIES
from bot.core.media_store import MediaStore
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.gateway.access.rate_limits import sender_digest
from bot.gateway.events import SessionSource
from bot.gateway.keys import (
    PersonRef,
    build_session_key,
    hash_chat_id,
    hash_sender_id,
    session_id_for,
)
from bot.gateway.voice_replies import refusal_chat_hash

__all__ = ["KINDS", "REDACTED", "Erasure", "erase_person"]

REDACTED: Final = "[removed at the person's request]"
"""What a group session shows instead of an erased person's message."""
KINDS: Final = (
    "memories",
    "sessions",
    "group messages redacted",
    "journal rows",
    "replies",
    "buttons",
    "scheduled jobs",
    "approvals",
    "usage rows",
    "pairing records",
    "rate and budget records",
    "window records",
    "media files",
)
"""The kinds ``forget-user`` reports, in its order."""

_SHA = re.compile(r"\b[0-9a-f]{64}\b")


@dataclass
class Erasure:
    """What ``erase_person`` removed, per kind (``KINDS``)."""

    counts: Counter[str] = field(default_factory=Counter)
    media: set[str] = field(default_factory=set)
    """SHA-256 of the media files found in what was removed."""
    notes: set[str] = field(default_factory=set)
    """Keys of the media notes (fetched file ids, transcripts) to remove."""

    def lines(self) -> list[str]:
        """One ``kind: count`` line per kind."""
        return [f"{kind}: {self.counts[kind]}" for kind in KINDS]


async def _table_exists(tx: Transaction, name: str) -> bool:
    if tx.dialect == "sqlite":
        sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    else:
        sql = (
            "SELECT 1 FROM information_schema.tables "
            "WHERE table_schema = current_schema() AND table_name = ?"
        )
    return await tx.fetchone(sql, (name,)) is not None


def _in(values: Sequence[object]) -> str:
    return ", ".join("?" for _ in values)


async def _delete_in(
    tx: Transaction, table: str, column: str, values: Iterable[object], *, extra: str = ""
) -> int:
    """``DELETE FROM table WHERE column IN values`` in slices; rows deleted."""
    items = sorted({str(v) for v in values})
    removed = 0
    for start in range(0, len(items), 200):
        chunk = items[start : start + 200]
        removed += max(
            0,
            await tx.execute(f"DELETE FROM {table} WHERE {column} IN ({_in(chunk)}){extra}", chunk),
        )
    return removed


class _Eraser:
    def __init__(self, tx: Transaction, person: PersonRef, secret: bytes, transcriber: str):
        self.tx = tx
        self.person = person
        self.secret = secret
        self.transcriber = transcriber
        self.result = Erasure()
        self.user_hash = hash_sender_id(person.user_id, secret)
        self.digest = sender_digest(person.platform, person.user_id, secret)
        self.dm_chat_hash = hash_chat_id(person.user_id, secret)
        dm = SessionSource(person.platform, person.user_id, "dm", person.user_id)
        self.dm_session = session_id_for(build_session_key(dm, secret=secret))

    async def has(self, table: str) -> bool:
        return await _table_exists(self.tx, table)

    def count(self, kind: str, n: int) -> None:
        self.result.counts[kind] += max(0, n)

    async def run(self) -> Erasure:
        tx = self.tx
        if tx.dialect == "sqlite":
            await tx.execute("PRAGMA secure_delete = ON")
        own = await self._own_sessions()
        messages, shared = await self._their_messages(own)
        await self._redact_shared(shared, messages)
        message_ids = set(messages)
        await self._sessions(own)
        await self._ledger(own, message_ids)
        await self._journal(own, message_ids)
        await self._keyed(own)
        return self.result

    async def _own_sessions(self) -> set[str]:
        """The private session and the per-person group sessions."""
        found = {self.dm_session}
        if await self.has("chatflow_sessions"):
            suffix = f":user:{self.user_hash}"
            rows = await self.tx.fetchall("SELECT session_id, metadata_json FROM chatflow_sessions")
            for session_id, metadata_json in rows:
                with contextlib.suppress(ValueError, TypeError):
                    key = str(json.loads(metadata_json).get("session_key", ""))
                    if key.split(":")[2:3] == [self.person.platform] and key.endswith(suffix):
                        found.add(str(session_id))
        return found

    async def _their_messages(
        self, own: set[str]
    ) -> tuple[dict[str, tuple[str, str]], dict[str, set[str]]]:
        """Their journaled messages (id -> (session id, text)) and, per shared session,
        the texts to redact in it."""
        messages: dict[str, tuple[str, str]] = {}
        shared: dict[str, set[str]] = {}
        if not await self.has("chatflow_inbox"):
            return messages, shared
        rows = await self.tx.fetchall(
            "SELECT message_id, session_id, event_json FROM chatflow_inbox WHERE platform = ?",
            (self.person.platform,),
        )
        for message_id, session_id, event_json in rows:
            try:
                event = json.loads(event_json)
                source = event.get("source") or {}
            except (ValueError, TypeError, AttributeError):
                continue
            if str(source.get("sender_id", "")) != self.person.user_id:
                continue
            text = str(event.get("text") or "")
            messages[str(message_id)] = (str(session_id), text)
            self.result.media |= set(_SHA.findall(str(event_json)))
            for media in event.get("media") or ():
                if isinstance(media, dict):
                    file_ref = media.get("unique_id") or media.get("file_id")
                    if file_ref:
                        self.result.notes.add(f"fetched:{self.person.platform}:{file_ref}")
            if str(session_id) not in own and text.strip():
                shared.setdefault(str(session_id), set()).add(text)
        return messages, shared

    async def _redact_shared(
        self, shared: dict[str, set[str]], messages: dict[str, tuple[str, str]]
    ) -> None:
        if not shared or not await self.has("chatflow_messages"):
            return
        for session_id, texts in shared.items():
            rows = await self.tx.fetchall(
                "SELECT id, message_json FROM chatflow_messages WHERE session_id = ? "
                "AND role = 'user'",
                (session_id,),
            )
            for row_id, message_json in rows:
                try:
                    message = json.loads(message_json)
                except ValueError:
                    continue
                content = str(message.get("content") or "")
                if not any(text in content for text in texts):
                    continue
                self.result.media |= set(_SHA.findall(str(message_json)))
                message["content"] = REDACTED
                message["parts"] = []
                await self.tx.execute(
                    "UPDATE chatflow_messages SET message_json = ? WHERE id = ?",
                    (json.dumps(message), row_id),
                )
                self.count("group messages redacted", 1)
            await self._drop_sender_name(session_id)

    async def _drop_sender_name(self, session_id: str) -> None:
        row = await self.tx.fetchone(
            "SELECT metadata_json FROM chatflow_sessions WHERE session_id = ?", (session_id,)
        )
        if row is None:
            return
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            metadata = json.loads(row[0])
            if metadata.pop("sender_name", None) is not None:
                await self.tx.execute(
                    "UPDATE chatflow_sessions SET metadata_json = ? WHERE session_id = ?",
                    (json.dumps(metadata), session_id),
                )

    async def _sessions(self, own: set[str]) -> None:
        if not await self.has("chatflow_sessions"):
            return
        ids = sorted(own)
        rows = await self.tx.fetchall(
            f"SELECT message_json FROM chatflow_messages WHERE session_id IN ({_in(ids)})", ids
        )
        for (message_json,) in rows:
            self.result.media |= set(_SHA.findall(str(message_json)))
        await _delete_in(self.tx, "chatflow_messages", "session_id", ids)
        self.count("sessions", await _delete_in(self.tx, "chatflow_sessions", "session_id", ids))

    async def _ledger(self, own: set[str], message_ids: set[str]) -> None:
        table = "chatflow_delivery_obligations"
        if not await self.has(table):
            return
        ids = sorted(own)
        rows = await self.tx.fetchall(
            f"SELECT obligation_id, message_ref, attachments FROM {table} "
            f"WHERE session_id IN ({_in(ids)}) OR (platform = ? AND chat_id = ?)",
            (*ids, self.person.platform, self.person.user_id),
        )
        obligations = {str(r[0]) for r in rows}
        for row in rows:
            self.result.media |= set(_SHA.findall(str(row[2] or "")))
        refs = sorted(message_ids)
        for start in range(0, len(refs), 200):
            chunk = refs[start : start + 200]
            more = await self.tx.fetchall(
                f"SELECT obligation_id, attachments FROM {table} "
                f"WHERE message_ref IN ({_in(chunk)})",
                chunk,
            )
            obligations |= {str(r[0]) for r in more}
            for row in more:
                self.result.media |= set(_SHA.findall(str(row[1] or "")))
        if await self.has("chatflow_delivery_sent"):
            await _delete_in(self.tx, "chatflow_delivery_sent", "obligation_id", obligations)
        if await self.has("chatflow_buttons"):
            buttons = await _delete_in(self.tx, "chatflow_buttons", "obligation_id", obligations)
            buttons += await _delete_in(self.tx, "chatflow_buttons", "session_id", own)
            self.count("buttons", buttons)
        self.count("replies", await _delete_in(self.tx, table, "obligation_id", obligations))

    async def _journal(self, own: set[str], message_ids: set[str]) -> None:
        if not await self.has("chatflow_inbox"):
            return
        ids = sorted(own)
        rows = await self.tx.fetchall(
            f"SELECT message_id, event_json FROM chatflow_inbox WHERE session_id IN ({_in(ids)})",
            ids,
        )
        journal = set(message_ids) | {str(r[0]) for r in rows}
        for row in rows:
            self.result.media |= set(_SHA.findall(str(row[1])))
        self.count(
            "journal rows", await _delete_in(self.tx, "chatflow_inbox", "message_id", journal)
        )
        if await self.has("chatflow_processed_messages"):
            await _delete_in(self.tx, "chatflow_processed_messages", "message_id", journal)

    async def _keyed(self, own: set[str]) -> None:
        tx, platform = self.tx, self.person.platform
        if await self.has(MEMORIES):
            self.count(
                "memories",
                await tx.execute(
                    f"DELETE FROM {MEMORIES} WHERE platform = ? AND person = ?",
                    (platform, self.user_hash),
                ),
            )
        if await self.has("chatflow_scheduled_jobs"):
            jobs = await _delete_in(tx, "chatflow_scheduled_jobs", "session_id", own)
            jobs += await tx.execute(
                "DELETE FROM chatflow_scheduled_jobs WHERE platform = ? AND chat_id = ?",
                (platform, self.person.user_id),
            )
            self.count("scheduled jobs", jobs)
        if await self.has("chatflow_approvals"):
            approvals = await _delete_in(tx, "chatflow_approvals", "session_id", own)
            approvals += await tx.execute(
                "DELETE FROM chatflow_approvals WHERE platform = ? AND sender_ref = ?",
                (platform, self.user_hash),
            )
            self.count("approvals", approvals)
        if await self.has("chatflow_takeovers"):
            await _delete_in(tx, "chatflow_takeovers", "session_id", own)
        if await self.has("chatflow_usage"):
            usage = await _delete_in(tx, "chatflow_usage", "session_id", own)
            usage += await tx.execute("DELETE FROM chatflow_usage WHERE sender = ?", (self.digest,))
            self.count("usage rows", usage)
        for table in ("chatflow_pairing_requests", "chatflow_pairing_approvals"):
            if await self.has(table):
                self.count(
                    "pairing records",
                    await tx.execute(
                        f"DELETE FROM {table} WHERE platform = ? AND sender = ?",
                        (platform, self.digest),
                    ),
                )
        for table in ("chatflow_rate_limits", "chatflow_budget_notices"):
            if await self.has(table):
                self.count(
                    "rate and budget records",
                    await tx.execute(f"DELETE FROM {table} WHERE sender = ?", (self.digest,)),
                )
        if await self.has("chatflow_contact_windows"):
            self.count(
                "window records",
                await tx.execute(
                    "DELETE FROM chatflow_contact_windows WHERE platform = ? AND chat_key = ?",
                    (platform, self.dm_chat_hash),
                ),
            )
        if await self.has("chatflow_voice_refusals"):
            chat_hash = refusal_chat_hash(self.person.user_id)
            self.count(
                "window records",
                await tx.execute(
                    "DELETE FROM chatflow_voice_refusals WHERE platform = ? AND chat_hash = ?",
                    (platform, chat_hash),
                ),
            )
        for sha in self.result.media:
            self.result.notes.add(f"transcript:{self.transcriber}:{sha}")


def _remove_media(media_dir: Path, erasure: Erasure) -> int:
    removed = 0
    media = MediaStore(media_dir)  # its own naming of files, so the two cannot drift
    paths = [media.note_path(key) for key in erasure.notes]
    for sha in erasure.media:
        with contextlib.suppress(ValueError):  # not a SHA-256: no file is named by it
            paths.append(media.path_of(sha))
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return removed


def _compact_sqlite(path: str) -> None:
    """Zero what was freed and empty the WAL into the file (``secure_delete``, a checkpoint)."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        conn.execute("PRAGMA secure_delete = ON")
        with contextlib.suppress(sqlite3.OperationalError):  # a running bot may hold a read
            conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.close()


async def erase_person(
    store: TransactionalStore,
    person: PersonRef,
    secret: bytes,
    *,
    media_dir: Path,
    transcription_model: str = "whisper-1",
) -> Erasure:
    """Remove everything about ``person`` (one transaction), then their media files; on
    SQLite, zero the freed pages and checkpoint. Returns the counts per kind."""

    async def body(tx: Transaction) -> Erasure:
        return await _Eraser(tx, person, secret, transcription_model).run()

    erasure = await store.run(body)
    erasure.counts["media files"] = await asyncio.to_thread(_remove_media, media_dir, erasure)
    db_path: Any = getattr(store, "db_path", None)
    if store.dialect == "sqlite" and isinstance(db_path, str) and ":memory:" not in db_path:
        # On a connection of its own: the store's stays open (a running bot's console).
        await asyncio.to_thread(_compact_sqlite, db_path)
    return erasure
