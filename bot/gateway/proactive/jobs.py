"""The operator's view of scheduled messages: list them and cancel one; and the jobs
of a conversation or of a person cancelled with them.

``python -m bot schedule`` and the console's "Scheduled" page read and change
``chatflow_scheduled_jobs`` through these functions, in the bot's own
database, whether a bot is running or not. A cancel is one guarded UPDATE
(only a job still ``scheduled``); the scheduler's claim is guarded by the same
state inside its own transaction, so a job cancelled here is never fired after.

``cancel_jobs`` (``cancel_jobs_in`` inside a transaction) is the one way the rest
of the bot stops jobs that lost their reason to exist: ``/reset`` and ``sessions
reset`` cancel the conversation's jobs, ``sessions delete`` erases them (their
text and raw chat id go with the conversation), ``pairing revoke`` cancels the
revoked person's jobs in every chat, and a command that forgets a person calls it
with their sender digest (``erase=True``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from bot.core.ids import log_session_id
from bot.core.scheduling import TABLE, ensure_jobs_schema_in
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.gateway.proactive.operator_send import SendTarget

__all__ = [
    "CancelOutcome",
    "ScheduledJob",
    "cancel_job",
    "cancel_jobs",
    "cancel_jobs_in",
    "scheduled_jobs",
]

logger = logging.getLogger(__name__)

CancelOutcome = Literal["cancelled", "unknown", "fired", "dropped", "already cancelled"]
"""What ``cancel_job`` did: only ``"cancelled"`` changed the row."""


@dataclass(frozen=True, slots=True)
class ScheduledJob:
    """A job still waiting to be sent."""

    job_id: str
    due_at: datetime
    cron: str | None
    platform: str
    session_id: str
    """The conversation's log ref (hashed): what a listing shows instead of the chat id."""
    chat_id: str
    thread_id: str | None
    text: str


async def scheduled_jobs(
    store: TransactionalStore,
    *,
    target: SendTarget | None = None,
    session_id: str | None = None,
) -> list[ScheduledJob]:
    """Jobs in state ``scheduled``, soonest first; only ``target``'s chat (and thread) or
    ``session_id``'s conversation when given."""
    where, params = "state = 'scheduled'", []
    if target is not None:
        where += " AND platform = ? AND chat_id = ?"
        params += [target.platform, target.chat_id]
        if target.thread_id is None:
            where += " AND thread_id IS NULL"
        else:
            where += " AND thread_id = ?"
            params.append(target.thread_id)
    if session_id is not None:
        where += " AND session_id = ?"
        params.append(session_id)

    async def body(tx: Transaction) -> list[tuple[Any, ...]]:
        await ensure_jobs_schema_in(tx)  # a database no bot has run on yet
        return await tx.fetchall(
            "SELECT id, due_at, cron, platform, session_id, chat_id, thread_id, text "
            f"FROM {TABLE} WHERE {where} ORDER BY due_at, id",
            tuple(params),
        )

    return [
        ScheduledJob(
            job_id=str(job_id),
            due_at=datetime.fromtimestamp(float(due_at), UTC),
            cron=None if cron is None else str(cron),
            platform=str(platform),
            session_id=str(sid),
            chat_id=str(chat_id),
            thread_id=None if thread_id is None else str(thread_id),
            text=str(text),
        )
        for job_id, due_at, cron, platform, sid, chat_id, thread_id, text in await store.run(body)
    ]


async def cancel_job(store: TransactionalStore, job_id: str) -> CancelOutcome:
    """Cancel ``job_id`` if it is still ``scheduled``; otherwise say why not."""

    async def body(tx: Transaction) -> CancelOutcome:
        await ensure_jobs_schema_in(tx)
        changed = await tx.execute(
            f"UPDATE {TABLE} SET state = 'cancelled' WHERE id = ? AND state = 'scheduled'",
            (job_id,),
        )
        if changed == 1:
            return "cancelled"
        row = await tx.fetchone(f"SELECT state FROM {TABLE} WHERE id = ?", (job_id,))
        if row is None:
            return "unknown"
        state = str(row[0])
        if state == "fired":
            return "fired"
        if state == "dropped":
            return "dropped"
        return "already cancelled"

    outcome = await store.run(body)
    if outcome == "cancelled":
        logger.info("scheduled job %s cancelled by the operator", job_id)
    return outcome


async def cancel_jobs_in(
    tx: Transaction,
    *,
    session_id: str | None = None,
    platform: str | None = None,
    sender: str | None = None,
    erase: bool = False,
) -> int:
    """Cancel, inside ``tx``, the waiting jobs of the conversation ``session_id`` or of the
    person ``sender`` (their ``sender_digest`` on ``platform``: the jobs they scheduled,
    in any chat); returns how many were waiting.

    ``erase=True`` deletes their rows instead, in every state (fired and cancelled
    ones too): nothing of their texts or chat ids stays (``sessions delete``, forget).
    """
    if (session_id is None) == (sender is None) or (sender is not None and platform is None):
        raise ValueError("give session_id, or platform and sender")
    await ensure_jobs_schema_in(tx)
    where, params = (
        ("session_id = ?", (session_id,))
        if session_id is not None
        else ("platform = ? AND sender = ?", (platform, sender))
    )
    if not erase:
        return await tx.execute(
            f"UPDATE {TABLE} SET state = 'cancelled' WHERE {where} AND state = 'scheduled'",
            params,
        )
    row = await tx.fetchone(
        f"SELECT COUNT(*) FROM {TABLE} WHERE {where} AND state = 'scheduled'", params
    )
    await tx.execute(f"DELETE FROM {TABLE} WHERE {where}", params)
    return 0 if row is None else int(row[0])


async def cancel_jobs(
    store: TransactionalStore,
    *,
    session_id: str | None = None,
    platform: str | None = None,
    sender: str | None = None,
    erase: bool = False,
    why: str = "removed",
) -> int:
    """``cancel_jobs_in`` in a transaction of its own; logs how many (``why``: the
    reason, e.g. "reset"), never the texts or the chat."""

    async def body(tx: Transaction) -> int:
        return await cancel_jobs_in(
            tx, session_id=session_id, platform=platform, sender=sender, erase=erase
        )

    count = await store.run(body)
    if count:
        # The session id carries the chat's raw id: hashed for the log, as everywhere.
        whose = (
            f"session {log_session_id(session_id)}"
            if session_id is not None
            else f"a {platform} sender"
        )
        logger.info("%d scheduled job(s) of %s cancelled: %s", count, whose, why)
    return count
