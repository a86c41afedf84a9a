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
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain, islice
from operator import attrgetter
from typing import Any, NamedTuple

from bot.core.agent import Agent
from bot.core.ids import log_session_id, validate_session_id
from bot.core.messages import Message, Role

__all__ = [
    "DEFAULT_MAX_TURNS",
    "DEFAULT_PRUNE_TO_FRACTION",
    "SessionCheckpoint",
    "SessionContext",
    "check_max_turns",
    "check_prune_to",
    "default_prune_to",
    "seq_runs",
]

DEFAULT_MAX_TURNS = 40
"""Turns kept in a session's history when nothing else is said."""

DEFAULT_PRUNE_TO_FRACTION = 0.75
"""The application's lower mark, as a share of ``max_turns`` (``default_prune_to``).

A history pruned one turn at a time past its window changes its first message on
every turn, so no request reuses the model provider's cached prompt prefix. Pruning
back to a lower mark at once keeps the prefix stable for the turns in between
(40 turns, down to 30: 43 % of input tokens cacheable over 150 turns becomes about
90 %, ``bench/prompt_cost.py``), and never keeps more than ``max_turns``.
"""


def default_prune_to(max_turns: int) -> int:
    """The lower mark the application uses for ``max_turns``: 3/4 of it, at least 1."""
    return max(1, int(max_turns * DEFAULT_PRUNE_TO_FRACTION))


def check_max_turns(value: object, name: str = "max_turns") -> int:
    """Return ``value`` if it is a positive int (not a bool); raise ``TypeError``/``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def check_prune_to(value: object, max_turns: int) -> int:
    """Return ``value`` if it is an int in ``1..max_turns``; raise ``TypeError``/``ValueError``."""
    check_max_turns(value, "prune_to")
    assert isinstance(value, int)
    if value > max_turns:
        raise ValueError(f"prune_to must not exceed max_turns ({max_turns}), got {value}")
    return value


class _Entry(NamedTuple):
    seq: int
    message: Message


_seq_of = attrgetter("seq")
# Enum member lookups (``Role.USER``) are slow attribute reads; the hot paths use these.
_SYSTEM, _USER, _MODEL, _TOOL = Role.SYSTEM, Role.USER, Role.MODEL, Role.TOOL
_ATOMS = (str, int, float, bool, type(None))


def _copy_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``metadata``; a plain dict copy when every value is immutable."""
    if all(type(value) in _ATOMS for value in metadata.values()):
        return dict(metadata)
    return copy.deepcopy(metadata)


def _call_ids(message: Message) -> Iterable[str]:
    """The distinct tool-call ids of a MODEL message, in order."""
    calls = message.tool_calls
    if len(calls) == 1:
        return (calls[0].id,)
    return dict.fromkeys(call.id for call in calls)


class _Changes(NamedTuple):
    """What a save must write: computed before the transaction, applied after commit."""

    inserts: tuple[_Entry, ...]
    deletes: tuple[int, ...]
    replace: bool
    compacts: tuple[int, ...] = ()
    """Seqs to keep in the store marked compacted (out of the history, not deleted)."""


class _State(NamedTuple):
    """A context's history and indices, frozen (``SessionContext._state`` / ``_from_state``)."""

    systems: tuple[_Entry, ...]
    others: tuple[_Entry, ...]
    users: tuple[int, ...]
    calls: dict[str, tuple[int, ...]]
    tools: dict[str, tuple[int, ...]]
    indexed: bool
    next_seq: int


class SessionCheckpoint:
    """Opaque token from ``SessionContext.checkpoint()``; valid only for that context."""

    __slots__ = ("_agent", "_metadata", "_others", "_owner", "_systems")

    def __init__(
        self,
        owner: SessionContext,
        systems: tuple[_Entry, ...],
        others: tuple[_Entry, ...],
        agent: Agent,
        metadata: dict[str, Any],
    ) -> None:
        self._owner = owner
        self._systems = systems
        self._others = others
        self._agent = agent
        self._metadata = metadata

    def __repr__(self) -> str:
        count = len(self._systems) + len(self._others)
        return f"<SessionCheckpoint messages={count} agent={self._agent.name!r}>"


