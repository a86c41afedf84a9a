"""One conversation's page: its transcript with each reply's delivery, the files it
may serve, and what a live transcript polls for (``recent_changes``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from bot.console.queries.common import TRANSCRIPT_LIMIT
from bot.core.agent import HANDOFF_PREFIX
from bot.core.compaction import is_summary
from bot.core.messages import Message, MessagePart, Role
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.gateway.ledger.keyboards import TABLE as BUTTONS_TABLE
from bot.gateway.ledger.keyboards import KeyboardButton
from bot.gateway.ledger.obligations import COLUMNS, TABLE, Obligation, decode_row
from bot.gateway.takeover import OPERATOR_NAME, TAKEOVER_TABLE

__all__ = ["TranscriptItem", "media_part", "recent_changes", "transcript"]

_DELIVERY_LABELS: Final = {
    "pending": "sending",
    "attempting": "sending",
    "delivered": "delivered",
    "failed": "failed, will retry",
    "abandoned": "abandoned",
}


@dataclass(frozen=True, slots=True)
class TranscriptItem:
    """One message of a transcript, with the delivery state of a reply."""

    seq: int
    """Position in the history."""
    message: Message
    """The stored message."""
    delivery: str | None = None
    """``delivered``, ``resent with marker``, ``sending``, ``failed...``, ``abandoned``."""
    delivery_error: str | None = None
    """The ledger's last error for it."""
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    """``(name, arguments as JSON)`` of the tools it called."""
    files: tuple[MessagePart, ...] = ()
    """Files the reply carried (from its ledger row), shown like the user's attachments."""
    compacted: bool = False
    """Summarised by a compaction: kept for the record, the model no longer sees it."""
    buttons: tuple[KeyboardButton, ...] = ()
    """The choices the reply carried (``ToolOutput(buttons=...)``), from its ledger row."""
    tappable: bool = False
    """Its keyboard is still open in a web test chat: the console shows it clickable."""

    @property
    def is_summary(self) -> bool:
        """A compaction's summary (what the model sees instead of the compacted turns)."""
        return is_summary(self.message)

    @property
    def kind(self) -> str:
        """How it is drawn: ``user``, ``agent``, ``person``, ``tool``, ``handoff``, ``system``."""
        role = self.message.role
        if role is Role.USER:
            return "user"
        if role is Role.TOOL:
            return "handoff" if (self.message.name or "").startswith(HANDOFF_PREFIX) else "tool"
        if role is Role.SYSTEM:
            return "system"
        return "person" if self.by_person else "agent"

    @property
    def shown_calls(self) -> list[tuple[str, str]]:
        """The tool calls drawn: a handoff shows once, as its result ("Transferred to X")."""
        return [call for call in self.tool_calls if not call[0].startswith(HANDOFF_PREFIX)]

    @property
    def attachments(self) -> tuple[MessagePart, ...]:
        """The message's own parts, then the files its reply carried."""
        return (*self.message.parts, *self.files)

    @property
    def by_person(self) -> bool:
        """Typed by an operator in the console."""
        return self.message.role is Role.MODEL and self.message.name == OPERATOR_NAME

    @property
    def who(self) -> str:
        """Who wrote it, for display."""
        role = self.message.role
        if role is Role.USER:
            return "user"
        if self.by_person:
            return "operator (person)"
        if role is Role.TOOL:
            return f"tool {self.message.name or ''}".strip()
        return self.message.agent or role.value


