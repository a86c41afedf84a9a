"""Behaviour every session store shares (in-memory, SQLite file and in memory, PostgreSQL)."""

from __future__ import annotations

import asyncio

import pytest

from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.session import SessionContext
from bot.core.sql import Transaction
from bot.core.stores.base import BaseSessionStore, SessionDeletedError, TransactionalStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import StorageError
from tests.core.conftest import StoreFactory
from tests.fakes.clock import FakeClock


def user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


def reply(text: str) -> Message:
    return Message(role=Role.MODEL, content=text, agent="Support")


def texts(session: SessionContext | None) -> list[str | None]:
    assert session is not None
    return [m.content for m in session.history]


def lock_registry(store: BaseSessionStore) -> int:
    if isinstance(store, SQLiteSessionStore):
        from bot.core.stores import sqlite as sqlite_store

        return len(sqlite_store._SHARED_SESSION_LOCKS)
    return len(store._session_locks)


# -- construction ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3], ids=["zero", "negative"])
def test_default_max_turns_must_be_positive(store_factory: StoreFactory, bad: int) -> None:
    with pytest.raises(ValueError, match="default_max_turns"):
        store_factory(default_max_turns=bad)


def test_dedup_ttl_must_be_positive(store_factory: StoreFactory) -> None:
    with pytest.raises(ValueError, match="dedup_ttl_hours"):
        store_factory(dedup_ttl_hours=0)


# -- sessions ----------------------------------------------------------------------------


async def test_get_or_create_then_get(store: BaseSessionStore, agent: Agent) -> None:
    assert await store.get("s-1") is None
    created = await store.get_or_create("s-1", agent, {"channel": "whatsapp"})
    assert created.active_agent is agent
    assert created.metadata == {"channel": "whatsapp"}
    assert created.max_turns == store.default_max_turns

    again = await store.get_or_create("s-1", agent, {"channel": "ignored"})
    assert again is not created
    assert again.metadata == {"channel": "whatsapp"}
    assert again.active_agent is agent
    assert await store.list_sessions() == ["s-1"]


async def test_save_and_reload(store: BaseSessionStore, agent: Agent) -> None:
    store.set_agent_resolver({agent.name: agent}.get)
    session = await store.get_or_create("s-1", agent)
    session.add_message(user("hello"))
    session.add_message(reply("hi there"))
    session.metadata["lang"] = "es"
    await store.save(session)

    loaded = await store.get("s-1")
    assert loaded is not None
    assert loaded.history == session.history
    assert loaded.metadata == {"lang": "es"}
    assert loaded.active_agent is agent


async def test_unsaved_changes_never_reach_the_store(store: BaseSessionStore, agent: Agent) -> None:
    session = await store.get_or_create("s-1", agent)
    session.add_message(user("saved"))
    await store.save(session)
    session.add_message(user("lost: the turn failed and was never saved"))
    session.metadata["dirty"] = True
    session.active_agent = Agent(name="Billing", instructions="")

    loaded = await store.get_or_create("s-1", agent)
    assert texts(loaded) == ["saved"]
    assert loaded.metadata == {}
    assert loaded.active_agent.name == "Support"


async def test_saving_a_new_context_creates_the_session(
    store: BaseSessionStore, agent: Agent
) -> None:
    session = SessionContext("direct", agent, metadata={"k": [1, 2]})
    session.add_message(user("u"))
    await store.save(session)
    session.add_message(reply("r"))
    await store.save(session)
    loaded = await store.get_or_create("direct", agent)
    assert texts(loaded) == ["u", "r"]
    assert loaded.metadata == {"k": [1, 2]}


async def test_pruned_turns_leave_the_store(store_factory: StoreFactory, agent: Agent) -> None:
    store = store_factory(default_max_turns=2)
    session = await store.get_or_create("s", agent)
    for i in range(5):
        session.add_message(user(f"u{i}"))
        session.add_message(reply(f"r{i}"))
        await store.save(session)
    assert texts(await store.get_or_create("s", agent)) == ["u3", "r3", "u4", "r4"]


