"""What every console page's queries share: sizes, labels, the console's schema, the age
of a moment (``bot.console.queries``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, Literal

from bot.core.messages import MessagePart
from bot.core.sql import ensure_schema
from bot.core.stores.base import TransactionalStore
from bot.gateway.ledger.obligations import TABLE

__all__ = [
    "ATTENTION_LIMIT",
    "KNOWN_PLATFORMS",
    "PAGE_SIZE",
    "PREVIEW_CHARS",
    "READS_TABLE",
    "SEARCH_WINDOW",
    "TRANSCRIPT_LIMIT",
    "ConversationState",
    "age",
    "open_schema",
    "part_label",
    "platform_label",
]

PAGE_SIZE: Final = 50
"""Conversations per page."""
TRANSCRIPT_LIMIT: Final = 500
"""Messages shown per transcript (the newest)."""
SEARCH_WINDOW: Final = 500
"""Conversations one search page looks through."""
READS_TABLE: Final = "chatflow_console_reads"
"""Where the operators last read each conversation (``mark_read``)."""
PREVIEW_CHARS: Final = 140
"""Longest last-message preview on a list line."""
ATTENTION_LIMIT: Final = 200
"""Most conversations ``needing_a_person`` returns (they are the taken-over ones)."""

ConversationState = Literal["bot", "human", "waiting"]
"""Who answers: the bot; a person; a person, and the user waits for them."""

_COMPONENT: Final = "console"
_MIGRATIONS: Final = {
    # A transcript reads its conversation's ledger rows: by index, not by a scan that
    # would hold SQLite's one database thread (the message path's) for long.
    1: (f"CREATE INDEX IF NOT EXISTS {TABLE}_session ON {TABLE} (session_id, created_at)",),
    # Shared by every operator and process: one inbox, read by a team. A session
    # deleted and started again (``/reset``) has a new created_at, so an old mark
    # never hides its messages.
    2: (
        f"CREATE TABLE IF NOT EXISTS {READS_TABLE} ("
        "session_id TEXT PRIMARY KEY NOT NULL, "
        "incarnation TEXT NOT NULL, "
        "seen_seq INTEGER NOT NULL)",
    ),
}
_PLATFORM_LABELS: Final = {
    "telegram": "Telegram",
    "whatsapp": "WhatsApp",
    "web": "Web",
    "console": "Terminal",
}
KNOWN_PLATFORMS: Final = frozenset(_PLATFORM_LABELS)
"""The platforms Chatflow ships: the list's filter offers them all."""
_NAME_CHARS: Final = 80


async def open_schema(store: TransactionalStore) -> None:
    """Create what the console's reads need (an index on the ledger); idempotent.

    Call it after the ledger's tables exist (``Gateway.start``).
    """
    async with store.transaction() as tx:
        await ensure_schema(tx, _COMPONENT, _MIGRATIONS)


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def platform_label(platform: str) -> str:
    """``telegram`` as people write it: ``Telegram``."""
    return _PLATFORM_LABELS.get(platform, platform.capitalize())


def part_label(part: MessagePart) -> str:
    """A few words for an attachment (``Photo``, ``Voice note``, a file's name)."""
    if part.kind == "image":
        return part.file_name or "Photo"
    if part.kind == "audio":
        return "Voice note" if part.voice else (part.file_name or "Audio")
    if part.kind == "document":
        return part.file_name or "Document"
    if part.kind == "location":
        return part.name or "Location"
    if part.kind == "contact":
        return f"Contact: {part.name}"
    return part.text


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _name(value: Any) -> str | None:
    return _one_line(value, _NAME_CHARS) or None if isinstance(value, str) else None


def age(moment: datetime, now: datetime) -> str:
    """``moment`` as a short age (``42 s``, ``5 min``, ``3 h``, ``2 d``)."""
    seconds = max(0, int((now - moment).total_seconds()))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"
