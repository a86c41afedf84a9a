"""The session-store contract (DESIGN §3.3) and the SQL capability some stores add.

``BaseSessionStore`` is what every store offers: load, save, delete and list
sessions, per-session locks, and inbound-message dedup. ``TransactionalStore``
is the capability of the SQL stores on top of it: ``transaction()`` blocks,
``run(body)`` (one transaction in one call: the hot path's form), ``claim_in``
and ``save(session, also=hook)``, through which the gateway writes its inbox
and ledger rows in the session's own transaction. Code that needs
SQL types against ``TransactionalStore`` and checks what it is given with
``require_transactional``, so an in-memory store fails at once, not inside a
turn.
"""

from __future__ import annotations

import json
import logging
import weakref
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

from bot.core.agent import Agent
from bot.core.ids import validate_session_id
from bot.core.messages import Message
from bot.core.session import DEFAULT_MAX_TURNS, SessionContext, check_max_turns, check_prune_to
from bot.core.sql import Dialect, Transaction
from bot.core.stores._locks import KeyedLocks
from bot.errors import StorageError

__all__ = [
    "DEFAULT_DEDUP_TTL_HOURS",
    "NO_SQL_MESSAGE",
    "PURGE_BATCH_SIZE",
    "PURGE_INTERVAL",
    "AgentResolver",
    "BaseSessionStore",
    "NotTransactionalError",
    "SaveHook",
    "SessionDeletedError",
    "TransactionBody",
    "TransactionalStore",
    "as_utc",
    "dump_metadata",
    "require_transactional",
]

logger = logging.getLogger(__name__)

DEFAULT_DEDUP_TTL_HOURS = 192
"""How long a processed inbound message id is remembered: 8 days, beyond WhatsApp's 7-day retry."""

PURGE_BATCH_SIZE = 1000
"""Most expired dedup ids deleted by one purge."""

PURGE_INTERVAL = timedelta(minutes=1)
"""Least time between two automatic purges (unless the last one filled its batch)."""

NO_SQL_MESSAGE = (
    "the in-memory store cannot run SQL; use SQLiteSessionStore or PostgresSessionStore"
)


class SessionDeletedError(StorageError):
    """The session was deleted from its store; the context can no longer be saved."""


class NotTransactionalError(StorageError, TypeError):
    """A store that cannot run SQL was given where SQL transactions are needed.

    A ``TypeError`` (the wrong kind of store was passed) and a ``StorageError``
    (so ``Runner.run_async`` still raises only ``ChatflowError``).
    """


SaveHook = Callable[[Transaction], Awaitable[None]]
"""Extra writes run by ``save(session, also=hook)`` inside the session's own transaction.

It must not suspend (await only the ``Transaction``): on SQLite it runs on the
database thread, inside ``run``."""

_T = TypeVar("_T")

TransactionBody = Callable[[Transaction], Coroutine[Any, Any, _T]]
"""``async def body(tx) -> T`` for ``TransactionalStore.run``: awaits only ``tx``."""

AgentResolver = Callable[[str], Agent | None]
"""Maps a stored agent name back to the live ``Agent`` (``None`` when unknown)."""


