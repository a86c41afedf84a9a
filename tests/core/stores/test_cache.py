"""The SQL stores' session cache (``bot.core.stores.cache``): a hit loads nothing from disk,
and no write -- by this store, another store, another process or an operator -- is missed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.session import SessionContext
from bot.core.sql import Transaction
from bot.core.stores.base import SessionDeletedError
from bot.core.stores.sql import SQLSessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import StorageError
from tests.fakes.clock import FakeClock
from tests.pgtest import fresh_schema

SQL_KINDS = ("sqlite-file", "sqlite-memory", "postgres")
SHARED_KINDS = ("sqlite-file", "postgres")  # kinds two store instances can share

SQLFactory = Callable[..., SQLSessionStore]


def user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


def reply(text: str) -> Message:
    return Message(role=Role.MODEL, content=text)


def contents(context: SessionContext | None) -> list[str | None]:
    assert context is not None
    return [m.content for m in context.history]


async def _factory(kind: str, tmp_path: Path, clock: FakeClock) -> AsyncIterator[SQLFactory]:
    made: list[SQLSessionStore] = []
    async with AsyncExitStack() as stack:
        dsn = await stack.enter_async_context(fresh_schema()) if kind == "postgres" else ""

        def make(**kwargs: Any) -> SQLSessionStore:
            kwargs.setdefault("clock", clock)
            store: SQLSessionStore
            if kind == "postgres":
                from bot.core.stores.postgres import PostgresSessionStore

                store = PostgresSessionStore(dsn, **kwargs)
            elif kind == "sqlite-file":
                store = SQLiteSessionStore(tmp_path / "chatflow.db", **kwargs)
            else:
                store = SQLiteSessionStore(":memory:", **kwargs)
            made.append(store)
            return store

        yield make
        for store in made:
            await store.close()


@pytest.fixture(params=SQL_KINDS)
async def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[SQLFactory]:
    async for make in _factory(request.param, tmp_path, clock):
        yield make


@pytest.fixture(params=SHARED_KINDS)
async def make_shared(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[SQLFactory]:
    """Builds stores on one database (one file, or one PostgreSQL schema with its own pools)."""
    async for make in _factory(request.param, tmp_path, clock):
        yield make


class Reads:
    """Counts a store's message reads (the disk loads)."""

    def __init__(self, store: SQLSessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = store._read_messages

        async def counting(tx: Transaction, session_id: str) -> list[tuple[Any, ...]]:
            self.count += 1
            return await original(tx, session_id)

        monkeypatch.setattr(store, "_read_messages", counting)


async def saved_turn(store: SQLSessionStore, agent: Agent, question: str) -> SessionContext:
    session = await store.get_or_create("s", agent)
    session.add_message(user(question))
    session.add_message(reply(f"re: {question}"))
    await store.save(session)
    return session


async def disk(make: SQLFactory) -> list[str | None]:
    """The stored window, read by a store without a cache (on the same database)."""
    store = make(cache_messages=0)
    loaded = await store.get("s")
    await store.close()
    return contents(loaded)


# -- hits ---------------------------------------------------------------------------------


async def test_a_hit_reads_no_messages(
    make_store: SQLFactory, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    await saved_turn(store, agent, "q1")
    reads = Reads(store, monkeypatch)
    commits = store.commits if isinstance(store, SQLiteSessionStore) else 0

    loaded = await store.get_or_create("s", agent)
    again = await store.get("s")

    assert reads.count == 0
    assert contents(loaded) == contents(again) == ["q1", "re: q1"]
    assert loaded.active_agent is agent
    if isinstance(store, SQLiteSessionStore):
        assert store.commits == commits  # the freshness read is no transaction
    loaded.add_message(user("q2"))
    await store.save(loaded)  # the handed-out context saves like a loaded one
    assert contents(await store.get("s")) == ["q1", "re: q1", "q2"]
    assert reads.count == 0


async def test_disabled_cache_loads_from_disk(
    make_store: SQLFactory, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(cache_messages=0)
    await saved_turn(store, agent, "q1")
    reads = Reads(store, monkeypatch)
    assert contents(await store.get_or_create("s", agent)) == ["q1", "re: q1"]
    assert reads.count == 1
    assert len(store._cache) == 0


async def test_a_disk_load_is_cached(
    make_shared: SQLFactory, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, reader = make_shared(), make_shared()
    await saved_turn(writer, agent, "q1")
    reads = Reads(reader, monkeypatch)
    assert contents(await reader.get("s")) == ["q1", "re: q1"]
    assert contents(await reader.get_or_create("s", agent)) == ["q1", "re: q1"]
    assert reads.count == 1


@pytest.mark.parametrize("bad", [-1, True, 1.5], ids=["negative", "bool", "float"])
def test_the_bound_is_checked(tmp_path: Path, bad: Any) -> None:
    assert not SQLiteSessionStore(tmp_path / "a.db", cache_messages=0)._cache.enabled
    with pytest.raises((TypeError, ValueError)):
        SQLiteSessionStore(tmp_path / "a.db", cache_messages=bad)


# -- other writers ------------------------------------------------------------------------


async def test_two_stores_alternating_turns_never_serve_a_stale_window(
    make_shared: SQLFactory, agent: Agent
) -> None:
    a, b = make_shared(), make_shared()
    expected: list[str | None] = []
    for turn in range(6):
        store = (a, b)[turn % 2]
        session = await store.get_or_create("s", agent)
        assert contents(session) == expected
        session.add_message(user(f"q{turn}"))
        session.add_message(reply(f"a{turn}"))
        await store.save(session)
        expected += [f"q{turn}", f"a{turn}"]
    for store in (a, b):
        assert contents(await store.get("s")) == expected


async def test_another_store_deleting_and_recreating_is_seen(
    make_shared: SQLFactory, agent: Agent
) -> None:
    a, b = make_shared(), make_shared()
    await saved_turn(a, agent, "old")
    assert contents(await a.get("s")) == ["old", "re: old"]  # cached in a
    assert await b.delete("s")
    assert await a.get("s") is None
    # Re-created at the same (fake) instant with as many messages: still told apart.
    await saved_turn(a, agent, "cached again")
    assert await b.delete("s")
    await saved_turn(b, agent, "new")
    assert contents(await a.get_or_create("s", agent)) == ["new", "re: new"]


async def test_delete_then_load_gives_a_fresh_session(make_store: SQLFactory, agent: Agent) -> None:
    store = make_store()
    await saved_turn(store, agent, "q1")
    assert await store.delete("s")
    assert "s" not in store._cache
    assert await store.get("s") is None
    assert contents(await store.get_or_create("s", agent)) == []


async def test_a_save_of_a_deleted_session_drops_the_snapshot(
    make_shared: SQLFactory, agent: Agent
) -> None:
    a, b = make_shared(), make_shared()
    session = await saved_turn(a, agent, "q1")
    await b.delete("s")
    session.add_message(user("q2"))
    with pytest.raises(SessionDeletedError):
        await a.save(session)
    assert "s" not in a._cache
    assert contents(await a.get_or_create("s", agent)) == []


async def test_a_stale_context_conflict_drops_the_snapshot(
    make_store: SQLFactory, agent: Agent
) -> None:
    store = make_store()
    await saved_turn(store, agent, "q1")
    first = await store.get_or_create("s", agent)
    second = await store.get_or_create("s", agent)
    first.add_message(user("first"))
    await store.save(first)
    second.add_message(user("second"))
    with pytest.raises(StorageError, match="changed in the store"):
        await store.save(second)
    assert "s" not in store._cache
    assert contents(await store.get("s")) == ["q1", "re: q1", "first"]


@pytest.mark.parametrize("edit", ["update", "delete", "insert", "metadata"])
async def test_an_out_of_band_edit_is_seen(make_store: SQLFactory, agent: Agent, edit: str) -> None:
    store = make_store()
    session = await saved_turn(store, agent, "q1")
    assert "s" in store._cache
    async with store.transaction() as tx:  # raw SQL: what an operator's client does
        if edit == "update":
            changed = await tx.execute(
                "UPDATE chatflow_messages SET message_json = ? WHERE session_id = ? AND seq = ?",
                (reply("edited").model_dump_json(), "s", 1),
            )
        elif edit == "delete":
            changed = await tx.execute("DELETE FROM chatflow_messages WHERE seq = ?", (1,))
        elif edit == "insert":
            changed = await tx.execute(
                "INSERT INTO chatflow_messages (session_id, seq, role, message_json, "
                "created_at) VALUES (?, ?, ?, ?, ?)",
                ("s", 7, "model", reply("inserted").model_dump_json(), "2026-01-01"),
            )
        else:
            changed = await tx.execute(
                "UPDATE chatflow_sessions SET metadata_json = ? WHERE session_id = ?",
                ('{"by": "hand"}', "s"),
            )
        assert changed == 1
    loaded = await store.get_or_create("s", agent)
    expected = {
        "update": ["q1", "edited"],
        "delete": ["q1"],
        "insert": ["q1", "re: q1", "inserted"],
        "metadata": ["q1", "re: q1"],
    }[edit]
    assert contents(loaded) == expected
    assert loaded.metadata == ({"by": "hand"} if edit == "metadata" else session.metadata)


# -- failures, cancellation, rollback -----------------------------------------------------


async def test_a_raising_also_hook_leaves_cache_memory_and_disk_as_they_were(
    make_store: SQLFactory, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    await saved_turn(store, agent, "q1")
    session = await store.get_or_create("s", agent)
    session.add_message(user("lost"))

    async def also(tx: Transaction) -> None:
        await tx.execute("SELECT 1")
        raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError, match="hook failed"):
        await store.save(session, also=also)
    assert contents(await store.get("s")) == ["q1", "re: q1"]
    if not (isinstance(store, SQLiteSessionStore) and store.db_path == ":memory:"):
        assert await disk(make_store) == ["q1", "re: q1"]  # (a private one: just read)
    # The context is unsaved: its next save writes the same difference.
    await store.save(session)
    assert contents(await store.get("s")) == ["q1", "re: q1", "lost"]


async def test_a_cancellation_during_the_commit_leaves_cache_memory_and_disk_equal(
    make_shared: SQLFactory, agent: Agent
) -> None:
    store = make_shared()
    await saved_turn(store, agent, "q1")
    session = await store.get_or_create("s", agent)
    session.add_message(user("q2"))
    loop = asyncio.get_running_loop()
    saving: asyncio.Task[None] | None = None

    async def also(tx: Transaction) -> None:
        # Runs inside the transaction (on SQLite, on the database thread): the
        # cancellation lands while the caller waits for the commit.
        assert saving is not None
        loop.call_soon_threadsafe(saving.cancel)

    saving = asyncio.create_task(store.save(session, also=also))
    with pytest.raises(asyncio.CancelledError):
        await saving
    on_disk = await disk(make_shared)
    assert contents(await store.get("s")) == on_disk == contents(session)
    session.add_message(reply("a2"))
    await store.save(session)  # bookkeeping matches the rows: no conflict
    assert contents(await store.get("s")) == await disk(make_shared)


async def test_mutating_a_handed_out_context_without_saving_does_not_leak(
    make_store: SQLFactory, agent: Agent
) -> None:
    store = make_store()
    session = await store.get_or_create("s", agent, {"prefs": {"lang": "es"}, "n": 1})
    session.add_message(user("q1"))
    await store.save(session)

    handed = await store.get_or_create("s", agent)
    handed.add_message(reply("unsaved"))
    handed.add_message(user("unsaved too"))
    handed.metadata["prefs"]["lang"] = "fr"
    handed.metadata["n"] = 2
    handed.active_agent = Agent(name="Other", instructions="")

    again = await store.get_or_create("s", agent)
    assert contents(again) == ["q1"]
    assert again.metadata == {"prefs": {"lang": "es"}, "n": 1}
    assert again.active_agent is agent
    assert again is not handed


async def test_a_turn_rolled_back_in_memory_needs_nothing(
    make_store: SQLFactory, agent: Agent
) -> None:
    store = make_store()
    await saved_turn(store, agent, "q1")
    session = await store.get_or_create("s", agent)
    checkpoint = session.checkpoint()
    for i in range(3):  # enough to prune, with max_turns small below
        session.add_message(user(f"failed {i}"))
    session.metadata["turn"] = "failed"
    session.rollback_to(checkpoint)
    assert contents(await store.get_or_create("s", agent)) == ["q1", "re: q1"]
    # The rolled-back context still saves (nothing to write) and the next turn goes on.
    session.add_message(user("q2"))
    await store.save(session)
    assert contents(await store.get("s")) == ["q1", "re: q1", "q2"]


async def test_a_snapshot_keeps_the_pruned_window_and_its_indices(
    make_store: SQLFactory, agent: Agent
) -> None:
    store = make_store(default_max_turns=2)
    session = await store.get_or_create("s", agent)
    for i in range(4):
        session.add_message(user(f"q{i}"))
        session.add_message(reply(f"a{i}"))
    await store.save(session)
    cached = await store.get_or_create("s", agent)
    assert contents(cached) == ["q2", "a2", "q3", "a3"]
    cached.add_message(user("q4"))  # prunes incrementally from the copied indices
    assert contents(cached) == ["q3", "a3", "q4"]
    await store.save(cached)
    assert contents(await store.get("s")) == ["q3", "a3", "q4"]


async def test_a_context_of_another_max_turns_is_not_cached(
    make_store: SQLFactory, agent: Agent
) -> None:
    store = make_store(default_max_turns=1)
    session = SessionContext("s", agent, max_turns=5)
    for i in range(3):
        session.add_message(user(f"q{i}"))
    await store.save(session)
    assert "s" not in store._cache
    assert contents(await store.get("s")) == ["q2"]  # the store's max_turns, as from disk


# -- the bound ----------------------------------------------------------------------------


async def test_the_bound_evicts_least_recently_used_sessions_by_messages(
    make_store: SQLFactory, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(cache_messages=6)

    async def turn(session_id: str, count: int) -> None:
        session = await store.get_or_create(session_id, agent)
        for i in range(count):
            session.add_message(user(f"{session_id}{i}"))
        await store.save(session)

    await turn("a", 2)
    await turn("b", 2)
    await turn("c", 2)
    assert store._cache.messages == 6 and len(store._cache) == 3
    await store.get("a")  # a is now the most recently used
    await turn("d", 1)  # 7 > 6: b, the least recently used, goes
    assert [k in store._cache for k in "abcd"] == [True, False, True, True]
    assert store._cache.messages == 5
    await turn("e", 7)  # larger than the whole bound: never cached
    assert "e" not in store._cache and store._cache.messages == 5

    reads = Reads(store, monkeypatch)
    assert contents(await store.get("b")) == ["b0", "b1"]  # evicted: from disk
    assert reads.count == 1
    assert contents(await store.get("a")) == ["a0", "a1"]
    assert reads.count == 1


async def test_a_load_beside_other_work_is_still_a_hit(
    make_store: SQLFactory, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With a body in flight, SQLite's freshness read joins the batch instead of running alone.
    store = make_store()
    await saved_turn(store, agent, "q1")
    other = await store.get_or_create("other", agent)
    other.add_message(user("x"))
    reads = Reads(store, monkeypatch)
    _, loaded = await asyncio.gather(store.save(other), store.get("s"))
    assert contents(loaded) == ["q1", "re: q1"]
    assert reads.count == 0
