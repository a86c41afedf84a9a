"""What the SQLite and PostgreSQL session stores share: the schema's rows, read and written.

Both stores hold the same three tables (DESIGN.md §3.3, created by
``bot.core.stores.schema``) and run the same SQL through their
``Transaction`` (``?`` placeholders; PostgreSQL's translates them). A subclass
supplies the connection side -- ``_transaction`` (begin, on its driver, end
with ``_settle``; ``run`` may drive a body in one call instead),
locking clauses, the purge statement and how a unique-key violation shows --
and this class does the rest: end a transaction (commit or roll back, even
under cancellation), load a session's window by index, save only what changed
in one transaction (with the caller's ``also`` hook), delete, list, and the
dedup claims.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, ClassVar, Final, TypeVar

from bot.core.agent import Agent
from bot.core.ids import check_message_id, log_session_id, validate_session_id
from bot.core.messages import Message
from bot.core.session import SessionContext, _Changes, seq_runs
from bot.core.sql import Transaction
from bot.core.stores.base import (
    PURGE_BATCH_SIZE,
    SaveHook,
    SessionDeletedError,
    TransactionalStore,
    as_utc,
    dump_metadata,
)
from bot.core.stores.cache import CachedLoads
from bot.errors import CommitOutcomeUnknownError, SessionLeaseLostError, StorageError

__all__ = ["DriverTransaction", "SQLSessionStore"]

logger = logging.getLogger(__name__)

_CLAIM_SQL: Final = (
    "INSERT INTO chatflow_processed_messages (message_id, processed_at) VALUES (?, ?) "
    "ON CONFLICT (message_id) DO UPDATE SET processed_at = excluded.processed_at "
    "WHERE chatflow_processed_messages.processed_at < ?"
)
_MARK_SQL: Final = (
    "INSERT INTO chatflow_processed_messages (message_id, processed_at) VALUES (?, ?) "
    "ON CONFLICT (message_id) DO UPDATE SET processed_at = excluded.processed_at"
)
_INSERT_MESSAGE_SQL: Final = (
    "INSERT INTO chatflow_messages (session_id, seq, role, message_json, created_at) "
    "VALUES (?, ?, ?, ?, ?)"
)


def _new_version() -> int:
    """A session's starting version: random, so a re-created one never matches an old snapshot.

    Only a collision matters, never a guess: the Mersenne Twister (reseeded after a
    fork) serves without the CSPRNG's system call per save.
    """
    return random.getrandbits(52)


# A new session starts at a random version: a re-created one never matches an old snapshot.
_INSERT_SESSION_SQL: Final = (
    "INSERT INTO chatflow_sessions (session_id, active_agent_name, metadata_json, "
    "created_at, updated_at, version) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (session_id) DO NOTHING"
)
_UPDATE_SESSION_SQL: Final = (
    "UPDATE chatflow_sessions SET active_agent_name = ?, metadata_json = ?, updated_at = ?, "
    "version = ? WHERE session_id = ?"
)


def _iso(value: datetime) -> str:
    return as_utc(value).isoformat(timespec="microseconds")


class DriverTransaction(ABC):
    """A ``Transaction`` on one driver connection; ``SQLSessionStore`` ends it.

    Subclasses run the statements (refusing them once ``_active`` is false) and
    say how their driver commits and rolls back.
    """

    __slots__ = ("_active",)

    def __init__(self) -> None:
        self._active = True

    @abstractmethod
    async def _send_commit(self) -> None:
        """COMMIT and wait for the database's answer; driver errors propagate as they are."""

    @abstractmethod
    async def _rollback(self) -> None:
        """Roll back, or drop the connection if that fails; raises no driver error."""

    @abstractmethod
    def _driver_error(self, exc: BaseException) -> str | None:
        """A description of ``exc`` if it is one of the driver's errors, else ``None``."""

    def _commit_ambiguous(self, exc: BaseException) -> bool:
        """Whether COMMIT failing with ``exc`` leaves its outcome unknown (the connection
        died after it was sent, so the server may have committed): no, by default."""
        return False


_TxT = TypeVar("_TxT", bound=DriverTransaction)


