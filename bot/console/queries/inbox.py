"""The conversation list and the inbox of conversations a person answers: key-set pages,
one line per conversation, and the operators' read mark (``mark_read``, the console's one
write). What a line shows besides (its last message, its unread count) is read by
correlated subqueries for the page's rows alone."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bot.console.queries.common import (
    ATTENTION_LIMIT,
    PAGE_SIZE,
    PREVIEW_CHARS,
    READS_TABLE,
    SEARCH_WINDOW,
    ConversationState,
    _like,
    _name,
    _one_line,
    part_label,
    platform_label,
)
from bot.core.messages import Message, Role
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.gateway.takeover import AGENT_REASON_PREFIX, OPERATOR_NAME, TAKEOVER_TABLE

__all__ = [
    "ConversationRow",
    "conversation",
    "conversations_by_id",
    "list_conversations",
    "mark_read",
    "needing_a_person",
]


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


def _chat_kind(metadata: dict[str, Any]) -> str:
    key = str(metadata.get("session_key", ""))
    if ":topic:" in key:
        return "topic"
    kind = str(metadata.get("chat_type", ""))
    if kind == "dm":
        return "DM"
    return kind or "?"


def _display_name(metadata: dict[str, Any], platform: str) -> str | None:
    if platform == "web":  # every test chat's sender is the operator: no name of its own
        return None
    if platform == "console":
        # The terminal's user is "you" to the terminal, not to the operator reading the
        # inbox, whose own messages read "You:" there (N19).
        return "Terminal user"
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
