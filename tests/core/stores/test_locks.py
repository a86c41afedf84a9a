"""``KeyedLocks``: one holder per key, and no entry left behind, cancellations included."""

from __future__ import annotations

import asyncio

import pytest

from bot.core.stores._locks import KeyedLocks


async def test_holders_of_one_key_take_turns_and_leave_nothing_behind() -> None:
    locks = KeyedLocks()
    order: list[str] = []
    first_in = asyncio.Event()
    release_first = asyncio.Event()

    async def first() -> None:
        async with locks.hold("a"):
            order.append("first in")
            first_in.set()
            await release_first.wait()
            order.append("first out")

    async def second() -> None:
        await first_in.wait()
        async with locks.hold("a"):
            order.append("second in")

    async def other_key() -> None:
        await first_in.wait()
        async with locks.hold("b"):
            order.append("other key in")
        release_first.set()

    await asyncio.gather(first(), second(), other_key())
    assert order == ["first in", "other key in", "first out", "second in"]
    assert len(locks) == 0


async def test_a_waiter_cancelled_before_its_turn_leaves_no_entry() -> None:
    locks = KeyedLocks()
    held = asyncio.Event()
    done = asyncio.Event()

    async def holder() -> None:
        async with locks.hold("a"):
            held.set()
            await done.wait()

    async def waiter() -> None:
        async with locks.hold("a"):
            pytest.fail("the waiter was cancelled before its turn")

    holding = asyncio.create_task(holder())
    await held.wait()
    waiting = asyncio.create_task(waiter())
    await asyncio.sleep(0)  # let it queue on the lock (no timing: one loop pass)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    done.set()
    await holding
    assert len(locks) == 0


async def test_an_error_inside_the_block_releases_the_key() -> None:
    locks = KeyedLocks()
    with pytest.raises(ValueError):
        async with locks.hold("a"):
            raise ValueError("boom")
    assert len(locks) == 0
    async with locks.hold("a"):  # free again
        pass
