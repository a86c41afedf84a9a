"""The ledger around one send: recording, the send bracket, outcomes, best-effort writes."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import StorageError
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import MAX_ATTEMPTS, RECOVERED_MARKER, RETRY_BACKOFF
from tests.fakes.clock import FakeClock
from tests.gateway.ledger.ledger_support import CONTENT, ONE_REPLY, get, open_ledger, record


@pytest.fixture
async def ledger(store: SQLiteSessionStore, clock: FakeClock) -> DeliveryLedger:
    return await open_ledger(store, clock)


# -- recording -------------------------------------------------------------------------


async def test_record_is_idempotent_and_never_reopens_a_delivered_row(
    ledger: DeliveryLedger,
) -> None:
    oid = await record(ledger)
    assert (
        await ledger.record_obligation(
            obligation_id=oid,
            session_key="k",
            session_id="s",
            platform="telegram",
            chat_id="42",
            thread_id=None,
            reply_to=None,
            content=CONTENT,
            message_ref="m",
        )
        is False
    )
    assert await ledger.mark_attempting(oid)
    assert await ledger.mark_delivered(oid, ["m1"])
    with pytest.raises(AssertionError):
        await record(ledger)
    assert (await get(ledger, oid)).state == "delivered"
    assert await ledger.status() == {
        "pending": 0,
        "attempting": 0,
        "delivered": 1,
        "failed": 0,
        "abandoned": 0,
    }


async def test_record_in_is_part_of_the_callers_transaction(
    ledger: DeliveryLedger, store: SQLiteSessionStore
) -> None:
    kwargs = ONE_REPLY
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            assert await ledger.record_obligation_in(tx, **kwargs)
            raise RuntimeError("the session save failed")
    assert await ledger.get("o1") is None
    async with store.transaction() as tx:
        assert await ledger.record_obligation_in(tx, **kwargs)
    assert (await get(ledger, "o1")).state == "pending"


async def test_record_in_raises_on_storage_failure(
    ledger: DeliveryLedger, store: SQLiteSessionStore
) -> None:
    async with store.transaction() as tx:
        pass
    with pytest.raises(StorageError):
        await ledger.record_obligation_in(
            tx,
            obligation_id="o",
            session_key="k",
            session_id="s",
            platform="telegram",
            chat_id="42",
            thread_id=None,
            reply_to=None,
            content="x",
            message_ref="m",
        )


# -- the send bracket ------------------------------------------------------------------


async def test_attempt_then_deliver(ledger: DeliveryLedger) -> None:
    oid = await record(ledger)
    assert await ledger.mark_attempting(oid)
    row = await get(ledger, oid)
    assert (row.state, row.attempts) == ("attempting", 1)
    assert await ledger.mark_attempting(oid) is False  # already in flight
    assert await ledger.mark_delivered(oid, ["wamid.A", "wamid.B"])
    row = await get(ledger, oid)
    assert (row.state, row.sent_ids) == ("delivered", ("wamid.A", "wamid.B"))
    assert await ledger.mark_attempting(oid) is False
    assert await ledger.find_by_sent_id("wamid.B") == oid
    assert await ledger.find_by_sent_id("wamid.B", platform="whatsapp") is None
    assert await ledger.find_by_sent_id("wamid.unknown") is None


async def test_mark_attempting_an_unknown_row_still_lets_the_reply_go(
    ledger: DeliveryLedger, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="bot.gateway.ledger"):
        assert await ledger.mark_attempting("nope") is True
    assert "nope" in caplog.text


async def test_failed_status_is_logged_against_its_obligation(
    ledger: DeliveryLedger, caplog: pytest.LogCaptureFixture
) -> None:
    oid = await record(ledger, platform="whatsapp")
    await ledger.mark_attempting(oid)
    await ledger.mark_delivered(oid, ["wamid.Z"])
    with caplog.at_level(logging.WARNING, logger="bot.gateway.ledger"):
        assert await ledger.status_failed("wamid.Z", "131047 re-engagement") == oid
    assert oid in caplog.text and CONTENT not in caplog.text
    row = await get(ledger, oid)
    assert row.state == "delivered"
    assert row.last_error is not None and "131047" in row.last_error
    assert await ledger.status_failed("wamid.other", "x") is None


async def test_retryable_failures_back_off_then_abandon(
    ledger: DeliveryLedger, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    oid = await record(ledger)
    for attempt in range(1, MAX_ATTEMPTS):
        assert await ledger.mark_attempting(oid)
        assert await ledger.mark_failed(oid, "timeout", retryable=True)
        row = await get(ledger, oid)
        backoff = RETRY_BACKOFF[min(attempt - 1, len(RETRY_BACKOFF) - 1)]
        assert (row.state, row.attempts) == ("failed", attempt)
        assert row.next_attempt_at == clock() + timedelta(seconds=backoff)
        assert await ledger.due_retries() == []  # not yet
        clock.advance(seconds=backoff)
        due = await ledger.due_retries()
        assert [d.obligation_id for d in due] == [oid]
        assert due[0].attempts == attempt + 1 and not due[0].needs_marker
        # due_retries claimed it; put it back for the next mark_attempting round
        assert await ledger.mark_failed(oid, "timeout", retryable=True, retry_after=0)
    assert await ledger.mark_attempting(oid)
    assert (await get(ledger, oid)).attempts == MAX_ATTEMPTS
    with caplog.at_level(logging.WARNING, logger="bot.gateway.ledger"):
        assert await ledger.mark_failed(oid, "timeout", retryable=True)
    row = await get(ledger, oid)
    assert row.state == "abandoned"
    assert row.last_error is not None and "gave up" in row.last_error
    assert oid in caplog.text and CONTENT not in caplog.text


async def test_retry_after_refunds_the_attempt(ledger: DeliveryLedger, clock: FakeClock) -> None:
    oid = await record(ledger)
    await ledger.mark_attempting(oid)
    assert await ledger.mark_failed(oid, "429", retryable=True, retry_after=17)
    row = await get(ledger, oid)
    assert (row.state, row.attempts) == ("failed", 0)
    assert row.next_attempt_at == clock() + timedelta(seconds=17)
    clock.advance(seconds=17)
    [due] = await ledger.due_retries()
    assert due.attempts == 1


async def test_permanent_failure_abandons_with_a_logged_reason(
    ledger: DeliveryLedger, caplog: pytest.LogCaptureFixture
) -> None:
    oid = await record(ledger)
    await ledger.mark_attempting(oid)
    with caplog.at_level(logging.WARNING, logger="bot.gateway.ledger"):
        assert await ledger.mark_failed(oid, "131047: outside the 24h window", retryable=False)
    row = await get(ledger, oid)
    assert (row.state, row.last_error) == ("abandoned", "131047: outside the 24h window")
    assert oid in caplog.text and "131047" in caplog.text and CONTENT not in caplog.text
    assert await ledger.mark_failed(oid, "again", retryable=True) is False  # terminal
    assert await ledger.mark_attempting(oid) is False


async def test_ambiguous_failure_makes_the_retry_carry_the_marker(
    ledger: DeliveryLedger, clock: FakeClock
) -> None:
    oid = await record(ledger)
    await ledger.mark_attempting(oid)
    await ledger.mark_failed(oid, "read timeout", retryable=True, ambiguous=True)
    await ledger.mark_failed(oid, "later clean failure", retryable=True)  # stays maybe-delivered
    clock.advance(seconds=max(RETRY_BACKOFF))
    [due] = await ledger.due_retries()
    assert due.needs_marker and due.maybe_delivered
    assert due.outgoing_text == RECOVERED_MARKER + CONTENT


# -- storage failures never block a reply ----------------------------------------------


async def test_ledger_failures_are_logged_and_swallowed(
    ledger: DeliveryLedger, store: SQLiteSessionStore, caplog: pytest.LogCaptureFixture
) -> None:
    oid = await record(ledger)
    await store.close()
    with caplog.at_level(logging.ERROR, logger="bot.gateway.ledger"):
        assert await ledger.mark_attempting(oid) is True  # send anyway
        assert await ledger.mark_delivered(oid, ["1"]) is False
        assert await ledger.mark_failed(oid, "x", retryable=True) is False
        assert await ledger.due_retries() == []
        assert await ledger.sweep_recoverable() == []
        assert await ledger.find_by_sent_id("1") is None
        assert await record_safely(ledger) is False
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 7
    assert all(oid in r.getMessage() for r in errors[:3])
    assert CONTENT not in caplog.text


async def record_safely(ledger: DeliveryLedger) -> bool:
    return await ledger.record_obligation(
        obligation_id="o",
        session_key="k",
        session_id="s",
        platform="telegram",
        chat_id="42",
        thread_id=None,
        reply_to=None,
        content=CONTENT,
        message_ref="m",
    )


async def test_a_failing_transaction_is_swallowed(
    ledger: DeliveryLedger, store: SQLiteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    oid = await record(ledger)
    await ledger.mark_attempting(oid)
    real = store.run

    async def broken(body: Any, **options: Any) -> Any:
        raise StorageError("database is locked")

    monkeypatch.setattr(store, "run", broken)
    assert await ledger.mark_delivered(oid, ["1"]) is False
    monkeypatch.setattr(store, "run", real)
    assert (await get(ledger, oid)).state == "attempting"  # the sweep of a later boot resends
