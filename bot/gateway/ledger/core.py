"""The delivery ledger's rows and their life: recording an owed reply, the marks around
one send (attempting, delivered, failed), group-committed delivered marks, fencing.

``LedgerCore`` is the state and the state machine of a ``DeliveryLedger``
(``bot.gateway.ledger``): the store, the owner and liveness, the schema, the
outcomes a storage failure kept out (``record_unrecorded``), and every
transition of one row around one send. A turn's reply is recorded in the turn's
own transaction (tx 2, ``record_in``), so a committed turn always owes its
reply; the send is bracketed by ``mark_attempting`` (unless the row was
recorded ``claimed``) and ``mark_delivered`` or ``mark_failed``. The marks are
best effort: a storage failure is logged and never blocks a reply. Delivered
marks are group-committed (one transaction for all marks buffered meanwhile);
every read of sent ids or states flushes them first. Later status reports of
the platform find their obligation through the sent message ids.

What a restart does with the rows (``bot.gateway.ledger.sweep``) and what the
operator does with them (``bot.gateway.ledger.admin``) build on this class.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, TypeVar, Unpack

from bot.core.sql import Transaction, ensure_schema
from bot.core.stores.base import TransactionalStore, TransactionBody, require_transactional
from bot.errors import StorageError
from bot.gateway.instances import (
    Owner,
    OwnerLiveness,
    ensure_instances_schema,
    is_owner_alive,
    lease_liveness,
    to_epoch,
)
from bot.gateway.ledger.keyboards import ensure_keyboards_schema, record_keyboard_in
from bot.gateway.ledger.obligations import (
    MAX_ATTEMPTS,
    MIGRATIONS,
    RETRY_BACKOFF,
    SENT_TABLE,
    TABLE,
    Obligation,
    OwedFields,
    attachments_json,
    buttons_json,
    clip_error,
)
from bot.tracing import spans

__all__ = ["STORAGE_ERRORS", "DeliveredMark", "LedgerCore"]

# One logger for every ledger module: operators filter on this name.
logger = logging.getLogger("bot.gateway.ledger")

_COMPONENT: Final = "delivery_ledger"

_T = TypeVar("_T")

STORAGE_ERRORS: Final = (StorageError, sqlite3.Error)
"""Storage failures swallowed by the best-effort methods (the store translates
sqlite3 errors into ``StorageError``; the second is belt and braces)."""


_LOOKUP_CHUNK: Final = 500
"""Ids per ``IN (...)`` lookup: under SQLite's smallest limit on bound parameters."""


@dataclass(slots=True)
class DeliveredMark:
    """A successful send waiting for the next group commit of delivered marks."""

    obligation_id: str
    message_ids: list[str]
    platform: str | None
    check: bool
    """Look the row up in the commit: to learn its platform, or for a caller that waits
    to know whether the row exists."""


class _Round:
    """The marks one commit writes; ``done`` resolves after it, ``written`` names the rows."""

    __slots__ = ("done", "marks", "written")

    def __init__(self) -> None:
        self.marks: dict[str, DeliveredMark] = {}
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.written: set[str] = set()


