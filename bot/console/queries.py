"""What the console reads (conversations, transcripts, the ledger) and the one mark it writes.

Every query is one ``store.run(body, write=False)`` over the stores' own
tables (``chatflow_sessions``/``chatflow_messages`` of ``bot.core.stores.sql``,
the ledger's of ``bot.gateway.ledger.obligations``, the takeover table): no write,
no lock a turn waits on. The conversation list pages by key set
(``updated_at, session_id``), never by offset, so page 2000 costs what page 1 does;
what a line shows besides (its last message, its unread count) is read by
correlated subqueries for the page's rows alone, through the messages'
``(session_id, seq)`` index. The one write is ``mark_read``: where the
operators last read a conversation (table ``chatflow_console_reads``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from bot.core.agent import HANDOFF_PREFIX
from bot.core.compaction import is_summary
from bot.core.messages import Message, MessagePart, Role
from bot.core.sql import Transaction, ensure_schema
from bot.core.stores.base import TransactionalStore
from bot.gateway.ledger.keyboards import TABLE as BUTTONS_TABLE
from bot.gateway.ledger.keyboards import KeyboardButton
from bot.gateway.ledger.obligations import COLUMNS, TABLE, Obligation, decode_row
from bot.gateway.takeover import AGENT_REASON_PREFIX, OPERATOR_NAME, TAKEOVER_TABLE
from bot.metrics import Metrics

__all__ = [
    "ATTENTION",
    "IN_FLIGHT",
    "PAGE_SIZE",
    "READS_TABLE",
    "SEARCH_WINDOW",
    "TRANSCRIPT_LIMIT",
    "UNDELIVERED",
    "ConversationRow",
    "ConversationState",
    "TranscriptItem",
    "age",
    "conversation",
    "conversations_by_id",
    "ledger_counts",
    "ledger_rows",
    "list_conversations",
    "mark_read",
    "media_part",
    "metric_totals",
    "needing_a_person",
    "open_schema",
    "part_label",
    "platform_label",
    "recent_changes",
    "transcript",
]

PAGE_SIZE: Final = 50
"""Conversations per page."""
TRANSCRIPT_LIMIT: Final = 500
"""Messages shown per transcript (the newest)."""
SEARCH_WINDOW: Final = 500
"""Conversations one search page looks through."""
UNDELIVERED: Final = ("pending", "attempting", "failed", "abandoned")
"""Ledger states the ledger page lists."""
ATTENTION: Final = ("abandoned", "failed")
"""Undelivered states a person should look at: listed first."""
IN_FLIGHT: Final = ("attempting", "pending")
"""Undelivered states still on their way: listed after ``ATTENTION``."""
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
_NAME_CHARS: Final = 80
_DELIVERY_LABELS: Final = {
    "pending": "sending",
    "attempting": "sending",
    "delivered": "delivered",
    "failed": "failed, will retry",
    "abandoned": "abandoned",
}


@dataclass(frozen=True, slots=True)
class ConversationRow:
    """One line of the conversation list."""

    session_id: str
    """The session id (already a hash of the chat: ``<platform>-<16 hex>``)."""
    platform: str
    """``telegram``, ``whatsapp``, ``console``..."""
    chat_kind: str
    """``DM``, ``group``, ``topic`` or ``channel``."""
    agent: str
    """Name of the agent that answers next."""
    last_activity: str
    """When the session was last saved (UTC, ISO 8601)."""
    messages: int
    """Messages kept in its history."""
    taken_over: bool
    """Whether a person answers it."""
    requested: str | None = None
    """Why its agent asked for a person (``transfer_to_human``), if it did."""
    display_name: str | None = None
    """The name the platform gave (the group's title, the person's profile name)."""
    preview: str = ""
    """The last message from the user or to them, on one line, cut short."""
    last_from: str = ""
    """Who wrote that message: ``user``, ``person`` (an operator) or the agent's name."""
    unread: int = 0
    """The user's messages since an operator last opened the conversation."""

    @property
    def cursor(self) -> str:
        """Key-set cursor of the page after this row."""
        return f"{self.last_activity}|{self.session_id}"

    @property
    def state(self) -> ConversationState:
        """``waiting``: taken over, and the last word is the user's, or the agent's
        call for a person that no person has answered yet."""
        if not self.taken_over:
            return "bot"
        if self.last_from == "user" or (self.requested is not None and self.last_from != "person"):
            return "waiting"
        return "human"

    @property
    def short_id(self) -> str:
        """The session hash's first characters: enough to tell two chats apart."""
        return self.session_id.rpartition("-")[2][:8]

    @property
    def title(self) -> str:
        """What the list calls it: the platform's name for it, else a stand-in."""
        if self.display_name:
            return self.display_name
        if self.platform == "web":
            return f"Test chat {self.short_id}"
        kind = "group" if self.chat_kind in ("group", "topic", "channel") else "chat"
        return f"{platform_label(self.platform)} {kind} {self.short_id}"

    @property
    def initials(self) -> str:
        """One or two letters for the avatar."""
        words = [w for w in self.title.split() if w[:1].isalnum()]
        letters = "".join(w[0] for w in words[:2]) if self.display_name else self.title[:1]
        return (letters or "?").upper()

    @property
    def hue(self) -> int:
        """The avatar's colour (0-7), the same for a conversation everywhere."""
        return hashlib.sha256(self.session_id.encode()).digest()[0] % 8


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


