"""Sessions: the conversation state of one chat, and the stores that keep it.

``SessionContext`` holds one conversation: its history, the active agent and
free-form metadata. History is pruned by whole turns (DESIGN §3.2), and
``checkpoint()`` / ``rollback_to()`` make a failed turn leave no trace.

Change tracking (how a save stays O(changes))
---------------------------------------------
Every message in a context carries a sequence number (``seq``) held by the
context, not by the frozen public ``Message``. Seqs only grow: a new message
gets the next one, and a rollback never hands a seq out again. A context also
remembers which seqs its store holds (``_persisted_seqs``, as of the last
load or committed save) and which *incarnation* of the stored session it
belongs to (``_incarnation``: ``None`` until it was loaded or saved).

On save, a store writes the difference between the two: messages whose seq it
does not hold are inserted; held seqs no longer in the history (pruned turns,
dropped orphan tool results, messages undone by a rollback) are deleted. Only
after the transaction commits does the context update its bookkeeping, so a
failed save (or a raising ``also`` hook) leaves it exactly as before and the
next save writes the same difference again.

The bookkeeping mirrors the *store*, not the conversation, so ``rollback_to``
restores history, agent and metadata but leaves the bookkeeping alone: if a
save happened after the checkpoint, the next save deletes what the rolled-back
turn wrote and re-inserts the turns that pruning had removed.

A stale context (loaded before another holder saved new messages) would write
seqs the store already holds; stores refuse that with ``StorageError`` instead
of interleaving two turns. Hold ``store.session_lock(session_id)`` around a
whole turn (load, run, save) so that never happens.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import re
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Hashable,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, ClassVar, NamedTuple, Protocol, Self

from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.paths import is_path_unsafe
from bot.core.sql import Dialect
from bot.errors import StorageError

__all__ = [
    "DEFAULT_DEDUP_TTL_HOURS",
    "DEFAULT_MAX_TURNS",
    "AgentResolver",
    "BaseSessionStore",
    "KeyedLocks",
    "SaveHook",
    "SessionCheckpoint",
    "SessionContext",
    "SessionDeletedError",
    "SessionStore",
    "Transaction",
    "log_session_id",
    "validate_session_id",
]

logger = logging.getLogger(__name__)

DEFAULT_DEDUP_TTL_HOURS = 192
"""How long a processed inbound message id is remembered: 8 days, beyond WhatsApp's 7-day retry."""

DEFAULT_MAX_TURNS = 40
"""Turns kept in a session's history when nothing else is said."""

PURGE_BATCH_SIZE = 1000
"""Most expired dedup ids deleted by one purge."""

PURGE_INTERVAL = timedelta(minutes=1)
"""Least time between two automatic purges (unless the last one filled its batch)."""

NO_SQL_MESSAGE = (
    "the in-memory store cannot run SQL; use SQLiteSessionStore or PostgresSessionStore"
)

_GATEWAY_SESSION_ID = re.compile(r"[a-z0-9_]+-[0-9a-f]{16}")


class SessionDeletedError(StorageError):
    """The session was deleted from its store; the context can no longer be saved."""


class Transaction(Protocol):
    """One open database transaction of a store (see ``BaseSessionStore.transaction``).

    Statements run on the store's connection inside the transaction; it commits
    when the ``async with`` block (or the ``save`` hook) ends without an error
    and rolls back otherwise. Database errors surface as ``StorageError``.
    """

    @property
    def dialect(self) -> Dialect:
        """The SQL dialect statements must be written in (``?`` placeholders on both)."""
        ...

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return the number of rows it changed (-1 if none apply)."""
        ...

    async def executemany(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per parameter set."""
        ...

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a query and return every row."""
        ...

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """Run a query and return its first row, or ``None``."""
        ...


SaveHook = Callable[[Transaction], Awaitable[None]]
"""Extra writes run by ``save(session, also=hook)`` inside the session's own transaction."""

