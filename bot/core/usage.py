"""Token accounting: the usage of every model call, one row per call, in the database.

A turn records its calls (chat, transcription, compaction) in its own
transaction (tx 2), so a committed turn has its tokens and a rolled-back one
does not; the gateway records a failed turn's calls in a small transaction of
their own, since the provider billed them anyway. Rows carry the session, the
agent, the kind of call, the model, the sender (the same HMAC digest access
control stores, never a raw id), the UTC day and the four counts the provider
reported (prompt, cached prompt, completion, reasoning). Nothing is estimated:
a call whose provider reported no usage records zeros.

The table is its own schema component (``usage``). ``ensure_usage_schema_in``
creates it; it is called at start by the gateway, and ``record_usage_in``
calls it too (a cheap version read, the migration lock only when the table
is missing), so a caller that never opened it still records.

The per-sender daily sums (``sender_tokens_on``) read the same table, so the
token budget (``MAX_TOKENS_PER_SENDER_PER_DAY``) is shared by every process
on one PostgreSQL database.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Final

from bot.core.models.base import Usage
from bot.core.sql import VERSIONS_TABLE, Transaction, ensure_schema

__all__ = [
    "CALL_KINDS",
    "COMPONENT",
    "MIGRATIONS",
    "TABLE",
    "CallUsage",
    "UsageRow",
    "UsageTotals",
    "daily_totals_in",
    "ensure_usage_schema_in",
    "record_usage_in",
    "sender_tokens_on",
    "session_sender_in",
    "session_totals_in",
    "usage_day",
]

logger = logging.getLogger(__name__)

TABLE: Final = "chatflow_usage"
"""One row per recorded model call."""
COMPONENT: Final = "usage"
"""The usage table's row in ``chatflow_schema_versions``."""
MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {TABLE} ("
        "id INTEGER PRIMARY KEY, "
        "session_id TEXT NOT NULL, "
        "agent TEXT NOT NULL, "
        "kind TEXT NOT NULL, "
        "model TEXT, "
        "sender TEXT, "
        "day TEXT NOT NULL, "
        "prompt_tokens INTEGER NOT NULL DEFAULT 0, "
        "cached_prompt_tokens INTEGER NOT NULL DEFAULT 0, "
        "completion_tokens INTEGER NOT NULL DEFAULT 0, "
        "reasoning_tokens INTEGER NOT NULL DEFAULT 0, "
        "created_at REAL NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_day ON {TABLE} (day, agent)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_session ON {TABLE} (session_id)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_sender ON {TABLE} (sender, day)",
    ),
}
"""``MIGRATIONS[v]`` moves the usage table from version ``v - 1`` to ``v`` (SQLite DDL)."""

_TARGET: Final = max(MIGRATIONS)

CALL_KINDS: Final = ("chat", "transcription", "compaction")
"""What a recorded call was for: a turn's answer, a voice note's transcript, a summary."""


@dataclass(frozen=True, slots=True)
class CallUsage:
    """One model call's usage, with what it is recorded under."""

    kind: str
    """``"chat"``, ``"transcription"`` or ``"compaction"`` (``CALL_KINDS``)."""
    model: str | None
    """The model the call went to (``None`` when unknown)."""
    agent: str
    """The agent it was made for (a transcription: the conversation's starting agent)."""
    usage: Usage
    """The tokens the provider reported."""


