"""Fires the jobs agents scheduled (``bot.core.scheduling``): each once, through the ledger.

The database is the truth; the timer is only in this process. The loop reads
the next due time, sleeps until then (or until a turn commits a new job and
wakes it, or a poll interval passes: another process may have added one), and
fires what is due. Each job is fired in one transaction that claims it (an
UPDATE guarded by the state and the due time read, so of several processes on
PostgreSQL exactly one changes the row) and records its ledger obligation
(``pending``, sent through the conversation's lane like any owed reply). The
obligation's ``message_ref`` is the job id and the occurrence's due time, so a
replay computes the same obligation id. The text joins the conversation's history
as the agent's message in that transaction (under the session's lock), so the
model and the console see what was said. A repeating job moves to the
schedule's next time after now (not after the late fire time) in the same
transaction; a one-shot job ends ``fired``.

A ``run_agent`` job owes a turn, not a text: the same transaction journals an
inbox entry instead of the obligation (a synthetic ``MessageEvent`` flagged
``scheduled``, its text behind ``SCHEDULED_MARKER``, its ``message_id`` the job
id and occurrence, so a replay is a dedup hit). It lands in the job's stored
session, runs in that conversation's lane like any accepted message, and its
answer is owed through the turn's commit and the ledger; a crash before that
commit leaves the entry ``received`` and the inbox's recovery runs it at start.

A job found more than ``SCHEDULE_MAX_LATENESS_SECONDS`` late (the bot was down)
is not sent: a one-shot job ends ``dropped``, a repeating one skips to its
next time; both are logged (job id only) and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Final

from bot.core.messages import Message, Role
from bot.core.scheduling import TABLE, ensure_jobs_schema_in, next_occurrence, scheduled_prompt
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.core.waiting import wait_any
from bot.gateway.contract import ChatType, MessageEvent, SessionSource
from bot.gateway.inbox import Inbox, InboxEntry
from bot.gateway.instances import from_epoch
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import Obligation, compute_obligation_id
from bot.metrics import Metrics

__all__ = ["POLL_SECONDS", "Scheduler"]

logger = logging.getLogger(__name__)

POLL_SECONDS: Final = 5.0
"""Longest sleep between two reads of the jobs table (jobs other processes added).

Short because it is also how late a job fires when the process that wrote it died
before it was due: a survivor only learns of the job here (like the retry poll)."""

_DROPPED: Final = "dropped"


class _NothingToSay(Exception):
    """Rolls a claim's save back: the job was not fired here, so nothing joins the history."""


