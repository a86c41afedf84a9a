"""Per-sender counts in the database: limits, one notice per window, restarts, processes."""

from __future__ import annotations

import asyncio

import pytest

from bot.core.stores.base import TransactionalStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.access.rate_limits import RateLimits, RateVerdict, sender_digest
from tests.fakes.clock import FakeClock
from tests.gateway.access.access_support import StoreFactory, databases

__all__ = ["databases"]

SECRET = b"s" * 32


def limits_on(store: TransactionalStore, limit: int = 3, window: float = 60.0) -> RateLimits:
    return RateLimits(store, limit=limit, window_seconds=window, secret=SECRET)


async def hit(limits: RateLimits, store: TransactionalStore, sender: str = "42") -> RateVerdict:
    async with store.transaction() as tx:
        return await limits.hit_in(tx, "telegram", sender)


async def test_the_message_past_the_limit_earns_the_one_notice(databases: StoreFactory) -> None:
    store = await databases()
    limits = limits_on(store)
    await limits.open()
    verdicts = [await hit(limits, store) for _ in range(6)]
    assert [v.allowed for v in verdicts] == [True, True, True, False, False, False]
    assert [v.notice for v in verdicts] == [False, False, False, True, False, False]
    assert await limits.count("telegram", "42") == 6


async def test_other_senders_and_platforms_count_apart(databases: StoreFactory) -> None:
    store = await databases()
    limits = limits_on(store, limit=1)
    await limits.open()
    assert (await hit(limits, store, "a")).allowed
    assert not (await hit(limits, store, "a")).allowed
    assert (await hit(limits, store, "b")).allowed
    async with store.transaction() as tx:
        assert (await limits.hit_in(tx, "whatsapp", "a")).allowed


@pytest.mark.parametrize(
    "window",
    [
        pytest.param(1.0, id="one-second"),
        pytest.param(7.5, id="fractional"),
        pytest.param(86_400.0, id="one-day"),
    ],
)
async def test_a_window_of_any_length_ends_and_lets_the_sender_in_again(
    databases: StoreFactory, clock: FakeClock, window: float
) -> None:
    store = await databases()
    limits = limits_on(store, limit=2, window=window)
    await limits.open()
    assert [(await hit(limits, store)).allowed for _ in range(3)] == [True, True, False]
    clock.advance(seconds=window * 0.9)
    verdict = await hit(limits, store)
    assert not verdict.allowed and not verdict.notice
    assert verdict.retry_in == pytest.approx(window * 0.1)
    clock.advance(seconds=window * 0.1 + 0.001)
    again = [await hit(limits, store) for _ in range(3)]
    assert [v.allowed for v in again] == [True, True, False]
    assert again[2].notice  # a new window, a new (single) notice


async def test_counts_survive_a_restart_in_the_middle_of_a_window(
    databases: StoreFactory, clock: FakeClock
) -> None:
    first = await databases()
    limits = limits_on(first, limit=3)
    await limits.open()
    assert (await hit(limits, first)).allowed
    assert (await hit(limits, first)).allowed
    await first.close()
    clock.advance(seconds=30)
    restarted = await databases()
    after = limits_on(restarted, limit=3)
    await after.open()
    verdicts = [await hit(after, restarted) for _ in range(3)]
    assert [(v.allowed, v.notice) for v in verdicts] == [
        (True, False),
        (False, True),
        (False, False),
    ]
    # the window still ends 60 s after the first message, not after the restart
    assert verdicts[-1].retry_in == pytest.approx(30)


async def test_a_rolled_back_transaction_does_not_count(databases: StoreFactory) -> None:
    store = await databases()
    limits = limits_on(store, limit=1)
    await limits.open()
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await limits.hit_in(tx, "telegram", "42")
            raise RuntimeError("turn failed before commit")
    assert await limits.count("telegram", "42") == 0


async def test_the_table_holds_no_raw_sender_id(databases: StoreFactory) -> None:
    store = await databases()
    limits = limits_on(store)
    await limits.open()
    await hit(limits, store, "16505551234")
    async with store.transaction() as tx:
        rows = await tx.fetchall("SELECT sender FROM chatflow_rate_limits")
    assert rows == [(sender_digest("telegram", "16505551234", SECRET),)]
    assert "16505551234" not in str(rows)


async def test_ended_windows_are_pruned(databases: StoreFactory, clock: FakeClock) -> None:
    store = await databases()
    limits = limits_on(store)
    await limits.open()
    await hit(limits, store, "old")
    clock.advance(seconds=61)
    await hit(limits, store, "new")
    assert await limits.prune() == 1
    assert await limits.count("telegram", "new") == 1


async def test_processes_sharing_a_database_count_together(databases: StoreFactory) -> None:
    """Two stores are two processes (on SQLite two connections to one file)."""
    one, two = await databases(), await databases()
    a, b = limits_on(one, limit=10), limits_on(two, limit=10)
    await a.open()
    await b.open()
    verdicts = await asyncio.gather(
        *(hit(a, one) for _ in range(8)), *(hit(b, two) for _ in range(8))
    )
    assert sum(v.allowed for v in verdicts) == 10
    assert sum(v.notice for v in verdicts) == 1


def test_limit_and_window_must_be_positive() -> None:
    store = SQLiteSessionStore(":memory:")
    with pytest.raises(ValueError, match="positive"):
        RateLimits(store, limit=0, window_seconds=60, secret=SECRET)
