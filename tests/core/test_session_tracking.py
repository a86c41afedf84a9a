"""Pruning back to a lower mark (``prune_to``) and the O(turn) change tracking of a save."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.config import Settings
from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.session import (
    SessionContext,
    _Changes,
    _Entry,
    check_prune_to,
    default_prune_to,
)
from bot.core.stores.in_memory import SessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.database import open_store
from tests.core.test_pruning_properties import (
    APPEND_KINDS,
    ID_POOL_IDS,
    ID_POOLS,
    appends,
    check_invariants,
    flatten,
    index_state,
    make_message,
    turn_rounds,
)

AGENT = Agent(name="Triage", instructions="triage")


class FullPruneSession(SessionContext):
    """The reference: every append runs the full pass over the pruned history plus it."""

    def add_message(self, message: Message) -> None:
        entry = _Entry(self._next_seq, message)
        self._next_seq += 1
        self._prune_entries([*self._entries, entry])


def marks() -> st.SearchStrategy[tuple[int, int]]:
    return st.integers(1, 6).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, m)))


def user_count(session: SessionContext) -> int:
    return sum(1 for m in session.history if m.role == Role.USER)


# -- the lower mark keeps DESIGN §3.2 ------------------------------------------------------


@pytest.mark.parametrize("ids", ID_POOLS, ids=ID_POOL_IDS)
@settings(max_examples=60, deadline=None)
@given(data=st.data(), turn_marks=marks())
def test_pruning_to_a_lower_mark_keeps_the_design_rules(
    ids: list[str], data: st.DataObject, turn_marks: tuple[int, int]
) -> None:
    max_turns, prune_to = turn_marks
    ops = data.draw(appends(ids, 14), label="ops")
    session = SessionContext("prop", AGENT, max_turns=max_turns, prune_to=prune_to)
    full = FullPruneSession("prop", AGENT, max_turns=max_turns, prune_to=prune_to)
    users: list[Message] = []
    for op in ops:
        message = make_message(op)
        before = user_count(session)
        session.add_message(message)
        full.add_message(message)
        if message.role == Role.USER:
            users.append(message)
        check_invariants(session.history, max_turns)
        # The kept turns are the newest ones, and the window only shrinks past max_turns.
        kept = [m for m in session.history if m.role == Role.USER]
        assert kept == users[len(users) - len(kept) :]
        if message.role == Role.USER:
            assert len(kept) == (before + 1 if before < max_turns else prune_to)
        # The O(turn) prune is the full pass applied after every append.
        assert index_state(session) == index_state(full)
    # A window of at most max_turns turns is left as it is by the full pass and a reload.
    before_state = index_state(session)
    session.prune_history()
    assert index_state(session) == before_state
    restored = SessionContext._restore(
        "prop", AGENT, max_turns, {}, session._entries, (), "x", prune_to=prune_to
    )
    assert index_state(restored) == before_state


def test_the_mark_is_checked_and_defaults_to_three_quarters() -> None:
    assert default_prune_to(40) == 30
    assert default_prune_to(1) == 1
    assert SessionContext("s", AGENT, max_turns=4).prune_to == 4
    with pytest.raises(ValueError):
        check_prune_to(5, 4)
    with pytest.raises(ValueError):
        SessionContext("s", AGENT, max_turns=4, prune_to=0)
    with pytest.raises(ValueError):
        SQLiteSessionStore(":memory:", default_max_turns=4, prune_to_turns=5)


def _turn(session: SessionContext, n: int) -> None:
    session.add_message(Message(role=Role.USER, content=f"question {n}"))
    session.add_message(Message(role=Role.MODEL, content=f"answer {n}"))


@pytest.mark.parametrize("cache_messages", [0, 10_000], ids=["uncached", "cached"])
async def test_a_store_prunes_to_its_lower_mark_and_keeps_the_prefix(
    tmp_path: Path, cache_messages: int
) -> None:
    store = SQLiteSessionStore(
        str(tmp_path / "s.db"), default_max_turns=8, prune_to_turns=6, cache_messages=cache_messages
    )
    try:
        firsts = []
        for n in range(20):
            async with store.session_lock("chat"):
                session = await store.get_or_create("chat", AGENT)
                _turn(session, n)
                await store.save(session)
            firsts.append(session.history[0].content)
            assert user_count(session) <= 8
        # 8 turns, then 6 after turn 9, then 7, 8, then 6 again: the first message
        # moves once every three turns instead of on every turn past the window.
        assert len(set(firsts)) == 1 + len(range(8, 20, 3))
        fresh = SQLiteSessionStore(str(tmp_path / "s.db"), default_max_turns=8, prune_to_turns=6)
        try:
            loaded = await fresh.get("chat")
            assert loaded is not None and loaded.history == session.history
        finally:
            await fresh.close()
    finally:
        await store.close()


async def test_the_in_memory_store_takes_the_mark_too() -> None:
    store = SessionStore(default_max_turns=4, prune_to_turns=2)
    session = await store.get_or_create("chat", AGENT)
    for n in range(5):
        _turn(session, n)
    await store.save(session)
    loaded = await store.get("chat")
    assert loaded is not None and user_count(loaded) == 2 == user_count(session)


# -- O(turn) change tracking against the full diff -----------------------------------------


def _expected(session: SessionContext) -> _Changes:
    """The full diff, by definition: the history against the seqs the store holds."""
    if session._incarnation is None:
        return _Changes(tuple(session._entries), (), True)
    persisted = session._persisted_seqs
    entries = session._entries
    return _Changes(
        tuple(e for e in entries if e.seq not in persisted),
        tuple(sorted(persisted - {e.seq for e in entries})),
        False,
    )


def _step(session: SessionContext, op: tuple[str, Any], tokens: list[Any]) -> None:
    kind, arg = op
    if kind in APPEND_KINDS:
        session.add_message(make_message(op))
    elif kind == "checkpoint":
        tokens.append(session.checkpoint())
    elif kind == "rollback":
        if tokens:
            session.rollback_to(tokens[arg % len(tokens)])
    elif kind == "save":
        session._mark_saved(session._pending_changes(), "inc-1")
    elif kind == "failed-save":  # computed, then the transaction failed: nothing is marked
        session._pending_changes()
    elif kind == "late-save":  # an append lands between computing and the commit
        changes = session._pending_changes()
        session.add_message(Message(role=Role.USER, content="late"))
        session._mark_saved(changes, "inc-1")
    elif kind == "prune":
        session.prune_history()


EXTRA = st.lists(
    st.sampled_from([("save", None), ("failed-save", None), ("late-save", None)]), max_size=2
)


@pytest.mark.parametrize("ids", ID_POOLS, ids=ID_POOL_IDS)
@settings(max_examples=80, deadline=None)
@given(data=st.data(), turn_marks=marks(), loaded=st.booleans())
def test_tracked_changes_equal_the_full_diff(
    ids: list[str], data: st.DataObject, turn_marks: tuple[int, int], loaded: bool
) -> None:
    max_turns, prune_to = turn_marks
    rounds = data.draw(st.lists(st.tuples(turn_rounds(ids), EXTRA), max_size=10), label="ops")
    ops = flatten([[*r, *extra] for r, extra in rounds])
    session = SessionContext("prop", AGENT, max_turns=max_turns, prune_to=prune_to)
    if loaded:  # as a store's first save leaves it: everything held, tracking on
        session._mark_saved(session._pending_changes(), "inc-1")
    tokens: list[Any] = []
    for op in ops:
        _step(session, op, tokens)
        expected = _expected(session)
        assert session._pending_changes() == expected
        # A snapshot of a committed save (the cache) tracks from where it was taken.
        if op[0] == "save":
            state = session._state()
            copy = SessionContext._from_state(
                "prop",
                AGENT,
                max_turns,
                {},
                state,
                session._persisted_seqs,
                "inc-1",
                prune_to=prune_to,
            )
            assert copy._tracked == state.indexed
            assert copy._pending_changes() == _Changes((), (), False)


def test_a_cached_turn_is_tracked_not_diffed() -> None:
    session = SessionContext("s", AGENT, max_turns=40, prune_to=30)
    for n in range(40):
        _turn(session, n)
    session._mark_saved(session._pending_changes(), "inc-1")
    assert session._tracked
    _turn(session, 40)  # passes the window: ten turns go at once
    changes = session._pending_changes()
    assert changes == _expected(session)
    assert len(changes.inserts) == 2 and len(changes.deletes) == 22
    assert session._tracked


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, (40, 30)), ({"max_turns": 4}, (4, 4)), ({"max_turns": 4, "prune_to_turns": 2}, (4, 2))],
    ids=["defaults", "max-turns-alone", "both"],
)
async def test_the_application_store_takes_the_settings_marks(
    tmp_path: Path, env: dict[str, int], expected: tuple[int, int]
) -> None:
    settings = Settings(_env_file=None, data_dir=tmp_path, **env)  # type: ignore[arg-type]
    store = open_store(settings)
    try:
        assert (store.default_max_turns, store.prune_to_turns) == expected
    finally:
        await store.close()
