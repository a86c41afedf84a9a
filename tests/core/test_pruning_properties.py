"""Invariants of pruning, rollback and persistence over random histories (hypothesis)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.core.agent import Agent
from bot.core.messages import Message, Role, ToolCall
from bot.core.session import SessionContext, _Entry
from bot.core.stores.base import BaseSessionStore
from bot.core.stores.in_memory import SessionStore
from bot.core.stores.sqlite import SQLiteSessionStore

AGENTS = [Agent(name=name, instructions=name) for name in ("Triage", "Billing", "Support")]
RESOLVER = {agent.name: agent for agent in AGENTS}.get
CALL_IDS = [f"call_{i}" for i in range(6)]

# -- operations ----------------------------------------------------------------------------

texts = st.text(max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)

message_ops = st.one_of(
    st.tuples(st.just("user"), texts),
    st.tuples(st.just("model"), texts),
    st.tuples(st.just("call"), st.lists(st.sampled_from(CALL_IDS), min_size=1, max_size=3)),
    st.tuples(st.just("tool"), st.sampled_from([*CALL_IDS, None])),
    st.tuples(st.just("system"), texts),
)
state_ops = st.one_of(
    st.tuples(st.just("agent"), st.sampled_from(AGENTS)),
    st.tuples(st.just("meta"), st.tuples(st.sampled_from(["a", "b", "c"]), json_values)),
    st.tuples(st.just("meta-nested"), st.tuples(st.sampled_from(["x", "y"]), json_values)),
)
any_ops = st.lists(st.one_of(message_ops, message_ops, state_ops), max_size=40)


def make_message(op: tuple[str, Any]) -> Message:
    kind, arg = op
    if kind == "user":
        return Message(role=Role.USER, content=arg)
    if kind == "model":
        return Message(role=Role.MODEL, content=arg, agent="Triage")
    if kind == "call":
        return Message(role=Role.MODEL, tool_calls=[ToolCall(id=c, name="t") for c in arg])
    if kind == "tool":  # "orphan" answers a call no MODEL message ever made
        return Message(role=Role.TOOL, tool_call_id=arg, content="ok", name="t")
    return Message(role=Role.SYSTEM, content=arg)


def apply(session: SessionContext, op: tuple[str, Any]) -> Message | None:
    kind, arg = op
    if kind == "agent":
        session.active_agent = arg
    elif kind == "meta":
        session.metadata[arg[0]] = arg[1]
    elif kind == "meta-nested":
        nested = session.metadata.setdefault("nested", {})
        if isinstance(nested, dict):
            nested[arg[0]] = arg[1]
    else:
        message = make_message(op)
        session.add_message(message)
        return message
    return None


def reference_prune(added: Sequence[Message], max_turns: int) -> list[Message]:
    """DESIGN §3.2 applied once to everything ever added."""
    systems = [m for m in added if m.role == Role.SYSTEM]
    others = [m for m in added if m.role != Role.SYSTEM]
    users = [i for i, m in enumerate(others) if m.role == Role.USER]
    if not users:
        return systems
    window = others[users[max(0, len(users) - max_turns)] :]
    kept: list[Message] = []
    calls: set[str] = set()
    for message in window:
        if message.role == Role.MODEL:
            calls |= {call.id for call in message.tool_calls}
        elif message.role == Role.TOOL and message.tool_call_id not in calls:
            continue
        kept.append(message)
    return systems + kept


def check_invariants(history: list[Message], max_turns: int) -> None:
    roles = [m.role for m in history]
    n_system = roles.count(Role.SYSTEM)
    assert all(r == Role.SYSTEM for r in roles[:n_system])
    rest = history[n_system:]
    assert Role.SYSTEM not in [m.role for m in rest]
    if rest:
        assert rest[0].role == Role.USER
    assert sum(1 for m in rest if m.role == Role.USER) <= max_turns
    seen_calls: set[str] = set()
    for message in rest:
        if message.role == Role.MODEL:
            seen_calls |= {call.id for call in message.tool_calls}
        if message.role == Role.TOOL:
            assert message.tool_call_id in seen_calls


# -- pruning -------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(message_ops, max_size=60), max_turns=st.integers(1, 5))
def test_pruning_invariants(ops: list[tuple[str, Any]], max_turns: int) -> None:
    session = SessionContext("prop", AGENTS[0], max_turns=max_turns)
    added: list[Message] = []
    for op in ops:
        added.append(make_message(op))
        session.add_message(added[-1])
        history = session.history
        check_invariants(history, max_turns)
        # Pruning after every add equals pruning everything once: nothing extra is lost.
        assert history == reference_prune(added, max_turns)
    systems = [m for m in added if m.role == Role.SYSTEM]
    assert session.history[: len(systems)] == systems
    users = [m for m in added if m.role == Role.USER]
    assert [m for m in session.history if m.role == Role.USER] == users[-max_turns:]


# -- rollback ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(before=any_ops, after=any_ops, max_turns=st.integers(1, 3))
def test_rollback_restores_the_checkpoint(
    before: list[tuple[str, Any]], after: list[tuple[str, Any]], max_turns: int
) -> None:
    session = SessionContext("prop", AGENTS[0], max_turns=max_turns)
    for op in before:
        apply(session, op)
    expected_history = session.history
    expected_agent = session.active_agent
    expected_metadata = json.loads(json.dumps(session.metadata))
    token = session.checkpoint()

    for op in after:
        apply(session, op)
    session.rollback_to(token)

    assert session.history == expected_history
    assert session.active_agent is expected_agent
    assert session.metadata == expected_metadata
    check_invariants(session.history, max_turns)


# -- persistence round trip ----------------------------------------------------------------

persist_ops = st.lists(
    st.one_of(
        message_ops,
        message_ops,
        state_ops,
        st.tuples(st.just("save"), st.none()),
        st.tuples(st.just("checkpoint"), st.none()),
        st.tuples(st.just("rollback"), st.none()),
    ),
    max_size=30,
)


async def _round_trip(
    store: BaseSessionStore, ops: list[tuple[str, Any]]
) -> tuple[SessionContext, SessionContext]:
    store.set_agent_resolver(RESOLVER)
    session = await store.get_or_create("prop", AGENTS[0])
    token = session.checkpoint()
    for op in ops:
        kind = op[0]
        if kind == "save":
            await store.save(session)
        elif kind == "checkpoint":
            token = session.checkpoint()
        elif kind == "rollback":
            session.rollback_to(token)
        else:
            apply(session, op)
    await store.save(session)
    loaded = await store.get("prop")
    assert loaded is not None
    return session, loaded


async def _both(ops: list[tuple[str, Any]], max_turns: int) -> None:
    memory_store = SessionStore(default_max_turns=max_turns)
    sqlite = SQLiteSessionStore(":memory:", default_max_turns=max_turns)
    try:
        mem_session, mem_loaded = await _round_trip(memory_store, ops)
        sql_session, sql_loaded = await _round_trip(sqlite, ops)
        async with sqlite.transaction() as tx:
            rows = await tx.fetchone("SELECT COUNT(*) FROM chatflow_messages")
    finally:
        await sqlite.close()
    for session, loaded in ((mem_session, mem_loaded), (sql_session, sql_loaded)):
        assert loaded.history == session.history
        assert loaded.active_agent is session.active_agent
        assert loaded.metadata == json.loads(json.dumps(session.metadata))
    # Both stores agree (the messages differ only in identity, not in content).
    assert [m.model_dump(exclude={"id", "created_at"}) for m in sql_loaded.history] == [
        m.model_dump(exclude={"id", "created_at"}) for m in mem_loaded.history
    ]
    # No row outlives its message: the saves wrote exactly the pruned window.
    assert rows == (len(sql_session.history),)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=persist_ops, max_turns=st.integers(1, 3))
def test_save_load_round_trip(ops: list[tuple[str, Any]], max_turns: int) -> None:
    asyncio.run(_both(ops, max_turns))


# -- the incremental prune against the full pass -------------------------------------------


class FullPruneSession(SessionContext):
    """The reference path: every append runs the full O(window) ``prune_history``."""

    def add_message(self, message: Message) -> None:
        entry = _Entry(self._next_seq, message)
        self._next_seq += 1
        self._prune_entries([*self._entries, entry])


def index_state(session: SessionContext) -> tuple[object, ...]:
    """The history with its seqs, plus the incremental prune's indices."""
    if not session._indexed:  # after a rollback: the next append would rebuild them
        history = session._entries
        session.prune_history()
        assert session._entries == history
    return (
        session._entries,
        list(session._users),
        {call_id: list(seqs) for call_id, seqs in session._calls.items()},
        {call_id: list(seqs) for call_id, seqs in session._tools.items()},
    )


