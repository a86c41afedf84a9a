"""The SQL stores' session cache: the last committed window of each session, checked per load.

A ``SessionCache`` keeps, per session, a ``Snapshot`` of what the store holds
as of its last committed save or load by this store: the pruned history with
its indices, the persisted seqs, the incarnation (``created_at``), the row's
``version``, the active agent's name and the metadata JSON.

Freshness
    Every save (by any process) bumps ``chatflow_sessions.version`` in its
    UPDATE, and the trigger of session-schema migration 2 bumps it when a
    message row is updated by hand; a delete removes the row, and a
    re-created session starts at a random version. A load reads only the
    session row's version, ``created_at``, agent and metadata and its
    message-row count (``VERSION_SQL``: a row inserted or deleted by hand
    changes the count) and uses the snapshot iff all match, else it loads
    from disk as before. Snapshots are hints: a stale one costs a disk load,
    never a stale window.

Updates
    A snapshot is put only once a save is known to have committed (its
    on-commit callback) or after a disk load, and dropped on delete, on any
    failed, conflicting or cancelled-before-commit save, and when its
    version no longer matches. A load hands out a *new* context built from
    the frozen snapshot (no parse, no prune): mutating it without saving
    never reaches the cache, so a turn rolled back in memory needs nothing.

Bound
    Least recently used snapshots go once the cached messages exceed
    ``max_messages`` (an empty session counts as one); ``0`` disables the cache.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from bot.core.agent import Agent
from bot.core.session import SessionContext, _State
from bot.core.sql import Transaction

__all__ = ["DEFAULT_CACHE_MESSAGES", "VERSION_SQL", "CachedLoads", "SessionCache", "Snapshot"]


DEFAULT_CACHE_MESSAGES: Final = 50_000
"""Messages a store's session cache holds at most, over all its sessions."""

VERSION_SQL: Final = (
    "SELECT version, created_at, active_agent_name, metadata_json, (SELECT COUNT(*) "
    "FROM chatflow_messages WHERE session_id = ? AND compacted = 0) "
    "FROM chatflow_sessions WHERE session_id = ?"
)
"""The freshness read of a cached load (the id twice): one row and one index range count."""


class Snapshot(NamedTuple):
    """One session as the store holds it, at ``version``."""

    state: _State
    persisted: frozenset[int]
    incarnation: str
    version: int
    agent_name: str
    metadata_json: str

    @property
    def size(self) -> int:
        """What the snapshot counts against the bound: its messages, at least 1."""
        return max(1, len(self.state.systems) + len(self.state.others))

    def matches(self, row: tuple[Any, ...] | None) -> bool:
        """Whether ``row`` (from ``VERSION_SQL``) says the store still holds this snapshot."""
        return (
            row is not None
            and int(row[0]) == self.version
            and str(row[1]) == self.incarnation
            and row[2] == self.agent_name
            and row[3] == self.metadata_json
            and int(row[4]) == len(self.persisted)
        )

    def context(
        self, session_id: str, agent: Agent, max_turns: int, prune_to: int | None = None
    ) -> SessionContext:
        """A new context holding this snapshot (its own lists, indices and metadata)."""
        metadata = json.loads(self.metadata_json)
        return SessionContext._from_state(
            session_id,
            agent,
            max_turns,
            metadata if isinstance(metadata, dict) else {},
            self.state,
            self.persisted,
            self.incarnation,
            prune_to=prune_to,
        )


def snapshot_of(
    context: SessionContext,
    version: int,
    agent_name: str,
    metadata_json: str,
    state: _State | None = None,
) -> Snapshot:
    """``context``'s committed state (call right after its load or save committed).

    ``state`` is the history the save wrote (``context._state()`` when it began).
    """
    incarnation = context._incarnation
    if incarnation is None:
        raise ValueError("only a loaded or saved context has a snapshot")
    return Snapshot(
        context._state() if state is None else state,
        frozenset(context._persisted_seqs),
        incarnation,
        version,
        agent_name,
        metadata_json,
    )