AgentResolver = Callable[[str], Agent | None]
"""Maps a stored agent name back to the live ``Agent`` (``None`` when unknown)."""


def validate_session_id(session_id: object) -> str:
    """Return ``session_id`` if it is a safe, non-empty string; raise otherwise."""
    if not isinstance(session_id, str):
        raise TypeError(f"session_id must be a str, not {type(session_id).__name__}")
    if is_path_unsafe(session_id):
        raise ValueError(
            "session_id must be non-empty and free of '..', '/', '\\', drive letters "
            "and control characters"
        )
    return session_id


def log_session_id(session_id: str) -> str:
    """A form of ``session_id`` fit for logs: gateway ids as they are, others hashed.

    Gateway ids are already hashes (``<platform>-<16 hex>``); an id chosen by a
    library user may be a phone number, which must not reach the logs.
    """
    if _GATEWAY_SESSION_ID.fullmatch(session_id):
        return session_id
    return "sid#" + hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:12]


def dump_metadata(metadata: Mapping[str, Any]) -> str:
    """Serialise session metadata to strict JSON, or raise ``StorageError``."""
    try:
        return json.dumps(metadata, ensure_ascii=False, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise StorageError(f"session metadata is not JSON-serialisable: {exc}") from exc


class _Entry(NamedTuple):
    seq: int
    message: Message


class _Changes(NamedTuple):
    """What a save must write: computed before the transaction, applied after commit."""

    inserts: tuple[_Entry, ...]
    deletes: tuple[int, ...]
    replace: bool


class SessionCheckpoint:
    """Opaque token from ``SessionContext.checkpoint()``; valid only for that context."""

    __slots__ = ("_agent", "_entries", "_metadata", "_owner")

    def __init__(
        self,
        owner: SessionContext,
        entries: tuple[_Entry, ...],
        agent: Agent,
        metadata: dict[str, Any],
    ) -> None:
        self._owner = owner
        self._entries = entries
        self._agent = agent
        self._metadata = metadata

    def __repr__(self) -> str:
        return f"<SessionCheckpoint messages={len(self._entries)} agent={self._agent.name!r}>"


class SessionContext:
    """The state of one conversation: history, active agent and metadata.

    ``history`` is pruned by whole turns on every ``add_message``; edit it only
    through ``add_message``, ``prune_history`` and ``rollback_to``.
    """

    def __init__(
        self,
        session_id: str,
        initial_agent: Agent,
        max_turns: int = DEFAULT_MAX_TURNS,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        validate_session_id(session_id)
        if not isinstance(initial_agent, Agent):
            raise TypeError("initial_agent must be an Agent")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int):
            raise TypeError("max_turns must be an int")
        if max_turns <= 0:
            raise ValueError(f"max_turns must be positive, got {max_turns}")
        self._session_id = session_id
        self._agent = initial_agent
        self._max_turns = max_turns
        self._metadata: dict[str, Any] = dict(metadata) if metadata else {}
        self._entries: list[_Entry] = []
        self._next_seq = 0
        self._deleted = False
        self._persisted_seqs: set[int] = set()
        self._incarnation: str | None = None

    # -- public state ---------------------------------------------------------------

    @property
    def session_id(self) -> str:
        """The session's id (safe as a file name)."""
        return self._session_id

    @property
    def active_agent(self) -> Agent:
        """The agent that answers the next message."""
        return self._agent

    @active_agent.setter
    def active_agent(self, agent: Agent) -> None:
        if not isinstance(agent, Agent):
            raise TypeError("active_agent must be an Agent")
        self._agent = agent

    @property
    def metadata(self) -> dict[str, Any]:
        """Free-form, JSON-serialisable data kept with the session (edit in place)."""
        return self._metadata

    @metadata.setter
    def metadata(self, value: Mapping[str, Any]) -> None:
        self._metadata = dict(value)

    @property
    def history(self) -> list[Message]:
        """A copy of the pruned history: SYSTEM messages first, then whole turns."""
        return [entry.message for entry in self._entries]

    @property
    def max_turns(self) -> int:
        """How many turns (each starting at a USER message) the history keeps."""
        return self._max_turns

    @property
    def deleted(self) -> bool:
        """True once the store deleted this session; saving it then fails."""
        return self._deleted

    def __repr__(self) -> str:
        return (
            f"<SessionContext id={log_session_id(self._session_id)!r} "
            f"agent={self._agent.name!r} messages={len(self._entries)}>"
        )

    # -- history --------------------------------------------------------------------

    def add_message(self, message: Message) -> None:
        """Append ``message`` to the history, then prune it."""
        if not isinstance(message, Message):
            raise TypeError("add_message expects a Message")
        fits = self._fits_at_end(message)
        self._entries.append(_Entry(self._next_seq, message))
        self._next_seq += 1
        if not fits:
            self.prune_history()

    def _fits_at_end(self, message: Message) -> bool:
        """Whether a pruned history stays pruned with ``message`` appended.

        The history is always pruned between calls (construction, restore and
        rollback prune or restore a pruned state), so a MODEL answer after a
        USER message, or a TOOL result whose call is in the history, changes
        nothing: the full pass (O(history)) is needed only for USER and SYSTEM
        messages, once a turn rather than at every step of it.
        """
        if message.role == Role.MODEL:
            return any(entry.message.role == Role.USER for entry in self._entries)
        if message.role == Role.TOOL and message.tool_call_id is not None:
            call_id = message.tool_call_id
            for entry in reversed(self._entries):
                if entry.message.role == Role.MODEL and any(
                    call.id == call_id for call in entry.message.tool_calls
                ):
                    return True
        return False

    def prune_history(self) -> None:
        """Apply DESIGN §3.2's pruning rules to the history.

        SYSTEM messages stay at the front in order; everything before the first
        USER message goes; only the last ``max_turns`` turns stay; a TOOL
        message whose call is not in an earlier kept MODEL message goes.
        """
        systems: list[_Entry] = []
        others: list[_Entry] = []
        for entry in self._entries:
            (systems if entry.message.role == Role.SYSTEM else others).append(entry)
        user_positions = [i for i, e in enumerate(others) if e.message.role == Role.USER]
        if not user_positions:
            others = []
        else:
            others = others[user_positions[-min(self._max_turns, len(user_positions))] :]
        kept: list[_Entry] = []
        calls: set[str] = set()
        for entry in others:
            message = entry.message
            if message.role == Role.MODEL:
                calls.update(call.id for call in message.tool_calls)
            elif message.role == Role.TOOL and (
                message.tool_call_id is None or message.tool_call_id not in calls
            ):
                continue
            kept.append(entry)
        self._entries = systems + kept

    _prune_history = prune_history

    # -- checkpoints ----------------------------------------------------------------

    def checkpoint(self) -> SessionCheckpoint:
        """Capture history, active agent and metadata for a later ``rollback_to``."""
        return SessionCheckpoint(
            self, tuple(self._entries), self._agent, copy.deepcopy(self._metadata)
        )

    def rollback_to(self, checkpoint: SessionCheckpoint) -> None:
        """Restore history, active agent and metadata exactly as at ``checkpoint``.

        Turns pruned since the checkpoint come back. The token stays valid, so
        the same checkpoint may be restored again.
        """
        if not isinstance(checkpoint, SessionCheckpoint):
            raise TypeError("rollback_to expects a token from checkpoint()")
        if checkpoint._owner is not self:
            raise ValueError("this checkpoint belongs to another SessionContext")
        self._entries = list(checkpoint._entries)
        self._agent = checkpoint._agent
        self._metadata = copy.deepcopy(checkpoint._metadata)

    # -- store bookkeeping (used by the stores only) --------------------------------

    @classmethod
    def _restore(
        cls,
        session_id: str,
        agent: Agent,
        max_turns: int,
        metadata: Mapping[str, Any],
        entries: Iterable[tuple[int, Message]],
        persisted_seqs: Iterable[int],
        incarnation: str,
    ) -> SessionContext:
        context = cls(session_id, agent, max_turns, metadata)
        context._entries = sorted((_Entry(s, m) for s, m in entries), key=lambda e: e.seq)
        context._persisted_seqs = set(persisted_seqs)
        known = context._persisted_seqs.union(e.seq for e in context._entries)
        context._next_seq = max(known, default=-1) + 1
        context._incarnation = incarnation
        context.prune_history()
        return context

    def _pending_changes(self) -> _Changes:
        if self._incarnation is None:
            return _Changes(tuple(self._entries), (), True)
        current = {entry.seq for entry in self._entries}
        inserts = tuple(e for e in self._entries if e.seq not in self._persisted_seqs)
        deletes = tuple(sorted(self._persisted_seqs - current))
        return _Changes(inserts, deletes, False)

    def _mark_saved(self, changes: _Changes, incarnation: str) -> None:
        if changes.replace:
            self._persisted_seqs = {entry.seq for entry in changes.inserts}
        else:
            self._persisted_seqs.difference_update(changes.deletes)
            self._persisted_seqs.update(entry.seq for entry in changes.inserts)
        self._incarnation = incarnation

    def _mark_deleted(self) -> None:
        self._deleted = True


def seq_runs(seqs: Sequence[int]) -> list[tuple[int, int]]:
    """Group sorted, distinct ints into inclusive ``(first, last)`` runs of consecutive values."""
    runs: list[tuple[int, int]] = []
    for seq in seqs:
        if runs and seq == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], seq)
        else:
            runs.append((seq, seq))
    return runs


