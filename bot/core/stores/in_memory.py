"""``SessionStore``: sessions and dedup ids in memory, for tests, the CLI and stateless services."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bot.core.agent import Agent
from bot.core.ids import check_message_id, log_session_id, validate_session_id
from bot.core.messages import Message
from bot.core.session import DEFAULT_MAX_TURNS, SessionContext, _Changes
from bot.core.stores.base import (
    DEFAULT_DEDUP_TTL_HOURS,
    PURGE_BATCH_SIZE,
    BaseSessionStore,
    SessionDeletedError,
    dump_metadata,
)
from bot.errors import StorageError

__all__ = ["SessionStore"]


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
    compacted: dict[int, Message] = field(default_factory=dict)
    """Messages a compaction took out of the history, by seq (kept for ``conversation``)."""


class SessionStore(BaseSessionStore):
    """In-memory store: for tests, the CLI and stateless services.

    It keeps a snapshot per session and hands out a fresh ``SessionContext`` on
    every load, so a turn that was never saved leaves no trace. It cannot run
    SQL: it is no ``TransactionalStore`` (the gateway needs ``SQLiteSessionStore``
    or ``PostgresSessionStore``).
    """

    def __init__(
        self,
        default_max_turns: int = DEFAULT_MAX_TURNS,
        *,
        dedup_ttl_hours: float = DEFAULT_DEDUP_TTL_HOURS,
        clock: Callable[[], datetime] | None = None,
        prune_to_turns: int | None = None,
    ) -> None:
        super().__init__(
            default_max_turns,
            dedup_ttl_hours=dedup_ttl_hours,
            clock=clock,
            prune_to_turns=prune_to_turns,
        )
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
            prune_to=self._prune_to_turns,
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
            context = SessionContext(
                session_id,
                default_agent,
                self._default_max_turns,
                metadata,
                prune_to=self._prune_to_turns,
            )
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

    async def save(self, session: SessionContext) -> None:
        """Store the session's changes."""
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
            for seq in changes.compacts:
                message = stored.messages.pop(seq, None)
                if message is not None:
                    stored.compacted[seq] = message
            for entry in changes.inserts:
                stored.messages[entry.seq] = entry.message
        stored.agent = session.active_agent
        stored.metadata_json = metadata_json
        stored.updated_at = self.now()
        session._mark_saved(changes, stored.incarnation)
        self._track(session)

    async def conversation(self, session_id: str) -> list[tuple[Message, bool]] | None:
        """Every stored message, compacted ones included, in order, each with whether it
        was compacted; ``None`` if there is no such session."""
        validate_session_id(session_id)
        stored = self._sessions.get(session_id)
        if stored is None:
            return None
        rows = [(seq, m, False) for seq, m in stored.messages.items()]
        rows.extend((seq, m, True) for seq, m in stored.compacted.items())
        return [(message, compacted) for _, message, compacted in sorted(rows, key=lambda r: r[0])]

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
        check_message_id(message_id)
        now = self.now()
        self._maybe_purge(now)
        processed_at = self._processed.get(message_id)
        if processed_at is not None and processed_at >= now - self._dedup_ttl:
            return False
        self._record(message_id, now)
        return True

    async def is_message_processed(self, message_id: str) -> bool:
        """True if ``message_id`` was claimed or marked within the TTL."""
        check_message_id(message_id)
        processed_at = self._processed.get(message_id)
        return processed_at is not None and processed_at >= self.now() - self._dedup_ttl

    async def mark_message_processed(self, message_id: str) -> None:
        """Record ``message_id`` as processed now."""
        check_message_id(message_id)
        now = self.now()
        self._maybe_purge(now)
        self._record(message_id, now)

    async def purge_expired_claims(self, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete up to ``batch_size`` expired dedup ids; return how many went."""
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        return self._purge(self.now(), batch_size)