def usage_day(moment: datetime) -> str:
    """The UTC day of ``moment`` as ``YYYY-MM-DD`` (a naive ``moment`` is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).date().isoformat()


async def ensure_usage_schema_in(tx: Transaction) -> None:
    """Create or migrate the usage table inside ``tx``.

    Reads the recorded version first, without the migration lock: a turn's
    transaction then costs one small read, and only a database without the
    table (or with an older one) takes the lock and migrates.
    """
    try:
        row = await tx.fetchone(
            f"SELECT version FROM {VERSIONS_TABLE} WHERE component = ?", (COMPONENT,)
        )
    except Exception:  # no versions table yet (PostgreSQL aborts the tx: re-raised)
        if tx.dialect == "postgres":
            raise
        row = None
    if row is not None and int(row[0]) == _TARGET:
        return
    await ensure_schema(tx, COMPONENT, MIGRATIONS)


async def session_sender_in(tx: Transaction, session_id: str) -> str | None:
    """The sender of the session's latest recorded call that had one (``None``: none).

    Calls no message caused (a compaction) are charged to this sender: the person
    whose conversation it is, or in a shared group conversation the last to speak.
    """
    await ensure_usage_schema_in(tx)
    row = await tx.fetchone(
        f"SELECT sender FROM {TABLE} WHERE session_id = ? AND sender IS NOT NULL "
        "ORDER BY id DESC LIMIT 1",
        (session_id,),
    )
    return None if row is None else str(row[0])


async def record_usage_in(
    tx: Transaction,
    *,
    session_id: str,
    agent: str,
    kind: str,
    model: str | None,
    usage: Usage,
    sender: str | None = None,
    at: datetime | None = None,
    schema_ready: bool = False,
) -> None:
    """Record one model call's ``usage`` inside ``tx`` (it commits or rolls back with it).

    ``kind`` says what the call was for (``"chat"``, ``"transcription"``,
    ``"compaction"``); ``model`` is the model name the call went to (``None``
    when unknown); ``sender`` is the sender's key as access control stores it
    (an HMAC digest, never a raw id), ``None`` for calls no sender caused;
    ``at`` is when the call was made (now by default): its UTC day is the row's.
    ``schema_ready``: the caller made sure of the table at its start (a read saved
    in every turn's transaction).
    """
    if not schema_ready:
        await ensure_usage_schema_in(tx)
    moment = at or datetime.now(UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    await tx.execute(
        f"INSERT INTO {TABLE} (session_id, agent, kind, model, sender, day, prompt_tokens, "
        "cached_prompt_tokens, completion_tokens, reasoning_tokens, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            session_id,
            agent,
            kind,
            model,
            sender,
            usage_day(moment),
            usage.input_tokens,
            usage.cached_input_tokens,
            usage.output_tokens,
            usage.reasoning_tokens,
            moment.timestamp(),
        ),
    )


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """Summed token counts (of a conversation, an agent's day, ...)."""

    prompt: int = 0
    """Prompt tokens (cached ones included)."""
    cached_prompt: int = 0
    """Of ``prompt``, those the provider served from its prompt cache."""
    completion: int = 0
    """Completion tokens (reasoning included, as providers count them)."""
    reasoning: int = 0
    """Of ``completion``, the reasoning tokens, where the provider reports them."""
    calls: int = 0
    """Model calls summed."""

    @property
    def total(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt + self.completion

    def __add__(self, other: UsageTotals) -> UsageTotals:
        return UsageTotals(
            self.prompt + other.prompt,
            self.cached_prompt + other.cached_prompt,
            self.completion + other.completion,
            self.reasoning + other.reasoning,
            self.calls + other.calls,
        )

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> UsageTotals:
        """From ``(prompt, cached, completion, reasoning, calls)`` sums (``NULL`` as 0)."""
        prompt, cached, completion, reasoning, calls = (int(value or 0) for value in row[:5])
        return cls(prompt, cached, completion, reasoning, calls)


_SUMS: Final = (
    "COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(cached_prompt_tokens), 0), "
    "COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(reasoning_tokens), 0), COUNT(*)"
)


async def session_totals_in(tx: Transaction, session_id: str) -> dict[str | None, UsageTotals]:
    """The summed usage of one conversation, by model (empty when nothing was recorded)."""
    await ensure_usage_schema_in(tx)
    rows = await tx.fetchall(
        f"SELECT model, {_SUMS} FROM {TABLE} WHERE session_id = ? GROUP BY model ORDER BY model",
        (session_id,),
    )
    return {row[0]: UsageTotals.from_row(row[1:]) for row in rows}


@dataclass(frozen=True, slots=True)
class UsageRow:
    """The summed usage of one agent's calls to one model on one UTC day."""

    day: str
    """``YYYY-MM-DD`` (UTC)."""
    agent: str
    """The agent the calls were made for."""
    model: str | None
    """The model they went to."""
    totals: UsageTotals
    """Their sums."""


async def daily_totals_in(tx: Transaction, since: str | None = None) -> list[UsageRow]:
    """Usage per UTC day, agent and model, oldest first; from the day ``since``
    (``YYYY-MM-DD``) on, or all of it."""
    await ensure_usage_schema_in(tx)
    where, params = ("WHERE day >= ? ", (since,)) if since is not None else ("", ())
    rows = await tx.fetchall(
        f"SELECT day, agent, model, {_SUMS} FROM {TABLE} {where}"
        "GROUP BY day, agent, model ORDER BY day, agent, model",
        params,
    )
    return [UsageRow(str(r[0]), str(r[1]), r[2], UsageTotals.from_row(r[3:])) for r in rows]


async def sender_tokens_on(tx: Transaction, sender: str, day: date | str) -> int:
    """Prompt plus completion tokens recorded for ``sender`` on the UTC ``day``."""
    await ensure_usage_schema_in(tx)
    key = day if isinstance(day, str) else day.isoformat()
    row = await tx.fetchone(
        f"SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) FROM {TABLE} "
        "WHERE sender = ? AND day = ?",
        (sender, key),
    )
    return 0 if row is None else int(row[0] or 0)
