"""The Runner's ``on_commit`` hook: written in the turn's own transaction, or not at all."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from bot.core.models import ScriptedModel
from bot.core.runner import Runner, RunResult
from bot.core.stores.in_memory import SessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import ChatflowError, StorageError
from tests.core.runner_support import SID, clear_tool_log, make_agents, sqlite_store, stored

# The fixtures, imported for this module's tests.
__all__ = ["clear_tool_log", "sqlite_store"]


async def test_on_commit_writes_in_the_same_transaction(sqlite_store: SQLiteSessionStore) -> None:
    triage, _ = make_agents()
    async with sqlite_store.transaction() as tx:
        await tx.execute("CREATE TABLE outbox (session_id TEXT, content TEXT)")
    seen: list[RunResult] = []

    async def on_commit(result: RunResult, tx: Any) -> None:
        seen.append(result)
        await tx.execute("INSERT INTO outbox VALUES (?, ?)", (result.session_id, result.content))

    runner = Runner(triage, sqlite_store, model=ScriptedModel([ScriptedModel.reply("hi!")]))
    result = await runner.run_async(SID, "hello", on_commit=on_commit)
    assert seen == [result]
    async with sqlite_store.transaction() as tx:
        rows = await tx.fetchall("SELECT session_id, content FROM outbox")
    assert rows == [(SID, "hi!")]


async def test_failing_on_commit_rolls_back_everything(
    sqlite_store: SQLiteSessionStore,
) -> None:
    triage, _ = make_agents()
    async with sqlite_store.transaction() as tx:
        await tx.execute("CREATE TABLE outbox (content TEXT)")

    async def on_commit(result: RunResult, tx: Any) -> None:
        await tx.execute("INSERT INTO outbox VALUES (?)", (result.content,))
        raise RuntimeError("ledger refused")

    model = ScriptedModel([ScriptedModel.reply("lost"), ScriptedModel.reply("kept")])
    runner = Runner(triage, sqlite_store, model=model)
    with pytest.raises(ChatflowError):
        await runner.run_async(SID, "hello", on_commit=on_commit)
    async with sqlite_store.transaction() as tx:
        assert await tx.fetchall("SELECT * FROM outbox") == []
    assert await sqlite_store.get(SID) is None or (await stored(sqlite_store))[0] == []
    assert (await runner.run_async(SID, "again")).content == "kept"


async def test_cancellation_during_the_commit_keeps_the_committed_turn(
    sqlite_store: SQLiteSessionStore,
) -> None:
    """A commit in flight settles first: memory must match disk, not be rolled back."""
    triage, _ = make_agents()
    async with sqlite_store.transaction() as tx:
        await tx.execute("CREATE TABLE outbox (content TEXT)")
    loop = asyncio.get_running_loop()
    entered, release = asyncio.Event(), threading.Event()

    async def on_commit(result: RunResult, tx: Any) -> None:
        # Runs on the store's database thread (a hook never suspends): it is held
        # there, inside the commit's transaction, while the caller is cancelled.
        loop.call_soon_threadsafe(entered.set)
        release.wait(5)
        await tx.execute("INSERT INTO outbox VALUES (?)", (result.content,))

    model = ScriptedModel([ScriptedModel.reply("committed"), ScriptedModel.reply("next")])
    runner = Runner(triage, sqlite_store, model=model)
    task = asyncio.create_task(runner.run_async(SID, "hello", on_commit=on_commit))
    await entered.wait()
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    history, _, _ = await stored(sqlite_store)
    assert [json.loads(m)["content"] for m in history] == ["hello", "committed"]
    async with sqlite_store.transaction() as tx:
        assert await tx.fetchall("SELECT content FROM outbox") == [("committed",)]
    await runner.run_async(SID, "more")
    assert [m.content for m in model.requests[1].messages] == ["hello", "committed", "more"]


async def test_on_commit_with_the_memory_store_is_a_storage_error() -> None:
    triage, _ = make_agents()
    store = SessionStore()

    async def on_commit(result: RunResult, tx: Any) -> None:
        raise AssertionError("never called")

    runner = Runner(triage, store, model=ScriptedModel([ScriptedModel.reply("x")]))
    with pytest.raises(StorageError):
        await runner.run_async(SID, "hi", on_commit=on_commit)
    assert (await stored(store))[0] == []