class SessionCache:
    """An LRU of ``Snapshot`` by session id, bounded by the messages it holds."""

    __slots__ = ("_entries", "_max_messages", "_messages")

    def __init__(self, max_messages: int = DEFAULT_CACHE_MESSAGES) -> None:
        if isinstance(max_messages, bool) or not isinstance(max_messages, int):
            raise TypeError("cache_messages must be an int")
        if max_messages < 0:
            raise ValueError(f"cache_messages must not be negative, got {max_messages}")
        self._max_messages = max_messages
        self._entries: OrderedDict[str, Snapshot] = OrderedDict()
        self._messages = 0

    @property
    def enabled(self) -> bool:
        """False when built with ``max_messages=0``: nothing is ever cached."""
        return self._max_messages > 0

    @property
    def messages(self) -> int:
        """Messages held now (the bound's measure)."""
        return self._messages

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._entries

    def get(self, session_id: str) -> Snapshot | None:
        """The snapshot of ``session_id`` (now the most recently used), or ``None``."""
        snapshot = self._entries.get(session_id)
        if snapshot is not None:
            self._entries.move_to_end(session_id)
        return snapshot

    def put(self, session_id: str, snapshot: Snapshot) -> None:
        """Keep ``snapshot`` for ``session_id``; evict the least recently used past the bound."""
        self.drop(session_id)
        size = snapshot.size
        if size > self._max_messages:
            return
        self._entries[session_id] = snapshot
        self._messages += size
        while self._messages > self._max_messages:
            _, evicted = self._entries.popitem(last=False)
            self._messages -= evicted.size

    def drop(self, session_id: str) -> None:
        """Forget ``session_id`` (a no-op if it is not cached)."""
        snapshot = self._entries.pop(session_id, None)
        if snapshot is not None:
            self._messages -= snapshot.size

    def clear(self) -> None:
        """Forget every session."""
        self._entries.clear()
        self._messages = 0


class CachedLoads:
    """The cache side of ``SQLSessionStore`` (a mixin after ``TransactionalStore``)."""

    _cache: SessionCache
    """Committed snapshots of this store's sessions."""

    if TYPE_CHECKING:  # provided by the store classes
        _default_max_turns: int
        _prune_to_turns: int | None

        def _resolve_agent(self, name: str, fallback: Agent | None = None) -> Agent: ...

        def _track(self, context: SessionContext) -> None: ...

        async def run(
            self,
            body: Callable[[Transaction], Any],
            *,
            write: bool = True,
            on_commit: Callable[[], None] | None = None,
        ) -> Any: ...

    async def _load_cached(self, session_id: str, fallback: Agent | None) -> SessionContext | None:
        """A context from the cached snapshot if the store still holds it (one read), else None."""
        fresh = self._fresh_without_read()  # first: it may clear the cache
        snapshot = self._cache.get(session_id)
        if snapshot is None:
            return None
        if not fresh and not snapshot.matches(await self._read_version(session_id)):
            self._cache.drop(session_id)
            return None
        agent = self._resolve_agent(snapshot.agent_name, fallback)
        context = snapshot.context(session_id, agent, self._default_max_turns, self._prune_to_turns)
        self._track(context)
        return context

    def _fresh_without_read(self) -> bool:
        """True if nothing can have changed in the store since the cache was checked.

        Without a way to tell at no cost (PostgreSQL) it is False: every load reads
        the version (``_read_version``).
        """
        return False

    async def _read_version(self, session_id: str) -> tuple[Any, ...] | None:
        """``VERSION_SQL``'s row, in a read transaction (subclasses may read it without one)."""

        async def body(tx: Transaction) -> tuple[Any, ...] | None:
            return await tx.fetchone(VERSION_SQL, (session_id, session_id))

        row: tuple[Any, ...] | None = await self.run(body, write=False)
        return row

    def _remember(
        self,
        context: SessionContext,
        version: int,
        agent_name: str,
        metadata_json: str,
        state: _State | None = None,
    ) -> None:
        """Cache ``context`` as committed at ``version`` (or forget its session)."""
        # Only where the next load takes the snapshot as is: the store's turn marks.
        if (
            self._cache.enabled
            and context.max_turns == self._default_max_turns
            and context.prune_to == (self._prune_to_turns or self._default_max_turns)
        ):
            snapshot = snapshot_of(context, version, agent_name, metadata_json, state)
            self._cache.put(context.session_id, snapshot)
        else:
            self._cache.drop(context.session_id)