class Scheduler:
    """The in-process timer over ``chatflow_scheduled_jobs``."""

    def __init__(
        self,
        store: TransactionalStore,
        ledger: DeliveryLedger,
        metrics: Metrics,
        *,
        max_lateness: float,
        on_fired: Callable[[list[Obligation]], None],
        poll_seconds: float = POLL_SECONDS,
        inbox: Inbox | None = None,
        on_turns: Callable[[list[InboxEntry]], None] | None = None,
    ) -> None:
        """``on_fired`` gets the obligations of fired jobs, ``on_turns`` the inbox
        entries of fired ``run_agent`` jobs (both after their commit)."""
        self._store = store
        self._inbox = inbox
        self._on_turns = on_turns
        self._ledger = ledger
        self._metrics = metrics
        self.max_lateness = max_lateness
        self._on_fired = on_fired
        self.poll_seconds = poll_seconds
        self._wake = asyncio.Event()

    def now(self) -> float:
        return self._store.now().timestamp()

    async def open(self) -> None:
        """Create or migrate the jobs table (at start, before the bot is ready: nothing
        is written to the database after readiness that a message did not cause, and
        the loop's reads every few seconds need no schema check)."""
        await self._store.run(ensure_jobs_schema_in)

    def wake(self) -> None:
        """A job was committed: read the next due time again."""
        self._wake.set()

    async def next_due(self) -> float | None:
        """The earliest due time of a scheduled job, ``None`` with none."""

        async def body(tx: Transaction) -> tuple[Any, ...] | None:
            return await tx.fetchone(f"SELECT MIN(due_at) FROM {TABLE} WHERE state = 'scheduled'")

        row = await self._store.run(body, write=False)
        return None if row is None or row[0] is None else float(row[0])

    async def fire_due(self) -> int:
        """Fire (or drop) every job due now; returns how many were sent."""

        async def due(tx: Transaction) -> list[tuple[Any, ...]]:
            return await tx.fetchall(
                f"SELECT id, due_at FROM {TABLE} WHERE state = 'scheduled' AND due_at <= ? "
                "ORDER BY due_at, id",
                (self.now(),),
            )

        fired: list[Obligation] = []
        turns: list[InboxEntry] = []
        for job_id, due_at in await self._store.run(due, write=False):
            outcome = await self._fire(str(job_id), float(due_at))
            if isinstance(outcome, Obligation):
                fired.append(outcome)
            elif isinstance(outcome, InboxEntry):
                turns.append(outcome)
        if fired:
            self._on_fired(fired)
        if turns and self._on_turns is not None:
            self._on_turns(turns)
        return len(fired) + len(turns)

    async def _fire(self, job_id: str, due_at: float) -> Obligation | InboxEntry | str | None:
        """Claim one occurrence; the obligation (or, for ``run_agent``, the inbox entry)
        it owes, ``"dropped"``, or ``None`` when another process (or an earlier pass)
        had it."""
        now = self.now()
        late = now - due_at

        async def body(tx: Transaction) -> Obligation | InboxEntry | str | None:
            row = await tx.fetchone(
                "SELECT session_key, session_id, platform, chat_id, thread_id, text, cron, "
                f"run_agent, traceparent FROM {TABLE} "
                "WHERE id = ? AND state = 'scheduled' AND due_at = ?",
                (job_id, due_at),
            )
            if row is None:
                return None
            session_key, session_id, platform, chat_id, thread_id, text, cron, run_agent = row[:8]
            link = None if row[8] is None else str(row[8])  # the scheduling turn's span
            # From the schedule's own grid: a late fire does not shift later runs.
            next_at = None if cron is None else next_occurrence(str(cron), max(due_at, now))
            dropped = late > self.max_lateness
            if run_agent and self._inbox is None:
                logger.error("scheduled job %s needs a turn but no inbox is set up", job_id)
                dropped = True
            if next_at is not None:
                state, new_due = "scheduled", next_at
            else:
                state, new_due = (_DROPPED if dropped else "fired"), due_at
            claimed = await tx.execute(
                f"UPDATE {TABLE} SET state = ?, due_at = ?, fired_count = fired_count + ? "
                "WHERE id = ? AND state = 'scheduled' AND due_at = ?",
                (state, new_due, 0 if dropped else 1, job_id, due_at),
            )
            if claimed != 1:
                return None
            if dropped:
                return _DROPPED
            message_ref = f"schedule:{job_id}@{due_at!r}"
            if run_agent:
                assert self._inbox is not None
                entry = _scheduled_entry(
                    message_ref,
                    str(session_key),
                    str(session_id),
                    str(platform),
                    str(chat_id),
                    None if thread_id is None else str(thread_id),
                    str(text),
                    now,
                )
                entry = dataclasses.replace(entry, link=link)
                accepted = await self._inbox.accept_in(
                    tx, entry.event, session_key=entry.session_key, session_id=entry.session_id
                )
                return entry if accepted else None  # this occurrence was journaled before
            obligation = Obligation.owed(
                obligation_id=compute_obligation_id(str(session_key), message_ref, str(text)),
                session_key=str(session_key),
                session_id=str(session_id),
                platform=str(platform),
                chat_id=str(chat_id),
                thread_id=None if thread_id is None else str(thread_id),
                reply_to=None,
                content=str(text),
                message_ref=message_ref,
                traceparent=link,
            )
            if not await self._ledger.record_in(tx, obligation):
                return None  # this occurrence was owed before
            return obligation

        outcome = await self._claim(job_id, due_at, late, body)
        if outcome == _DROPPED:
            self._metrics.scheduled_dropped.inc()
            logger.info(
                "scheduled job %s dropped: %.0f s late, over SCHEDULE_MAX_LATENESS_SECONDS",
                job_id,
                late,
            )
        elif isinstance(outcome, Obligation):
            self._metrics.scheduled_fired.inc()
            logger.info(
                "scheduled job %s fired (%.0f s late) as %s", job_id, late, outcome.obligation_id
            )
        elif isinstance(outcome, InboxEntry):
            self._metrics.scheduled_fired.inc()
            logger.info("scheduled job %s fired (%.0f s late) as a turn", job_id, late)
        return outcome

    async def _claim(
        self,
        job_id: str,
        due_at: float,
        late: float,
        body: Callable[[Transaction], Coroutine[Any, Any, Obligation | InboxEntry | str | None]],
    ) -> Obligation | InboxEntry | str | None:
        """Run the claim ``body``; a text that goes out also joins its conversation's
        history (as the agent's message, in the same transaction), so the model and
        the console know what was said. A ``run_agent`` job's turn records itself."""
        store = self._store

        async def peek(tx: Transaction) -> tuple[Any, ...] | None:
            return await tx.fetchone(
                f"SELECT session_id, text, run_agent FROM {TABLE} "
                "WHERE id = ? AND state = 'scheduled' AND due_at = ?",
                (job_id, due_at),
            )

        row = await store.run(peek, write=False)
        if row is None or bool(row[2]) or late > self.max_lateness:
            return await store.run(body)
        session_id, text = str(row[0]), str(row[1])
        outcome: list[Obligation | InboxEntry | str | None] = []

        async def claim(tx: Transaction) -> None:
            outcome.append(await body(tx))
            if not isinstance(outcome[-1], Obligation):
                raise _NothingToSay  # not ours, or not sent: leave the history as it was

        async with store.session_lock(session_id):
            session = await store.get(session_id)
            if session is None:  # the conversation was deleted: the chat still gets it
                return await store.run(body)
            session.add_message(
                Message(role=Role.MODEL, content=text, agent=session.active_agent.name)
            )
            with contextlib.suppress(_NothingToSay):
                await store.save(session, also=claim)
        return outcome[-1] if outcome else None

    async def run(self, stopping: asyncio.Event) -> None:
        """Fire jobs as they fall due until ``stopping`` is set."""
        while not stopping.is_set():
            self._wake.clear()  # before the read: a job committed from here on wakes us
            wait = self.poll_seconds
            try:
                await self.fire_due()
                next_at = await self.next_due()
                if next_at is not None:
                    wait = min(wait, max(0.0, next_at - self.now()))
            except Exception:
                logger.exception("firing scheduled messages failed; trying again later")
            await wait_any(wait, stopping, self._wake)


def _chat_type(session_key: str) -> ChatType:
    """The chat type a session key was built for (``agent:main:<platform>:<type>:...``)."""
    parts = session_key.split(":")
    kind = parts[3] if len(parts) > 3 else ""
    return "group" if kind == "group" else "channel" if kind == "channel" else "dm"


def _scheduled_entry(
    message_ref: str,
    session_key: str,
    session_id: str,
    platform: str,
    chat_id: str,
    thread_id: str | None,
    text: str,
    now: float,
) -> InboxEntry:
    """The turn a ``run_agent`` job owes, in the job's own session (its stored key and
    id, not one rebuilt from the route): nobody wrote it, so the chat stands in for
    the sender."""
    received_at = from_epoch(now)
    event = MessageEvent(
        platform=platform,
        message_id=message_ref,
        source=SessionSource(
            platform=platform,
            chat_id=chat_id,
            chat_type=_chat_type(session_key),
            sender_id=chat_id,
            thread_id=thread_id,
        ),
        text=scheduled_prompt(text),
        timestamp=received_at,
        scheduled=True,
    )
    return InboxEntry(
        event=event,
        session_key=session_key,
        session_id=session_id,
        received_at=received_at,
        attempts=0,
    )