async def transcript(
    store: TransactionalStore, session_id: str, *, limit: int = TRANSCRIPT_LIMIT
) -> list[TranscriptItem]:
    """The newest ``limit`` messages of a session, oldest first, replies with their
    delivery and the files they carried."""

    async def body(tx: Transaction) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        messages = await tx.fetchall(
            "SELECT seq, message_json, compacted FROM chatflow_messages WHERE session_id = ? "
            "ORDER BY seq DESC LIMIT ?",
            (session_id, limit),
        )
        owed = await tx.fetchall(
            f"SELECT {COLUMNS} FROM {TABLE} WHERE session_id = ? ORDER BY created_at",
            (session_id,),
        )
        # Keyboards no tap used yet (their buttons are clickable in a web test chat).
        open_rows = await tx.fetchall(
            f"SELECT DISTINCT keyboard_id FROM {BUTTONS_TABLE} "
            "WHERE session_id = ? AND used_at IS NULL",
            (session_id,),
        )
        open_keyboards.update(str(r[0]) for r in open_rows)
        return messages, owed

    open_keyboards: set[str] = set()
    rows, owed_rows = await store.run(body, write=False)
    owed = [decode_row(o).obligation for o in owed_rows]
    by_ref = {o.message_ref: o for o in owed}
    unused = list(owed)
    items: list[TranscriptItem] = []
    for seq, message_json, compacted in reversed(rows):
        try:
            message = Message.model_validate_json(message_json)
        except ValueError:
            continue
        calls = [
            (call.name, json.dumps(call.arguments, ensure_ascii=False, indent=1))
            for call in message.tool_calls
        ]
        match: Obligation | None = None
        if message.role is Role.MODEL and message.content and not message.tool_calls:
            if message.name == OPERATOR_NAME:
                match = by_ref.get(f"{OPERATOR_NAME}:{message.id}")
            else:
                # A reply's row holds the text as sent: the adapter may prefix it.
                content = message.content
                match = next((o for o in unused if o.content.endswith(content)), None)
            if match is not None and match in unused:
                unused.remove(match)
        delivery = error = None
        files: tuple[MessagePart, ...] = ()
        if match is not None:
            delivery = _DELIVERY_LABELS.get(match.state, match.state)
            if match.state == "delivered" and match.maybe_delivered:
                delivery = "resent with marker"
            elif match.state == "pending" and match.next_attempt_at is not None:
                delivery = "waiting"  # its platform is not connected (last_error says so)
            error = match.last_error
            files = match.attachments
        buttons = match.buttons if match is not None else ()
        tappable = bool(buttons) and session_id.startswith("web-")
        items.append(
            TranscriptItem(
                int(seq),
                message,
                delivery,
                error,
                calls,
                files,
                bool(compacted),
                buttons=buttons,
                tappable=tappable and match is not None and match.obligation_id in open_keyboards,
            )
        )
    return items


async def media_part(store: TransactionalStore, session_id: str, sha256: str) -> MessagePart | None:
    """The attachment of ``session_id`` whose bytes are ``sha256`` (validated hex), if
    one of its messages or replies has it: the console serves no other file."""
    pattern = f"%{sha256}%"

    async def body(tx: Transaction) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        messages = await tx.fetchall(
            "SELECT message_json FROM chatflow_messages WHERE session_id = ? "
            "AND message_json LIKE ?",
            (session_id, pattern),
        )
        owed = await tx.fetchall(
            f"SELECT {COLUMNS} FROM {TABLE} WHERE session_id = ? AND attachments LIKE ?",
            (session_id, pattern),
        )
        return messages, owed

    messages, owed = await store.run(body, write=False)
    parts: list[MessagePart] = []
    for (message_json,) in messages:
        try:
            parts += Message.model_validate_json(message_json).parts
        except ValueError:
            continue
    for row in owed:
        parts += decode_row(row).obligation.attachments
    return next((p for p in parts if getattr(p, "sha256", None) == sha256), None)


async def recent_changes(
    store: TransactionalStore, session_id: str, since: float
) -> tuple[Any, int, tuple[int, Any]]:
    """What a live transcript shows, in brief: the session's version, whether it is
    taken over, and (count, newest ``updated_at``) of its ledger rows updated after
    ``since`` (unix time)."""

    async def body(tx: Transaction) -> tuple[Any, int, tuple[int, Any]]:
        version = await tx.fetchone(
            "SELECT version FROM chatflow_sessions WHERE session_id = ?", (session_id,)
        )
        taken = await tx.fetchone(
            f"SELECT COUNT(*) FROM {TAKEOVER_TABLE} WHERE session_id = ?", (session_id,)
        )
        # Through the ledger's (state, updated_at) index: only the last moments are read.
        owed = await tx.fetchone(
            f"SELECT COUNT(*), MAX(updated_at) FROM {TABLE} WHERE state IN "
            "('pending', 'attempting', 'delivered', 'failed', 'abandoned') "
            "AND updated_at > ? AND session_id = ?",
            (since, session_id),
        )
        return (
            None if version is None else version[0],
            0 if taken is None else int(taken[0]),
            (0, None) if owed is None else (int(owed[0]), owed[1]),
        )

    return await store.run(body, write=False)