class LedgerCore:
    """The ledger's store, owner and liveness, and every transition of a row around a send."""

    def __init__(
        self,
        store: TransactionalStore,
        *,
        clock: Callable[[], datetime] | None = None,
        owner: Owner | None = None,
        liveness: OwnerLiveness | None = None,
        on_abandoned: Callable[[str], None] | None = None,
    ) -> None:
        """``on_abandoned(platform)`` is called for every row this ledger abandons."""
        self._store = store = require_transactional(store, "the delivery ledger")
        self._on_abandoned = on_abandoned
        # Outcomes of sends that a storage failure kept out of the ledger, retried
        # by ``record_unrecorded``; the rows stay 'attempting' meanwhile, so a
        # crash before they land resends with the marker.
        self._unrecorded: dict[str, Callable[[], Awaitable[bool]]] = {}
        # Group commit of delivered marks: ``_queued`` fills while ``_writing`` commits;
        # one flusher task writes rounds back to back while any are queued (no timer).
        self._queued: _Round | None = None
        self._writing: _Round | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._clock = clock or store.now
        self._owner = owner or Owner.current()
        self._opened = False
        # PostgreSQL: owners hold leases, and updates around a send are fenced by owner.
        self._fenced = store.dialect == "postgres"
        if liveness is None and self._fenced:
            liveness = lease_liveness(store)
        self._liveness = liveness

    @property
    def owner(self) -> Owner:
        """The owner stamped on rows this ledger records or claims."""
        return self._owner

    async def open(self) -> None:
        """Create or migrate the ledger tables; idempotent."""
        async with self._store.transaction() as tx:
            await ensure_schema(tx, _COMPONENT, MIGRATIONS)
            await ensure_keyboards_schema(tx)
            if self._fenced:
                await ensure_instances_schema(tx)  # leases decide who is alive
        self._opened = True

    async def _ensure_open_in(self, tx: Transaction) -> None:
        # Not marked open here: the caller's transaction may still roll back.
        if not self._opened:
            await ensure_schema(tx, _COMPONENT, MIGRATIONS)
            await ensure_keyboards_schema(tx)
            if self._fenced:
                await ensure_instances_schema(tx)

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[Transaction]:
        """A store transaction, the tables created first if ``open`` was not called."""
        if not self._opened:
            await self.open()
        async with self._store.transaction() as tx:
            yield tx

    async def _run(self, body: TransactionBody[_T], *, write: bool = True) -> _T:
        """``store.run(body)``, the tables created first if ``open`` was not called.

        One call on the database thread (it joins the group commit), where a
        ``_tx()`` block costs a round trip per statement: the body may await
        only ``tx``'s methods.
        """
        if not self._opened:
            await self.open()
        return await self._store.run(body, write=write)

    def _now(self, now: datetime | None = None) -> float:
        return to_epoch(now if now is not None else self._clock())

    async def _is_alive(self, owner: Owner) -> bool:
        if owner.pid == self._owner.pid and owner.instance_id == self._owner.instance_id:
            return True
        if self._liveness is not None:
            return await self._liveness(owner)
        return is_owner_alive(owner)

    def _fence(self) -> tuple[str, tuple[str, ...]]:
        """WHERE clause (and parameter) that keeps an update to our own rows on PostgreSQL."""
        if self._fenced:
            return " AND owner_instance = ?", (self._owner.instance_id,)
        return "", ()

    def _abandoned(self, platform: str) -> None:
        if self._on_abandoned is not None:
            self._on_abandoned(platform)

    def _log_storage_failure(self, what: str, obligation_id: str, exc: BaseException) -> None:
        logger.error(
            "delivery ledger could not %s obligation %s (%s: %s); the reply is not held up",
            what,
            obligation_id,
            type(exc).__name__,
            exc,
        )

    # -- group commit of delivered marks ------------------------------------------------

    def _queue_delivered(self, mark: DeliveredMark) -> _Round:
        """Buffer ``mark`` for the next commit (started at once if none is writing)."""
        round_ = self._queued
        if round_ is None:
            round_ = self._queued = _Round()
        earlier = round_.marks.get(mark.obligation_id)
        if earlier is not None:
            mark.check = mark.check or earlier.check
        round_.marks[mark.obligation_id] = mark
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_rounds())
        return round_

    def _buffered(self, obligation_id: str) -> bool:
        return any(
            r is not None and obligation_id in r.marks for r in (self._queued, self._writing)
        )

    async def flush(self) -> None:
        """Commit the delivered marks buffered so far (a failed commit keeps them for
        ``record_unrecorded``); never raises a storage error."""
        round_ = self._queued or self._writing
        if round_ is None:
            return
        if self._flusher is None:  # the last flusher was cancelled with rounds left
            self._flusher = asyncio.get_running_loop().create_task(self._flush_rounds())
        # Shielded: a caller cancelled while waiting must not cancel everyone's commit.
        await asyncio.shield(round_.done)

    async def _flush_rounds(self) -> None:
        try:
            while (round_ := self._queued) is not None:
                self._queued, self._writing = None, round_
                marks = list(round_.marks.values())
                try:
                    round_.written = await self._write_delivered(marks)
                except Exception as exc:
                    self._keep_delivered(marks, exc)
                except BaseException as exc:  # cancelled (the loop is closing): keep them too
                    self._keep_delivered(marks, exc)
                    raise
                else:
                    for mark in marks:
                        self._unrecorded.pop(mark.obligation_id, None)
                finally:
                    self._writing = None
                    if not round_.done.done():
                        round_.done.set_result(None)
        finally:
            self._flusher = None

    def _keep_delivered(self, marks: Iterable[DeliveredMark], exc: BaseException) -> None:
        """Hold marks a failed commit kept out for ``record_unrecorded``; the rows stay
        'attempting', so a crash before they land resends with the marker."""
        marks = list(marks)
        shown = ", ".join(m.obligation_id for m in marks[:5])
        more = f" and {len(marks) - 5} more" if len(marks) > 5 else ""
        self._log_storage_failure("mark delivered", shown + more, exc)
        for mark in marks:
            self._unrecorded[mark.obligation_id] = self._requeue(mark)

    def _requeue(self, mark: DeliveredMark) -> Callable[[], Awaitable[bool]]:
        async def write() -> bool:
            self._queue_delivered(mark)
            return True

        return write

    # -- recording -------------------------------------------------------------

    async def record_in(
        self, tx: Transaction, obligation: Obligation, *, claimed: bool = False
    ) -> bool:
        """Record ``obligation`` (built with ``Obligation.owed``) as owed by this process in ``tx``.

        The one way a row is recorded. Idempotent: an existing row with this id
        (in any state, delivered included) is left untouched. Returns whether a
        row was inserted. Errors propagate, so the turn's transaction rolls
        back with them.

        ``claimed``: recorded already ``attempting`` (one attempt counted) by this
        process, for a caller that sends right after the commit without
        ``mark_attempting``. Until the send's outcome is recorded the row then
        says "may have been sent", so a crash at any point after the commit
        resends with the marker, and a failed outcome write cannot leave a sent
        reply looking unsent.
        """
        await self._ensure_open_in(tx)
        now = self._now()
        me = self._owner
        o = obligation
        if claimed:
            o = o.claimed()
        inserted = await tx.execute(
            f"INSERT INTO {TABLE} (obligation_id, session_key, session_id, platform, chat_id, "
            "thread_id, reply_to, message_ref, content, state, attempts, maybe_delivered, "
            "last_error, owner_pid, owner_instance, owner_started, next_attempt_at, sent_ids, "
            "created_at, fresh_since, updated_at, attachments, buttons, traceparent) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, NULL, ?, ?, ?, NULL, NULL, "
            "?, ?, ?, ?, ?, ?) ON CONFLICT(obligation_id) DO NOTHING",
            (
                o.obligation_id,
                o.session_key,
                o.session_id,
                o.platform,
                o.chat_id,
                o.thread_id,
                o.reply_to,
                o.message_ref,
                o.content,
                o.state,
                o.attempts,
                me.pid,
                me.instance_id,
                me.started,
                now,
                now,
                now,
                attachments_json(o.attachments),
                buttons_json(o.buttons),
                # The span that owes it (tx 2's, a scheduler's): a later resend links to it.
                o.traceparent or spans.traceparent(),
            ),
        )
        if inserted == 1 and o.buttons:
            # Same transaction: a recorded reply always has its keyboard's rows.
            await record_keyboard_in(
                tx,
                keyboard_id=o.obligation_id,
                obligation_id=o.obligation_id,
                platform=o.platform,
                chat_id=o.chat_id,
                thread_id=o.thread_id,
                session_key=o.session_key,
                session_id=o.session_id,
                buttons=o.buttons,
                now=now,
            )
        return inserted == 1

    async def record_obligation_in(self, tx: Transaction, **fields: Unpack[OwedFields]) -> bool:
        """``record_in(tx, Obligation.owed(...))``: the reply recorded ``pending`` in ``tx``.

        Errors propagate, so the turn's transaction rolls back with them.
        """
        return await self.record_in(tx, Obligation.owed(**fields))

    async def record_obligation(self, **fields: Unpack[OwedFields]) -> bool:
        """``record_in`` of a ``pending`` reply in its own transaction; best effort.

        A storage failure is logged and returns ``False`` (the reply is still sent).
        """
        if "traceparent" not in fields:  # read here: the body may run on another thread
            fields["traceparent"] = spans.traceparent()

        async def body(tx: Transaction) -> bool:
            return await self.record_in(tx, Obligation.owed(**fields))

        try:
            return await self._store.run(body)
        except STORAGE_ERRORS as exc:
            self._log_storage_failure("record", fields["obligation_id"], exc)
            return False

    # -- around a send -----------------------------------------------------------

    async def mark_attempting(self, obligation_id: str) -> bool:
        """Move a ``pending``/``failed`` row to ``attempting`` (attempts + 1, owner = us).

        Returns whether the caller should send: ``False`` only when the row
        exists and must not be sent now (delivered, abandoned, already being
        attempted, attempts used up). A missing row or a storage failure is
        logged and returns ``True``: the ledger never blocks a reply. Rows
        returned by ``sweep_recoverable`` and ``due_retries`` are already
        claimed; do not call this for them.
        """
        now = self._now()
        me = self._owner
        fence, fence_params = self._fence()

        async def body(tx: Transaction) -> list[tuple[Any, ...]] | None:
            changed = await tx.execute(
                f"UPDATE {TABLE} SET state = 'attempting', attempts = attempts + 1, "
                "owner_pid = ?, owner_instance = ?, owner_started = ?, "
                "next_attempt_at = NULL, updated_at = ? "
                "WHERE obligation_id = ? AND state IN ('pending', 'failed') AND attempts < ?"
                + fence,
                (
                    me.pid,
                    me.instance_id,
                    me.started,
                    now,
                    obligation_id,
                    MAX_ATTEMPTS,
                    *fence_params,
                ),
            )
            if changed == 1:
                return None
            return await tx.fetchall(
                f"SELECT state, attempts FROM {TABLE} WHERE obligation_id = ?",
                (obligation_id,),
            )

        try:
            rows = await self._run(body)
        except STORAGE_ERRORS as exc:
            self._log_storage_failure("mark attempting", obligation_id, exc)
            return True
        if rows is None:
            return True  # claimed
        if not rows:
            logger.warning("obligation %s is not in the ledger; sending anyway", obligation_id)
            return True
        logger.info(
            "obligation %s not sent: it is %s after %d attempt(s)",
            obligation_id,
            rows[0][0],
            rows[0][1],
        )
        return False

    async def mark_delivered(
        self,
        obligation_id: str,
        message_ids: Sequence[str] = (),
        *,
        platform: str | None = None,
        wait: bool = True,
    ) -> bool:
        """Record a successful send and the platform ids of its parts; best effort.

        The mark is group-committed: it joins the next transaction of delivered
        marks, which writes every mark buffered meanwhile. ``platform`` (the
        obligation's) spares the row lookup. With ``wait`` it returns once
        committed, whether the row was updated (``False`` for a missing row or a
        storage failure, which is logged and retried by ``record_unrecorded``);
        without it returns ``True`` at once, and a crash before the commit leaves
        the row ``attempting``: resent with the marker.
        """
        ids = [str(m) for m in message_ids]
        mark = DeliveredMark(obligation_id, ids, platform, check=wait or platform is None)
        round_ = self._queue_delivered(mark)
        if not wait:
            return True
        await asyncio.shield(round_.done)
        return obligation_id in round_.written

    async def _write_delivered(self, marks: Sequence[DeliveredMark]) -> set[str]:
        """Write ``marks`` in one transaction: one statement for the states, one for the ids.

        Only marks with ``check`` are looked up (one query per chunk); the rest
        come from ``Outbox.send`` for a row it holds, so they are written blind.
        """
        now = self._now()

        async def body(tx: Transaction) -> set[str]:
            known: dict[str, str] = {}
            asked = [m.obligation_id for m in marks if m.check]
            for start in range(0, len(asked), _LOOKUP_CHUNK):
                chunk = asked[start : start + _LOOKUP_CHUNK]
                rows = await tx.fetchall(
                    f"SELECT obligation_id, platform FROM {TABLE} "
                    f"WHERE obligation_id IN ({', '.join('?' * len(chunk))})",
                    chunk,
                )
                known.update((str(r[0]), str(r[1])) for r in rows)
            written: list[tuple[DeliveredMark, str]] = []
            for m in marks:
                if m.check and m.obligation_id not in known:
                    logger.warning("delivered obligation %s is not in the ledger", m.obligation_id)
                    continue
                platform = m.platform if m.platform is not None else known[m.obligation_id]
                written.append((m, platform))
            if written:
                await tx.executemany(
                    f"UPDATE {TABLE} SET state = 'delivered', sent_ids = ?, "
                    "next_attempt_at = NULL, updated_at = ? WHERE obligation_id = ?",
                    [(json.dumps(m.message_ids), now, m.obligation_id) for m, _ in written],
                )
            sent = [(p, i, m.obligation_id) for m, p in written for i in m.message_ids]
            if sent:
                # The chat comes from the row: message ids are only unique per chat.
                await tx.executemany(
                    f"INSERT INTO {SENT_TABLE} (platform, chat_id, message_id, obligation_id) "
                    f"SELECT CAST(? AS TEXT), chat_id, CAST(? AS TEXT), obligation_id FROM {TABLE} "
                    "WHERE obligation_id = ? "
                    "ON CONFLICT(platform, chat_id, message_id) DO NOTHING",
                    sent,
                )
            return {m.obligation_id for m, _ in written}

        return await self._run(body)

    async def mark_failed(
        self,
        obligation_id: str,
        error: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
        ambiguous: bool = False,
    ) -> bool:
        """Record a failed send; best effort.

        - ``retry_after`` given (the platform said "wait"): ``failed``, the
          attempt is refunded, due again after ``retry_after`` seconds;
        - ``retryable``: ``failed``, due after ``RETRY_BACKOFF``; ``abandoned``
          once ``MAX_ATTEMPTS`` attempts are used;
        - otherwise ``abandoned`` (logged with the reason).

        ``ambiguous`` (the send may have arrived) sets ``maybe_delivered`` for
        good, so any resend carries the marker. Returns whether the row was
        updated; a delivered or abandoned row is left as it is.
        """
        if self._buffered(obligation_id):
            await self.flush()  # a delivered mark still buffered decides first, as written
        now = self._now()
        error = clip_error(error)
        fence, fence_params = self._fence()

        async def body(tx: Transaction) -> tuple[bool, str, str, str]:
            """(updated, new state, error, platform) of the row."""
            rows = await tx.fetchall(
                f"SELECT state, attempts, platform FROM {TABLE} WHERE obligation_id = ?",
                (obligation_id,),
            )
            if not rows:
                logger.warning("failed obligation %s is not in the ledger", obligation_id)
                return False, "", error, ""
            state, attempts, platform = str(rows[0][0]), int(rows[0][1]), str(rows[0][2])
            if state in ("delivered", "abandoned"):
                return False, state, error, platform
            maybe = 1 if ambiguous else None
            noted = error
            if retry_after is not None:
                new_state, attempts = "failed", max(attempts - 1, 0)
                next_at: float | None = now + max(float(retry_after), 0.0)
            elif retryable and attempts < MAX_ATTEMPTS:
                delay = RETRY_BACKOFF[min(max(attempts - 1, 0), len(RETRY_BACKOFF) - 1)]
                new_state, next_at = "failed", now + delay
            else:
                new_state, next_at = "abandoned", None
                if retryable:
                    noted = clip_error(f"{error} (gave up after {attempts} attempts)")
            changed = await tx.execute(
                f"UPDATE {TABLE} SET state = ?, attempts = ?, last_error = ?, "
                "next_attempt_at = ?, maybe_delivered = COALESCE(?, maybe_delivered), "
                "updated_at = ? WHERE obligation_id = ? AND state = ?" + fence,
                (
                    new_state,
                    attempts,
                    noted,
                    next_at,
                    maybe,
                    now,
                    obligation_id,
                    state,
                    *fence_params,
                ),
            )
            if changed != 1 and self._fenced:
                logger.info(
                    "obligation %s was taken over by another process; its failure here "
                    "is not recorded",
                    obligation_id,
                )
                return False, state, noted, platform
            return True, new_state, noted, platform

        try:
            updated, new_state, noted, platform = await self._run(body)
        except STORAGE_ERRORS as exc:
            self._log_storage_failure("mark failed", obligation_id, exc)
            self._unrecorded[obligation_id] = lambda: self.mark_failed(
                obligation_id,
                error,
                retryable=retryable,
                retry_after=retry_after,
                ambiguous=ambiguous,
            )
            return False
        self._unrecorded.pop(obligation_id, None)
        if updated and new_state == "abandoned":
            logger.warning("obligation %s abandoned: %s", obligation_id, noted)
            self._abandoned(platform)
        return updated

    async def mark_waiting(self, obligation_id: str, reason: str, *, wait: float) -> bool:
        """Give back a claimed row that was never handed to its platform (it is not
        connected): ``pending`` again, its attempt refunded, due after ``wait``
        seconds, ``reason`` kept for the operator. Not ``failed``: nothing was tried,
        so a later send carries no "resent" marker either. Best effort, like
        ``mark_failed``; returns whether the row was updated."""
        if self._buffered(obligation_id):
            await self.flush()
        now = self._now()
        noted = clip_error(reason)
        fence, fence_params = self._fence()

        async def body(tx: Transaction) -> int:
            return await tx.execute(
                f"UPDATE {TABLE} SET state = 'pending', "
                "attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END, "
                "last_error = ?, next_attempt_at = ?, updated_at = ? "
                "WHERE obligation_id = ? AND state = 'attempting'" + fence,
                (noted, now + max(wait, 0.0), now, obligation_id, *fence_params),
            )

        try:
            changed = await self._run(body)
        except STORAGE_ERRORS as exc:
            self._log_storage_failure("mark waiting", obligation_id, exc)
            self._unrecorded[obligation_id] = lambda: self.mark_waiting(
                obligation_id, reason, wait=wait
            )
            return False
        self._unrecorded.pop(obligation_id, None)
        return changed == 1

    @property
    def unrecorded(self) -> int:
        """Send outcomes waiting to be written (a storage failure kept them out)."""
        return len(self._unrecorded)

    async def record_unrecorded(self) -> int:
        """Write the send outcomes a storage failure kept out; returns how many still wait.

        Delivered marks go back into the buffer and are committed together.
        """
        for obligation_id, write in list(self._unrecorded.items()):
            if self._unrecorded.get(obligation_id) is write:
                del self._unrecorded[obligation_id]
                await write()  # on failure it puts itself back
        await self.flush()
        return len(self._unrecorded)

    # -- platform status reports ------------------------------------------------------

    async def find_by_sent_id(
        self,
        platform_message_id: str,
        *,
        platform: str | None = None,
        chat: tuple[str, str | None] | None = None,
    ) -> str | None:
        """The obligation whose delivery produced ``platform_message_id``.

        ``platform`` narrows the lookup; ``chat`` (chat id, thread id) too, and
        it is required wherever the answer is shown to someone: Telegram numbers
        messages per chat, so an id alone may name another chat's message (a
        WhatsApp wamid is unique). Best effort: ``None`` when unknown or on a
        storage failure. Buffered delivered marks are committed first, so a
        just-sent id is found.
        """
        await self.flush()
        sql = (
            f"SELECT s.obligation_id FROM {SENT_TABLE} s JOIN {TABLE} o "
            "ON o.obligation_id = s.obligation_id WHERE s.message_id = ?"
        )
        params: tuple[str, ...] = (platform_message_id,)
        if platform is not None:
            sql += " AND s.platform = ?"
            params += (platform,)
        if chat is not None:
            chat_id, thread_id = chat
            sql += " AND s.chat_id = ? AND o.chat_id = ?"
            params += (chat_id, chat_id)
            if thread_id is None:
                sql += " AND o.thread_id IS NULL"
            else:
                sql += " AND o.thread_id = ?"
                params += (thread_id,)

        async def body(tx: Transaction) -> list[tuple[object, ...]]:
            return await tx.fetchall(sql + " LIMIT 1", params)

        try:
            rows = await self._run(body, write=False)
        except STORAGE_ERRORS as exc:
            self._log_storage_failure("look up a sent message of", "(any)", exc)
            return None
        return str(rows[0][0]) if rows else None

    async def status_failed(
        self, platform_message_id: str, error: str, *, platform: str | None = None
    ) -> str | None:
        """Log a platform's later "failed" status for a sent message against its obligation.

        The row stays ``delivered`` (the platform accepted the send) but its
        ``last_error`` records the report. Returns the obligation id, or
        ``None`` when the message is not one of ours.
        """
        obligation_id = await self.find_by_sent_id(platform_message_id, platform=platform)
        if obligation_id is None:
            logger.info("failed status for a message the ledger does not know")
            return None
        logger.warning("platform reported obligation %s as not delivered: %s", obligation_id, error)
        note = clip_error(f"platform status failed: {error}")

        async def body(tx: Transaction) -> None:
            await tx.execute(
                f"UPDATE {TABLE} SET last_error = ?, updated_at = ? WHERE obligation_id = ?",
                (note, self._now(), obligation_id),
            )

        try:
            await self._store.run(body)
        except STORAGE_ERRORS as exc:
            self._log_storage_failure("note a failed status of", obligation_id, exc)
        return obligation_id
