"""What the console reads: conversations, transcripts, the ledger (read-only SQL).

Every query is one ``store.run(body, write=False)`` over the stores' own
tables (``chatflow_sessions``/``chatflow_messages`` of ``bot.core.sql_store``,
the ledger's of ``bot.gateway.obligations``, the takeover table): no write,
no lock a turn waits on. The conversation list pages by key set
(``updated_at, session_id``), never by offset, so page 2000 costs what page 1 does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from bot.core.memory import Transaction, TransactionalStore
from bot.core.messages import Message, Role
from bot.gateway.obligations import COLUMNS, TABLE, Obligation, decode_row
from bot.gateway.schema import ensure_schema
from bot.gateway.takeover import AGENT_REASON_PREFIX, OPERATOR_NAME, TAKEOVER_TABLE
from bot.metrics import Metrics

__all__ = [
    "PAGE_SIZE",
    "SEARCH_WINDOW",
    "TRANSCRIPT_LIMIT",
    "UNDELIVERED",
    "ConversationRow",
    "TranscriptItem",
    "age",
    "conversation",
    "ledger_counts",
    "ledger_rows",
    "list_conversations",
    "metric_totals",
    "open_schema",
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

_COMPONENT: Final = "console"
_MIGRATIONS: Final = {
    # A transcript reads its conversation's ledger rows: by index, not by a scan that
    # would hold SQLite's one database thread (the message path's) for long.
    1: (f"CREATE INDEX IF NOT EXISTS {TABLE}_session ON {TABLE} (session_id, created_at)",),
}
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

    @property
    def cursor(self) -> str:
        """Key-set cursor of the page after this row."""
        return f"{self.last_activity}|{self.session_id}"


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


def _row(values: tuple[Any, ...]) -> ConversationRow:
    session_id, agent, metadata_json, updated_at, count, reason = values
    try:
        metadata = json.loads(metadata_json)
    except (TypeError, ValueError):
        metadata = {}
    if not isinstance(metadata, dict):
        metadata = {}
    platform = str(metadata.get("platform") or str(session_id).partition("-")[0])
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
    )


_COLUMNS = (
    "SELECT s.session_id, s.active_agent_name, s.metadata_json, s.updated_at, "
    "(SELECT COUNT(*) FROM chatflow_messages m WHERE m.session_id = s.session_id), "
    f"(SELECT t.reason FROM {TAKEOVER_TABLE} t WHERE t.session_id = s.session_id) "
)
_SELECT = _COLUMNS + "FROM chatflow_sessions s"
_ORDER = " ORDER BY s.updated_at DESC, s.session_id DESC"


def _page_sql(conditions: list[str]) -> str:
    """The page: the inner query walks the ``updated_at`` index down and stops at its
    LIMIT (a range plus a sort of ties only, never of every row); the counts run
    for the rows of the page alone."""
    where = " WHERE " + " AND ".join(conditions) if conditions else ""
    inner = (
        "SELECT s.session_id, s.active_agent_name, s.metadata_json, s.updated_at "
        f"FROM chatflow_sessions s{where}{_ORDER} LIMIT ?"
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


async def transcript(
    store: TransactionalStore, session_id: str, *, limit: int = TRANSCRIPT_LIMIT
) -> list[TranscriptItem]:
    """The newest ``limit`` messages of a session, oldest first, replies with their delivery."""

    async def body(tx: Transaction) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        messages = await tx.fetchall(
            "SELECT seq, message_json FROM chatflow_messages WHERE session_id = ? "
            "ORDER BY seq DESC LIMIT ?",
            (session_id, limit),
        )
        owed = await tx.fetchall(
            f"SELECT content, state, maybe_delivered, message_ref, last_error FROM {TABLE} "
            "WHERE session_id = ? ORDER BY created_at",
            (session_id,),
        )
        return messages, owed

    rows, owed = await store.run(body, write=False)
    by_ref = {str(o[3]): o for o in owed}
    unused = list(owed)
    items: list[TranscriptItem] = []
    for seq, message_json in reversed(rows):
        try:
            message = Message.model_validate_json(message_json)
        except ValueError:
            continue
        calls = [
            (call.name, json.dumps(call.arguments, ensure_ascii=False, indent=1))
            for call in message.tool_calls
        ]
        match: tuple[Any, ...] | None = None
        if message.role is Role.MODEL and message.content and not message.tool_calls:
            if message.name == OPERATOR_NAME:
                match = by_ref.get(f"{OPERATOR_NAME}:{message.id}")
            else:
                # A reply's row holds the text as sent: the adapter may prefix it.
                content = message.content
                match = next((o for o in unused if str(o[0]).endswith(content)), None)
            if match is not None and match in unused:
                unused.remove(match)
        delivery = error = None
        if match is not None:
            state = str(match[1])
            delivery = _DELIVERY_LABELS.get(state, state)
            if state == "delivered" and match[2]:
                delivery = "resent with marker"
            error = match[4]
        items.append(TranscriptItem(int(seq), message, delivery, error, calls))
    return items


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
    """Owed, failed and abandoned replies, newest first."""

    async def body(tx: Transaction) -> list[tuple[Any, ...]]:
        marks = ", ".join("?" for _ in UNDELIVERED)
        return await tx.fetchall(
            f"SELECT {COLUMNS} FROM {TABLE} WHERE state IN ({marks}) "
            "ORDER BY created_at DESC, obligation_id LIMIT ?",
            (*UNDELIVERED, limit),
        )

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