def from_scratch(added: Sequence[Message], max_turns: int) -> SessionContext:
    """``prune_history()`` applied once to everything added (seqs as the appends gave them)."""
    return SessionContext._restore(
        "prop", AGENTS[0], max_turns, {}, enumerate(added), (), "scratch"
    )


# Few ids make repeats across turns (and orphans of a dropped turn's calls) common;
# test_pruning_invariants above covers six ids.
ID_POOLS = [["c0"], ["c0", "c1"]]
ID_POOL_IDS = ["one-id", "two-ids"]


APPEND_KINDS = frozenset({"user", "model", "call", "tool", "system"})


def append_ops(ids: list[str]) -> st.SearchStrategy[tuple[str, Any]]:
    return st.one_of(
        st.tuples(st.just("user"), texts),
        st.tuples(st.just("model"), texts),
        st.tuples(st.just("call"), st.lists(st.sampled_from(ids), min_size=1, max_size=3)),
        st.tuples(st.just("tool"), st.sampled_from([*ids, None, "orphan"])),
        st.tuples(st.just("tool"), st.sampled_from(ids)),
        st.tuples(st.just("system"), texts),
    )


def appends(ids: list[str], max_turns: int = 12) -> st.SearchStrategy[list[tuple[str, Any]]]:
    """Messages shaped as turns (a USER message, then calls, results and answers)."""
    inside = st.lists(append_ops(ids), max_size=5)
    turn = st.tuples(st.tuples(st.just("user"), texts), inside)
    return st.tuples(inside, st.lists(turn, max_size=max_turns)).map(
        lambda drawn: drawn[0] + [op for user, rest in drawn[1] for op in [user, *rest]]
    )