class SQLSessionStore(TransactionalStore, CachedLoads):
    """A session store on a SQL database; subclasses bring the connection."""

    _FOR_SHARE: ClassVar[str] = ""
    """Clause that keeps a row from changing until the transaction ends (reads)."""
    _FOR_UPDATE: ClassVar[str] = ""
    """Clause that makes concurrent saves of one session queue (writes)."""
    _PURGE_SQL: ClassVar[str]
    """``DELETE`` of at most ``?`` expired dedup ids older than ``?``, oldest first."""

    _closed: bool
    _open_lock: asyncio.Lock

    async def open(self) -> None:
        """Connect and migrate the schema; idempotent (and safe to race)."""
        if self._closed:
            raise StorageError("the session store is closed")
        if self._connected:
            return
        async with self._open_lock:
            if self._closed:
                raise StorageError("the session store is closed")
            if not self._connected:
                await self._open_connection()

    @property
    @abstractmethod
    def _connected(self) -> bool:
        """Whether the connection (or pool) is open."""

    @abstractmethod
    async def _open_connection(self) -> None:
        """Connect and migrate; called once, under ``_open_lock``."""

    @property
    def connection_waiters(self) -> int:
        """Tasks waiting for a pooled database connection now (a gauge; 0 without a pool)."""
        return 0

    def _lease_fence(self, session_id: str) -> tuple[str, tuple[Any, ...]] | None:
        """The statement (and parameters) a save of ``session_id`` runs first in its
        transaction to prove the current turn still owns the session: no row back and
        the save fails with ``SessionLeaseLostError``. ``None``: nothing to prove (a
        store with in-process locks only, or a save outside ``session_lock``)."""
        return None

    @abstractmethod
    def _is_unique_violation(self, exc: BaseException | None) -> bool:
        """Whether a driver error is a unique-key violation."""

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """An ``async with`` block running SQL in one write transaction.

        Commits when the block ends normally, rolls back on any exception. Inside
        the block use only the yielded ``Transaction``, not the store itself.
        """
        async with self._transaction(write=True) as tx:
            yield tx

    @asynccontextmanager
    async def _settle(self, tx: _TxT, on_commit: Callable[[], None] | None) -> AsyncIterator[_TxT]:
        """Yield the begun ``tx``; commit it if the block ends normally, else roll it back."""
        try:
            yield tx
        except BaseException:
            tx._active = False
            await tx._rollback()
            raise
        tx._active = False
        await self._commit(tx, on_commit)

    async def _commit(self, tx: DriverTransaction, on_commit: Callable[[], None] | None) -> None:
        # Once COMMIT is sent its outcome is the database's: wait for it whatever
        # happens to this task, so a session's bookkeeping always matches the rows.
        commit = asyncio.ensure_future(tx._send_commit())
        cancelled = False
        while not commit.done():
            try:
                await asyncio.wait({commit})
            except asyncio.CancelledError:
                cancelled = True
        error = commit.exception()
        if error is not None:
            await tx._rollback()
            described = tx._driver_error(error)
            if described is not None and tx._commit_ambiguous(error):
                # Never reported as aborted: the caller reads the keys back (D2).
                raise CommitOutcomeUnknownError(f"commit outcome unknown: {described}") from error
            if described is not None:
                raise StorageError(f"commit failed: {described}") from error
            raise error
        if on_commit is not None:
            on_commit()
        if cancelled:
            raise asyncio.CancelledError

    async def ping(self) -> None:
        """Check the database answers, in a read-only transaction (no write lock)."""
        await self.open()
        async with self._transaction(write=False) as tx:
            await tx.fetchall("SELECT 1")

    async def _run_own(
        self, body: Callable[[Transaction], Any], on_commit: Callable[[], None] | None
    ) -> Any:
        """``run`` for the store's own saves: the cache accounts for what they write."""
        return await self.run(body, on_commit=on_commit)

    def _watch_from_here(self, tx: Transaction) -> None:
        """From here on, ``tx`` (an own save's) runs the caller's SQL (``also``)."""

    async def get_or_create(
        self,
        session_id: str,
        default_agent: Agent,
        metadata: Mapping[str, Any] | None = None,
    ) -> SessionContext:
        """Load the session, or create (and store) it with ``default_agent`` and ``metadata``.

        ``metadata`` is used only when the session is created.
        """
        validate_session_id(session_id)
        cached = await self._load_cached(session_id, default_agent)
        if cached is not None:
            return cached
        fresh = SessionContext(
            session_id,
            default_agent,
            self._default_max_turns,
            metadata,
            prune_to=self._prune_to_turns,
        )
        metadata_json = dump_metadata(fresh.metadata)
        now = _iso(self.now())
        version = _new_version()

        async def body(tx: Transaction) -> tuple[bool, tuple[Any, ...] | None, list[Any]]:
            row = await self._read_session(tx, session_id)
            created = False
            if row is None:
                params = (session_id, default_agent.name, metadata_json, now, now, version)
                created = await tx.execute(_INSERT_SESSION_SQL, params) == 1
                if not created:  # another process created it a moment ago
                    row = await self._read_session(tx, session_id)
            messages = [] if row is None else await self._read_messages(tx, session_id)
            return created, row, messages

        created, row, messages = await self._run_own(body, None)
        if created:
            fresh._mark_saved(_Changes((), (), True), now)
            self._remember(fresh, version, default_agent.name, metadata_json)
            context = fresh
        elif row is None:
            raise StorageError(
                f"session {log_session_id(session_id)} was deleted while it was being created"
            )
        else:
            context = self._build(session_id, row, messages, fallback=default_agent)
        self._track(context)
        return context

    async def get(self, session_id: str) -> SessionContext | None:
        """A fresh context for the stored session, or ``None``."""
        validate_session_id(session_id)
        cached = await self._load_cached(session_id, None)
        if cached is not None:
            return cached

        async def body(tx: Transaction) -> tuple[tuple[Any, ...] | None, list[Any]]:
            row = await self._read_session(tx, session_id)
            return row, [] if row is None else await self._read_messages(tx, session_id)

        # A locking read (FOR SHARE) cannot run in a read-only transaction.
        row, messages = await self.run(body, write=bool(self._FOR_SHARE))
        if row is None:
            return None
        context = self._build(session_id, row, messages)
        self._track(context)
        return context

    async def _read_session(self, tx: Transaction, session_id: str) -> tuple[Any, ...] | None:
        # No save of this session can commit between this read and the messages read,
        # so the two are one consistent state (FOR SHARE, or SQLite's one-writer lock).
        return await tx.fetchone(
            "SELECT active_agent_name, metadata_json, created_at, version "
            "FROM chatflow_sessions WHERE session_id = ?" + self._FOR_SHARE,
            (session_id,),
        )

    async def _read_messages(self, tx: Transaction, session_id: str) -> list[tuple[Any, ...]]:
        return await tx.fetchall(
            "SELECT seq, message_json FROM chatflow_messages "
            "WHERE session_id = ? AND compacted = 0 ORDER BY seq",
            (session_id,),
        )

    async def conversation(self, session_id: str) -> list[tuple[Message, bool]] | None:
        """Every stored message of the session, compacted ones included, in order, each
        with whether it was compacted; ``None`` if there is no such session."""
        validate_session_id(session_id)

        async def body(tx: Transaction) -> list[tuple[Any, ...]] | None:
            row = await tx.fetchone(
                "SELECT 1 FROM chatflow_sessions WHERE session_id = ?", (session_id,)
            )
            if row is None:
                return None
            return await tx.fetchall(
                "SELECT message_json, compacted FROM chatflow_messages "
                "WHERE session_id = ? ORDER BY seq",
                (session_id,),
            )

        rows = await self.run(body, write=False)
        if rows is None:
            return None
        result: list[tuple[Message, bool]] = []
        for message_json, compacted in rows:
            try:
                result.append((Message.model_validate_json(message_json), bool(compacted)))
            except (TypeError, ValueError):
                continue  # unreadable rows are skipped, as loads skip them
        return result

    def _build(
        self,
        session_id: str,
        row: tuple[Any, ...],
        messages: list[tuple[Any, ...]],
        *,
        fallback: Agent | None = None,
    ) -> SessionContext:
        agent_name, metadata_json, created_at, version = row
        try:
            metadata = json.loads(metadata_json)
        except (TypeError, ValueError):
            metadata = None
        if not isinstance(metadata, dict):
            logger.warning(
                "session %s: unreadable metadata replaced by {}", log_session_id(session_id)
            )
            metadata, metadata_json = {}, "{}"
        entries: list[tuple[int, Message]] = []
        seqs: list[int] = []
        for seq, message_json in messages:
            seqs.append(int(seq))
            try:
                entries.append((int(seq), Message.model_validate_json(message_json)))
            except (TypeError, ValueError) as exc:
                # The row is deleted by the next save; its text never reaches the log.
                logger.warning(
                    "session %s: skipping unreadable message row seq=%s (%s)",
                    log_session_id(session_id),
                    seq,
                    type(exc).__name__,
                )
        agent = self._resolve_agent(str(agent_name), fallback)
        context = SessionContext._restore(
            session_id,
            agent,
            self._default_max_turns,
            metadata,
            entries,
            seqs,
            str(created_at),
            prune_to=self._prune_to_turns,
        )
        self._remember(context, int(version), str(agent_name), str(metadata_json))
        return context

    async def save(self, session: SessionContext, *, also: SaveHook | None = None) -> None:
        """Write the session's changes in one transaction (O(messages added or pruned)).

        ``also(tx)`` runs last inside the same transaction: everything commits
        together or nothing does, and on failure the session stays unsaved (a
        later save writes the same changes). Raises ``SessionDeletedError`` if
        the session was deleted (by any holder, in any process) since it was
        loaded, and ``StorageError`` if another holder saved newer messages.
        """
        session_id = session.session_id
        if session.deleted:
            raise SessionDeletedError(f"session {log_session_id(session_id)} was deleted")
        changes = session._pending_changes()
        metadata_json = dump_metadata(session.metadata)
        agent_name = session.active_agent.name
        now = _iso(self.now())
        inserts = [
            (
                session_id,
                entry.seq,
                entry.message.role.value,
                entry.message.model_dump_json(),
                _iso(entry.message.created_at),
            )
            for entry in changes.inserts
        ]
        loaded_incarnation = session._incarnation
        incarnation = loaded_incarnation or now
        gone = saved = False
        version = _new_version()
        state = session._state() if self._cache.enabled else None  # what this save writes
        fence = self._lease_fence(session_id)  # read here: the body may run elsewhere

        def committed() -> None:
            nonlocal saved
            saved = True
            session._mark_saved(changes, incarnation)
            self._remember(session, version, agent_name, metadata_json, state)

        # The body may run on a database thread: it touches no session state.
        async def body(tx: Transaction) -> None:
            nonlocal incarnation, gone, version
            if fence is not None and await tx.fetchone(*fence) is None:
                raise SessionLeaseLostError(
                    f"session {log_session_id(session_id)} was taken over by another "
                    "process while this turn ran; nothing was saved"
                )
            # Saves of one session queue here, whatever process runs them.
            row = await tx.fetchone(
                "SELECT created_at, version FROM chatflow_sessions WHERE session_id = ?"
                + self._FOR_UPDATE,
                (session_id,),
            )
            if not changes.replace:
                if row is None or row[0] != loaded_incarnation:
                    gone = True
                    raise SessionDeletedError(f"session {log_session_id(session_id)} was deleted")
            elif row is None:
                created = await tx.execute(
                    _INSERT_SESSION_SQL, (session_id, agent_name, metadata_json, now, now, version)
                )
                if created != 1:
                    # Created by someone else since the read: replace it like any row.
                    row = await tx.fetchone(
                        "SELECT created_at, version FROM chatflow_sessions WHERE session_id = ?"
                        + self._FOR_UPDATE,
                        (session_id,),
                    )
                    if row is None:
                        raise StorageError(
                            f"session {log_session_id(session_id)} changed while it was saved"
                        )
            if changes.replace and row is not None:
                # A context that was never loaded replaces whatever the store holds.
                incarnation = str(row[0])
                await tx.execute(
                    "DELETE FROM chatflow_messages WHERE session_id = ?", (session_id,)
                )
            if changes.deletes:
                await tx.executemany(
                    "DELETE FROM chatflow_messages WHERE session_id = ? AND seq BETWEEN ? AND ?",
                    [(session_id, first, last) for first, last in seq_runs(changes.deletes)],
                )
            if changes.compacts:
                # Kept for the console and audits; loads skip them. (The version trigger
                # fires here; the UPDATE below sets the version this save decides.)
                await tx.executemany(
                    "UPDATE chatflow_messages SET compacted = 1 "
                    "WHERE session_id = ? AND seq BETWEEN ? AND ?",
                    [(session_id, first, last) for first, last in seq_runs(changes.compacts)],
                )
            if inserts:
                try:
                    await tx.executemany(_INSERT_MESSAGE_SQL, inserts)
                except StorageError as exc:
                    if self._is_unique_violation(exc.__cause__):
                        raise StorageError(
                            f"session {log_session_id(session_id)} changed in the store since "
                            "this context was loaded; load it again "
                            "(hold session_lock for a whole turn)"
                        ) from exc.__cause__
                    raise
            # The row is locked, and a save's statements fire no trigger: nothing else
            # moves the version before this UPDATE.
            version = (version if row is None else int(row[1])) + 1
            await tx.execute(
                _UPDATE_SESSION_SQL, (agent_name, metadata_json, now, version, session_id)
            )
            if also is not None:
                self._watch_from_here(tx)
                await also(tx)

        try:
            await self._run_own(body, committed)
        except BaseException as exc:
            if not saved:  # failed, conflicting or rolled back: the store may differ
                self._cache.drop(session_id)
            if gone and isinstance(exc, SessionDeletedError):
                session._mark_deleted()
            raise
        self._track(session)

    async def delete(self, session_id: str) -> bool:
        """Delete the session and (by cascade) its messages; ``True`` if it existed."""
        validate_session_id(session_id)
        async with self._transaction(write=True) as tx:
            deleted = await tx.execute(
                "DELETE FROM chatflow_sessions WHERE session_id = ?", (session_id,)
            )
        self._cache.drop(session_id)
        self._mark_deleted(session_id)
        return deleted > 0

    async def list_sessions(self) -> list[str]:
        """Ids of all stored sessions, most recently updated first."""
        async with self._transaction(write=False) as tx:
            rows = await tx.fetchall(
                "SELECT session_id FROM chatflow_sessions ORDER BY updated_at DESC, session_id"
            )
        return [str(row[0]) for row in rows]

    # -- dedup ----------------------------------------------------------------------

    async def claim_message(self, message_id: str) -> bool:
        """Atomically claim ``message_id``: ``True`` only for the first claim within the TTL,
        across every process on the database (its primary key decides)."""
        check_message_id(message_id)

        async def body(tx: Transaction) -> bool:
            return await self.claim_in(tx, message_id)

        return await self.run(body)

    async def claim_in(self, tx: Transaction, message_id: str) -> bool:
        """Claim ``message_id`` inside ``tx`` (a transaction of this store).

        An id whose claim expired counts as unclaimed even before it is purged.
        """
        check_message_id(message_id)
        now = self.now()
        await self._maybe_purge_in(tx, now)
        changed = await tx.execute(
            _CLAIM_SQL, (message_id, now.timestamp(), (now - self._dedup_ttl).timestamp())
        )
        return changed > 0

    async def is_message_processed(self, message_id: str) -> bool:
        """True if ``message_id`` was claimed or marked within the TTL."""
        check_message_id(message_id)
        cutoff = (self.now() - self._dedup_ttl).timestamp()
        async with self._transaction(write=False) as tx:
            row = await tx.fetchone(
                "SELECT 1 FROM chatflow_processed_messages "
                "WHERE message_id = ? AND processed_at >= ?",
                (message_id, cutoff),
            )
        return row is not None

    async def mark_message_processed(self, message_id: str) -> None:
        """Record ``message_id`` as processed now."""
        check_message_id(message_id)
        now = self.now()
        async with self._transaction(write=True) as tx:
            await self._maybe_purge_in(tx, now)
            await tx.execute(_MARK_SQL, (message_id, now.timestamp()))

    async def purge_expired_claims(self, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete up to ``batch_size`` expired dedup ids (by index); return how many went."""
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        now = self.now()
        async with self._transaction(write=True) as tx:
            return await self._purge_in(tx, now, batch_size)

    async def _maybe_purge_in(self, tx: Transaction, now: datetime) -> None:
        if self._purge_due(now):
            await self._purge_in(tx, now, PURGE_BATCH_SIZE)

    async def _purge_in(self, tx: Transaction, now: datetime, batch_size: int) -> int:
        deleted = await tx.execute(
            self._PURGE_SQL, ((now - self._dedup_ttl).timestamp(), batch_size)
        )
        deleted = max(deleted, 0)
        self._purge_done(now, deleted, batch_size)
        if deleted:
            logger.debug("purged %d expired dedup ids", deleted)
        return deleted
