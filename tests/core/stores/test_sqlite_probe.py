"""Freshness without a round trip: the SQLite store's ``PRAGMA data_version`` probe.

A cached window is served without a hop to the database thread only when no
connection committed anything since the thread last looked; any other write is
seen at the next load, whoever made it.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.session import SessionContext
from bot.core.sql import Transaction
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.stores.sqlite_writer import SQLiteWriter

AGENT = Agent(name="Triage", instructions="triage")
OTHER = Agent(name="Billing", instructions="billing")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


@pytest.fixture
async def store(db: Path) -> AsyncIterator[SQLiteSessionStore]:
    store = SQLiteSessionStore(str(db))
    store.set_agent_resolver({a.name: a for a in (AGENT, OTHER)}.get)
    yield store
    await store.close()


def writer_of(store: SQLiteSessionStore) -> SQLiteWriter:
    assert store._conn is not None
    return store._conn


async def turn(store: SQLiteSessionStore, text: str) -> SessionContext:
    async with store.session_lock("s"):
        session = await store.get_or_create("s", AGENT)
        session.add_message(Message(role=Role.USER, content=text))
        session.add_message(Message(role=Role.MODEL, content=f"re: {text}"))
        await store.save(session)
    return session


async def load_hops(store: SQLiteSessionStore) -> tuple[SessionContext, int]:
    """A load, and the round trips into the database thread it took."""
    before = writer_of(store).hops
    loaded = await store.get_or_create("s", AGENT)
    return loaded, writer_of(store).hops - before


async def test_a_cached_load_takes_no_round_trip(store: SQLiteSessionStore) -> None:
    saved = await turn(store, "q1")
    loaded, hops = await load_hops(store)
    assert hops == 0
    assert loaded.history == saved.history


def _edit(raw: sqlite3.Connection, kind: str, n: int) -> None:
    seq = raw.execute("SELECT max(seq) FROM chatflow_messages WHERE session_id = 's'").fetchone()[0]
    text = Message(role=Role.MODEL, content=f"by hand {n}").model_dump_json()
    if kind == "update":
        raw.execute(
            "UPDATE chatflow_messages SET message_json = ? WHERE session_id = 's' AND seq = ?",
            (text, seq),
        )
    elif kind == "delete":
        raw.execute("DELETE FROM chatflow_messages WHERE session_id = 's' AND seq = ?", (seq,))
    elif kind == "insert":
        raw.execute(
            "INSERT INTO chatflow_messages (session_id, seq, role, message_json, created_at) "
            "VALUES ('s', ?, 'model', ?, '2026-01-01')",
            (seq + 1000, text),
        )
    elif kind == "agent":
        raw.execute(
            "UPDATE chatflow_sessions SET active_agent_name = ? WHERE session_id = 's'",
            (OTHER.name if n % 2 else AGENT.name,),
        )
    else:
        raw.execute(
            "UPDATE chatflow_sessions SET metadata_json = ? WHERE session_id = 's'",
            (f'{{"n": {n}}}',),
        )


async def _fresh_load(db: Path) -> SessionContext:
    other = SQLiteSessionStore(str(db), cache_messages=0)
    other.set_agent_resolver({a.name: a for a in (AGENT, OTHER)}.get)
    try:
        loaded = await other.get("s")
        assert loaded is not None
        return loaded
    finally:
        await other.close()


def same(a: SessionContext, b: SessionContext) -> bool:
    return (a.history, a.active_agent.name, a.metadata) == (
        b.history,
        b.active_agent.name,
        b.metadata,
    )


async def test_a_second_connection_editing_rows_between_save_and_load_is_always_seen(
    store: SQLiteSessionStore, db: Path
) -> None:
    rng = random.Random(1)
    raw = sqlite3.connect(db, isolation_level=None)
    try:
        for n in range(50):
            await turn(store, f"q{n}")
            _edit(raw, rng.choice(["update", "delete", "insert", "agent", "metadata"]), n)
            loaded = await store.get_or_create("s", AGENT)
            assert same(loaded, await _fresh_load(db)), n
    finally:
        raw.close()


async def test_an_edit_right_after_a_load_is_seen_by_the_next(
    store: SQLiteSessionStore, db: Path
) -> None:
    await turn(store, "q1")
    raw = sqlite3.connect(db, isolation_level=None)
    try:
        for n in range(20):
            await store.get_or_create("s", AGENT)  # the thread has not looked since
            _edit(raw, "metadata", n)
            loaded = await store.get_or_create("s", AGENT)
            assert loaded.metadata == {"n": n}
    finally:
        raw.close()


async def test_a_transaction_block_editing_session_rows_is_seen(
    store: SQLiteSessionStore,
) -> None:
    await turn(store, "q1")
    await store.get_or_create("s", AGENT)
    async with store.transaction() as tx:
        await tx.execute(
            "UPDATE chatflow_sessions SET active_agent_name = ? WHERE session_id = 's'",
            (OTHER.name,),
        )
    loaded = await store.get_or_create("s", AGENT)
    assert loaded.active_agent is OTHER
    # A block that touches no session table leaves the cache alone.
    async with store.transaction() as tx:
        await tx.fetchall("SELECT 1")
    _, hops = await load_hops(store)
    assert hops == 0


async def test_a_run_body_or_a_save_hook_editing_session_rows_is_seen(
    store: SQLiteSessionStore,
) -> None:
    await turn(store, "q1")

    async def by_hand(tx: Transaction) -> None:
        await tx.execute("UPDATE chatflow_sessions SET metadata_json = '{\"a\": 1}'")

    await store.run(by_hand)
    assert (await store.get_or_create("s", AGENT)).metadata == {"a": 1}

    other = await store.get_or_create("t", AGENT)

    async def hook(tx: Transaction) -> None:
        await tx.execute(
            "UPDATE chatflow_sessions SET metadata_json = '{\"b\": 2}' WHERE session_id = 's'"
        )

    other.add_message(Message(role=Role.USER, content="hi"))
    await store.save(other, also=hook)
    assert (await store.get_or_create("s", AGENT)).metadata == {"b": 2}


async def test_a_busy_or_locked_probe_falls_back_to_the_version_read(
    store: SQLiteSessionStore, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await turn(store, "q1")
    writer = writer_of(store)
    raw = sqlite3.connect(db, isolation_level=None)
    try:
        # The probe's lock held (the database thread publishing): the loop does not wait.
        _edit(raw, "metadata", 1)
        with writer._probe_lock:
            assert not store._fresh_without_read()
        loaded, hops = await load_hops(store)
        assert loaded.metadata == {"n": 1} and hops >= 1

        # The probe answering SQLITE_BUSY: the same fallback.
        class Busy:
            def execute(self, sql: str) -> sqlite3.Cursor:
                raise sqlite3.OperationalError("database is locked")

            def close(self) -> None:
                pass

        monkeypatch.setattr(writer, "_probe", Busy())
        _edit(raw, "metadata", 2)
        loaded, hops = await load_hops(store)
        assert loaded.metadata == {"n": 2} and hops >= 1
    finally:
        raw.close()


async def test_two_stores_on_one_file_see_each_others_saves(db: Path) -> None:
    first, second = SQLiteSessionStore(str(db)), SQLiteSessionStore(str(db))
    try:
        for n in range(10):
            for mine in (first, second):
                async with mine.session_lock("s"):
                    session = await mine.get_or_create("s", AGENT)
                    session.add_message(Message(role=Role.USER, content=f"q{n}"))
                    await mine.save(session)
        loaded = await first.get_or_create("s", AGENT)
        assert [m.content for m in loaded.history][-2:] == ["q9", "q9"]
    finally:
        await first.close()
        await second.close()
