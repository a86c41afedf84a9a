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

Each conversation's due jobs are fired by a task of their own (at most
``MAX_FIRING`` conversations at once), so a conversation whose lock a slow turn
holds never delays another's reminders, and each job's message is queued as
soon as its claim commits. A job that cannot be fired (its next time cannot be
computed, say) is set aside: ``failed``, logged by job id and counted in
``/metrics``, and the other jobs go on. A storage error is not the job's fault:
its conversation is tried again later (the database may come back).

Before a job fires, the person who scheduled it (the job's ``sender``, a digest)
is judged as their own message would be now: revoked or off the allow lists,
the job is cancelled. A ``run_agent`` job's turn is charged to them, and while
they are over ``MAX_TOKENS_PER_SENDER_PER_DAY`` its occurrences are skipped (no
model call; they are told once a day, as for their own messages).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from bot.core.messages import Message, Role
from bot.core.scheduling import (
    SCHEDULED_REF,
    TABLE,
    ensure_jobs_schema_in,
    next_occurrence,
    scheduled_prompt,
)
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.core.waiting import wait_any
from bot.errors import StorageError
from bot.gateway.contract import ChatType, MessageEvent, SessionSource
from bot.gateway.inbox import Inbox, InboxEntry
from bot.gateway.instances import from_epoch
from bot.gateway.keys import chat_type_of
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import Obligation, compute_obligation_id
from bot.metrics import Metrics

if TYPE_CHECKING:
    from bot.gateway.accounting import TokenAccounting

__all__ = ["MAX_FIRING", "POLL_SECONDS", "OwnerCheck", "Scheduler"]

logger = logging.getLogger(__name__)

POLL_SECONDS: Final = 5.0
"""Longest sleep between two reads of the jobs table (jobs other processes added).

Short because it is also how late a job fires when the process that wrote it died
before it was due: a survivor only learns of the job here (like the retry poll)."""
MAX_FIRING: Final = 16
"""Conversations whose due jobs are fired at once (each may wait for its session lock,
holding a lock connection on PostgreSQL)."""
MAX_STORAGE_BACKOFF: Final = 300.0
"""Longest wait before a conversation whose job met a storage error is tried again (the
wait doubles from ``POLL_SECONDS`` with each error of that job). A storage error never
sets a job aside: the database may come back."""

_DROPPED: Final = "dropped"

OwnerCheck = Callable[[str, str, ChatType, "str | None"], Awaitable[bool]]
"""``(platform, chat_id, chat type, sender digest or None)``: whether the person who
scheduled a job is still served (``Gate.admits_owner``)."""


class _NothingToSay(Exception):
    """Rolls a claim's save back: the job was not fired here, so nothing joins the history."""


@dataclass(frozen=True, slots=True)
class _Job:
    """One due occurrence, as read before its claim (only ``state`` and ``due_at`` of a
    row ever change, and the claim's UPDATE is guarded by both)."""

    job_id: str
    due_at: float
    session_key: str
    session_id: str
    platform: str
    chat_id: str
    thread_id: str | None
    text: str
    cron: str | None
    run_agent: bool
    sender: str | None
    timezone: str | None
    traceparent: str | None
    """The scheduling turn's span (tracing on): the firing's trace links to it."""

    @property
    def chat_type(self) -> ChatType:
        return chat_type_of(self.session_key)


@dataclass(frozen=True, slots=True)
class _Skipped:
    """An occurrence not run: its owner is over the token budget (``notice``: the one
    notice of their day, owed to the chat)."""

    notice: Obligation | None


_Outcome = Obligation | InboxEntry | _Skipped | str | None


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
        admit_owner: OwnerCheck | None = None,
        accounting: TokenAccounting | None = None,
        budget_notice: Callable[[], str] | None = None,
        max_firing: int = MAX_FIRING,
    ) -> None:
        """``on_fired`` gets the obligations of fired jobs, ``on_turns`` the inbox
        entries of fired ``run_agent`` jobs (both after their commit, job by job).
        ``admit_owner`` re-screens a job's owner before it fires; ``accounting`` judges
        a ``run_agent`` job's owner against the daily budget (``budget_notice``: what
        they are told, once a day)."""
        if max_firing < 1:
            raise ValueError("max_firing must be at least 1")
        self._store = store
        self._inbox = inbox
        self._on_turns = on_turns
        self._ledger = ledger
        self._metrics = metrics
        self.max_lateness = max_lateness
        self._on_fired = on_fired
        self.poll_seconds = poll_seconds
        self.admit_owner = admit_owner
        """Re-screens a job's owner before it fires (the gateway sets ``Gate.admits_owner``)."""
        self.accounting = accounting
        """Judges a ``run_agent`` job's owner against the daily budget (the gateway sets it)."""
        self.budget_notice = budget_notice
        """What an owner over the budget is told, once a day (the gateway sets it)."""
        self.max_firing = max_firing
        self._wake = asyncio.Event()
        self._firing: dict[str, asyncio.Task[int]] = {}
        """Conversations whose due jobs a task is firing now."""
        self._deferred: dict[str, float] = {}
        """Conversations left until then after a storage error."""
        self._storage_errors: dict[str, int] = {}

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
        """The earliest due time of a scheduled job that no task is firing yet (a
        conversation left after a storage error counts from when it may be tried)."""
        busy = set(self._firing)

        async def body(tx: Transaction) -> list[tuple[Any, ...]]:
            return await tx.fetchall(
                f"SELECT session_id, MIN(due_at) FROM {TABLE} WHERE state = 'scheduled' "
                "GROUP BY session_id ORDER BY MIN(due_at) LIMIT ?",
                (len(busy) + len(self._deferred) + 1,),
            )

        times = [
            max(float(due), self._deferred.get(str(sid), float("-inf")))
            for sid, due in await self._store.run(body, write=False)
            if str(sid) not in busy
        ]
        return min(times, default=None)

    async def fire_due(self) -> int:
        """Fire (or drop) every job due now and wait for it; returns how many were sent."""
        started = await self._start_due()
        return sum(await asyncio.gather(*started)) if started else 0

    async def _start_due(self) -> list[asyncio.Task[int]]:
        """Start a task for each conversation with due jobs that none is firing yet."""
        now = self.now()

        async def due(tx: Transaction) -> list[tuple[Any, ...]]:
            return await tx.fetchall(
                f"SELECT id, due_at, session_id FROM {TABLE} "
                "WHERE state = 'scheduled' AND due_at <= ? ORDER BY due_at, id",
                (now,),
            )

        self._deferred = {sid: at for sid, at in self._deferred.items() if at > now}
        jobs: dict[str, list[tuple[str, float]]] = {}
        for job_id, due_at, session_id in await self._store.run(due, write=False):
            jobs.setdefault(str(session_id), []).append((str(job_id), float(due_at)))
        started: list[asyncio.Task[int]] = []
        for session_id, owed in jobs.items():
            if session_id in self._firing or self._deferred.get(session_id, now) > now:
                continue
            if len(self._firing) >= self.max_firing:
                break
            self._deferred.pop(session_id, None)
            task = asyncio.create_task(self._fire_conversation(session_id, owed))
            self._firing[session_id] = task
            task.add_done_callback(functools.partial(self._done, session_id))
            started.append(task)
        return started

    def _done(self, session_id: str, task: asyncio.Task[int]) -> None:
        if self._firing.get(session_id) is task:
            del self._firing[session_id]
        self._wake.set()  # its conversation may have more due by now; a slot is free

    async def _fire_conversation(self, session_id: str, owed: list[tuple[str, float]]) -> int:
        """Fire one conversation's due jobs in order; each queued as soon as it commits."""
        sent = 0
        for job_id, due_at in owed:
            try:
                outcome = await self._fire(job_id, due_at)
            except Exception as exc:
                if not await self._failed(session_id, job_id, due_at, exc):
                    return sent  # a storage error: the rest of this conversation waits too
                continue
            if isinstance(outcome, Obligation):
                self._on_fired([outcome])
                sent += 1
            elif isinstance(outcome, InboxEntry):
                if self._on_turns is not None:
                    self._on_turns([outcome])
                sent += 1
            elif isinstance(outcome, _Skipped) and outcome.notice is not None:
                self._on_fired([outcome.notice])
        return sent

    async def _failed(self, session_id: str, job_id: str, due_at: float, exc: Exception) -> bool:
        """A job could not be fired: set it aside (``failed``), unless it was a storage
        error (then its conversation waits, longer each time). True if set aside."""
        if isinstance(exc, StorageError):
            tries = self._storage_errors.get(job_id, 0) + 1
            if len(self._storage_errors) >= 4096:
                self._storage_errors.clear()  # jobs cancelled meanwhile: no need to keep them
            self._storage_errors[job_id] = tries
            wait = min(self.poll_seconds * 2 ** (tries - 1), MAX_STORAGE_BACKOFF)
            self._deferred[session_id] = self.now() + wait
            logger.warning(
                "firing scheduled job %s failed (%s); trying again in %.0f s",
                job_id,
                type(exc).__name__,
                wait,
            )
            return False
        self._storage_errors.pop(job_id, None)

        async def body(tx: Transaction) -> int:
            return await tx.execute(
                f"UPDATE {TABLE} SET state = 'failed' "
                "WHERE id = ? AND state = 'scheduled' AND due_at = ?",
                (job_id, due_at),
            )

        try:
            marked = await self._store.run(body)
        except Exception as mark_exc:
            logger.error(
                "scheduled job %s could not be fired (%s) nor set aside (%s)",
                job_id,
                type(exc).__name__,
                type(mark_exc).__name__,
            )
            return True
        if marked:
            self._metrics.scheduled_failed.inc()
            logger.error(
                "scheduled job %s set aside as failed: %s (%s); the other jobs go on",
                job_id,
                type(exc).__name__,
                _reason(exc),
            )
        return True

    async def _read(self, job_id: str, due_at: float) -> _Job | None:
        async def body(tx: Transaction) -> tuple[Any, ...] | None:
            return await tx.fetchone(
                "SELECT session_key, session_id, platform, chat_id, thread_id, text, cron, "
                f"run_agent, sender, timezone, traceparent FROM {TABLE} "
                "WHERE id = ? AND state = 'scheduled' AND due_at = ?",
                (job_id, due_at),
            )

        row = await self._store.run(body, write=False)
        if row is None:
            return None
        key, sid, platform, chat_id, thread_id, text, cron, run_agent, sender, zone, link = row
        return _Job(
            job_id=job_id,
            due_at=due_at,
            session_key=str(key),
            session_id=str(sid),
            platform=str(platform),
            chat_id=str(chat_id),
            thread_id=None if thread_id is None else str(thread_id),
            text=str(text),
            cron=None if cron is None else str(cron),
            run_agent=bool(run_agent),
            sender=None if sender is None else str(sender),
            timezone=None if zone is None else str(zone),
            traceparent=None if link is None else str(link),
        )

    async def _owner_refused(self, job: _Job) -> bool:
        """Cancel ``job`` if the person who scheduled it is no longer served; True then."""
        if self.admit_owner is None or await self.admit_owner(
            job.platform, job.chat_id, job.chat_type, job.sender
        ):
            return False

        async def body(tx: Transaction) -> int:
            return await tx.execute(
                f"UPDATE {TABLE} SET state = 'cancelled' "
                "WHERE id = ? AND state = 'scheduled' AND due_at = ?",
                (job.job_id, job.due_at),
            )

        if await self._store.run(body):
            self._metrics.scheduled_skipped.labels("no access").inc()
            logger.info(
                "scheduled job %s cancelled: the person who scheduled it is no longer served",
                job.job_id,
            )
        return True

    async def _fire(self, job_id: str, due_at: float) -> _Outcome:
        """Claim one occurrence; the obligation (or, for ``run_agent``, the inbox entry)
        it owes, ``"dropped"``, ``_Skipped`` (over budget), or ``None`` when another
        process (or an earlier pass) had it or its owner lost access."""
        job = await self._read(job_id, due_at)
        if job is None or await self._owner_refused(job):
            return None
        now = self.now()
        late = now - due_at
        budget = self.accounting if job.run_agent and job.sender is not None else None

        async def body(tx: Transaction) -> _Outcome:
            # From the schedule's own grid: a late fire does not shift later runs.
            next_at = (
                None
                if job.cron is None
                else next_occurrence(job.cron, max(due_at, now), job.timezone)
            )
            dropped = late > self.max_lateness
            if job.run_agent and self._inbox is None:
                logger.error("scheduled job %s needs a turn but no inbox is set up", job_id)
                dropped = True
            skipped: _Skipped | None = None
            if budget is not None and not dropped:
                verdict = await budget.sender_budget_in(tx, job.sender)
                if verdict.over:
                    skipped = _Skipped(self._notice(job, now) if verdict.notice else None)
            if next_at is not None:
                state, new_due = "scheduled", next_at
            else:
                state, new_due = (_DROPPED if dropped or skipped else "fired"), due_at
            claimed = await tx.execute(
                f"UPDATE {TABLE} SET state = ?, due_at = ?, fired_count = fired_count + ? "
                "WHERE id = ? AND state = 'scheduled' AND due_at = ?",
                (state, new_due, 0 if dropped or skipped else 1, job_id, due_at),
            )
            if claimed != 1:
                return None
            if dropped:
                return _DROPPED
            if skipped is not None:
                if skipped.notice is not None:
                    await self._ledger.record_in(tx, skipped.notice)
                return skipped
            message_ref = f"{SCHEDULED_REF}{job_id}@{due_at!r}"
            if job.run_agent:
                assert self._inbox is not None
                entry = _scheduled_entry(message_ref, job, now)
                accepted = await self._inbox.accept_in(
                    tx, entry.event, session_key=entry.session_key, session_id=entry.session_id
                )
                return entry if accepted else None  # this occurrence was journaled before
            obligation = Obligation.owed(
                obligation_id=compute_obligation_id(job.session_key, message_ref, job.text),
                session_key=job.session_key,
                session_id=job.session_id,
                platform=job.platform,
                chat_id=job.chat_id,
                thread_id=job.thread_id,
                reply_to=None,
                content=job.text,
                message_ref=message_ref,
                traceparent=job.traceparent,
            )
            if not await self._ledger.record_in(tx, obligation):
                return None  # this occurrence was owed before
            return obligation

        outcome = await self._claim(job, late, body)
        self._storage_errors.pop(job_id, None)
        if outcome == _DROPPED:
            self._metrics.scheduled_dropped.inc()
            logger.info(
                "scheduled job %s dropped: %.0f s late, over SCHEDULE_MAX_LATENESS_SECONDS",
                job_id,
                late,
            )
        elif isinstance(outcome, _Skipped):
            self._metrics.scheduled_skipped.labels("over budget").inc()
            self._metrics.over_budget.labels(job.platform).inc()
            logger.info(
                "scheduled job %s skipped: the person who scheduled it is over the daily "
                "token budget",
                job_id,
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

    def _notice(self, job: _Job, now: float) -> Obligation | None:
        """The budget notice owed to the job's chat (once per owner and day)."""
        if self.budget_notice is None:
            return None
        text = self.budget_notice()
        message_ref = f"{SCHEDULED_REF}{job.job_id}@{job.due_at!r}:budget"
        return Obligation.owed(
            obligation_id=compute_obligation_id(job.session_key, message_ref, text),
            session_key=job.session_key,
            session_id=job.session_id,
            platform=job.platform,
            chat_id=job.chat_id,
            thread_id=job.thread_id,
            reply_to=None,
            content=text,
            message_ref=message_ref,
        )

    async def _claim(
        self,
        job: _Job,
        late: float,
        body: Callable[[Transaction], Coroutine[Any, Any, _Outcome]],
    ) -> _Outcome:
        """Run the claim ``body``; a text that goes out also joins its conversation's
        history (as the agent's message, in the same transaction), so the model and
        the console know what was said. A ``run_agent`` job's turn records itself."""
        store = self._store
        if job.run_agent or late > self.max_lateness:
            return await store.run(body)
        outcome: list[_Outcome] = []

        async def claim(tx: Transaction) -> None:
            outcome.append(await body(tx))
            if not isinstance(outcome[-1], Obligation):
                raise _NothingToSay  # not ours, or not sent: leave the history as it was

        async with store.session_lock(job.session_id):
            session = await store.get(job.session_id)
            if session is None:  # the conversation was deleted: the chat still gets it
                return await store.run(body)
            session.add_message(
                Message(role=Role.MODEL, content=job.text, agent=session.active_agent.name)
            )
            with contextlib.suppress(_NothingToSay):
                await store.save(session, also=claim)
        return outcome[-1] if outcome else None

    async def run(self, stopping: asyncio.Event) -> None:
        """Fire jobs as they fall due until ``stopping`` is set."""
        try:
            while not stopping.is_set():
                self._wake.clear()  # before the read: a job committed from here on wakes us
                wait = self.poll_seconds
                try:
                    await self._start_due()
                    next_at = await self.next_due()
                    if next_at is not None and len(self._firing) < self.max_firing:
                        wait = min(wait, max(0.0, next_at - self.now()))
                except Exception:
                    logger.exception("firing scheduled messages failed; trying again later")
                await wait_any(wait, stopping, self._wake)
        finally:
            firing = list(self._firing.values())
            for task in firing:
                task.cancel()  # a claim cancelled mid-transaction rolls back
            await asyncio.gather(*firing, return_exceptions=True)


def _reason(exc: Exception) -> str:
    """A short reason that carries no message text (croniter's say what is wrong)."""
    if type(exc).__module__.startswith("croniter"):
        return str(exc)[:120]
    return "see the job with `python -m bot schedule list`"


def _scheduled_entry(message_ref: str, job: _Job, now: float) -> InboxEntry:
    """The turn a ``run_agent`` job owes, in the job's own session (its stored key and
    id, not one rebuilt from the route): nobody wrote it, so the chat stands in for
    the sender, and the person who scheduled it pays for it (``scheduled_by``)."""
    received_at = from_epoch(now)
    event = MessageEvent(
        platform=job.platform,
        message_id=message_ref,
        source=SessionSource(
            platform=job.platform,
            chat_id=job.chat_id,
            chat_type=job.chat_type,
            sender_id=job.chat_id,
            thread_id=job.thread_id,
        ),
        text=scheduled_prompt(job.text),
        timestamp=received_at,
        scheduled=True,
        scheduled_by=job.sender,
    )
    return InboxEntry(
        event=event,
        session_key=job.session_key,
        session_id=job.session_id,
        received_at=received_at,
        attempts=0,
        link=job.traceparent,
    )