async def test_rollback_after_save_is_persisted_exactly(
    store_factory: StoreFactory, agent: Agent
) -> None:
    store = store_factory(default_max_turns=2)
    session = await store.get_or_create("s", agent)
    for i in range(2):
        session.add_message(user(f"u{i}"))
        session.add_message(reply(f"r{i}"))
    await store.save(session)
    token = session.checkpoint()
    session.add_message(user("u2"))  # prunes u0's turn
    session.metadata["x"] = 1
    await store.save(session)
    session.rollback_to(token)
    await store.save(session)

    loaded = await store.get_or_create("s", agent)
    assert texts(loaded) == ["u0", "r0", "u1", "r1"]
    assert loaded.metadata == {}
    loaded.add_message(user("u3"))
    await store.save(loaded)
    assert texts(await store.get("s")) == ["u1", "r1", "u3"]


async def test_non_json_metadata_is_a_storage_error(store: BaseSessionStore, agent: Agent) -> None:
    session = await store.get_or_create("s", agent)
    session.metadata["when"] = object()
    with pytest.raises(StorageError, match="JSON"):
        await store.save(session)


@pytest.mark.parametrize("bad_id", ["../x", "a/b", ""], ids=["traversal", "slash", "empty"])
async def test_unsafe_ids_are_refused(store: BaseSessionStore, agent: Agent, bad_id: str) -> None:
    with pytest.raises(ValueError):
        await store.get_or_create(bad_id, agent)
    with pytest.raises(ValueError):
        await store.get(bad_id)
    with pytest.raises(ValueError):
        await store.delete(bad_id)
    with pytest.raises(ValueError):
        async with store.session_lock(bad_id):
            pass


async def test_list_sessions_most_recent_first(
    store: BaseSessionStore, agent: Agent, clock: FakeClock
) -> None:
    for sid in ("b", "a", "c"):
        await store.get_or_create(sid, agent)
        clock.advance(seconds=1)
    older = await store.get_or_create("b", agent)
    older.add_message(user("bump"))
    await store.save(older)
    assert await store.list_sessions() == ["b", "c", "a"]


# -- deletion ----------------------------------------------------------------------------


async def test_delete(store: BaseSessionStore, agent: Agent) -> None:
    session = await store.get_or_create("s", agent)
    session.add_message(user("secret"))
    await store.save(session)
    other_holder = await store.get("s")
    assert other_holder is not None

    assert await store.delete("s") is True
    assert session.deleted and other_holder.deleted
    assert await store.get("s") is None
    assert await store.list_sessions() == []
    assert await store.delete("s") is False

    session.add_message(user("after delete"))
    with pytest.raises(SessionDeletedError):
        await store.save(session)

    # A new session of the same id starts empty: the messages went with the old one.
    reborn = await store.get_or_create("s", agent)
    assert reborn.history == []
    with pytest.raises(SessionDeletedError):
        await store.save(other_holder)
    assert texts(await store.get("s")) == []


# -- concurrent holders ------------------------------------------------------------------


async def test_stale_context_cannot_overwrite_a_newer_turn(
    store: BaseSessionStore, agent: Agent
) -> None:
    first = await store.get_or_create("s", agent)
    stale = await store.get_or_create("s", agent)
    first.add_message(user("turn A"))
    await store.save(first)
    stale.add_message(user("turn B"))
    with pytest.raises(StorageError, match="changed in the store"):
        await store.save(stale)
    assert texts(await store.get("s")) == ["turn A"]


async def test_session_lock_serialises_turns(store: BaseSessionStore, agent: Agent) -> None:
    await store.get_or_create("s", agent)
    a_inside = asyncio.Event()
    release_a = asyncio.Event()
    b_inside = asyncio.Event()

    async def turn(label: str, inside: asyncio.Event, release: asyncio.Event | None) -> None:
        async with store.session_lock("s"):
            inside.set()
            session = await store.get_or_create("s", agent)  # its own context object
            session.add_message(user(f"{label}-question"))
            if release is not None:
                await release.wait()
            session.add_message(reply(f"{label}-answer"))
            await store.save(session)

    task_a = asyncio.create_task(turn("a", a_inside, release_a))
    await a_inside.wait()
    task_b = asyncio.create_task(turn("b", b_inside, None))
    try:
        for _ in range(20):
            await asyncio.sleep(0)  # let b run as far as it can
        assert not b_inside.is_set()
    finally:
        release_a.set()
        results = await asyncio.gather(task_a, task_b, return_exceptions=True)
    assert list(results) == [None, None]
    assert texts(await store.get("s")) == ["a-question", "a-answer", "b-question", "b-answer"]
    assert lock_registry(store) == 0