class _LockEntry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class KeyedLocks:
    """Per-key asyncio locks that exist only while someone holds or waits for them."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, _LockEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        """Hold the lock for ``key`` for the duration of the ``async with`` block."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _LockEntry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _default_clock() -> datetime:
    return datetime.now(UTC)


class BaseSessionStore(ABC):
    """Where sessions live between turns, plus inbound-message dedup.

    Hold ``session_lock(session_id)`` around a whole turn (load, run, save):
    two turns of one session then never interleave, however many
    ``SessionContext`` objects exist. The lock is not re-entrant.
    """

    dialect: ClassVar[Dialect | None] = None
    """SQL dialect of ``transaction()`` (``None``: the store cannot run SQL)."""

    def __init__(
        self,
        default_max_turns: int = DEFAULT_MAX_TURNS,
        *,
        dedup_ttl_hours: float = DEFAULT_DEDUP_TTL_HOURS,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        if isinstance(default_max_turns, bool) or not isinstance(default_max_turns, int):
            raise TypeError("default_max_turns must be an int")
        if default_max_turns <= 0:
            raise ValueError(f"default_max_turns must be positive, got {default_max_turns}")
        if isinstance(dedup_ttl_hours, bool) or not isinstance(dedup_ttl_hours, int | float):
            raise TypeError("dedup_ttl_hours must be a number")
        if not dedup_ttl_hours > 0:
            raise ValueError(f"dedup_ttl_hours must be positive, got {dedup_ttl_hours}")
        self._default_max_turns = default_max_turns
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
    def dedup_ttl(self) -> timedelta:
        """How long a claimed message id stays claimed."""
        return self._dedup_ttl

    def now(self) -> datetime:
        """The store's clock (aware UTC); injectable for tests."""
        return _utc(self._clock())

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
        logger.warning(
            "stored agent %r is unknown to this runner; using a placeholder without tools", name
        )
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
    async def save(self, session: SessionContext, *, also: SaveHook | None = None) -> None:
        """Write the session's changes in one transaction (O(changes)).

        ``also`` runs in the same transaction (SQL stores only). Raises
        ``SessionDeletedError`` if the session was deleted since it was loaded.
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

    @abstractmethod
    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """An ``async with`` block running SQL in one transaction on the store's database."""

    async def ping(self) -> None:
        """Raise ``StorageError`` unless the store answers (health checks; no write lock)."""
        return None  # in memory: always answers

    # -- dedup ----------------------------------------------------------------------

    @abstractmethod
    async def claim_message(self, message_id: str) -> bool:
        """Atomically claim an inbound message id: ``True`` only for the first claim in the TTL."""

    async def claim_in(self, tx: Transaction, message_id: str) -> bool:
        """``claim_message`` inside the caller's transaction (SQL stores only)."""
        raise StorageError(NO_SQL_MESSAGE)

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


def _check_message_id(message_id: object) -> str:
    if not isinstance(message_id, str) or not message_id:
        raise ValueError("message_id must be a non-empty str")
    return message_id


@dataclass
class _StoredSession:
    incarnation: str
    """Distinguishes this stored session from an earlier one of the same id."""
    agent: Agent
    """Active agent at the last save."""
    metadata_json: str
    """Metadata at the last save, as JSON (same semantics as the SQLite store)."""
    updated_at: datetime
    """Time of the last save."""
    messages: dict[int, Message] = field(default_factory=dict)
    """Stored messages by seq."""


class SessionStore(BaseSessionStore):
    """In-memory store: for tests, the CLI and stateless services.

    It keeps a snapshot per session and hands out a fresh ``SessionContext`` on
    every load, so a turn that was never saved leaves no trace. It cannot run
    SQL: ``transaction()``, ``claim_in()`` and ``save(also=...)`` raise
    ``StorageError`` (the gateway needs ``SQLiteSessionStore``).
    """

    def __init__(
        self,
        default_max_turns: int = DEFAULT_MAX_TURNS,
        *,
        dedup_ttl_hours: float = DEFAULT_DEDUP_TTL_HOURS,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        super().__init__(default_max_turns, dedup_ttl_hours=dedup_ttl_hours, clock=clock)
        self._sessions: dict[str, _StoredSession] = {}
        self._processed: OrderedDict[str, datetime] = OrderedDict()
        self._incarnations = 0

    async def close(self) -> None:
        """Nothing to release: the data lives as long as the store object."""

    def _new_incarnation(self) -> str:
        self._incarnations += 1
        return f"mem-{self._incarnations}"

    def _load(self, session_id: str, stored: _StoredSession) -> SessionContext:
        context = SessionContext._restore(
            session_id,
            stored.agent,
            self._default_max_turns,
            json.loads(stored.metadata_json),
            stored.messages.items(),
            stored.messages.keys(),
            stored.incarnation,
        )
        self._track(context)
        return context

    async def get_or_create(
        self,
        session_id: str,
        default_agent: Agent,
        metadata: Mapping[str, Any] | None = None,
    ) -> SessionContext:
        """Load the session, or create (and store) it with ``default_agent`` and ``metadata``."""
        validate_session_id(session_id)
        stored = self._sessions.get(session_id)
        if stored is None:
            context = SessionContext(session_id, default_agent, self._default_max_turns, metadata)
            stored = _StoredSession(
                incarnation=self._new_incarnation(),
                agent=default_agent,
                metadata_json=dump_metadata(context.metadata),
                updated_at=self.now(),
            )
            self._sessions[session_id] = stored
            context._mark_saved(_Changes((), (), True), stored.incarnation)
            self._track(context)
            return context
        return self._load(session_id, stored)

    async def get(self, session_id: str) -> SessionContext | None:
        """A fresh context for the stored session, or ``None``."""
        validate_session_id(session_id)
        stored = self._sessions.get(session_id)
        return None if stored is None else self._load(session_id, stored)

    async def save(self, session: SessionContext, *, also: SaveHook | None = None) -> None:
        """Store the session's changes. ``also`` is not supported here (``StorageError``)."""
        if also is not None:
            raise StorageError(NO_SQL_MESSAGE)
        if session.deleted:
            raise SessionDeletedError(f"session {log_session_id(session.session_id)} was deleted")
        changes = session._pending_changes()
        metadata_json = dump_metadata(session.metadata)
        stored = self._sessions.get(session.session_id)
        if changes.replace:
            if stored is None:
                stored = _StoredSession(
                    incarnation=self._new_incarnation(),
                    agent=session.active_agent,
                    metadata_json=metadata_json,
                    updated_at=self.now(),
                )
                self._sessions[session.session_id] = stored
            stored.messages = {entry.seq: entry.message for entry in changes.inserts}
        else:
            if stored is None or stored.incarnation != session._incarnation:
                raise SessionDeletedError(
                    f"session {log_session_id(session.session_id)} was deleted"
                )
            if any(entry.seq in stored.messages for entry in changes.inserts):
                raise StorageError(
                    f"session {log_session_id(session.session_id)} changed in the store since "
                    "this context was loaded; load it again (hold session_lock for a whole turn)"
                )
            for seq in changes.deletes:
                stored.messages.pop(seq, None)
            for entry in changes.inserts:
                stored.messages[entry.seq] = entry.message
        stored.agent = session.active_agent
        stored.metadata_json = metadata_json
        stored.updated_at = self.now()
        session._mark_saved(changes, stored.incarnation)
        self._track(session)

    async def delete(self, session_id: str) -> bool:
        """Delete the session; contexts handed out become ``deleted``."""
        validate_session_id(session_id)
        existed = self._sessions.pop(session_id, None) is not None
        self._mark_deleted(session_id)
        return existed

    async def list_sessions(self) -> list[str]:
        """Ids of all stored sessions, most recently updated first."""
        ids = sorted(self._sessions)
        ids.sort(key=lambda sid: self._sessions[sid].updated_at, reverse=True)
        return ids

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """Always raises ``StorageError``: the in-memory store cannot run SQL."""
        raise StorageError(NO_SQL_MESSAGE)

    # -- dedup ----------------------------------------------------------------------

    def _record(self, message_id: str, now: datetime) -> None:
        # Re-inserting keeps the dict ordered by time, so purges read only the front.
        self._processed.pop(message_id, None)
        self._processed[message_id] = now

    def _maybe_purge(self, now: datetime) -> None:
        if self._purge_due(now):
            self._purge(now, PURGE_BATCH_SIZE)

    def _purge(self, now: datetime, batch_size: int) -> int:
        cutoff = now - self._dedup_ttl
        deleted = 0
        while deleted < batch_size and self._processed:
            oldest_id, processed_at = next(iter(self._processed.items()))
            if processed_at >= cutoff:
                break
            del self._processed[oldest_id]
            deleted += 1
        self._purge_done(now, deleted, batch_size)
        return deleted

    async def claim_message(self, message_id: str) -> bool:
        """Atomically claim ``message_id`` (no await between check and record)."""
        _check_message_id(message_id)
        now = self.now()
        self._maybe_purge(now)
        processed_at = self._processed.get(message_id)
        if processed_at is not None and processed_at >= now - self._dedup_ttl:
            return False
        self._record(message_id, now)
        return True

    async def is_message_processed(self, message_id: str) -> bool:
        """True if ``message_id`` was claimed or marked within the TTL."""
        _check_message_id(message_id)
        processed_at = self._processed.get(message_id)
        return processed_at is not None and processed_at >= self.now() - self._dedup_ttl

    async def mark_message_processed(self, message_id: str) -> None:
        """Record ``message_id`` as processed now."""
        _check_message_id(message_id)
        now = self.now()
        self._maybe_purge(now)
        self._record(message_id, now)

    async def purge_expired_claims(self, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete up to ``batch_size`` expired dedup ids; return how many went."""
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        return self._purge(self.now(), batch_size)
