"""The operator's view of scheduled messages: list them and cancel one.

``python -m bot schedule`` and the console's "Scheduled" page read and change
``chatflow_scheduled_jobs`` through these two functions, in the bot's own
database, whether a bot is running or not. A cancel is one guarded UPDATE
(only a job still ``scheduled``); the scheduler's claim is guarded by the same
state inside its own transaction, so a job cancelled here is never fired after.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from bot.core.scheduling import TABLE, ensure_jobs_schema_in
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.gateway.operator_send import SendTarget

__all__ = ["CancelOutcome", "ScheduledJob", "cancel_job", "scheduled_jobs"]

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