def dump_metadata(metadata: Mapping[str, Any]) -> str:
    """Serialise session metadata to strict JSON, or raise ``StorageError``."""
    try:
        return json.dumps(metadata, ensure_ascii=False, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise StorageError(f"session metadata is not JSON-serialisable: {exc}") from exc


def as_utc(value: datetime) -> datetime:
    """``value`` as an aware UTC datetime (a naive one is taken to be UTC already)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _default_clock() -> datetime:
    return datetime.now(UTC)


class BaseSessionStore(ABC):
    """Where sessions live between turns, plus inbound-message dedup.

    Hold ``session_lock(session_id)`` around a whole turn (load, run, save):
    two turns of one session then never interleave, however many
    ``SessionContext`` objects exist. The lock is not re-entrant.
    """

    def __init__(
        self,
        default_max_turns: int = DEFAULT_MAX_TURNS,
        *,
        dedup_ttl_hours: float = DEFAULT_DEDUP_TTL_HOURS,
        clock: Callable[[], datetime] | None = None,
        prune_to_turns: int | None = None,
    ) -> None:
        self._default_max_turns = check_max_turns(default_max_turns, "default_max_turns")
        # Past max_turns a session drops back to this many turns at once (None: one at a time).
        self._prune_to_turns = (
            None if prune_to_turns is None else check_prune_to(prune_to_turns, default_max_turns)
        )
        if isinstance(dedup_ttl_hours, bool) or not isinstance(dedup_ttl_hours, int | float):
            raise TypeError("dedup_ttl_hours must be a number")
        if not dedup_ttl_hours > 0:
            raise ValueError(f"dedup_ttl_hours must be positive, got {dedup_ttl_hours}")
        self._dedup_ttl = timedelta(hours=dedup_ttl_hours)
        self._clock: Callable[[], datetime] = clock or _default_clock
        self._resolver: AgentResolver | None = None
        self._live: weakref.WeakSet[SessionContext] = weakref.WeakSet()
        self._next_purge_at: datetime | None = None
        self._session_locks = KeyedLocks()

    @property
    def default_max_turns(self) -> int:
        """``max_turns`` of every session this store loads or creates."""
        return self._default_max_turns

    @property
    def prune_to_turns(self) -> int:
        """Turns a session drops back to when it passes ``default_max_turns``."""
        return self._default_max_turns if self._prune_to_turns is None else self._prune_to_turns

    @property
    def dedup_ttl(self) -> timedelta:
        """How long a claimed message id stays claimed."""
        return self._dedup_ttl

    def now(self) -> datetime:
        """The store's clock (aware UTC); injectable for tests."""
        return as_utc(self._clock())

    # -- agents ---------------------------------------------------------------------

    def set_agent_resolver(self, resolver: AgentResolver | None) -> None:
        """Map stored agent names back to live agents (the Runner registers one)."""
        self._resolver = resolver

    def _resolve_agent(self, name: str, fallback: Agent | None = None) -> Agent:
        if self._resolver is not None:
            agent = self._resolver(name)
            if agent is not None:
                return agent
        if fallback is not None and fallback.name == name:
            return fallback
        # DEBUG: the Runner that loads it says once, at INFO, where the conversation goes.
        logger.debug("stored agent %r is unknown here; a placeholder without tools", name)
        return Agent(name=name, instructions="")

    # -- contexts -------------------------------------------------------------------

    def _track(self, context: SessionContext) -> None:
        self._live.add(context)

    def _mark_deleted(self, session_id: str) -> None:
        for context in list(self._live):
            if context.session_id == session_id:
                context._mark_deleted()

    # -- lifecycle ------------------------------------------------------------------

    async def open(self) -> None:  # noqa: B027 - optional hook, nothing to open by default
        """Prepare the store (a no-op unless the backend needs it); idempotent."""

    @abstractmethod
    async def close(self) -> None:
        """Release the store's resources; idempotent."""

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- sessions -------------------------------------------------------------------

    @abstractmethod
    async def get_or_create(
        self,
        session_id: str,
        default_agent: Agent,
        metadata: Mapping[str, Any] | None = None,
    ) -> SessionContext:
        """Load the session, or create (and store) it with ``default_agent`` and ``metadata``.

        ``metadata`` is used only when the session is created.
        """

    @abstractmethod
    async def get(self, session_id: str) -> SessionContext | None:
        """A fresh context for the stored session, or ``None`` if there is none."""

    @abstractmethod
    async def save(self, session: SessionContext) -> None:
        """Write the session's changes in one transaction (O(changes)).

        Raises ``SessionDeletedError`` if the session was deleted since it was loaded.
        """

    @abstractmethod
    async def conversation(self, session_id: str) -> list[tuple[Message, bool]] | None:
        """Every stored message of the session, compacted ones included, in order.

        Each comes with whether a compaction took it out of the history (the
        model no longer sees it); ``None`` if there is no such session.
        """

    @abstractmethod
    async def delete(self, session_id: str) -> bool:
        """Delete the session and its messages; ``True`` if it existed."""

    @abstractmethod
    async def list_sessions(self) -> list[str]:
        """Ids of all stored sessions, most recently updated first."""

    def session_lock(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """An async context manager serialising turns of ``session_id`` (not re-entrant)."""
        validate_session_id(session_id)
        return self._session_locks.hold(session_id)

    async def ping(self) -> None:
        """Raise ``StorageError`` unless the store answers (health checks; no write lock)."""
        return None  # in memory: always answers

    # -- dedup ----------------------------------------------------------------------

    @abstractmethod
    async def claim_message(self, message_id: str) -> bool:
        """Atomically claim an inbound message id: ``True`` only for the first claim in the TTL."""

    @abstractmethod
    async def is_message_processed(self, message_id: str) -> bool:
        """True if ``message_id`` was claimed or marked within the TTL."""

    @abstractmethod
    async def mark_message_processed(self, message_id: str) -> None:
        """Record ``message_id`` as processed now (the seeds' check-then-mark pair)."""

    @abstractmethod
    async def purge_expired_claims(self, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete up to ``batch_size`` expired dedup ids; return how many went."""

    def _purge_due(self, now: datetime) -> bool:
        return self._next_purge_at is None or now >= self._next_purge_at

    def _purge_done(self, now: datetime, deleted: int, batch_size: int) -> None:
        # A full batch means a backlog: purge again on the next claim.
        self._next_purge_at = now if deleted >= batch_size else now + PURGE_INTERVAL


class TransactionalStore(BaseSessionStore):
    """A store on a SQL database: its transactions can carry the caller's own rows.

    The SQLite and PostgreSQL stores implement it; the in-memory ``SessionStore``
    does not (it cannot join SQL writes).
    """

    dialect: ClassVar[Dialect]
    """SQL dialect of ``transaction()``: read where the SQL must differ."""

    @abstractmethod
    async def save(self, session: SessionContext, *, also: SaveHook | None = None) -> None:
        """Write the session's changes in one transaction (O(changes)).

        ``also(tx)`` runs last in the same transaction: everything commits
        together or nothing does. Raises ``SessionDeletedError`` if the session
        was deleted since it was loaded.
        """

    @abstractmethod
    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """An ``async with`` block running SQL in one transaction on the store's database."""

    @abstractmethod
    def _transaction(
        self, *, write: bool, on_commit: Callable[[], None] | None = None
    ) -> AbstractAsyncContextManager[Transaction]:
        """A transaction; ``on_commit`` runs once it is known to have committed.

        Implementations begin it on their driver and end it by ``SQLSessionStore._settle``.
        """

    async def run(
        self,
        body: TransactionBody[_T],
        *,
        write: bool = True,
        on_commit: Callable[[], None] | None = None,
    ) -> _T:
        """``await body(tx)`` in one transaction, committed (or rolled back) when it returns.

        ``body`` may await only ``tx``'s methods: on SQLite it runs on the
        database thread in one call, and one that suspends fails with
        ``StorageError``. ``on_commit()`` runs on the caller's loop once the
        commit is known. A caller cancelled once its body is on the database
        thread (SQLite) or its COMMIT is sent waits for the outcome, runs
        ``on_commit`` if it committed, then raises ``CancelledError``.
        """
        async with self._transaction(write=write, on_commit=on_commit) as tx:
            return await body(tx)

    @abstractmethod
    async def claim_in(self, tx: Transaction, message_id: str) -> bool:
        """``claim_message`` inside the caller's transaction ``tx`` (one of this store's)."""


def require_transactional(store: BaseSessionStore, needed_by: str) -> TransactionalStore:
    """``store`` if it can run SQL; else ``NotTransactionalError`` naming ``needed_by``."""
    if isinstance(store, TransactionalStore):
        return store
    raise NotTransactionalError(
        f"{needed_by} needs a SQL store, not {type(store).__name__}: {NO_SQL_MESSAGE}"
    )
