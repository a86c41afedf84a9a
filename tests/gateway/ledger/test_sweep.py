"""The ledger's recovery: due retries, sweeps of a dead process's rows, abandonment, pruning."""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta

import pytest

from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.instances import Owner
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import MAX_ATTEMPTS, RECOVERED_MARKER, RETENTION, STALE_AFTER
from tests.fakes.clock import FakeClock
from tests.gateway.ledger.ledger_support import (
    CONTENT,
    dead_owner,
    get,
    open_ledger,
    owner_of,
    record,
)


@pytest.fixture
async def ledger(store: SQLiteSessionStore, clock: FakeClock) -> DeliveryLedger:
    return await open_ledger(store, clock)


@pytest.fixture
async def old_ledger(store: SQLiteSessionStore, clock: FakeClock) -> DeliveryLedger:
    """The ledger of a process that has since died."""
    return await open_ledger(store, clock, dead_owner())


# -- due retries -----------------------------------------------------------------------


async def test_due_retries_only_take_this_processes_rows(
    ledger: DeliveryLedger, old_ledger: DeliveryLedger, clock: FakeClock
) -> None:
    theirs = await record(old_ledger, "telegram:42:9")
    await old_ledger.mark_attempting(theirs)
    await old_ledger.mark_failed(theirs, "x", retryable=True)
    clock.advance(hours=1)
    assert await ledger.due_retries() == []
    assert [o.obligation_id for o in await old_ledger.due_retries()] == [theirs]


async def test_stale_failed_rows_are_abandoned_by_due_retries(
    ledger: DeliveryLedger, clock: FakeClock
) -> None:
    oid = await record(ledger)
    await ledger.mark_attempting(oid)
    await ledger.mark_failed(oid, "x", retryable=True, retry_after=3600)
    clock.advance(hours=25)
    assert await ledger.due_retries() == []
    assert (await get(ledger, oid)).state == "abandoned"


# -- sweep -----------------------------------------------------------------------------


async def test_sweep_claims_a_dead_processes_rows_marked_only_if_they_may_have_arrived(
    ledger: DeliveryLedger, old_ledger: DeliveryLedger, store: SQLiteSessionStore, clock: FakeClock
) -> None:
    pending = await record(old_ledger, "telegram:42:1")
    attempting = await record(old_ledger, "telegram:42:2")
    failed = await record(old_ledger, "telegram:42:3")
    await old_ledger.mark_attempting(attempting)
    await old_ledger.mark_attempting(failed)
    await old_ledger.mark_failed(failed, "x", retryable=True, retry_after=0)  # certain: not sent
    unsure = await record(old_ledger, "telegram:42:6")
    await old_ledger.mark_attempting(unsure)
    await old_ledger.mark_failed(unsure, "timed out", retryable=True, ambiguous=True)
    waiting = await record(old_ledger, "telegram:42:7")
    await old_ledger.mark_attempting(waiting)
    await old_ledger.mark_waiting(waiting, "waiting: telegram is not connected", wait=0)
    delivered = await record(old_ledger, "telegram:42:4")
    await old_ledger.mark_delivered(delivered, ["9"])
    mine = await record(ledger, "telegram:42:5")

    claimed = {o.obligation_id: o for o in await ledger.sweep_recoverable(now=_later(clock))}

    assert set(claimed) == {pending, attempting, failed, unsure, waiting}
    marked = {oid for oid, o in claimed.items() if o.needs_marker}
    assert marked == {attempting, unsure}  # a send cut by a death, an ambiguous failure
    assert claimed[pending].attempts == 1 and claimed[attempting].attempts == 2
    assert claimed[waiting].attempts == 1  # its first real attempt
    assert all(o.state == "attempting" for o in claimed.values())
    for oid in claimed:
        assert await owner_of(store, oid) == (ledger.owner.pid, ledger.owner.instance_id)
        assert (await get(ledger, oid)).state == "attempting"
    assert (await get(ledger, mine)).state == "pending"  # ours, alive
    assert await ledger.sweep_recoverable() == []  # now owned by a live process


def _later(clock: FakeClock) -> datetime:
    """A moment past every retry these tests set (the backoff's first steps)."""
    return clock() + timedelta(seconds=600)


async def test_a_resend_cut_by_a_death_keeps_its_marker_after_a_certain_failure(
    ledger: DeliveryLedger, old_ledger: DeliveryLedger, store: SQLiteSessionStore, clock: FakeClock
) -> None:
    oid = await record(old_ledger)
    await old_ledger.mark_attempting(oid)  # the process dies mid-send: it may have arrived
    second = await open_ledger(store, clock, dead_owner("second"))
    (swept,) = await second.sweep_recoverable()
    assert swept.needs_marker
    await second.mark_failed(oid, "refused", retryable=True)  # the resend is refused, surely
    # The second process dies too: the third still owes the marker of the first send.
    (again,) = await ledger.sweep_recoverable(now=_later(clock))
    assert again.needs_marker


async def test_a_row_whose_platform_is_not_connected_waits_unsent_and_unmarked(
    ledger: DeliveryLedger, clock: FakeClock
) -> None:
    oid = await record(ledger)
    assert await ledger.mark_attempting(oid)
    assert await ledger.mark_waiting(oid, "waiting: telegram is not connected", wait=60)
    row = await get(ledger, oid)
    assert (row.state, row.attempts, row.needs_marker) == ("pending", 0, False)
    assert row.last_error == "waiting: telegram is not connected"
    assert await ledger.due_retries() == []  # not before the wait is over
    clock.advance(seconds=60)
    (due,) = await ledger.due_retries()
    assert (due.obligation_id, due.state, due.attempts, due.needs_marker) == (
        oid,
        "attempting",
        1,
        False,
    )
    assert not due.outgoing_text.startswith(RECOVERED_MARKER)