async def open_schema(store: TransactionalStore) -> None:
    """Create what the console's reads need (an index on the ledger); idempotent.

    Call it after the ledger's tables exist (``Gateway.start``).
    """
    async with store.transaction() as tx:
        await ensure_schema(tx, _COMPONENT, _MIGRATIONS)


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _chat_kind(metadata: dict[str, Any]) -> str:
    key = str(metadata.get("session_key", ""))
    if ":topic:" in key:
        return "topic"
    kind = str(metadata.get("chat_type", ""))
    if kind == "dm":
        return "DM"
    return kind or "?"


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


def _display_name(metadata: dict[str, Any], platform: str) -> str | None:
    if platform == "web":  # every test chat's sender is the operator: no name of its own
        return None
    chat, sender = _name(metadata.get("chat_name")), _name(metadata.get("sender_name"))
    if metadata.get("chat_type") == "dm":
        return sender or chat
    return chat  # a group's last sender is not its name


def _last(message_json: Any) -> tuple[str, str]:
    """(who wrote it, the preview) of the last message to or from the user."""
    if message_json is None:
        return "", ""
    try:
        message = Message.model_validate_json(message_json)
    except ValueError:
        return "", ""
    text = (message.content or "").strip()
    if not text and message.parts:
        text = ", ".join(part_label(p) for p in message.parts)
    if message.role is Role.USER:
        who = "user"
    elif message.name == OPERATOR_NAME:
        who = "person"
    else:
        who = message.agent or "bot"
    return who, _one_line(text, PREVIEW_CHARS)


def _row(values: tuple[Any, ...]) -> ConversationRow:
    session_id, agent, metadata_json, updated_at, count, reason, last_json, unread = values
    try:
        metadata = json.loads(metadata_json)
    except (TypeError, ValueError):
        metadata = {}
    if not isinstance(metadata, dict):
        metadata = {}
    platform = str(metadata.get("platform") or str(session_id).partition("-")[0])
    last_from, preview = _last(last_json)
    return ConversationRow(
        session_id=str(session_id),
        platform=platform,
        chat_kind=_chat_kind(metadata),
        agent=str(agent),
        last_activity=str(updated_at),
        messages=int(count),
        taken_over=reason is not None,
        requested=(
            str(reason).removeprefix(AGENT_REASON_PREFIX)
            if reason is not None and str(reason).startswith(AGENT_REASON_PREFIX)
            else None
        ),
        display_name=_display_name(metadata, platform),
        preview=preview,
        last_from=last_from,
        unread=int(unread or 0),
    )


_COLUMNS = (
    "SELECT s.session_id, s.active_agent_name, s.metadata_json, s.updated_at, "
    "(SELECT COUNT(*) FROM chatflow_messages m WHERE m.session_id = s.session_id), "
    f"(SELECT t.reason FROM {TAKEOVER_TABLE} t WHERE t.session_id = s.session_id), "
    # The last message to or from the user (tool traffic is not a conversation's news).
    "(SELECT m.message_json FROM chatflow_messages m WHERE m.session_id = s.session_id "
    "AND m.role IN ('user', 'model') ORDER BY m.seq DESC LIMIT 1), "
    # The user's messages after the operators' mark (all of them: never opened).
    "(SELECT COUNT(*) FROM chatflow_messages m WHERE m.session_id = s.session_id "
    "AND m.role = 'user' AND m.seq > COALESCE((SELECT r.seen_seq FROM "
    f"{READS_TABLE} r WHERE r.session_id = s.session_id AND r.incarnation = s.created_at), -1)) "
)
_SELECT = _COLUMNS + "FROM chatflow_sessions s"
_ORDER = " ORDER BY s.updated_at DESC, s.session_id DESC"