@pytest.mark.parametrize("ids", ID_POOLS, ids=ID_POOL_IDS)
@settings(max_examples=40)
@given(data=st.data(), max_turns=st.integers(1, 6))
def test_incremental_prune_equals_the_full_prune(
    ids: list[str], data: st.DataObject, max_turns: int
) -> None:
    ops = data.draw(appends(ids), label="ops")
    session = SessionContext("prop", AGENTS[0], max_turns=max_turns)
    added: list[Message] = []
    for op in ops:
        added.append(make_message(op))
        session.add_message(added[-1])
        assert index_state(session) == index_state(from_scratch(added, max_turns))
        assert session.history == reference_prune(added, max_turns)
    # The full pass over the incrementally pruned history changes nothing.
    before = index_state(session)
    session.prune_history()
    assert index_state(session) == before


def _step(
    session: SessionContext, op: tuple[str, Any], tokens: list[Any], message: Message | None
) -> None:
    kind, arg = op
    if message is not None:
        session.add_message(message)
    elif kind == "checkpoint":
        tokens.append(session.checkpoint())
    elif kind == "rollback":
        if tokens:
            session.rollback_to(tokens[arg % len(tokens)])
    elif kind == "save":
        # What a store does on a committed save: write the difference, then mark it.
        session._mark_saved(session._pending_changes(), "inc-1")
    elif kind == "prune":
        session.prune_history()
    else:
        apply(session, op)


