"""``SessionContext``: the conversation state of one chat, its change tracking and checkpoints.

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

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from bot.core.agent import Agent
from bot.core.ids import log_session_id, validate_session_id
from bot.core.messages import Message, Role

__all__ = [
    "DEFAULT_MAX_TURNS",
    "SessionCheckpoint",
    "SessionContext",
    "check_max_turns",
    "seq_runs",
]

DEFAULT_MAX_TURNS = 40
"""Turns kept in a session's history when nothing else is said."""


def check_max_turns(value: object, name: str = "max_turns") -> int:
    """Return ``value`` if it is a positive int (not a bool); raise ``TypeError``/``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


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
        self._session_id = session_id
        self._agent = initial_agent
        self._max_turns = check_max_turns(max_turns)
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
