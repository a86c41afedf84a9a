"""Invariants of pruning, rollback and persistence over random histories (hypothesis)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.core.agent import Agent
from bot.core.memory import BaseSessionStore, SessionContext, SessionStore
from bot.core.messages import Message, Role, ToolCall
from bot.core.sqlite_store import SQLiteSessionStore

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
    if kind == "tool":
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