# A round is what the Runner does with a turn: checkpoint, append, then commit (save),
# roll back (to this checkpoint or an older one), or neither; stray ops sit between.
ROUND_ENDS: dict[str, list[tuple[str, Any]]] = {
    "save": [("save", None)],
    "rollback": [("rollback", -1)],
    "rollback-oldest": [("rollback", 0)],
    "prune": [("prune", None)],
    "keep": [],
}


def turn_rounds(ids: list[str]) -> st.SearchStrategy[list[tuple[str, Any]]]:
    def build(
        state: list[tuple[str, Any]], messages: list[tuple[str, Any]], end: str
    ) -> list[tuple[str, Any]]:
        return [("checkpoint", None), *state, *messages, *ROUND_ENDS[end]]

    return st.builds(
        build, st.lists(state_ops, max_size=2), appends(ids, 2), st.sampled_from(sorted(ROUND_ENDS))
    )


def flatten(rounds: list[list[tuple[str, Any]]]) -> list[tuple[str, Any]]:
    return [op for ops in rounds for op in ops]


@pytest.mark.parametrize("ids", ID_POOLS, ids=ID_POOL_IDS)
@settings(max_examples=30)
@given(data=st.data(), max_turns=st.integers(1, 4))
def test_checkpoints_rollbacks_and_saves_match_the_full_path(
    ids: list[str], data: st.DataObject, max_turns: int
) -> None:
    ops = data.draw(st.lists(turn_rounds(ids), max_size=8).map(flatten), label="ops")
    incremental = SessionContext("prop", AGENTS[0], max_turns=max_turns)
    full = FullPruneSession("prop", AGENTS[0], max_turns=max_turns)
    inc_tokens: list[Any] = []
    full_tokens: list[Any] = []
    for op in ops:
        message = make_message(op) if op[0] in APPEND_KINDS else None
        _step(incremental, op, inc_tokens, message)
        _step(full, op, full_tokens, message)
        # Same messages under the same seqs, so the store's O(changes) save is the same.
        assert index_state(incremental) == index_state(full)
        # The indices are those of the history they index, not of an earlier state.
        rebuilt = SessionContext._restore(
            "prop", AGENTS[0], max_turns, {}, incremental._entries, (), "rebuilt"
        )
        assert index_state(incremental) == index_state(rebuilt)
        assert incremental._pending_changes() == full._pending_changes()
        assert incremental._persisted_seqs == full._persisted_seqs
        assert incremental.metadata == full.metadata
        assert incremental.active_agent is full.active_agent
        check_invariants(incremental.history, max_turns)


stored_rows = st.lists(
    st.tuples(st.integers(0, 40), append_ops(["c0", "c1"])),
    max_size=30,
    unique_by=lambda row: row[0],
)


@settings(max_examples=40)
@given(
    rows=stored_rows,
    then=appends(["c0", "c1"], 4),
    max_turns=st.integers(1, 4),
)
def test_restored_foreign_rows_then_appends_match_the_full_path(
    rows: list[tuple[int, tuple[str, Any]]], then: list[tuple[str, Any]], max_turns: int
) -> None:
    # Rows in any seq order, pruned for another max_turns or not at all.
    entries = [(seq, make_message(op)) for seq, op in rows]
    persisted = [seq for seq, _ in entries]
    incremental = SessionContext._restore(
        "prop", AGENTS[0], max_turns, {}, entries, persisted, "inc-1"
    )
    full = FullPruneSession._restore("prop", AGENTS[0], max_turns, {}, entries, persisted, "inc-1")
    assert index_state(incremental) == index_state(full)
    for op in then:
        message = make_message(op)
        incremental.add_message(message)
        full.add_message(message)
        assert index_state(incremental) == index_state(full)
        assert incremental._pending_changes() == full._pending_changes()
