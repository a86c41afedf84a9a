"""Per-session serialisation: turns of one session never interleave, other sessions
run in parallel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest

from bot.core.messages import Role
from bot.core.models import ModelResponse, ScriptedModel
from bot.core.models.scripted import RecordedCall
from bot.core.runner import Runner
from bot.core.stores.base import BaseSessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from tests.core.runner_support import SID, clear_tool_log, make_agents, sqlite_store

# The fixtures, imported for this module's tests.
__all__ = ["clear_tool_log", "sqlite_store"]


def spy_lock(
    monkeypatch: pytest.MonkeyPatch, store: BaseSessionStore, waiting: asyncio.Event, nth: int
) -> None:
    """Set ``waiting`` when the ``nth`` caller asks for a session lock (it may then block)."""
    original = store.session_lock
    count = 0

    @asynccontextmanager
    async def spy(session_id: str) -> AsyncIterator[None]:
        nonlocal count
        count += 1
        if count == nth:
            waiting.set()
        async with original(session_id):
            yield

    lock: Callable[[str], AbstractAsyncContextManager[None]] = spy
    monkeypatch.setattr(store, "session_lock", lock)


def held_reply(entered: asyncio.Event, release: asyncio.Event, text: str) -> Any:
    async def step(call: RecordedCall) -> ModelResponse:
        entered.set()
        await release.wait()
        return ScriptedModel.reply(text)

    return step


@pytest.mark.parametrize("runners", [1, 2], ids=["one-runner", "two-runners"])
async def test_turns_of_one_session_never_interleave(
    sqlite_store: SQLiteSessionStore, monkeypatch: pytest.MonkeyPatch, runners: int
) -> None:
    triage, _ = make_agents()
    entered, release, second_waiting = asyncio.Event(), asyncio.Event(), asyncio.Event()
    model = ScriptedModel(
        [
            ScriptedModel.call("lookup_order", order_id="1"),
            held_reply(entered, release, "first done"),
            ScriptedModel.reply("second done"),
        ]
    )
    runner_a = Runner(triage, sqlite_store, model=model)
    runner_b = runner_a if runners == 1 else Runner(make_agents()[0], sqlite_store, model=model)
    spy_lock(monkeypatch, sqlite_store, second_waiting, nth=2)
    async with asyncio.timeout(10):
        first = asyncio.create_task(runner_a.run_async(SID, "first"))
        await entered.wait()  # the first turn is inside its second model call
        second = asyncio.create_task(runner_b.run_async(SID, "second"))
        await second_waiting.wait()
        assert len(model.requests) == 2  # the second turn has not reached the model
        release.set()
        results = await asyncio.gather(first, second)
    assert [r.content for r in results] == ["first done", "second done"]
    seen = [(m.role, m.content) for m in model.requests[2].messages]
    assert seen[:2] == [(Role.USER, "first"), (Role.MODEL, None)]
    assert seen[2][0] is Role.TOOL
    assert seen[3:] == [(Role.MODEL, "first done"), (Role.USER, "second")]


async def test_different_sessions_run_in_parallel(sqlite_store: SQLiteSessionStore) -> None:
    triage, _ = make_agents()
    entered, release = asyncio.Event(), asyncio.Event()
    model = ScriptedModel([held_reply(entered, release, "slow"), ScriptedModel.reply("fast")])
    runner = Runner(triage, sqlite_store, model=model)
    async with asyncio.timeout(10):
        slow = asyncio.create_task(runner.run_async("test-aaaaaaaaaaaaaaaa", "slow"))
        await entered.wait()
        fast = await runner.run_async("test-bbbbbbbbbbbbbbbb", "fast")  # not blocked by slow
        assert fast.content == "fast"
        assert not slow.done()
        release.set()
        assert (await slow).content == "slow"