def _page_sql(conditions: list[str]) -> str:
    """The page: the inner query walks the ``updated_at`` index down and stops at its
    LIMIT (a range plus a sort of ties only, never of every row); the counts and
    the last message are read for the rows of the page alone."""
    where = " WHERE " + " AND ".join(conditions) if conditions else ""
    inner = (
        "SELECT s.session_id, s.active_agent_name, s.metadata_json, s.updated_at, "
        f"s.created_at FROM chatflow_sessions s{where}{_ORDER} LIMIT ?"
    )
    return f"{_COLUMNS}FROM ({inner}) s{_ORDER}"


async def list_conversations(
    store: TransactionalStore,
    *,
    platform: str | None = None,
    search: str | None = None,
    before: str | None = None,
    limit: int = PAGE_SIZE,
) -> tuple[list[ConversationRow], str | None]:
    """A page of conversations, most recent first, and the cursor of the next page.

    ``platform`` keeps one platform (session ids start with it); ``search``
    keeps conversations with a message containing the text (case-insensitive);
    ``before`` is a cursor from the previous page. A search looks through at
    most ``SEARCH_WINDOW`` conversations per page (on SQLite every read shares
    the one database thread with the message path, so no query may scan
    everything); the next page's cursor continues after them.
    """
    where: list[str] = []
    params: list[Any] = []
    if platform:
        where.append("s.session_id LIKE ? ESCAPE '\\'")
        params.append(_like(platform + "-")[1:])
    if before:
        updated, _, session_id = before.partition("|")
        # "(updated, id) < cursor", spelled so the updated_at index bounds the range.
        where.append("s.updated_at <= ? AND (s.updated_at < ? OR s.session_id < ?)")
        params += [updated, updated, session_id]
    # The last conversation of the search window, and whether any comes after it.
    bound_sql = (
        "SELECT s.updated_at, s.session_id FROM chatflow_sessions s"
        + (" WHERE " + " AND ".join(where) if where else "")
        + _ORDER
        + " LIMIT 2 OFFSET ?"
    )
    bound_params = [*params, SEARCH_WINDOW - 1]

    async def body(tx: Transaction) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        bounds: list[tuple[Any, ...]] = []
        conditions, values = list(where), list(params)
        if search:
            bounds = await tx.fetchall(bound_sql, bound_params)
            if bounds:
                last = bounds[0]
                conditions.append("s.updated_at >= ? AND (s.updated_at > ? OR s.session_id >= ?)")
                values += [last[0], last[0], last[1]]
            # message_json keeps non-ASCII text as is (pydantic), so a LIKE finds it.
            conditions.append(
                "EXISTS (SELECT 1 FROM chatflow_messages f WHERE f.session_id = s.session_id "
                "AND LOWER(f.message_json) LIKE ? ESCAPE '\\')"
            )
            values.append(_like(search.lower()))
        page = await tx.fetchall(_page_sql(conditions), (*values, limit + 1))
        return page, bounds

    found, bounds = await store.run(body, write=False)
    rows = [_row(r) for r in found]
    if len(rows) > limit:
        return rows[:limit], rows[limit - 1].cursor
    if len(bounds) == 2:  # the search window ended before the last conversation
        return rows, f"{bounds[0][0]}|{bounds[0][1]}"
    return rows, None


async def conversation(store: TransactionalStore, session_id: str) -> ConversationRow | None:
    """One conversation's list line, or ``None``."""

    async def body(tx: Transaction) -> tuple[Any, ...] | None:
        return await tx.fetchone(_SELECT + " WHERE s.session_id = ?", (session_id,))

    row = await store.run(body, write=False)
    return None if row is None else _row(row)


