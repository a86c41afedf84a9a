"""The SQLite store's database thread: bodies in one call, group commit, failures, cancellation."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.sql import Transaction
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.stores.sqlite_writer import MAX_BATCH
from bot.errors import StorageError


async def claimed(store: SQLiteSessionStore, message_id: str) -> bool:
    return await store.is_message_processed(message_id)


def claim_body(message_id: str) -> Callable[[Transaction], Any]:
    async def body(tx: Transaction) -> int:
        return await tx.execute(
            "INSERT INTO chatflow_processed_messages VALUES (?, 1e12)", (message_id,)
        )

    return body


@asynccontextmanager
async def thread_held(store: SQLiteSessionStore) -> AsyncIterator[None]:
    """Hold the database thread in a transaction block; bodies queue up meanwhile.

    Leaving the block lets the thread run every body queued as one batch.
    """
    async with store.transaction() as tx:
        yield
        # One round trip: tasks created before it reach the thread's queue first.
        await tx.fetchone("SELECT 1")


async def test_run_returns_the_body_result_and_commits(
    sqlite_file_store: SQLiteSessionStore,
) -> None:
    store = sqlite_file_store
    committed: list[bool] = []
    assert await store.run(claim_body("m1"), on_commit=lambda: committed.append(True)) == 1
    assert committed == [True]
    assert await claimed(store, "m1")


async def test_a_body_that_suspends_fails_loudly_and_is_rolled_back(
    sqlite_file_store: SQLiteSessionStore,
) -> None:
    store = sqlite_file_store
    event = asyncio.Event()
    committed: list[bool] = []

    async def waits_for_an_event(tx: Transaction) -> None:
        await claim_body("m-event")(tx)
        await event.wait()

    async def sleeps(tx: Transaction) -> None:
        await claim_body("m-sleep")(tx)
        await asyncio.sleep(0)

    for body in (waits_for_an_event, sleeps):
        with pytest.raises(StorageError, match="suspended"):
            await store.run(body, on_commit=lambda: committed.append(True))
    assert committed == []
    assert not await claimed(store, "m-event")
    assert not await claimed(store, "m-sleep")
    event.set()  # the abandoned wait left nothing behind on the loop
    assert await store.claim_message("m-after")


async def test_a_save_hook_that_suspends_fails_loudly_and_rolls_the_turn_back(
    sqlite_file_store: SQLiteSessionStore, agent: Agent
) -> None:
    store = sqlite_file_store
    session = await store.get_or_create("s", agent)
    session.add_message(Message(role=Role.USER, content="q"))
    event = asyncio.Event()

    async def hook(tx: Transaction) -> None:
        await claim_body("m-hook")(tx)
        await event.wait()  # real waiting has no place inside the turn's transaction

    with pytest.raises(StorageError, match="suspended"):
        await store.save(session, also=hook)
    assert not await claimed(store, "m-hook")
    assert (await store.get_or_create("s", agent)).history == []
    await store.save(session)  # the turn is still unsaved: a plain save writes it
    assert [m.content for m in (await store.get_or_create("s", agent)).history] == ["q"]


async def test_one_failing_body_in_a_batch_leaves_the_others_committed(
    sqlite_file_store: SQLiteSessionStore,
) -> None:
    store = sqlite_file_store
    await store.open()

    async def fails(tx: Transaction) -> None:
        await claim_body("m-bad")(tx)
        raise KeyError("boom")

    async def suspends(tx: Transaction) -> None:
        await claim_body("m-suspends")(tx)
        await asyncio.sleep(0)

    commits = store.commits
    async with thread_held(store):
        tasks = [
            asyncio.create_task(store.run(claim_body("m-1"))),
            asyncio.create_task(store.run(fails)),
            asyncio.create_task(store.run(suspends)),
            asyncio.create_task(store.run(claim_body("m-2"))),
        ]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[0] == 1 and results[3] == 1
    assert isinstance(results[1], KeyError)
    assert isinstance(results[2], StorageError)
    assert store.commits == commits + 2  # the held block and one batch
    assert await claimed(store, "m-1") and await claimed(store, "m-2")
    assert not await claimed(store, "m-bad")
    assert not await claimed(store, "m-suspends")


async def test_a_failing_commit_fails_the_whole_batch(
    sqlite_file_store: SQLiteSessionStore, agent: Agent
) -> None:
    store = sqlite_file_store
    session = await store.get_or_create("s", agent)
    session.add_message(Message(role=Role.USER, content="q"))
    acted: list[str] = []

    async def breaks_the_commit(tx: Transaction) -> None:
        # A deferred foreign-key violation passes every statement and fails only COMMIT.
        await tx.execute("PRAGMA defer_foreign_keys = ON")
        await tx.execute(
            "INSERT INTO chatflow_messages (session_id, seq, role, message_json, created_at) "
            "VALUES ('no-such-session', 1, 'user', '{}', '2026-01-01')"
        )

    async with thread_held(store):
        tasks = [
            asyncio.create_task(store.run(claim_body("m-1"), on_commit=lambda: acted.append("1"))),
            asyncio.create_task(store.run(breaks_the_commit, on_commit=lambda: acted.append("x"))),
            asyncio.create_task(store.save(session)),
        ]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        assert isinstance(result, StorageError)
        assert "commit failed" in str(result)
        assert isinstance(result.__cause__, sqlite3.IntegrityError)
    assert acted == []
    assert not await claimed(store, "m-1")
    # The session still holds its unsaved message: the next save writes it once.
    await store.save(session)
    loaded = await store.get_or_create("s", agent)
    assert [m.content for m in loaded.history] == ["q"]


async def test_concurrent_claims_share_commits(sqlite_file_store: SQLiteSessionStore) -> None:
    store = sqlite_file_store
    await store.open()
    commits = store.commits
    results = await asyncio.gather(*(store.claim_message(f"m-{i}") for i in range(20)))
    assert all(results)
    assert store.commits - commits <= 5

    commits = store.commits
    async with thread_held(store):
        queued = [asyncio.create_task(store.claim_message(f"n-{i}")) for i in range(MAX_BATCH + 6)]
    assert all(await asyncio.gather(*queued))
    assert store.commits - commits == 1 + 2  # the held block, then batches of MAX_BATCH


async def test_a_transaction_block_is_serialised_with_the_batches(
    sqlite_file_store: SQLiteSessionStore,
) -> None:
    store = sqlite_file_store
    async with store.transaction() as tx:
        await tx.execute("INSERT INTO chatflow_processed_messages VALUES ('m-block', 1e12)")
        waiting = asyncio.create_task(store.run(claim_body("m-block")))
        await tx.fetchone("SELECT 1")
        assert not waiting.done()
    # The body ran after the block committed, so it collides with its row.
    with pytest.raises(StorageError) as info:
        await waiting
    assert isinstance(info.value.__cause__, sqlite3.IntegrityError)


async def test_run_inside_its_own_transaction_raises(
    sqlite_file_store: SQLiteSessionStore,
) -> None:
    async with sqlite_file_store.transaction():
        with pytest.raises(StorageError, match="inside its own transaction"):
            await sqlite_file_store.run(claim_body("m"))


async def test_a_cancelled_caller_waits_for_the_body_and_its_commit(
    sqlite_file_store: SQLiteSessionStore,
) -> None:
    store = sqlite_file_store
    loop = asyncio.get_running_loop()
    on_thread, release = asyncio.Event(), threading.Event()
    committed: list[bool] = []

    async def held(tx: Transaction) -> None:
        loop.call_soon_threadsafe(on_thread.set)
        release.wait(5)  # blocks the database thread, not the loop
        await claim_body("m-held")(tx)

    task = asyncio.create_task(store.run(held, on_commit=lambda: committed.append(True)))
    await on_thread.wait()
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert committed == [True]
    assert await claimed(store, "m-held")


async def test_a_closed_store_refuses_bodies(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "x.db")
    await store.open()
    await store.close()
    with pytest.raises(StorageError, match="closed"):
        await store.run(claim_body("m"))


async def test_memory_uri_databases_run_bodies() -> None:
    async with SQLiteSessionStore("file:writer-test?mode=memory&cache=shared") as store:
        assert await store.run(claim_body("m")) == 1
        assert await claimed(store, "m")