async def test_sweep_leaves_rows_of_a_live_process_alone(
    ledger: DeliveryLedger, store: SQLiteSessionStore, clock: FakeClock
) -> None:
    parent = Owner(os.getppid(), "someone-else")  # a live process
    other = DeliveryLedger(store, clock=clock, owner=parent)
    oid = await record(other)
    await other.mark_attempting(oid)
    assert await ledger.sweep_recoverable() == []
    assert (await get(ledger, oid)).attempts == 1


async def test_undeliverable_platforms_spend_no_attempt(
    ledger: DeliveryLedger, old_ledger: DeliveryLedger, store: SQLiteSessionStore
) -> None:
    wa = await record(old_ledger, "wamid.1", platform="whatsapp")
    await old_ledger.mark_attempting(wa)
    tg = await record(old_ledger, "telegram:42:1")

    claimed = await ledger.sweep_recoverable(deliverable_platforms={"telegram"})

    assert [o.obligation_id for o in claimed] == [tg]
    row = await get(ledger, wa)
    assert (row.state, row.attempts) == ("attempting", 1)
    assert await owner_of(store, wa) == (old_ledger.owner.pid, old_ledger.owner.instance_id)
    # the boot that has WhatsApp connected picks it up
    [later] = await ledger.sweep_recoverable(deliverable_platforms={"telegram", "whatsapp"})
    assert (later.obligation_id, later.attempts, later.needs_marker) == (wa, 2, True)


async def test_stale_and_exhausted_rows_are_abandoned_with_a_reason(
    ledger: DeliveryLedger,
    old_ledger: DeliveryLedger,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stale = await record(old_ledger, "telegram:42:1")
    clock.advance(seconds=STALE_AFTER.total_seconds() - 60)
    exhausted = await record(old_ledger, "telegram:42:2")
    for _ in range(MAX_ATTEMPTS - 1):
        assert await old_ledger.mark_attempting(exhausted)
        await old_ledger.mark_failed(exhausted, "x", retryable=True)
    assert await old_ledger.mark_attempting(exhausted)  # the last attempt dies mid-send
    assert (await get(ledger, exhausted)).attempts == MAX_ATTEMPTS
    fresh = await record(old_ledger, "telegram:42:3")
    clock.advance(seconds=120)

    with caplog.at_level(logging.WARNING, logger="bot.gateway.ledger"):
        claimed = await ledger.sweep_recoverable()

    assert [o.obligation_id for o in claimed] == [fresh]
    for oid, word in ((stale, "stale"), (exhausted, "gave up")):
        row = await get(ledger, oid)
        assert row.state == "abandoned"
        assert row.last_error is not None and word in row.last_error
        assert oid in caplog.text
    assert CONTENT not in caplog.text


async def test_sweep_adopts_failed_rows_whose_retry_is_not_due(
    ledger: DeliveryLedger, old_ledger: DeliveryLedger, store: SQLiteSessionStore, clock: FakeClock
) -> None:
    oid = await record(old_ledger)
    await old_ledger.mark_attempting(oid)
    await old_ledger.mark_failed(oid, "429", retryable=True, retry_after=60)

    assert await ledger.sweep_recoverable() == []
    assert (await get(ledger, oid)).state == "failed"
    assert await owner_of(store, oid) == (ledger.owner.pid, ledger.owner.instance_id)
    clock.advance(seconds=60)
    [due] = await ledger.due_retries()
    assert due.obligation_id == oid and due.attempts == 1


async def test_sweep_now_argument_overrides_the_clock(
    ledger: DeliveryLedger, old_ledger: DeliveryLedger, clock: FakeClock
) -> None:
    oid = await record(old_ledger)
    assert await ledger.sweep_recoverable(clock() + STALE_AFTER + timedelta(seconds=1)) == []
    assert (await get(ledger, oid)).state == "abandoned"


# -- pruning ---------------------------------------------------------------------------


async def test_prune_removes_old_settled_rows_and_their_sent_ids(
    ledger: DeliveryLedger, store: SQLiteSessionStore, clock: FakeClock
) -> None:
    delivered = await record(ledger, "m1")
    await ledger.mark_delivered(delivered, ["wamid.1"])
    abandoned = await record(ledger, "m2")
    await ledger.abandon(abandoned, "operator said so")
    pending = await record(ledger, "m3")
    clock.advance(seconds=RETENTION.total_seconds() - 1)
    recent = await record(ledger, "m4")
    await ledger.mark_delivered(recent, [])
    clock.advance(seconds=2)
    assert await ledger.prune() == 2
    assert {o.obligation_id for o in await ledger.list_obligations()} == {pending, recent}
    assert await ledger.find_by_sent_id("wamid.1") is None
    async with store.transaction() as tx:
        assert await tx.fetchall("SELECT * FROM chatflow_delivery_sent") == []


async def test_prune_in_batches(ledger: DeliveryLedger, clock: FakeClock) -> None:
    for i in range(250):
        oid = await record(ledger, f"m{i}")
        await ledger.mark_delivered(oid, [f"id{i}"])
    clock.advance(days=8)
    assert await ledger.prune() == 250
