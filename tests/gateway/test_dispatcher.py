from __future__ import annotations

import asyncio

from bot.gateway.dispatcher import DispatcherBusyError, SessionDispatcher


async def test_per_session_order_and_parallel_sessions() -> None:
    order: list[tuple[str, int]] = []
    release = asyncio.Event()
    both_running = asyncio.Event()
    running: set[str] = set()

    async def handle(item: tuple[str, int]) -> None:
        session, n = item
        running.add(session)
        if len(running) == 2:
            both_running.set()
        if n == 0:
            await release.wait()
        order.append(item)
        running.discard(session)

    d: SessionDispatcher[tuple[str, int]] = SessionDispatcher(handle, max_concurrent=4)
    for n in range(3):
        d.submit("a", f"a{n}", ("a", n))
        d.submit("b", f"b{n}", ("b", n))
    d.resume()
    await asyncio.wait_for(both_running.wait(), 5)  # sessions run side by side
    release.set()
    assert await d.drain(5)
    assert [n for s, n in order if s == "a"] == [0, 1, 2]
    assert [n for s, n in order if s == "b"] == [0, 1, 2]


async def test_duplicate_key_is_ignored() -> None:
    handled: list[int] = []

    async def handle(item: int) -> None:
        handled.append(item)

    d: SessionDispatcher[int] = SessionDispatcher(handle, max_concurrent=1)
    assert d.submit("s", "k1", 1)
    assert not d.submit("s", "k1", 1)
    assert d.submit("s", "k2", 2)
    assert d.queued == 2
    d.resume()
    assert await d.drain(5)
    assert handled == [1, 2]


async def test_concurrency_is_bounded() -> None:
    active = 0
    peak = 0
    gate = asyncio.Event()

    async def handle(item: int) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await gate.wait()
        active -= 1

    d: SessionDispatcher[int] = SessionDispatcher(handle, max_concurrent=3)
    for n in range(10):
        d.submit(f"s{n}", f"k{n}", n)
    d.resume()
    for _ in range(20):
        await asyncio.sleep(0)
    assert peak == 3
    gate.set()
    assert await d.drain(5)


async def test_a_failing_item_does_not_stop_its_session() -> None:
    handled: list[int] = []

    async def handle(item: int) -> None:
        if item == 1:
            raise RuntimeError("boom")
        handled.append(item)

    d: SessionDispatcher[int] = SessionDispatcher(handle, max_concurrent=1)
    d.resume()
    d.submit("s", "k1", 1)
    d.submit("s", "k2", 2)
    assert await d.drain(5)
    assert handled == [2]


def test_the_busy_error_asks_the_platform_to_redeliver() -> None:
    assert DispatcherBusyError("too many messages waiting").retryable