async def conversations_by_id(
    store: TransactionalStore, session_ids: Iterable[str]
) -> dict[str, ConversationRow]:
    """The list lines of ``session_ids`` (a page's worth: one query by primary key)."""
    wanted = sorted(set(session_ids))
    if not wanted:
        return {}
    marks = ", ".join("?" for _ in wanted)

    async def body(tx: Transaction) -> list[tuple[Any, ...]]:
        return await tx.fetchall(_SELECT + f" WHERE s.session_id IN ({marks})", wanted)

    return {row.session_id: row for row in map(_row, await store.run(body, write=False))}


async def needing_a_person(
    store: TransactionalStore, *, limit: int = ATTENTION_LIMIT
) -> list[ConversationRow]:
    """The conversations a person answers: those where the user waits first, then
    the rest, most recent first within each."""
    # Driven by the takeover table (a person's workload: small), never by a walk of
    # every session; CROSS JOIN keeps SQLite's planner to that order.
    sql = (
        _COLUMNS + f"FROM {TAKEOVER_TABLE} o CROSS JOIN chatflow_sessions s "
        "WHERE s.session_id = o.session_id" + _ORDER + " LIMIT ?"
    )

    async def body(tx: Transaction) -> list[tuple[Any, ...]]:
        return await tx.fetchall(sql, (limit,))

    rows = [_row(r) for r in await store.run(body, write=False)]
    return sorted(rows, key=lambda row: row.state != "waiting")


async def mark_read(store: TransactionalStore, session_id: str) -> None:
    """Record that an operator has seen every message of ``session_id`` so far."""

    async def body(tx: Transaction) -> None:
        await tx.execute(
            f"INSERT INTO {READS_TABLE} (session_id, incarnation, seen_seq) "
            "SELECT s.session_id, s.created_at, COALESCE((SELECT MAX(m.seq) FROM "
            "chatflow_messages m WHERE m.session_id = s.session_id), -1) "
            "FROM chatflow_sessions s WHERE s.session_id = ? "
            "ON CONFLICT (session_id) DO UPDATE SET incarnation = excluded.incarnation, "
            "seen_seq = excluded.seen_seq",
            (session_id,),
        )

    await store.run(body)


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


async def ledger_rows(store: TransactionalStore, *, limit: int = 100) -> list[Obligation]:
    """Undelivered replies, what needs a person first: abandoned ones (given up:
    only a person can still help), failed ones (retried by the bot), then those
    on their way; newest first within each, up to ``limit`` in all."""

    async def body(tx: Transaction) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        for states in (("abandoned",), ("failed",), IN_FLIGHT):
            if len(rows) >= limit:
                break
            marks = ", ".join("?" for _ in states)
            rows += await tx.fetchall(
                f"SELECT {COLUMNS} FROM {TABLE} WHERE state IN ({marks}) "
                "ORDER BY created_at DESC, obligation_id LIMIT ?",
                (*states, limit - len(rows)),
            )
        return rows

    return [decode_row(r).obligation for r in await store.run(body, write=False)]


async def ledger_counts(store: TransactionalStore) -> dict[str, int]:
    """Undelivered obligations per state (``UNDELIVERED``)."""

    async def body(tx: Transaction) -> list[tuple[Any, ...]]:
        # Undelivered states only: an index range, where counting 'delivered' would
        # read the whole ledger on the database thread the message path uses.
        marks = ", ".join("?" for _ in UNDELIVERED)
        return await tx.fetchall(
            f"SELECT state, COUNT(*) FROM {TABLE} WHERE state IN ({marks}) GROUP BY state",
            UNDELIVERED,
        )

    counts = dict.fromkeys(UNDELIVERED, 0)
    for state, count in await store.run(body, write=False):
        counts[str(state)] = int(count)
    return counts


def age(moment: datetime, now: datetime) -> str:
    """``moment`` as a short age (``42 s``, ``5 min``, ``3 h``, ``2 d``)."""
    seconds = max(0, int((now - moment).total_seconds()))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def metric_totals(metrics: Metrics) -> dict[str, float]:
    """This process's counters and gauges, summed over their labels (``/metrics`` in brief)."""
    totals: dict[str, float] = {}
    for family in metrics.registry.collect():
        if family.type not in ("counter", "gauge"):
            continue
        values = [
            sample.value
            for sample in family.samples
            if family.type == "gauge" or sample.name.endswith("_total")
        ]
        totals[family.name.removeprefix("chatflow_").replace("_", " ")] = sum(values)
    return totals
