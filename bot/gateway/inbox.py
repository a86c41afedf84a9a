"""The inbound journal: dedup claim plus a durable copy of every accepted message.

``accept`` runs tx 1 of a message's path (DESIGN §2): the dedup claim and the
inbox row commit together, after which the platform may be told "got it". The
turn's own transaction (tx 2) marks the row ``done`` through ``mark_done_in``.
A row still ``received`` at start-up belongs to a turn that never committed:
``recover`` hands it back to be run again, unless it is too old to be worth
answering (``expired``) or has already been retried too often (poison).

Every row names the process that owns it (``owner_instance``: the one that
accepted it, or the one that recovered it). On PostgreSQL several processes
share the table: ``recover(live_owners=...)`` takes only rows whose owner is
no longer alive, claiming them with ``FOR UPDATE SKIP LOCKED`` so two
recovering processes never take the same row, and the turn's ``mark_done_in``
is fenced by owner: a process whose row was taken over cannot commit that
turn a second time (``InboxClaimLostError``).

Rows hold raw ids and the message text because a re-run needs them; they are
pruned after ``RETENTION``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from bot.core.sql import Transaction, ensure_schema
from bot.core.stores.base import TransactionalStore, require_transactional
from bot.errors import StorageError
from bot.gateway.events import MessageEvent, event_from_dict, event_to_dict
from bot.gateway.instances import Owner, from_epoch, to_epoch
from bot.logs import log_ref
from bot.tracing import spans
from bot.tracing.spans import Carried

__all__ = [
    "MAX_RECOVERIES",
    "RETENTION",
    "Inbox",
    "InboxClaimLostError",
    "InboxEntry",
    "InboxState",
    "event_from_dict",
    "event_to_dict",
]

logger = logging.getLogger(__name__)

InboxState = Literal["received", "done", "expired"]

MAX_RECOVERIES: Final = 5
"""A message whose turn died with the process this many times while it ran alone is
answered with an apology instead of being run again (it is what kills the process)."""

RETENTION: Final = timedelta(days=7)
"""Done and expired rows are pruned after this long (below the 8-day dedup TTL)."""

GAVE_UP_ERROR: Final = f"gave up after {MAX_RECOVERIES} attempts"

# One encoder for every row: json.dumps with options builds a new one per call.
_encode_event = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

_COMPONENT = "inbox"
_TABLE = "chatflow_inbox"
_PRUNE_BATCH = 500
_MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {_TABLE} ("
        "message_id TEXT PRIMARY KEY NOT NULL, "
        "platform TEXT NOT NULL, "
        "session_key TEXT NOT NULL, "
        "session_id TEXT NOT NULL, "
        "event_json TEXT NOT NULL, "
        "state TEXT NOT NULL CHECK (state IN ('received', 'done', 'expired')), "
        "error TEXT, "
        "attempts INTEGER NOT NULL DEFAULT 0, "
        "received_at REAL NOT NULL, "
        "updated_at REAL NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {_TABLE}_state_received ON {_TABLE} (state, received_at)",
    ),
    # 2: owners, so several processes can share the table (rows before it have none).
    2: (f"ALTER TABLE {_TABLE} ADD COLUMN owner_instance TEXT",),
    # 3: the receipt's trace context (tracing on): a turn re-run after a crash or by
    # another process starts a new trace linked to it; NULL before it.
    3: (f"ALTER TABLE {_TABLE} ADD COLUMN traceparent TEXT",),
}


class InboxClaimLostError(StorageError):
    """Another process took this message over (this one's lease had expired); the turn
    run here must not commit."""


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """A message accepted earlier whose turn never committed, handed back to be run."""

    event: MessageEvent
    """The message as accepted (without ``raw``)."""
    session_key: str
    """The session key it was routed to."""
    session_id: str
    """The session id its turn runs in."""
    received_at: datetime
    """When ``accept`` stored it (UTC)."""
    attempts: int
    """Times it was re-run alone after a crash (``mark_started_alone``) without committing."""
    gave_up: bool = False
    """It died with the process ``MAX_RECOVERIES`` times while running alone: close it
    with an apology instead of running it again."""
    trace: Carried | None = field(default=None, compare=False)
    """The receipt's span (tracing on, received by this process): the turn continues
    its trace."""
    queued_ns: int = field(default=0, compare=False)
    """When it was queued (``time.time_ns()``), for the queue wait's span; 0 if untraced."""
    link: str | None = field(default=None, compare=False)
    """``traceparent`` of the span that owed this turn (a scheduled job's, an approval's):
    its new trace links to it."""


class Inbox:
    """Inbound journal in the session store's database (table ``chatflow_inbox``)."""

    def __init__(
        self,
        store: TransactionalStore,
        *,
        clock: Callable[[], datetime] | None = None,
        owner: str | None = None,
        on_accept_in: Callable[[Transaction, MessageEvent], Awaitable[None]] | None = None,
    ) -> None:
        """``on_accept_in(tx, event)`` runs in tx 1 of every message accepted (not of
        duplicates); its errors roll tx 1 back."""
        self._store = store = require_transactional(store, "the inbox")
        self._on_accept_in = on_accept_in
        self._clock = clock or store.now
        self._owner = owner or Owner.current().instance_id
        # On PostgreSQL other processes may take rows over: fence the turn commit.
        self._fenced = store.dialect == "postgres"
        self._opened = False

    @property
    def owner(self) -> str:
        """Instance id stamped on rows this inbox accepts or recovers."""
        return self._owner

    async def open(self) -> None:
        """Create or migrate the inbox table; idempotent."""
        async with self._store.transaction() as tx:
            await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
        self._opened = True

    async def _ensure_open(self) -> None:
        if not self._opened:
            await self.open()

    async def _ensure_open_in(self, tx: Transaction) -> None:
        # Not marked open here: the caller's transaction may still roll back.
        if not self._opened:
            await ensure_schema(tx, _COMPONENT, _MIGRATIONS)

    async def accept(self, event: MessageEvent, *, session_key: str, session_id: str) -> bool:
        """Journal ``event``: ``True`` the first time, ``False`` for a duplicate.

        One transaction holds the dedup claim and the inbox row, so a crash
        leaves either both or neither. Raises ``StorageError`` when the database
        fails; the adapter must then not confirm the update to its platform.
        """
        if not self._opened:  # checked inline: this runs for every inbound message
            await self.open()
        now = to_epoch(self._clock())
        payload = _encode_event(event_to_dict(event))
        parent = spans.traceparent()  # read here: the store may run the body in its own task
        return await self._store.run(
            lambda tx: self._accept_in(tx, event, session_key, session_id, now, payload, parent)
        )

    async def accept_in(
        self, tx: Transaction, event: MessageEvent, *, session_key: str, session_id: str
    ) -> bool:
        """Journal ``event`` inside the caller's transaction (the scheduler's claim of a
        ``run_agent`` job): ``True`` the first time, ``False`` for a duplicate."""
        await self._ensure_open_in(tx)
        now = to_epoch(self._clock())
        payload = _encode_event(event_to_dict(event))
        return await self._accept_in(tx, event, session_key, session_id, now, payload)

    async def _accept_in(
        self,
        tx: Transaction,
        event: MessageEvent,
        session_key: str,
        session_id: str,
        now: float,
        payload: str,
        parent: str | None = None,
    ) -> bool:
        if not await self._store.claim_in(tx, event.message_id):
            return False
        inserted = await tx.execute(
            f"INSERT INTO {_TABLE} (message_id, platform, session_key, session_id, "
            "event_json, state, error, attempts, received_at, updated_at, owner_instance, "
            "traceparent) VALUES (?, ?, ?, ?, ?, 'received', NULL, 0, ?, ?, ?, ?) "
            "ON CONFLICT(message_id) DO NOTHING",
            (
                event.message_id,
                event.platform,
                session_key,
                session_id,
                payload,
                now,
                now,
                self._owner,
                parent,
            ),
        )
        # An existing row means the message was journaled before the dedup id
        # expired: still a duplicate. A scheduled turn is not the person writing:
        # it must not, e.g., reopen their WhatsApp window.
        if inserted == 1 and self._on_accept_in is not None and not event.scheduled:
            await self._on_accept_in(tx, event)
        return inserted == 1

    async def mark_done_in(
        self, tx: Transaction, message_id: str, error: str | None = None
    ) -> bool:
        """Mark a message ``done`` inside the caller's transaction (the turn's tx 2).

        Returns whether a row was updated. Errors propagate: the turn
        transaction must roll back with them. On PostgreSQL only a ``received``
        row this process owns is closed; one another process took over (or
        already answered) raises ``InboxClaimLostError``.
        """
        await self._ensure_open_in(tx)
        now = to_epoch(self._clock())
        if not self._fenced:
            changed = await tx.execute(
                f"UPDATE {_TABLE} SET state = 'done', error = ?, updated_at = ? "
                "WHERE message_id = ? AND state != 'done'",
                (error, now, message_id),
            )
            return changed > 0
        changed = await tx.execute(
            f"UPDATE {_TABLE} SET state = 'done', error = ?, updated_at = ? "
            "WHERE message_id = ? AND state = 'received' AND owner_instance = ?",
            (error, now, message_id, self._owner),
        )
        if changed > 0:
            return True
        row = await tx.fetchone(f"SELECT state FROM {_TABLE} WHERE message_id = ?", (message_id,))
        if row is None:
            return False
        raise InboxClaimLostError(
            f"inbox message {_ref(message_id)} is {row[0]} and owned by another process; "
            "this process's turn for it is discarded"
        )

    async def committed_in(self, tx: Transaction, message_id: str) -> bool:
        """Whether a turn of this process committed ``message_id``: its row is ``done``
        with no error note (an apology, a takeover or a refusal leaves one)."""
        await self._ensure_open_in(tx)
        row = await tx.fetchone(
            f"SELECT state, error, owner_instance FROM {_TABLE} WHERE message_id = ?",
            (message_id,),
        )
        return (
            row is not None
            and row[0] == "done"
            and row[1] is None
            and row[2] in (None, self._owner)
        )

    async def mark_started_alone(self, message_id: str) -> None:
        """Count one solo run of a recovered message, before it runs (poison detection).

        After a crash every recovered message is a suspect; the gateway re-runs
        them one at a time and counts each run here, in its own transaction. If
        the process dies again, the count blames the one message that was
        running. Normal traffic never calls this, so it costs no commit there.
        Best effort: a storage failure is logged and the turn runs anyway.
        """
        now = to_epoch(self._clock())

        async def body(tx: Transaction) -> None:
            await self._ensure_open_in(tx)
            await tx.execute(
                f"UPDATE {_TABLE} SET attempts = attempts + 1, updated_at = ? "
                "WHERE message_id = ? AND state = 'received'",
                (now, message_id),
            )

        try:
            await self._store.run(body)
        except StorageError as exc:
            logger.warning("could not count a run of %s: %s", _ref(message_id), exc)

    async def recover(
        self,
        freshness_seconds: float,
        *,
        live_owners: Collection[str] | None = None,
        lasting: tuple[str, ...] = (),
    ) -> list[InboxEntry]:
        """Hand back the messages whose turn never committed, oldest first.

        Without ``live_owners`` every ``received`` row is taken: call it once
        at start-up, before adapters deliver new messages (a row of a turn
        still running in this process would be run twice). With
        ``live_owners`` (instance ids of the processes alive now, this one
        included) only rows of other owners are taken, so it may run at any
        time, in any number of processes: each row goes to one of them (it
        becomes this inbox's row). Rows older than ``freshness_seconds`` become
        ``expired`` (an answer hours late is worse than none), except those whose id
        starts with one of ``lasting``: a decision someone already made (an approval's
        continuation) is carried out however late the bot comes back. One that died
        with the process ``MAX_RECOVERIES`` times while running alone comes back
        with ``gave_up`` set, to be closed with an apology (a message that
        crashes the process must not crash it forever, nor be dropped in silence).
        """
        await self._ensure_open()
        now = to_epoch(self._clock())
        cutoff = now - freshness_seconds
        entries: list[InboxEntry] = []
        expired = 0
        where = "state = 'received'"
        params: list[str] = []
        if live_owners is not None:
            live = sorted({*live_owners, self._owner})
            where += (
                " AND (owner_instance IS NULL OR owner_instance NOT IN "
                f"({', '.join('?' * len(live))}))"
            )
            params.extend(live)
        # Rows another recovering process holds right now are its own; skip them.
        lock = " FOR UPDATE SKIP LOCKED" if self._store.dialect == "postgres" else ""
        async with self._store.transaction() as tx:
            rows = await tx.fetchall(
                "SELECT message_id, session_key, session_id, event_json, attempts, received_at, "
                f"traceparent FROM {_TABLE} WHERE {where} ORDER BY received_at, message_id{lock}",
                params,
            )
            for row in rows:
                message_id, session_key, session_id, event_json, attempts, received_at = row[:6]
                if float(received_at) < cutoff and not str(message_id).startswith(lasting):
                    await tx.execute(
                        f"UPDATE {_TABLE} SET state = 'expired', updated_at = ? "
                        "WHERE message_id = ?",
                        (now, message_id),
                    )
                    expired += 1
                    continue
                try:
                    event = event_from_dict(json.loads(event_json))
                except (ValueError, TypeError, KeyError):
                    await self._give_up(tx, message_id, "unreadable inbox row", now)
                    continue
                await tx.execute(
                    f"UPDATE {_TABLE} SET updated_at = ?, owner_instance = ? WHERE message_id = ?",
                    (now, self._owner, message_id),
                )
                gave_up = int(attempts) >= MAX_RECOVERIES
                if gave_up:
                    logger.warning(
                        "inbox message %s crashed the process %d times while running alone; "
                        "answering it with an apology",
                        _ref(message_id),
                        int(attempts),
                    )
                entries.append(
                    InboxEntry(
                        event=event,
                        session_key=str(session_key),
                        session_id=str(session_id),
                        received_at=from_epoch(received_at),
                        attempts=int(attempts),
                        gave_up=gave_up,
                        link=None if row[6] is None else str(row[6]),
                    )
                )
        if expired:
            logger.warning(
                "%d unanswered message(s) older than %.0f s expired",
                expired,
                freshness_seconds,
            )
        # No INFO line here: the caller knows which of these arrived while recovery
        # ran (not left by a crash) and logs the real count.
        logger.debug("%d message(s) whose turn never committed", len(entries))
        return entries

    async def own_quiet(
        self, before: float, *, skip: Callable[[str], bool], freshness_seconds: float
    ) -> list[InboxEntry]:
        """This process's ``received`` rows last touched before ``before`` (Unix time) that
        ``skip(message_id)`` says nothing here holds, oldest first: turns a failure left
        undone while this process lives (the database went away mid-turn, or took tx 1
        and lost its answer), which the recovery of dead owners' rows never takes.
        Rows older than ``freshness_seconds`` are left to ``recover``'s expiry."""
        await self._ensure_open()
        cutoff = to_epoch(self._clock()) - freshness_seconds

        async def body(tx: Transaction) -> list[tuple[Any, ...]]:
            return await tx.fetchall(
                f"SELECT message_id, session_key, session_id, event_json, attempts, "
                f"received_at FROM {_TABLE} WHERE state = 'received' AND owner_instance = ? "
                "AND updated_at < ? AND received_at >= ? ORDER BY received_at, message_id",
                (self._owner, before, cutoff),
            )

        entries: list[InboxEntry] = []
        for message_id, key, session_id, event_json, attempts, received_at in await self._store.run(
            body, write=False
        ):
            if skip(str(message_id)):
                continue
            try:
                event = event_from_dict(json.loads(event_json))
            except (ValueError, TypeError, KeyError):
                continue  # recover() closes unreadable rows
            entries.append(
                InboxEntry(
                    event=event,
                    session_key=str(key),
                    session_id=str(session_id),
                    received_at=from_epoch(received_at),
                    attempts=int(attempts),
                )
            )
        return entries

    async def state_of(self, message_id: str) -> tuple[InboxState, str | None] | None:
        """The row's state and owner, read back (an unknown commit's outcome); ``None``
        when no row has this id."""
        await self._ensure_open()

        async def body(tx: Transaction) -> tuple[Any, ...] | None:
            return await tx.fetchone(
                f"SELECT state, owner_instance FROM {_TABLE} WHERE message_id = ?",
                (message_id,),
            )

        row = await self._store.run(body, write=False)
        if row is None:
            return None
        state: InboxState = row[0]
        return state, None if row[1] is None else str(row[1])

    async def adopt(self, from_owner: str, prefix: str) -> list[InboxEntry]:
        """Take the ``received`` rows ``from_owner`` journaled (an operator command, which
        runs no turn) whose id starts with ``prefix``: each becomes this inbox's row by a
        guarded UPDATE, so of several processes one runs it. Returns them to be run."""
        await self._ensure_open()

        async def waiting(tx: Transaction) -> list[tuple[Any, ...]]:
            return await tx.fetchall(
                f"SELECT message_id, session_key, session_id, event_json, received_at "
                f"FROM {_TABLE} WHERE state = 'received' AND owner_instance = ? "
                "ORDER BY received_at, message_id",
                (from_owner,),
            )

        entries: list[InboxEntry] = []
        # Read first (read-only, every few seconds): a write only when there is work.
        for message_id, key, session_id, event_json, received_at in await self._store.run(
            waiting, write=False
        ):
            if not str(message_id).startswith(prefix):
                continue
            now = to_epoch(self._clock())
            async with self._store.transaction() as tx:
                changed = await tx.execute(
                    f"UPDATE {_TABLE} SET owner_instance = ?, updated_at = ? "
                    "WHERE message_id = ? AND state = 'received' AND owner_instance = ?",
                    (self._owner, now, message_id, from_owner),
                )
            if changed != 1:
                continue  # another process took it
            entries.append(
                InboxEntry(
                    event=event_from_dict(json.loads(event_json)),
                    session_key=str(key),
                    session_id=str(session_id),
                    received_at=from_epoch(received_at),
                    attempts=0,
                )
            )
        return entries

    async def journaled_event(self, message_id: str) -> MessageEvent | None:
        """The message journaled under ``message_id`` (without ``raw``), read only;
        ``None`` when unknown, pruned after ``RETENTION`` or unreadable."""
        await self._ensure_open()

        async def body(tx: Transaction) -> tuple[Any, ...] | None:
            sql = f"SELECT event_json FROM {_TABLE} WHERE message_id = ?"
            return await tx.fetchone(sql, (message_id,))

        row = await self._store.run(body, write=False)
        if row is None:
            return None
        try:
            return event_from_dict(json.loads(row[0]))
        except (ValueError, TypeError, KeyError):
            return None

    async def _give_up(self, tx: Transaction, message_id: str, reason: str, now: float) -> None:
        await tx.execute(
            f"UPDATE {_TABLE} SET state = 'done', error = ?, updated_at = ? WHERE message_id = ?",
            (reason, now, message_id),
        )
        logger.warning("inbox message %s marked done: %s", _ref(message_id), reason)

    async def prune(self, older_than: timedelta = RETENTION) -> int:
        """Delete ``done``/``expired`` rows received more than ``older_than`` ago.

        Works in batches, each its own short transaction, so a large backlog
        never holds the database lock for long. Returns the number deleted.
        """
        await self._ensure_open()
        cutoff = to_epoch(self._clock()) - older_than.total_seconds()
        total = 0
        while True:
            async with self._store.transaction() as tx:
                deleted = await tx.execute(
                    f"DELETE FROM {_TABLE} WHERE message_id IN (SELECT message_id FROM {_TABLE} "
                    "WHERE state IN ('done', 'expired') AND received_at < ? LIMIT ?)",
                    (cutoff, _PRUNE_BATCH),
                )
            total += deleted
            if deleted < _PRUNE_BATCH:
                break
        if total:
            logger.debug("pruned %d inbox row(s)", total)
        return total


def _ref(message_id: str) -> str:
    """A log-safe reference to a message id (ids can embed chat ids or phone numbers)."""
    return log_ref(message_id)