async def test_session_locks_are_per_session(store: BaseSessionStore) -> None:
    inside_other = asyncio.Event()
    async with store.session_lock("s-1"):

        async def other() -> None:
            async with store.session_lock("s-2"):
                inside_other.set()

        await asyncio.wait_for(asyncio.create_task(other()), timeout=5)
    assert inside_other.is_set()
    assert lock_registry(store) == 0


# -- dedup -------------------------------------------------------------------------------


async def test_concurrent_claims_have_one_winner(store: BaseSessionStore) -> None:
    results = await asyncio.gather(*(store.claim_message("wamid.X") for _ in range(50)))
    assert results.count(True) == 1
    assert await store.is_message_processed("wamid.X")
    assert not await store.is_message_processed("wamid.Y")


async def test_claims_expire_after_the_ttl(store: BaseSessionStore, clock: FakeClock) -> None:
    assert await store.claim_message("m1")
    clock.advance(hours=191)
    assert not await store.claim_message("m1")
    assert await store.is_message_processed("m1")
    clock.advance(hours=1, seconds=-30)
    assert not await store.claim_message("m1")  # still inside the TTL; a purge runs now
    clock.advance(seconds=31)
    # Expired, and no purge is due yet: the stale row itself must count as unclaimed.
    assert not await store.is_message_processed("m1")
    assert await store.claim_message("m1")
    assert not await store.claim_message("m1")


async def test_expired_ids_are_purged_automatically_then_reclaimable(
    store: BaseSessionStore, clock: FakeClock
) -> None:
    for i in range(5):
        await store.mark_message_processed(f"old-{i}")
    clock.advance(hours=193)
    await store.mark_message_processed("new")  # a purge is due: it removes the old ids
    assert await store.purge_expired_claims() == 0
    assert await store.is_message_processed("new")
    assert not await store.is_message_processed("old-0")
    assert await store.claim_message("old-0")
    assert not await store.claim_message("new")


async def test_explicit_purge_in_batches(store_factory: StoreFactory, clock: FakeClock) -> None:
    store = store_factory()
    for i in range(5):
        await store.mark_message_processed(f"old-{i}")  # first call purges an empty table
    clock.advance(hours=193)
    assert await store.purge_expired_claims(batch_size=2) == 2
    assert await store.purge_expired_claims(batch_size=2) == 2
    assert await store.purge_expired_claims(batch_size=2) == 1
    assert await store.purge_expired_claims() == 0


async def test_seed_check_then_mark_pair(store: BaseSessionStore) -> None:
    assert not await store.is_message_processed("wamid.HBgLMjAyNjEwMzAA")
    await store.mark_message_processed("wamid.HBgLMjAyNjEwMzAA")
    assert await store.is_message_processed("wamid.HBgLMjAyNjEwMzAA")
    assert not await store.claim_message("wamid.HBgLMjAyNjEwMzAA")


async def test_empty_message_id_is_refused(store: BaseSessionStore) -> None:
    with pytest.raises(ValueError):
        await store.claim_message("")


# -- run(): one transaction in one call (the SQL stores) ---------------------------------


def sql_store(store: BaseSessionStore) -> TransactionalStore:
    if not isinstance(store, TransactionalStore):
        pytest.skip("the in-memory store runs no SQL")
    return store


async def test_run_commits_the_body_and_then_calls_on_commit(store: BaseSessionStore) -> None:
    sql = sql_store(store)
    committed: list[bool] = []

    async def body(tx: Transaction) -> bool:
        return await sql.claim_in(tx, "m-run")

    assert await sql.run(body, on_commit=lambda: committed.append(True)) is True
    assert committed == [True]
    assert not await sql.claim_message("m-run")


async def test_run_rolls_back_a_failing_body(store: BaseSessionStore) -> None:
    sql = sql_store(store)
    committed: list[bool] = []

    async def body(tx: Transaction) -> None:
        assert await sql.claim_in(tx, "m-run")
        raise KeyError("boom")

    with pytest.raises(KeyError):
        await sql.run(body, on_commit=lambda: committed.append(True))
    assert committed == []
    assert await sql.claim_message("m-run")


async def test_run_read_only_body(store: BaseSessionStore) -> None:
    sql = sql_store(store)

    async def body(tx: Transaction) -> tuple[object, ...] | None:
        return await tx.fetchone("SELECT 1 + 1")

    assert await sql.run(body, write=False) == (2,)
