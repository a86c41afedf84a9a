"""The delivery ledger: every final reply is an obligation until it is delivered.

A turn's reply is recorded ``pending`` in the turn's own transaction (tx 2,
``record_obligation_in``), so a committed turn always owes its reply. The
gateway then brackets the send with ``mark_attempting`` and ``mark_delivered``
or ``mark_failed``. A process that dies mid-send leaves rows whose owner is
dead; ``sweep_recoverable`` at the next start claims them (one guarded UPDATE
per row, so of two racing processes only one wins a row) and hands them back
for a resend, with ``needs_marker`` when the earlier send may have arrived.

States: ``pending`` -> ``attempting`` -> ``delivered``; ``attempting`` ->
``failed`` (retry later) or ``abandoned`` (given up, reason logged).
``abandoned`` is terminal except for the operator's ``retry``.

The ledger is best effort around the send: a storage failure in ``mark_*`` is
logged and never blocks a reply. Only ``record_obligation_in`` raises, because
it is part of the turn's transaction.

The owner of a row is ``(pid, instance id)``; the instance id is new in every
process, so a restarted process that got the same pid (PID 1 in a container)
still sees the old owner as dead. On SQLite (one host) liveness of another pid
is checked with ``os.kill(pid, 0)`` and, on Linux, the process start time,
which catches an unrelated program that reused the pid. On PostgreSQL (several
processes, several hosts) an owner is alive iff its lease in
``chatflow_instances`` has not expired (``bot.gateway.instances``), and the
updates a process makes around its own sends are guarded by owner, so a
process that stalled past its lease cannot undo the work of the one that took
its rows over.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

from bot.core.memory import BaseSessionStore, Transaction
from bot.errors import StorageError
from bot.gateway.instances import (
    Owner,
    OwnerLiveness,
    ensure_instances_schema,
    is_owner_alive,
    lease_liveness,
)
from bot.gateway.instances import _process_start_ticks as _process_start_ticks
from bot.gateway.schema import ensure_schema

__all__ = [
    "MAX_ATTEMPTS",
    "RECOVERED_MARKER",
    "RETENTION",
    "RETRY_BACKOFF",
    "STALE_AFTER",
    "DeliveryLedger",
    "Obligation",
    "ObligationState",
    "Owner",
    "OwnerLiveness",
    "compute_obligation_id",
    "is_owner_alive",
]

logger = logging.getLogger(__name__)

ObligationState = Literal["pending", "attempting", "delivered", "failed", "abandoned"]
STATES: Final[tuple[ObligationState, ...]] = (
    "pending",
    "attempting",
    "delivered",
    "failed",
    "abandoned",
)

RECOVERED_MARKER: Final = "↻ Resent after a restart (you may have seen this already):\n\n"
"""Prefix of a resent reply that may repeat one the user already got."""
MAX_ATTEMPTS: Final = 3
"""Send attempts per obligation; past it the row is abandoned."""
STALE_AFTER: Final = timedelta(hours=24)
"""An owed reply older than this is abandoned instead of sent."""
RETENTION: Final = timedelta(days=7)
"""Delivered and abandoned rows are pruned after this long."""
RETRY_BACKOFF: Final[tuple[float, ...]] = (30.0, 120.0)
"""Seconds before retry n (n = attempts made, the last value repeats)."""

_COMPONENT = "delivery_ledger"
_TABLE = "chatflow_delivery_obligations"
_SENT = "chatflow_delivery_sent"
_BATCH = 100
_MAX_ERROR_LEN = 500
_MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {_TABLE} ("
        "obligation_id TEXT PRIMARY KEY NOT NULL, "
        "session_key TEXT NOT NULL, "
        "session_id TEXT NOT NULL, "
        "platform TEXT NOT NULL, "
        "chat_id TEXT NOT NULL, "
        "thread_id TEXT, "
        "reply_to TEXT, "
        "message_ref TEXT NOT NULL, "
        "content TEXT NOT NULL, "
        "state TEXT NOT NULL CHECK (state IN "
        "('pending', 'attempting', 'delivered', 'failed', 'abandoned')), "
        "attempts INTEGER NOT NULL DEFAULT 0, "
        "maybe_delivered INTEGER NOT NULL DEFAULT 0, "
        "last_error TEXT, "
        "owner_pid INTEGER NOT NULL, "
        "owner_instance TEXT NOT NULL, "
        "owner_started INTEGER, "
        "next_attempt_at REAL, "
        "sent_ids TEXT, "
        "created_at REAL NOT NULL, "
        "fresh_since REAL NOT NULL, "
        "updated_at REAL NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {_TABLE}_state_next ON {_TABLE} (state, next_attempt_at)",
        f"CREATE INDEX IF NOT EXISTS {_TABLE}_platform_state ON {_TABLE} (platform, state)",
        f"CREATE INDEX IF NOT EXISTS {_TABLE}_state_updated ON {_TABLE} (state, updated_at)",
        f"CREATE TABLE IF NOT EXISTS {_SENT} ("
        "platform TEXT NOT NULL, "
        "message_id TEXT NOT NULL, "
        "obligation_id TEXT NOT NULL, "
        "PRIMARY KEY (platform, message_id))",
        f"CREATE INDEX IF NOT EXISTS {_SENT}_obligation ON {_SENT} (obligation_id)",
    ),
}
_COLUMNS = (
    "obligation_id, session_key, session_id, platform, chat_id, thread_id, reply_to, "
    "content, state, attempts, last_error, created_at, maybe_delivered, message_ref, "
    "next_attempt_at, sent_ids, owner_pid, owner_instance, owner_started, fresh_since"
)
# Storage failures swallowed by the best-effort methods (the store translates
# sqlite3 errors into StorageError; the second is belt and braces).
_STORAGE_ERRORS: Final = (StorageError, sqlite3.Error)


def compute_obligation_id(session_key: str, message_ref: str, content: str) -> str:
    """Stable id: the same turn with the same content re-records idempotently,
    while different threads of one chat never collide."""
    payload = f"{session_key}|{message_ref}|{content}"
    return hashlib.sha256(payload.encode("utf-8", "replace")).hexdigest()[:24]


# -- owners -------------------------------------------------------------------

_NOBODY: Final = Owner(0, "")
"""Owner of rows the operator re-queued: nobody, so any sweep may claim them."""


# -- obligations --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Obligation:
    """One reply owed to a chat."""

    obligation_id: str
    """``compute_obligation_id(session_key, message_ref, content)``."""
    session_key: str
    """Session key of the conversation."""
    session_id: str
    """Session id of the conversation."""
    platform: str
    """Adapter that must send it."""
    chat_id: str
    """Raw platform chat id to send to."""
    thread_id: str | None
    """Topic or thread to send into."""
    reply_to: str | None
    """Platform message id the reply quotes."""
    content: str
    """The reply text, without any marker."""
    state: ObligationState
    """Ledger state when this object was read."""
    attempts: int
    """Send attempts counted so far (the claim that returned it included)."""
    last_error: str | None
    """Why the last attempt failed, or why it was abandoned."""
    created_at: datetime
    """When it was recorded (UTC)."""
    needs_marker: bool
    """True when an earlier send may have arrived: resend with ``RECOVERED_MARKER``."""
    maybe_delivered: bool = False
    """An earlier attempt failed ambiguously (it may have reached the user)."""
    message_ref: str = ""
    """Inbound message id the reply answers."""
    next_attempt_at: datetime | None = None
    """When a failed row becomes due for a retry."""
    sent_ids: tuple[str, ...] = ()
    """Platform message ids of the delivered parts."""

    @classmethod
    def owed(
        cls,
        *,
        obligation_id: str,
        session_key: str,
        session_id: str,
        platform: str,
        chat_id: str,
        thread_id: str | None,
        reply_to: str | None,
        content: str,
        message_ref: str,
    ) -> Obligation:
        """A reply just owed: ``pending``, no attempt yet, created now."""
        return cls(
            obligation_id=obligation_id,
            session_key=session_key,
            session_id=session_id,
            platform=platform,
            chat_id=chat_id,
            thread_id=thread_id,
            reply_to=reply_to,
            content=content,
            state="pending",
            attempts=0,
            last_error=None,
            created_at=datetime.now(UTC),
            needs_marker=False,
            message_ref=message_ref,
        )

    @property
    def outgoing_text(self) -> str:
        """The text to send: ``content``, prefixed by ``RECOVERED_MARKER`` if ``needs_marker``."""
        return RECOVERED_MARKER + self.content if self.needs_marker else self.content


def _epoch(moment: datetime) -> float:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _dt(value: Any) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(float(value), UTC)


def _clip(error: str) -> str:
    return error if len(error) <= _MAX_ERROR_LEN else error[: _MAX_ERROR_LEN - 1] + "…"


@dataclass(frozen=True, slots=True)
class _Row:
    """A row as read, with the stamps a guarded UPDATE compares against."""

    obligation: Obligation
    owner: Owner
    fresh_since: float


def _row(values: Sequence[Any], *, needs_marker: bool | None = None) -> _Row:
    (
        obligation_id,
        session_key,
        session_id,
        platform,
        chat_id,
        thread_id,
        reply_to,
        content,
        state,
        attempts,
        last_error,
        created_at,
        maybe_delivered,
        message_ref,
        next_attempt_at,
        sent_ids,
        owner_pid,
        owner_instance,
        owner_started,
        fresh_since,
    ) = values
    created = _dt(created_at)
    assert created is not None
    obligation = Obligation(
        obligation_id=str(obligation_id),
        session_key=str(session_key),
        session_id=str(session_id),
        platform=str(platform),
        chat_id=str(chat_id),
        thread_id=thread_id,
        reply_to=reply_to,
        content=str(content),
        state=state,
        attempts=int(attempts),
        last_error=last_error,
        created_at=created,
        needs_marker=bool(maybe_delivered) if needs_marker is None else needs_marker,
        maybe_delivered=bool(maybe_delivered),
        message_ref=str(message_ref),
        next_attempt_at=_dt(next_attempt_at),
        sent_ids=tuple(json.loads(sent_ids)) if sent_ids else (),
    )
    owner = Owner(int(owner_pid), str(owner_instance), owner_started)
    return _Row(obligation, owner, float(fresh_since))


class DeliveryLedger:
    """Obligations in the session store's database (``chatflow_delivery_obligations``)."""

    def __init__(
        self,
        store: BaseSessionStore,
        *,
        clock: Callable[[], datetime] | None = None,
        owner: Owner | None = None,
        liveness: OwnerLiveness | None = None,
        on_abandoned: Callable[[str], None] | None = None,
    ) -> None:
        """``on_abandoned(platform)`` is called for every row this ledger abandons."""
        self._store = store
        self._on_abandoned = on_abandoned
        # Outcomes of sends that a storage failure kept out of the ledger, retried
        # by ``record_unrecorded``; the rows stay 'attempting' meanwhile, so a
        # crash before they land resends with the marker.
        self._unrecorded: dict[str, Callable[[], Awaitable[bool]]] = {}
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
            await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
            if self._fenced:
                await ensure_instances_schema(tx)  # leases decide who is alive
        self._opened = True

    async def _ensure_open_in(self, tx: Transaction) -> None:
        # Not marked open here: the caller's transaction may still roll back.
        if not self._opened:
            await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
            if self._fenced:
                await ensure_instances_schema(tx)

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[Transaction]:
        """A store transaction, the tables created first if ``open`` was not called."""
        if not self._opened:
            await self.open()
        async with self._store.transaction() as tx:
            yield tx

    def _now(self, now: datetime | None = None) -> float:
        return _epoch(now if now is not None else self._clock())

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

    # -- recording -------------------------------------------------------------

    async def record_obligation_in(
        self,
        tx: Transaction,
        *,
        obligation_id: str,
        session_key: str,
        session_id: str,
        platform: str,
        chat_id: str,
        thread_id: str | None,
        reply_to: str | None,
        content: str,
        message_ref: str,
    ) -> bool:
        """Record a reply as owed (``pending``, owned by this process) inside ``tx``.

        Idempotent: an existing row with this id (in any state, delivered
        included) is left untouched. Returns whether a row was inserted.
        Errors propagate, so the turn's transaction rolls back with them.
        """
        return await self.record_in(
            tx,
            Obligation.owed(
                obligation_id=obligation_id,
                session_key=session_key,
                session_id=session_id,
                platform=platform,
                chat_id=chat_id,
                thread_id=thread_id,
                reply_to=reply_to,
                content=content,
                message_ref=message_ref,
            ),
        )

    async def record_in(
        self, tx: Transaction, obligation: Obligation, *, claimed: bool = False
    ) -> bool:
        """``record_obligation_in`` for an ``Obligation`` built with ``Obligation.owed``.

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
        state, attempts = ("attempting", 1) if claimed else ("pending", 0)
        inserted = await tx.execute(
            f"INSERT INTO {_TABLE} (obligation_id, session_key, session_id, platform, chat_id, "
            "thread_id, reply_to, message_ref, content, state, attempts, maybe_delivered, "
            "last_error, owner_pid, owner_instance, owner_started, next_attempt_at, sent_ids, "
            "created_at, fresh_since, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, NULL, ?, ?, ?, NULL, NULL, "
            "?, ?, ?) ON CONFLICT(obligation_id) DO NOTHING",
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
                state,
                attempts,
                me.pid,
                me.instance_id,
                me.started,
                now,
                now,
                now,
            ),
        )
        return inserted == 1

    async def record_obligation(
        self,
        *,
        obligation_id: str,
        session_key: str,
        session_id: str,
        platform: str,
        chat_id: str,
        thread_id: str | None,
        reply_to: str | None,
        content: str,
        message_ref: str,
    ) -> bool:
        """``record_obligation_in`` in its own transaction; best effort.

        A storage failure is logged and returns ``False`` (the reply is still sent).
        """
        try:
            async with self._store.transaction() as tx:
                return await self.record_obligation_in(
                    tx,
                    obligation_id=obligation_id,
                    session_key=session_key,
                    session_id=session_id,
                    platform=platform,
                    chat_id=chat_id,
                    thread_id=thread_id,
                    reply_to=reply_to,
                    content=content,
                    message_ref=message_ref,
                )
        except _STORAGE_ERRORS as exc:
            self._log_storage_failure("record", obligation_id, exc)
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
        try:
            async with self._tx() as tx:
                changed = await tx.execute(
                    f"UPDATE {_TABLE} SET state = 'attempting', attempts = attempts + 1, "
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
                    return True
                rows = await tx.fetchall(
                    f"SELECT state, attempts FROM {_TABLE} WHERE obligation_id = ?",
                    (obligation_id,),
                )
        except _STORAGE_ERRORS as exc:
            self._log_storage_failure("mark attempting", obligation_id, exc)
            return True
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

    async def mark_delivered(self, obligation_id: str, message_ids: Sequence[str] = ()) -> bool:
        """Record a successful send and the platform ids of its parts; best effort.

        Returns whether the row was updated (``False`` for a missing row or a
        storage failure, which is logged).
        """
        now = self._now()
        ids = [str(m) for m in message_ids]
        try:
            async with self._tx() as tx:
                rows = await tx.fetchall(
                    f"SELECT platform FROM {_TABLE} WHERE obligation_id = ?", (obligation_id,)
                )
                if not rows:
                    logger.warning("delivered obligation %s is not in the ledger", obligation_id)
                    return False
                platform = str(rows[0][0])
                await tx.execute(
                    f"UPDATE {_TABLE} SET state = 'delivered', sent_ids = ?, "
                    "next_attempt_at = NULL, updated_at = ? WHERE obligation_id = ?",
                    (json.dumps(ids), now, obligation_id),
                )
                if ids:
                    await tx.executemany(
                        f"INSERT INTO {_SENT} (platform, message_id, obligation_id) "
                        "VALUES (?, ?, ?) ON CONFLICT(platform, message_id) DO NOTHING",
                        [(platform, m, obligation_id) for m in ids],
                    )
        except _STORAGE_ERRORS as exc:
            self._log_storage_failure("mark delivered", obligation_id, exc)
            self._unrecorded[obligation_id] = lambda: self.mark_delivered(obligation_id, ids)
            return False
        self._unrecorded.pop(obligation_id, None)
        return True

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
        now = self._now()
        error = _clip(error)
        try:
            async with self._tx() as tx:
                rows = await tx.fetchall(
                    f"SELECT state, attempts, platform FROM {_TABLE} WHERE obligation_id = ?",
                    (obligation_id,),
                )
                if not rows:
                    logger.warning("failed obligation %s is not in the ledger", obligation_id)
                    return False
                state, attempts, platform = str(rows[0][0]), int(rows[0][1]), str(rows[0][2])
                if state in ("delivered", "abandoned"):
                    return False
                maybe = 1 if ambiguous else None
                if retry_after is not None:
                    new_state, attempts = "failed", max(attempts - 1, 0)
                    next_at: float | None = now + max(float(retry_after), 0.0)
                elif retryable and attempts < MAX_ATTEMPTS:
                    delay = RETRY_BACKOFF[min(max(attempts - 1, 0), len(RETRY_BACKOFF) - 1)]
                    new_state, next_at = "failed", now + delay
                else:
                    new_state, next_at = "abandoned", None
                    if retryable:
                        error = _clip(f"{error} (gave up after {attempts} attempts)")
                fence, fence_params = self._fence()
                changed = await tx.execute(
                    f"UPDATE {_TABLE} SET state = ?, attempts = ?, last_error = ?, "
                    "next_attempt_at = ?, maybe_delivered = COALESCE(?, maybe_delivered), "
                    "updated_at = ? WHERE obligation_id = ? AND state = ?" + fence,
                    (
                        new_state,
                        attempts,
                        error,
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
                    return False
        except _STORAGE_ERRORS as exc:
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
        if new_state == "abandoned":
            logger.warning("obligation %s abandoned: %s", obligation_id, error)
            self._abandoned(platform)
        return True

    @property
    def unrecorded(self) -> int:
        """Send outcomes waiting to be written (a storage failure kept them out)."""
        return len(self._unrecorded)

    async def record_unrecorded(self) -> int:
        """Write the send outcomes a storage failure kept out; returns how many still wait."""
        for obligation_id, write in list(self._unrecorded.items()):
            if self._unrecorded.get(obligation_id) is write:
                del self._unrecorded[obligation_id]
                await write()  # on failure it puts itself back
        return len(self._unrecorded)

    def _abandoned(self, platform: str) -> None:
        if self._on_abandoned is not None:
            self._on_abandoned(platform)

    # -- retries and recovery ---------------------------------------------------

    async def due_retries(self, now: datetime | None = None) -> builtins.list[Obligation]:
        """Claim this process's ``failed`` rows whose retry time has come; best effort.

        Each returned row is already ``attempting`` (attempts counted): send
        it without ``mark_attempting``. ``needs_marker`` is set when an earlier
        attempt may have arrived. Rows past ``STALE_AFTER`` or out of attempts
        are abandoned instead. A storage failure is logged and returns ``[]``.
        """
        moment = self._now(now)
        me = self._owner
        try:
            async with self._tx() as tx:
                rows = await tx.fetchall(
                    f"SELECT {_COLUMNS} FROM {_TABLE} WHERE state = 'failed' "
                    "AND next_attempt_at <= ? AND owner_pid = ? AND owner_instance = ? "
                    "ORDER BY next_attempt_at, created_at",
                    (moment, me.pid, me.instance_id),
                )
            candidates = [_row(r) for r in rows]
            claimed = await self._settle(candidates, moment, needs_marker_for=_maybe_only)
        except _STORAGE_ERRORS as exc:
            self._log_storage_failure("claim due retries of", "(any)", exc)
            return []
        return claimed

    async def next_retry_at(self) -> datetime | None:
        """When this process's earliest ``failed`` row becomes due (``None`` if none)."""
        me = self._owner
        try:
            async with self._tx() as tx:
                rows = await tx.fetchall(
                    f"SELECT MIN(next_attempt_at) FROM {_TABLE} WHERE state = 'failed' "
                    "AND owner_pid = ? AND owner_instance = ?",
                    (me.pid, me.instance_id),
                )
        except _STORAGE_ERRORS as exc:
            self._log_storage_failure("read the next retry of", "(any)", exc)
            return None
        return _dt(rows[0][0]) if rows else None

    async def sweep_recoverable(
        self,
        now: datetime | None = None,
        *,
        deliverable_platforms: Collection[str] | None = None,
        adopt_only: bool = False,
    ) -> builtins.list[Obligation]:
        """Claim the rows a dead process owed and return them for a resend.

        With ``adopt_only`` the rows are only made ours (owner changed, state and
        attempts as they were) and returned with ``needs_marker`` decided; the
        caller ``claim``s each right before sending it, so rows that wait in a
        queue spend no attempt if this process dies before their turn comes.

        Looks at ``pending``/``attempting``/``failed`` rows whose owner is dead
        (``is_owner_alive`` on SQLite, an expired lease on PostgreSQL, or the
        ``liveness`` given). Rows older than ``STALE_AFTER`` or with
        ``MAX_ATTEMPTS`` attempts used become ``abandoned`` (logged). Rows of a
        platform not in ``deliverable_platforms`` are otherwise left alone, no
        attempt spent. ``failed`` rows whose retry is not yet due are adopted
        (owner = us, still ``failed``) for ``due_retries``. The rest are claimed
        with one guarded UPDATE each (owner and state unchanged since read, so
        only one of two racing processes wins), moved to ``attempting`` with
        attempts + 1, and returned oldest first with ``needs_marker`` when they
        were not ``pending``. Send them without ``mark_attempting``.

        Call it at start-up once adapters are connected, and from time to time
        afterwards to pick up rows the operator re-queued. A storage failure is
        logged and returns what was claimed so far.
        """
        moment = self._now(now)
        alive: dict[Owner, bool] = {}
        claimed: builtins.list[Obligation] = []
        try:
            async with self._tx() as tx:
                rows = await tx.fetchall(
                    f"SELECT {_COLUMNS} FROM {_TABLE} "
                    "WHERE state IN ('pending', 'attempting', 'failed') "
                    "ORDER BY created_at, obligation_id",
                    (),
                )
            candidates: builtins.list[_Row] = []
            for values in rows:
                row = _row(values)
                if row.owner not in alive:
                    alive[row.owner] = await self._is_alive(row.owner)
                if alive[row.owner]:
                    continue
                candidates.append(row)
            for start in range(0, len(candidates), _BATCH):
                batch = await self._settle(
                    candidates[start : start + _BATCH],
                    moment,
                    needs_marker_for=_not_pending,
                    deliverable_platforms=deliverable_platforms,
                    adopt_only=adopt_only,
                )
                claimed.extend(batch)
        except _STORAGE_ERRORS as exc:
            self._log_storage_failure("sweep", "(any)", exc)
        if claimed:
            logger.info("claimed %d undelivered repl(ies) from a previous run", len(claimed))
        return claimed

    async def _settle(
        self,
        rows: Sequence[_Row],
        moment: float,
        *,
        needs_marker_for: Callable[[Obligation], bool],
        deliverable_platforms: Collection[str] | None = None,
        adopt_only: bool = False,
    ) -> builtins.list[Obligation]:
        """Abandon, adopt or claim ``rows`` in one transaction, each by a guarded UPDATE.

        Returns the claimed obligations.
        """
        me = self._owner
        stale_before = moment - STALE_AFTER.total_seconds()
        claimed: builtins.list[Obligation] = []
        abandoned: builtins.list[tuple[str, str, str]] = []
        guard = (
            "WHERE obligation_id = ? AND owner_pid = ? AND owner_instance = ? "
            "AND state = ? AND attempts = ?"
        )
        async with self._store.transaction() as tx:
            for row in rows:
                ob = row.obligation
                stamp = (
                    ob.obligation_id,
                    row.owner.pid,
                    row.owner.instance_id,
                    ob.state,
                    ob.attempts,
                )
                reason: str | None = None
                if row.fresh_since < stale_before:
                    reason = f"stale: owed for more than {STALE_AFTER.total_seconds() / 3600:g} h"
                elif ob.attempts >= MAX_ATTEMPTS:
                    reason = f"gave up after {ob.attempts} attempts"
                    if ob.last_error:
                        reason += f"; last error: {ob.last_error}"
                if reason is not None:
                    changed = await tx.execute(
                        f"UPDATE {_TABLE} SET state = 'abandoned', last_error = ?, "
                        f"next_attempt_at = NULL, updated_at = ? {guard}",
                        (_clip(reason), moment, *stamp),
                    )
                    if changed == 1:
                        abandoned.append((ob.obligation_id, reason, ob.platform))
                    continue
                if deliverable_platforms is not None and ob.platform not in deliverable_platforms:
                    continue
                due = ob.next_attempt_at is None or _epoch(ob.next_attempt_at) <= moment
                if (ob.state == "failed" and not due) or adopt_only:
                    adopted = await tx.execute(
                        f"UPDATE {_TABLE} SET owner_pid = ?, owner_instance = ?, "
                        f"owner_started = ?, updated_at = ? {guard}",
                        (me.pid, me.instance_id, me.started, moment, *stamp),
                    )
                    if adopted == 1 and adopt_only and (due or ob.state != "failed"):
                        claimed.append(replace(ob, needs_marker=needs_marker_for(ob)))
                    continue
                changed = await tx.execute(
                    f"UPDATE {_TABLE} SET owner_pid = ?, owner_instance = ?, owner_started = ?, "
                    "state = 'attempting', attempts = attempts + 1, next_attempt_at = NULL, "
                    f"updated_at = ? {guard}",
                    (me.pid, me.instance_id, me.started, moment, *stamp),
                )
                if changed == 1:
                    claimed.append(
                        Obligation(
                            obligation_id=ob.obligation_id,
                            session_key=ob.session_key,
                            session_id=ob.session_id,
                            platform=ob.platform,
                            chat_id=ob.chat_id,
                            thread_id=ob.thread_id,
                            reply_to=ob.reply_to,
                            content=ob.content,
                            state="attempting",
                            attempts=ob.attempts + 1,
                            last_error=ob.last_error,
                            created_at=ob.created_at,
                            needs_marker=needs_marker_for(ob),
                            maybe_delivered=ob.maybe_delivered,
                            message_ref=ob.message_ref,
                            next_attempt_at=None,
                            sent_ids=ob.sent_ids,
                        )
                    )
        for obligation_id, reason, platform in abandoned:
            logger.warning("obligation %s abandoned: %s", obligation_id, reason)
            self._abandoned(platform)
        return claimed

    async def claim(self, obligation: Obligation) -> Obligation | None:
        """Claim a row adopted by ``sweep_recoverable(adopt_only=True)`` to send it now.

        Moves it to ``attempting`` (attempts + 1) if it is still ours and as it
        was read; ``None`` when it changed meanwhile (another path took it) or
        the database failed (logged; the row stays for the next sweep).
        """
        me = self._owner
        try:
            async with self._tx() as tx:
                changed = await tx.execute(
                    f"UPDATE {_TABLE} SET state = 'attempting', attempts = attempts + 1, "
                    "next_attempt_at = NULL, updated_at = ? WHERE obligation_id = ? "
                    "AND owner_pid = ? AND owner_instance = ? AND state = ? AND attempts = ?",
                    (
                        self._now(),
                        obligation.obligation_id,
                        me.pid,
                        me.instance_id,
                        obligation.state,
                        obligation.attempts,
                    ),
                )
        except _STORAGE_ERRORS as exc:
            self._log_storage_failure("claim", obligation.obligation_id, exc)
            return None
        if changed != 1:
            return None
        return replace(obligation, state="attempting", attempts=obligation.attempts + 1)

    # -- housekeeping --------------------------------------------------------------

    async def prune(self, now: datetime | None = None) -> int:
        """Delete ``delivered``/``abandoned`` rows settled more than ``RETENTION`` ago.

        Works in batches of short transactions; returns the number deleted.
        Raises ``StorageError`` on a database failure.
        """
        cutoff = self._now(now) - RETENTION.total_seconds()
        total = 0
        while True:
            async with self._tx() as tx:
                rows = await tx.fetchall(
                    f"SELECT obligation_id FROM {_TABLE} "
                    "WHERE state IN ('delivered', 'abandoned') AND updated_at < ? LIMIT ?",
                    (cutoff, _BATCH),
                )
                ids = [(str(r[0]),) for r in rows]
                if ids:
                    await tx.executemany(f"DELETE FROM {_SENT} WHERE obligation_id = ?", ids)
                    await tx.executemany(f"DELETE FROM {_TABLE} WHERE obligation_id = ?", ids)
            total += len(ids)
            if len(ids) < _BATCH:
                break
        if total:
            logger.debug("pruned %d ledger row(s)", total)
        return total

    # -- platform status reports ------------------------------------------------------

    async def find_by_sent_id(
        self, platform_message_id: str, *, platform: str | None = None
    ) -> str | None:
        """The obligation whose delivery produced ``platform_message_id`` (a WhatsApp wamid).

        ``platform`` narrows the lookup (Telegram message ids are only unique
        per chat). Best effort: ``None`` when unknown or on a storage failure.
        """
        sql = f"SELECT obligation_id FROM {_SENT} WHERE message_id = ?"
        params: tuple[str, ...] = (platform_message_id,)
        if platform is not None:
            sql += " AND platform = ?"
            params += (platform,)
        try:
            async with self._tx() as tx:
                rows = await tx.fetchall(sql + " LIMIT 1", params)
        except _STORAGE_ERRORS as exc:
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
        try:
            async with self._store.transaction() as tx:
                await tx.execute(
                    f"UPDATE {_TABLE} SET last_error = ?, updated_at = ? WHERE obligation_id = ?",
                    (_clip(f"platform status failed: {error}"), self._now(), obligation_id),
                )
        except _STORAGE_ERRORS as exc:
            self._log_storage_failure("note a failed status of", obligation_id, exc)
        return obligation_id

    # -- operator ------------------------------------------------------------------

    async def get(self, obligation_id: str) -> Obligation | None:
        """One obligation as stored (``needs_marker`` mirrors ``maybe_delivered``)."""
        async with self._tx() as tx:
            rows = await tx.fetchall(
                f"SELECT {_COLUMNS} FROM {_TABLE} WHERE obligation_id = ?", (obligation_id,)
            )
        return _row(rows[0]).obligation if rows else None

    async def status(self) -> dict[str, int]:
        """Number of obligations per state (every state present, zero included)."""
        counts: dict[str, int] = dict.fromkeys(STATES, 0)
        async with self._tx() as tx:
            rows = await tx.fetchall(f"SELECT state, COUNT(*) FROM {_TABLE} GROUP BY state", ())
        for state, count in rows:
            counts[str(state)] = int(count)
        return counts

    async def list(
        self, state: ObligationState | None = None, limit: int = 50
    ) -> builtins.list[Obligation]:
        """Obligations, newest first, optionally of one state."""
        if state is not None and state not in STATES:
            raise ValueError(f"unknown obligation state {state!r}")
        sql = f"SELECT {_COLUMNS} FROM {_TABLE}"
        params: tuple[Any, ...] = ()
        if state is not None:
            sql += " WHERE state = ?"
            params = (state,)
        sql += " ORDER BY created_at DESC, obligation_id LIMIT ?"
        async with self._tx() as tx:
            rows = await tx.fetchall(sql, (*params, max(int(limit), 0)))
        return [_row(r).obligation for r in rows]

    async def retry(self, obligation_id: str) -> bool:
        """Operator: put an ``abandoned``/``failed`` row back to ``pending``.

        Attempts and the staleness clock restart, and the row belongs to
        nobody, so the next ``sweep_recoverable`` of a running gateway sends it
        (with the marker if an earlier attempt may have arrived). Returns
        whether the row was re-queued.
        """
        now = self._now()
        async with self._tx() as tx:
            changed = await tx.execute(
                f"UPDATE {_TABLE} SET state = 'pending', attempts = 0, next_attempt_at = NULL, "
                "owner_pid = ?, owner_instance = ?, owner_started = NULL, fresh_since = ?, "
                "updated_at = ? WHERE obligation_id = ? AND state IN ('abandoned', 'failed')",
                (_NOBODY.pid, _NOBODY.instance_id, now, now, obligation_id),
            )
        if changed:
            logger.info("obligation %s re-queued by the operator", obligation_id)
        return changed == 1

    async def abandon(self, obligation_id: str, reason: str) -> bool:
        """Operator: give up an undelivered row with ``reason``. Returns whether it changed."""
        now = self._now()
        async with self._tx() as tx:
            changed = await tx.execute(
                f"UPDATE {_TABLE} SET state = 'abandoned', last_error = ?, "
                "next_attempt_at = NULL, updated_at = ? "
                "WHERE obligation_id = ? AND state IN ('pending', 'attempting', 'failed')",
                (_clip(reason), now, obligation_id),
            )
        if changed:
            logger.warning("obligation %s abandoned by the operator: %s", obligation_id, reason)
        return changed == 1

    def _log_storage_failure(self, what: str, obligation_id: str, exc: BaseException) -> None:
        logger.error(
            "delivery ledger could not %s obligation %s (%s: %s); the reply is not held up",
            what,
            obligation_id,
            type(exc).__name__,
            exc,
        )


def _maybe_only(obligation: Obligation) -> bool:
    return obligation.maybe_delivered


def _not_pending(obligation: Obligation) -> bool:
    return obligation.state != "pending" or obligation.maybe_delivered
