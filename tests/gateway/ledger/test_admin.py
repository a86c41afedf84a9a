"""The operator's ledger: list, status, get, retry and abandon."""

from __future__ import annotations

import logging

import pytest

from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import STATES
from tests.fakes.clock import FakeClock
from tests.gateway.ledger.ledger_support import get, open_ledger, record


@pytest.fixture
async def ledger(store: SQLiteSessionStore, clock: FakeClock) -> DeliveryLedger:
    return await open_ledger(store, clock)


# -- operator --------------------------------------------------------------------------


async def test_operator_list_retry_and_abandon(
    ledger: DeliveryLedger, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    first = await record(ledger, "m1")
    clock.advance(seconds=1)
    second = await record(ledger, "m2")
    assert [o.obligation_id for o in await ledger.list_obligations()] == [second, first]
    assert [o.obligation_id for o in await ledger.list_obligations(limit=1)] == [second]
    with pytest.raises(ValueError):
        await ledger.list_obligations("bogus")  # type: ignore[arg-type]

    assert await ledger.retry(first) is False  # pending: nothing to retry
    with caplog.at_level(logging.WARNING, logger="bot.gateway.ledger"):
        assert await ledger.abandon(first, "customer asked")
    assert "customer asked" in caplog.text
    assert await ledger.abandon(first, "again") is False
    assert [o.obligation_id for o in await ledger.list_obligations("abandoned")] == [first]
    assert await ledger.sweep_recoverable() == []  # abandoned is terminal

    clock.advance(days=2)  # older than STALE_AFTER: retry restarts the clock
    assert await ledger.retry(first)
    row = await get(ledger, first)
    assert (row.state, row.attempts) == ("pending", 0)
    [claimed] = await ledger.sweep_recoverable()  # owned by nobody: any sweep sends it
    assert claimed.obligation_id == first and not claimed.needs_marker
    assert await ledger.status() == {
        "pending": 1,
        "attempting": 1,
        "delivered": 0,
        "failed": 0,
        "abandoned": 0,
    }


async def test_an_empty_ledger_reports_every_state_at_zero(ledger: DeliveryLedger) -> None:
    assert await ledger.status() == dict.fromkeys(STATES, 0)
    assert await ledger.list_obligations() == []
    assert await ledger.get("unknown") is None
    assert await ledger.retry("unknown") is False
    assert await ledger.abandon("unknown", "no such row") is False
