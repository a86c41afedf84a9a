"""The Runner's gauges of turns running and turns waiting for their session (/metrics)."""

from __future__ import annotations

import asyncio

from bot.core.agent import Agent
from bot.core.models import ScriptedModel
from bot.core.runner import Runner
from bot.core.stores.in_memory import SessionStore


async def test_a_second_turn_of_a_session_counts_as_waiting_until_the_first_ends() -> None:
    runner = Runner(Agent(name="A", instructions="x"), SessionStore(), model=ScriptedModel())
    release = asyncio.Event()
    inside = asyncio.Event()

    async def first() -> None:
        async with runner._counted("s"):
            inside.set()
            await release.wait()

    async def second() -> None:
        async with runner._counted("s"):
            assert runner.turns_running == 1 and runner.turns_waiting == 0

    one = asyncio.create_task(first())
    await inside.wait()
    two = asyncio.create_task(second())
    await asyncio.sleep(0)  # two reaches the session's lock and waits there
    assert (runner.turns_running, runner.turns_waiting) == (1, 1)
    release.set()
    await asyncio.gather(one, two)
    assert (runner.turns_running, runner.turns_waiting) == (0, 0)


async def test_a_cancelled_wait_is_no_longer_counted() -> None:
    runner = Runner(Agent(name="A", instructions="x"), SessionStore(), model=ScriptedModel())
    release = asyncio.Event()
    inside = asyncio.Event()

    async def hold() -> None:
        async with runner._counted("s"):
            inside.set()
            await release.wait()

    async def wait() -> None:
        async with runner._counted("s"):
            pass

    holder = asyncio.create_task(hold())
    await inside.wait()
    waiter = asyncio.create_task(wait())
    await asyncio.sleep(0)
    assert runner.turns_waiting == 1
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert runner.turns_waiting == 0
    release.set()
    await holder
    assert runner.turns_running == 0
