"""Delivered marks are group-committed: buffered, written together, flushed before reads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import StorageError
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.core import DeliveredMark
from bot.gateway.ledger.obligations import Obligation
from bot.gateway.outbox import Outbox
from bot.metrics import Metrics
from tests.fakes.adapter import FakeAdapter
from tests.fakes.clock import FakeClock
from tests.gateway.ledger.ledger_support import open_ledger


@pytest.fixture
async def ledger(store: SQLiteSessionStore, clock: FakeClock) -> DeliveryLedger:
    return await open_ledger(store, clock)


@pytest.fixture
async def adapter() -> AsyncIterator[FakeAdapter]:
    made = FakeAdapter()

    async def ignore(event: object) -> bool:
        return False

    await made.start(ignore)
    yield made
    await made.stop()


async def owe(ledger: DeliveryLedger, store: SQLiteSessionStore, count: int) -> list[Obligation]:
    """``count`` replies recorded claimed in one tx 2, as the gateway hands them to the outbox."""
    owed = [
        Obligation.owed(
            obligation_id=f"ob{n:04d}",
            session_key=f"agent:main:fake:dm:chat_{n}",
            session_id=f"fake-{n:016x}",
            platform="fake",
            chat_id=f"chat-{n}",
            thread_id=None,
            reply_to=None,
            content=f"reply {n}",
            message_ref=f"fake:{n}",
        )
        for n in range(count)
    ]
    async with store.transaction() as tx:
        for ob in owed:
            assert await ledger.record_in(tx, ob, claimed=True)
    claimed = [await ledger.get(ob.obligation_id) for ob in owed]
    assert all(c is not None and c.state == "attempting" for c in claimed)
    return [c for c in claimed if c is not None]


async def states(store: SQLiteSessionStore) -> dict[str, str]:
    """Every row's state read straight from the table (no flush on the way)."""
    async with store.transaction() as tx:
        rows = await tx.fetchall("SELECT obligation_id, state FROM chatflow_delivery_obligations")
    return {str(r[0]): str(r[1]) for r in rows}


def count_transactions(store: SQLiteSessionStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Wrap ``store.run``; the returned one-item list counts the transaction bodies run."""
    opened = [0]
    real = store.run

    async def counting(body: Any, **options: Any) -> Any:
        opened[0] += 1
        return await real(body, **options)

    monkeypatch.setattr(store, "run", counting)
    return opened


async def test_concurrent_sends_share_a_few_commits_for_their_marks(
    ledger: DeliveryLedger,
    store: SQLiteSessionStore,
    adapter: FakeAdapter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owed = await owe(ledger, store, 100)
    outbox = Outbox(ledger, {"fake": adapter}, Metrics())
    opened = count_transactions(store, monkeypatch)
    await asyncio.gather(*(outbox.send(ob) for ob in owed))
    await ledger.flush()
    commits = opened[0]
    monkeypatch.undo()
    assert len(adapter.sent) == 100
    assert 1 <= commits <= 5, f"{commits} commits for 100 delivered marks"
    assert set((await states(store)).values()) == {"delivered"}
    # the sent-id rows landed with them (the platform came from the obligation, not a SELECT)
    last = await ledger.get(owed[-1].obligation_id)
    assert last is not None and len(last.sent_ids) == 1
    assert await ledger.find_by_sent_id(last.sent_ids[0], platform="fake") == last.obligation_id


async def test_marks_queued_during_a_commit_share_the_next_one(
    ledger: DeliveryLedger, store: SQLiteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    owed = await owe(ledger, store, 10)
    real = ledger._write_delivered
    writing, release = asyncio.Event(), asyncio.Event()
    batches: list[int] = []

    async def held(marks: Sequence[DeliveredMark]) -> set[str]:
        batches.append(len(marks))
        writing.set()
        await release.wait()
        return await real(marks)

    monkeypatch.setattr(ledger, "_write_delivered", held)
    first = asyncio.create_task(
        ledger.mark_delivered(owed[0].obligation_id, ["a0"], platform="fake")
    )
    await writing.wait()
    for n, ob in enumerate(owed[1:], 1):
        await ledger.mark_delivered(ob.obligation_id, [f"a{n}"], platform="fake", wait=False)
    release.set()
    assert await first
    await ledger.flush()
    assert batches == [1, 9]
    assert set((await states(store)).values()) == {"delivered"}


async def test_a_mark_is_buffered_until_the_commit_and_waiting_returns_its_outcome(
    ledger: DeliveryLedger, store: SQLiteSessionStore
) -> None:
    [ob] = await owe(ledger, store, 1)
    assert await ledger.mark_delivered(ob.obligation_id, ["m1"], platform="fake", wait=False)
    assert (await states(store))[ob.obligation_id] == "attempting"  # not written yet
    await ledger.flush()
    assert (await states(store))[ob.obligation_id] == "delivered"
    # The DESIGN form (no platform, waited) looks the row up and reports a missing one.
    assert await ledger.mark_delivered("nope", ["m2"]) is False
    assert await ledger.find_by_sent_id("m2") is None


async def test_a_failed_status_finds_a_sent_id_not_yet_committed(
    ledger: DeliveryLedger, store: SQLiteSessionStore
) -> None:
    [ob] = await owe(ledger, store, 1)
    await ledger.mark_delivered(ob.obligation_id, ["wamid.Q"], platform="fake", wait=False)
    found = await ledger.status_failed("wamid.Q", "undeliverable", platform="fake")
    assert found == ob.obligation_id
    row = await ledger.get(ob.obligation_id)
    assert row is not None and row.state == "delivered"
    assert row.last_error is not None and "undeliverable" in row.last_error


async def test_a_failed_flush_leaves_the_rows_attempting_and_is_retried(
    ledger: DeliveryLedger, store: SQLiteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    owed = await owe(ledger, store, 3)
    real = store.run

    async def locked(body: Any, **options: Any) -> Any:
        raise StorageError("database is locked")

    monkeypatch.setattr(store, "run", locked)
    for n, ob in enumerate(owed):
        await ledger.mark_delivered(ob.obligation_id, [f"s{n}"], platform="fake", wait=False)
    await ledger.flush()
    assert ledger.unrecorded == 3
    monkeypatch.setattr(store, "run", real)
    assert set((await states(store)).values()) == {"attempting"}  # a crash now resends marked
    opened = count_transactions(store, monkeypatch)
    assert await ledger.record_unrecorded() == 0
    assert opened[0] == 1  # the retried marks share one commit too
    monkeypatch.undo()
    assert set((await states(store)).values()) == {"delivered"}
    assert await ledger.find_by_sent_id("s2", platform="fake") == owed[2].obligation_id


async def test_a_failure_after_a_buffered_delivery_does_not_overtake_it(
    ledger: DeliveryLedger, store: SQLiteSessionStore
) -> None:
    [ob] = await owe(ledger, store, 1)
    await ledger.mark_delivered(ob.obligation_id, ["m1"], platform="fake", wait=False)
    # The delivered mark is written first, so the late failure leaves the row delivered.
    assert await ledger.mark_failed(ob.obligation_id, "late", retryable=True) is False
    assert (await states(store))[ob.obligation_id] == "delivered"
