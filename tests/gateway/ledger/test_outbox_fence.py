"""The outbox's fence is asked last, after a scheduled post waited for its room."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bot.core.scheduling import SCHEDULED_REF
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.contract import SendLimits
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import Obligation
from bot.gateway.outbox import Outbox
from bot.gateway.pacing import AccountPacer
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


async def test_a_scheduled_post_is_fenced_after_it_made_way_not_before(
    ledger: DeliveryLedger,
    store: SQLiteSessionStore,
    adapter: FakeAdapter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owed = Obligation.owed(
        obligation_id="ob-scheduled",
        session_key="agent:main:fake:dm:chat_1",
        session_id="fake-1",
        platform="fake",
        chat_id="chat-1",
        thread_id=None,
        reply_to=None,
        content="the reminder",
        message_ref=f"{SCHEDULED_REF}job_1@1.0",
    )
    async with store.transaction() as tx:
        assert await ledger.record_in(tx, owed, claimed=True)
    claimed = await ledger.get(owed.obligation_id)
    assert claimed is not None
    outbox = Outbox(ledger, {"fake": adapter}, Metrics())
    # make_way may wait up to a group's minute: the lease can lapse meanwhile.
    order: list[str] = []
    pacer = AccountPacer(SendLimits(per_second=30), name="fake")

    async def make_way(chat_id: str, *, group: bool = False) -> None:
        order.append("make_way")

    monkeypatch.setattr(pacer, "make_way", make_way)
    outbox.pacers["fake"] = pacer

    async def fence(obligation: Obligation) -> bool:
        order.append("fence")
        return False  # the lease lapsed while the post waited

    outbox.fence = fence
    await outbox.send(claimed)
    assert order == ["make_way", "fence"]
    assert adapter.sent == []