class SessionContext:
    """The state of one conversation: history, active agent and metadata.

    ``history`` is pruned by whole turns on every ``add_message``; edit it only
    through ``add_message``, ``prune_history`` and ``rollback_to``.

    The history is held pruned as SYSTEM entries plus the turns (``_others``,
    which starts at a USER message), with indices that make an append O(turn),
    not O(window): the seqs of the USER messages (``_users``, one per kept
    turn) and, per tool-call id, the seqs of the kept MODEL messages carrying
    it (``_calls``; its length is the id's reference count) and of the kept
    TOOL messages answering it (``_tools``); their values are tuples, replaced
    rather than edited, so a snapshot copies them with one ``dict()``. Seqs grow
    along ``_others``, so "earlier" is "smaller seq". The full pass
    (``prune_history``) builds the indices; a rollback leaves them to be
    rebuilt by the next append.

    ``prune_to`` (default ``max_turns``) is the lower mark: when an append
    passes ``max_turns`` turns, the oldest turns go until ``prune_to`` are
    left. Every rule of DESIGN §3.2 holds for any mark; a lower one keeps the
    history's first message, hence the model's cached prompt prefix, stable
    for ``max_turns - prune_to`` turns at a time.
    """

    def __init__(
        self,
        session_id: str,
        initial_agent: Agent,
        max_turns: int = DEFAULT_MAX_TURNS,
        metadata: Mapping[str, Any] | None = None,
        *,
        prune_to: int | None = None,
    ) -> None:
        validate_session_id(session_id)
        if not isinstance(initial_agent, Agent):
            raise TypeError("initial_agent must be an Agent")
        self._session_id = session_id
        self._agent = initial_agent
        self._max_turns = check_max_turns(max_turns)
        self._prune_to = (
            self._max_turns if prune_to is None else check_prune_to(prune_to, max_turns)
        )
        self._metadata: dict[str, Any] = dict(metadata) if metadata else {}
        self._systems: list[_Entry] = []
        self._others: deque[_Entry] = deque()
        self._users: deque[int] = deque()
        self._calls: dict[str, tuple[int, ...]] = {}
        self._tools: dict[str, tuple[int, ...]] = {}
        self._indexed = True  # False after a rollback, until the next append rebuilds them
        self._next_seq = 0
        self._deleted = False
        self._persisted_seqs: set[int] = set()
        self._incarnation: str | None = None
        # O(turn) change tracking, valid while _tracked: the store holds exactly the
        # history's seqs below _saved_next plus _dropped (seqs the incremental prune
        # removed since). A full pass, rollback or restore falls back to the full diff.
        self._tracked = False
        self._saved_next = 0
        self._dropped: list[int] = []
        self._epoch = 0  # bumped by every edit the tracking does not follow
        # The last changes computed and the edit mark then: if both still hold at
        # commit, the tracking restarts from empty, else from the full diff.
        self._computed: tuple[_Changes, tuple[int, int, int]] | None = None
        # Seqs a compaction took out of the history: the store marks them, never deletes.
        self._compacting: set[int] = set()

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
        return [entry.message for entry in self._iter_entries()]

    @property
    def max_turns(self) -> int:
        """How many turns (each starting at a USER message) the history keeps."""
        return self._max_turns

    @property
    def prune_to(self) -> int:
        """Turns left when an append passes ``max_turns`` (``max_turns``: one at a time)."""
        return self._prune_to

    @property
    def deleted(self) -> bool:
        """True once the store deleted this session; saving it then fails."""
        return self._deleted

    def __repr__(self) -> str:
        return (
            f"<SessionContext id={log_session_id(self._session_id)!r} "
            f"agent={self._agent.name!r} messages={len(self._systems) + len(self._others)}>"
        )

    # -- history --------------------------------------------------------------------

    def _iter_entries(self) -> Iterator[_Entry]:
        return chain(self._systems, self._others)

    @property
    def _entries(self) -> list[_Entry]:
        """The pruned history as ``(seq, message)`` entries, SYSTEM first (a copy)."""
        return [*self._systems, *self._others]

    def add_message(self, message: Message) -> None:
        """Append ``message`` to the history, then prune it.

        The history is pruned between calls, so an append prunes incrementally,
        in O(turn) whatever the window's length: a USER message past
        ``max_turns`` drops the oldest turn (only that one can fall out) and
        the TOOL results it orphans; a SYSTEM message joins the others at the
        front; a MODEL or TOOL message before the first USER message, or a TOOL
        message whose call no kept MODEL message carries, is dropped at once.
        The result is what ``prune_history()`` gives (DESIGN §3.2).
        """
        if not isinstance(message, Message):
            raise TypeError("add_message expects a Message")
        if not self._indexed:
            self.prune_history()  # a pruned history stays as it is; the indices are rebuilt
        entry = _Entry(self._next_seq, message)
        self._next_seq += 1
        role = message.role
        if role == _USER:
            self._others.append(entry)
            self._users.append(entry.seq)
            if len(self._users) > self._max_turns:
                while len(self._users) > self._prune_to:
                    self._drop_oldest_turn()
        elif role == _SYSTEM:
            self._systems.append(entry)
        elif not self._users:
            return  # nothing before the first USER message is kept
        elif role == _MODEL:
            self._others.append(entry)
            calls = self._calls
            for call_id in _call_ids(message):
                refs = calls.get(call_id)
                calls[call_id] = (entry.seq,) if refs is None else (*refs, entry.seq)
        else:
            answered = message.tool_call_id
            if answered is None or answered not in self._calls:
                return  # its call is not in the history
            self._others.append(entry)
            answers = self._tools.get(answered)
            self._tools[answered] = (entry.seq,) if answers is None else (*answers, entry.seq)

    def _drop_oldest_turn(self) -> None:
        """Drop the oldest turn and the TOOL results that lose their call with it.

        A TOOL result stays iff a kept MODEL message *before* it carries its
        call id; only ids used in the dropped turn can lose such a message,
        and for each the results before its first remaining call go (an id may
        repeat across turns, so a later call can keep later results alive).
        """
        others = self._others
        dropped = self._dropped
        self._users.popleft()
        boundary = self._users[0]  # the seq of the new oldest turn's USER message
        touched: dict[str, None] = {}
        while others[0].seq < boundary:
            gone = others.popleft()
            dropped.append(gone.seq)
            message = gone.message
            if message.role == _MODEL:
                touched.update(dict.fromkeys(_call_ids(message)))
            elif message.tool_call_id is not None:
                touched[message.tool_call_id] = None
        orphans: list[int] = []
        calls, tools = self._calls, self._tools
        for call_id in touched:
            refs = calls.get(call_id)
            first_call: int | None = None
            if refs is not None:
                refs = refs[bisect_left(refs, boundary) :]
                if refs:
                    calls[call_id] = refs
                    first_call = refs[0]
                else:
                    del calls[call_id]
            answers = tools.get(call_id)
            if answers is None:
                continue
            start = bisect_left(answers, boundary)
            keep = len(answers) if first_call is None else bisect_left(answers, first_call)
            keep = max(start, keep)
            orphans.extend(answers[start:keep])
            if keep < len(answers):
                tools[call_id] = answers[keep:]
            else:
                del tools[call_id]
        for seq in sorted(orphans, reverse=True):
            del others[bisect_left(others, seq, key=_seq_of)]
        dropped.extend(orphans)

    def prune_history(self) -> None:
        """Apply DESIGN §3.2's pruning rules to the history.

        SYSTEM messages stay at the front in order; everything before the first
        USER message goes; only the last ``max_turns`` turns stay; a TOOL
        message whose call is not in an earlier kept MODEL message goes.
        This full pass (O(history)) also serves restores and rollbacks.
        """
        self._prune_entries(list(self._iter_entries()))

    _prune_history = prune_history

    def _prune_entries(self, entries: Iterable[_Entry]) -> None:
        """Set the history to ``entries`` (seqs growing), pruned in full; rebuild the indices."""
        systems: list[_Entry] = []
        others: list[_Entry] = []
        for entry in entries:
            (systems if entry.message.role == _SYSTEM else others).append(entry)
        user_positions = [i for i, e in enumerate(others) if e.message.role == _USER]
        turns = len(user_positions)
        if turns > self._max_turns:
            others = others[user_positions[-self._prune_to] :]
        elif user_positions:
            others = others[user_positions[0] :]
        else:
            others = []
        kept: deque[_Entry] = deque()
        users: deque[int] = deque()
        calls: dict[str, tuple[int, ...]] = {}
        tools: dict[str, tuple[int, ...]] = {}
        for entry in others:
            message = entry.message
            if message.role == _MODEL:
                for call_id in _call_ids(message):
                    calls[call_id] = (*calls.get(call_id, ()), entry.seq)
            elif message.role == _TOOL:
                answered = message.tool_call_id
                if answered is None or answered not in calls:
                    continue
                tools[answered] = (*tools.get(answered, ()), entry.seq)
            elif message.role == _USER:
                users.append(entry.seq)
            kept.append(entry)
        self._systems = systems
        self._others = kept
        self._users = users
        self._calls = calls
        self._tools = tools
        self._indexed = True
        self._untrack()  # a full pass may drop anything

    def _compact(self, keep_from: int | None, replaced: Iterable[int], summary: Message) -> None:
        """Replace the turns before seq ``keep_from`` and the SYSTEM entries ``replaced``
        by ``summary`` (a SYSTEM message, appended after the other SYSTEM messages).

        ``keep_from=None`` compacts every turn. The next save keeps the removed rows
        in the store, marked compacted (``bot.core.compactor``).
        """
        gone = set(replaced)
        kept: list[_Entry] = []
        removed: list[int] = []
        for entry in self._iter_entries():
            if entry.message.role == _SYSTEM:
                drop = entry.seq in gone
            else:
                drop = keep_from is None or entry.seq < keep_from
            if drop:
                removed.append(entry.seq)
            else:
                kept.append(entry)
        kept.append(_Entry(self._next_seq, summary))
        self._next_seq += 1
        self._compacting.update(removed)
        self._prune_entries(sorted(kept, key=_seq_of))

    # -- checkpoints ----------------------------------------------------------------

    def checkpoint(self) -> SessionCheckpoint:
        """Capture history, active agent and metadata for a later ``rollback_to``."""
        return SessionCheckpoint(
            self,
            tuple(self._systems),
            tuple(self._others),
            self._agent,
            _copy_metadata(self._metadata),
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
        self._systems = list(checkpoint._systems)
        self._others = deque(checkpoint._others)
        # The indices wait for the next append: a failed turn's context is often
        # dropped, and the checkpointed history is already pruned.
        self._indexed = False
        self._untrack()
        self._agent = checkpoint._agent
        self._metadata = _copy_metadata(checkpoint._metadata)

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
        *,
        prune_to: int | None = None,
    ) -> SessionContext:
        context = cls(session_id, agent, max_turns, metadata, prune_to=prune_to)
        ordered = sorted((_Entry(s, m) for s, m in entries), key=_seq_of)
        context._persisted_seqs = set(persisted_seqs)
        known = context._persisted_seqs.union(e.seq for e in ordered)
        context._next_seq = max(known, default=-1) + 1
        context._incarnation = incarnation
        context._prune_entries(ordered)  # the full pass: foreign rows, another max_turns
        context._track_if_in_sync()
        return context

    def _state(self) -> _State:
        """The history and its indices, frozen: ``_from_state`` rebuilds them without a prune."""
        return _State(
            tuple(self._systems),
            tuple(self._others),
            tuple(self._users),
            dict(self._calls),  # tuple values: never edited in place
            dict(self._tools),
            self._indexed,
            self._next_seq,
        )

    @classmethod
    def _from_state(
        cls,
        session_id: str,
        agent: Agent,
        max_turns: int,
        metadata: Mapping[str, Any],
        state: _State,
        persisted_seqs: Iterable[int],
        incarnation: str,
        *,
        prune_to: int | None = None,
    ) -> SessionContext:
        """A new context holding ``state`` (taken from a context of the same turn marks)."""
        context = cls(session_id, agent, max_turns, metadata, prune_to=prune_to)
        context._systems = list(state.systems)
        context._others = deque(state.others)
        context._users = deque(state.users)
        context._calls = dict(state.calls)
        context._tools = dict(state.tools)
        context._indexed = state.indexed
        context._next_seq = state.next_seq
        context._persisted_seqs = set(persisted_seqs)
        context._incarnation = incarnation
        # A snapshot is taken where a load or save committed: the store holds its history.
        if state.indexed and len(context._persisted_seqs) == len(state.systems) + len(state.others):
            context._tracked = True
            context._saved_next = state.next_seq
        return context

    # -- change tracking ------------------------------------------------------------

    def _untrack(self) -> None:
        """Fall back to the full diff for the next save (an edit the tracking does not follow)."""
        self._tracked = False
        self._epoch += 1

    def _edit_mark(self) -> tuple[int, int, int]:
        """Moves with every edit of the history since the tracking last restarted."""
        return (self._epoch, self._next_seq, len(self._dropped))

    def _track_if_in_sync(self) -> None:
        """Restart the tracking if the store holds exactly the history (else keep the full diff)."""
        persisted = self._persisted_seqs
        in_sync = self._indexed and len(persisted) == len(self._systems) + len(self._others)
        if in_sync and all(entry.seq in persisted for entry in self._iter_entries()):
            self._tracked = True
            self._saved_next = self._next_seq
            self._dropped = []

    def _pending_changes(self) -> _Changes:
        """What the next save writes: O(turn) while tracked, else the full diff."""
        changes = self._compute_changes()
        self._computed = (changes, self._edit_mark())
        return changes

    def _compute_changes(self) -> _Changes:
        if self._incarnation is None:
            return _Changes(tuple(self._entries), (), True)
        if not (self._tracked and self._indexed):
            return self._full_changes()
        # New entries are appended at the ends of both lists, with seqs from _saved_next.
        floor = self._saved_next
        inserts: list[_Entry] = []
        for part in (self._systems, self._others):
            count = 0
            for entry in reversed(part):
                if entry.seq < floor:
                    break
                count += 1
            if count:
                inserts.extend(islice(part, len(part) - count, None))
        # Entries appended and pruned since the last save were never written.
        deletes = tuple(sorted(seq for seq in self._dropped if seq < floor))
        return _Changes(tuple(inserts), deletes, False)

    def _full_changes(self) -> _Changes:
        """The difference between the history and what the store holds (O(window))."""
        entries = self._entries
        persisted = self._persisted_seqs
        current = {entry.seq for entry in entries}
        inserts = tuple(e for e in entries if e.seq not in persisted)
        gone = persisted - current
        compacting = self._compacting
        if not compacting:
            return _Changes(inserts, tuple(sorted(gone)), False)
        compacts = tuple(sorted(gone & compacting))
        return _Changes(inserts, tuple(sorted(gone - compacting)), False, compacts)

    def _mark_saved(self, changes: _Changes, incarnation: str) -> None:
        if changes.replace:
            self._persisted_seqs = {entry.seq for entry in changes.inserts}
        else:
            self._persisted_seqs.difference_update(changes.deletes)
            self._persisted_seqs.difference_update(changes.compacts)
            self._persisted_seqs.update(entry.seq for entry in changes.inserts)
        self._compacting.difference_update(changes.compacts)
        self._incarnation = incarnation
        computed, self._computed = self._computed, None
        if computed is not None and computed[0] is changes and computed[1] == self._edit_mark():
            # Nothing changed since the changes were computed: the store holds the history.
            self._tracked = self._indexed
            self._saved_next = self._next_seq
            self._dropped = []
        else:
            self._untrack()

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
