"""The delivery ledger: state machine, retries, sweep, owners, pruning, best-effort writes."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import subprocess
import sys
from collections.abc import Coroutine
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from bot.core.sqlite_store import SQLiteSessionStore
from bot.errors import StorageError
from bot.gateway import ledger as ledger_module
from bot.gateway.ledger import (
    MAX_ATTEMPTS,
    RECOVERED_MARKER,
    RETENTION,
    RETRY_BACKOFF,
    STALE_AFTER,
    DeliveryLedger,
    Obligation,
    Owner,
    compute_obligation_id,
    is_owner_alive,
)
from tests.fakes.clock import FakeClock

T = TypeVar("T")

CONTENT = "Tu pedido 4411 sale mañana"


def dead_owner(tag: str = "previous") -> Owner:
    """Same pid as this process, another instance: a predecessor that died (PID reuse)."""
    return Owner(os.getpid(), f"dead-{tag}")


@pytest.fixture
async def ledger(store: SQLiteSessionStore, clock: FakeClock) -> DeliveryLedger:
    made = DeliveryLedger(store, clock=clock)
    await made.open()
    return made


@pytest.fixture
async def old_ledger(store: SQLiteSessionStore, clock: FakeClock) -> DeliveryLedger:
    """The ledger of a process that has since died."""
    made = DeliveryLedger(store, clock=clock, owner=dead_owner())
    await made.open()
    return made


async def record(
    ledger: DeliveryLedger,
    ref: str = "telegram:42:1",
    *,
    platform: str = "telegram",
    content: str = CONTENT,
    thread_id: str | None = None,
) -> str:
    key = f"agent:main:{platform}:dm:chat_0123456789ab"
    oid = compute_obligation_id(key, ref, content)
    assert await ledger.record_obligation(
        obligation_id=oid,
        session_key=key,
        session_id=f"{platform}-0123456789abcdef",
        platform=platform,
        chat_id="42",
        thread_id=thread_id,
        reply_to="1",
        content=content,
        message_ref=ref,
    )
    return oid


async def get(ledger: DeliveryLedger, oid: str) -> Obligation:
    row = await ledger.get(oid)
    assert row is not None
    return row


async def owner_of(store: SQLiteSessionStore, oid: str) -> tuple[int, str]:
    async with store.transaction() as tx:
        row = await tx.fetchone(
            "SELECT owner_pid, owner_instance FROM chatflow_delivery_obligations "
            "WHERE obligation_id = ?",
            (oid,),
        )
    assert row is not None
    return int(row[0]), str(row[1])


# -- ids, marker, schema -----------------------------------------------------------


def test_obligation_id_formula() -> None:
    expected = hashlib.sha256(b"k|m|hello").hexdigest()[:24]
    assert compute_obligation_id("k", "m", "hello") == expected
    assert compute_obligation_id("k:topic:1", "m", "x") != compute_obligation_id(
        "k:topic:2", "m", "x"
    )


def test_marker_prefixes_resent_text() -> None:
    ob = Obligation(
        "id",
        "k",
        "s",
        "telegram",
        "42",
        None,
        None,
        "hi",
        "attempting",
        2,
        None,
        created_at=FakeClock()(),
        needs_marker=True,
    )
    assert ob.outgoing_text.startswith(RECOVERED_MARKER)
    assert ob.outgoing_text.endswith("hi")
    assert replace(ob, needs_marker=False).outgoing_text == "hi"
    assert RECOVERED_MARKER.strip() and len(RECOVERED_MARKER) < 80


async def test_open_twice_and_schema_versions(
    ledger: DeliveryLedger, store: SQLiteSessionStore
) -> None:
    await ledger.open()
    async with store.transaction() as tx:
        versions = await tx.fetchall("SELECT component, version FROM chatflow_schema_versions")
        indexes = {
            r[1] for r in await tx.fetchall("PRAGMA index_list(chatflow_delivery_obligations)")
        }
    assert ("delivery_ledger", 1) in versions
    assert any("state_next" in i for i in indexes)
    assert any("platform_state" in i for i in indexes)


# -- recording --------------------------------------------------------------------------


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


_ONE_REPLY: dict[str, Any] = dict(
    obligation_id="o1",
    session_key="k",
    session_id="s",
    platform="telegram",
    chat_id="42",
    thread_id=None,
    reply_to=None,
    content="x",
    message_ref="m",
)


async def test_record_in_is_part_of_the_callers_transaction(
    ledger: DeliveryLedger, store: SQLiteSessionStore
) -> None:
    kwargs = _ONE_REPLY
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


# -- the send bracket ---------------------------------------------------------------------


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


async def test_due_retries_only_take_this_processes_rows(
    ledger: DeliveryLedger, old_ledger: DeliveryLedger, clock: FakeClock
) -> None:
    theirs = await record(old_ledger, "telegram:42:9")
    await old_ledger.mark_attempting(theirs)
    await old_ledger.mark_failed(theirs, "x", retryable=True)
    clock.advance(hours=1)
    assert await ledger.due_retries() == []
    assert [o.obligation_id for o in await old_ledger.due_retries()] == [theirs]


async def test_next_retry_at(ledger: DeliveryLedger, clock: FakeClock) -> None:
    assert await ledger.next_retry_at() is None
    oid = await record(ledger)
    await ledger.mark_attempting(oid)
    await ledger.mark_failed(oid, "x", retryable=True, retry_after=5)
    assert await ledger.next_retry_at() == clock() + timedelta(seconds=5)


async def test_stale_failed_rows_are_abandoned_by_due_retries(
    ledger: DeliveryLedger, clock: FakeClock
) -> None:
    oid = await record(ledger)
    await ledger.mark_attempting(oid)
    await ledger.mark_failed(oid, "x", retryable=True, retry_after=3600)
    clock.advance(hours=25)
    assert await ledger.due_retries() == []
    assert (await get(ledger, oid)).state == "abandoned"


# -- sweep ----------------------------------------------------------------------------------


async def test_sweep_claims_a_dead_processes_rows_with_marker_unless_pending(
    ledger: DeliveryLedger, old_ledger: DeliveryLedger, store: SQLiteSessionStore
) -> None:
    pending = await record(old_ledger, "telegram:42:1")
    attempting = await record(old_ledger, "telegram:42:2")
    failed = await record(old_ledger, "telegram:42:3")
    await old_ledger.mark_attempting(attempting)
    await old_ledger.mark_attempting(failed)
    await old_ledger.mark_failed(failed, "x", retryable=True, retry_after=0)
    delivered = await record(old_ledger, "telegram:42:4")
    await old_ledger.mark_delivered(delivered, ["9"])
    mine = await record(ledger, "telegram:42:5")

    claimed = {o.obligation_id: o for o in await ledger.sweep_recoverable()}

    assert set(claimed) == {pending, attempting, failed}
    assert not claimed[pending].needs_marker
    assert claimed[attempting].needs_marker and claimed[failed].needs_marker
    assert claimed[pending].attempts == 1 and claimed[attempting].attempts == 2
    assert all(o.state == "attempting" for o in claimed.values())
    for oid in claimed:
        assert await owner_of(store, oid) == (ledger.owner.pid, ledger.owner.instance_id)
        assert (await get(ledger, oid)).state == "attempting"
    assert (await get(ledger, mine)).state == "pending"  # ours, alive
    assert await ledger.sweep_recoverable() == []  # now owned by a live process


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


# -- owners ----------------------------------------------------------------------------------


def test_owner_identity_is_one_per_process() -> None:
    me = Owner.current()
    assert Owner.current() is me
    assert me.pid == os.getpid() and len(me.instance_id) == 32
    assert is_owner_alive(me)


def test_same_pid_other_instance_is_dead() -> None:
    assert not is_owner_alive(Owner(os.getpid(), "an-earlier-boot"))


def test_no_such_process_is_dead() -> None:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert not is_owner_alive(Owner(int(child.stdout), "whatever"))


@pytest.mark.parametrize("pid", [pytest.param(0, id="zero"), pytest.param(-1, id="negative")])
def test_non_positive_pids_are_dead(pid: int) -> None:
    assert not is_owner_alive(Owner(pid, ""))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_reused_pid_with_another_start_time_is_dead() -> None:
    parent = os.getppid()
    started = ledger_module._process_start_ticks(parent)
    assert started is not None
    assert is_owner_alive(Owner(parent, "x", started))
    assert not is_owner_alive(Owner(parent, "x", started + 1))
    assert Owner.current().started == ledger_module._process_start_ticks(os.getpid())


# -- housekeeping and operator ------------------------------------------------------------------


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
    assert {o.obligation_id for o in await ledger.list()} == {pending, recent}
    assert await ledger.find_by_sent_id("wamid.1") is None
    async with store.transaction() as tx:
        assert await tx.fetchall("SELECT * FROM chatflow_delivery_sent") == []


async def test_prune_in_batches(ledger: DeliveryLedger, clock: FakeClock) -> None:
    for i in range(250):
        oid = await record(ledger, f"m{i}")
        await ledger.mark_delivered(oid, [f"id{i}"])
    clock.advance(days=8)
    assert await ledger.prune() == 250


async def test_operator_list_retry_and_abandon(
    ledger: DeliveryLedger, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    first = await record(ledger, "m1")
    clock.advance(seconds=1)
    second = await record(ledger, "m2")
    assert [o.obligation_id for o in await ledger.list()] == [second, first]
    assert [o.obligation_id for o in await ledger.list(limit=1)] == [second]
    with pytest.raises(ValueError):
        await ledger.list("bogus")  # type: ignore[arg-type]

    assert await ledger.retry(first) is False  # pending: nothing to retry
    with caplog.at_level(logging.WARNING, logger="bot.gateway.ledger"):
        assert await ledger.abandon(first, "customer asked")
    assert "customer asked" in caplog.text
    assert await ledger.abandon(first, "again") is False
    assert [o.obligation_id for o in await ledger.list("abandoned")] == [first]
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


# -- storage failures never block a reply -------------------------------------------------------


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
        assert await ledger.next_retry_at() is None
        assert await record_safely(ledger) is False
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 8
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
    real = store.transaction

    def broken() -> Any:
        raise StorageError("database is locked")

    monkeypatch.setattr(store, "transaction", broken)
    assert await ledger.mark_delivered(oid, ["1"]) is False
    monkeypatch.setattr(store, "transaction", real)
    assert (await get(ledger, oid)).state == "attempting"  # the sweep of a later boot resends


# -- invariants over random operation sequences ---------------------------------------------------


class LedgerMachine(RuleBasedStateMachine):
    """One obligation driven through random sends, failures, restarts and operator actions.

    Checked after every step: a delivered row is never reopened; ``attempts`` equals the
    claims made since the last operator retry and never exceeds ``MAX_ATTEMPTS``;
    ``abandoned`` is left only by the operator's ``retry``; ``maybe_delivered`` is sticky;
    a successor's sweep marks exactly the rows that were not cleanly ``pending``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.store = SQLiteSessionStore(":memory:", clock=self.clock)
        self.generation = 0
        self.ledger = self._ledger()
        self.run(self.ledger.open())
        self.oid = compute_obligation_id("k", "m", "text")
        self.claims = 0
        self.row: Obligation | None = None
        self.ever_delivered = False
        self.record()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def _ledger(self) -> DeliveryLedger:
        owner = Owner(os.getpid(), f"gen{self.generation}")
        return DeliveryLedger(self.store, clock=self.clock, owner=owner)

    def teardown(self) -> None:
        self.run(self.store.close())
        self.loop.close()

    def _state(self) -> str | None:
        return None if self.row is None else self.row.state

    def _after(self, op: str, *, revives: bool = False) -> None:
        before, after = self.row, self.run(self.ledger.get(self.oid))
        assert after is not None
        if self.ever_delivered:
            assert after.state == "delivered", f"{op} reopened a delivered row"
        self.ever_delivered = after.state == "delivered"
        assert 0 <= after.attempts <= MAX_ATTEMPTS
        if after.state != "abandoned":
            assert after.attempts == self.claims, op
        if before is not None and not revives:
            if before.state == "abandoned":
                assert after.state == "abandoned", f"{op} revived an abandoned row"
            if before.maybe_delivered:
                assert after.maybe_delivered, f"{op} forgot a maybe-delivered send"
        self.row = after

    @rule()
    def record(self) -> None:
        self.run(
            self.ledger.record_obligation(
                obligation_id=self.oid,
                session_key="k",
                session_id="s",
                platform="telegram",
                chat_id="42",
                thread_id=None,
                reply_to=None,
                content="text",
                message_ref="m",
            )
        )
        self._after("record")

    @precondition(lambda self: self._state() in ("pending", "failed"))
    @rule()
    def attempt(self) -> None:
        if self.run(self.ledger.mark_attempting(self.oid)):
            self.claims += 1
        self._after("attempt")

    @precondition(lambda self: self._state() == "attempting")
    @rule()
    def deliver(self) -> None:
        assert self.run(self.ledger.mark_delivered(self.oid, ["1"]))
        self._after("deliver")

    @precondition(lambda self: self._state() == "attempting")
    @rule(kind=st.sampled_from(["retryable", "retry_after", "ambiguous", "permanent"]))
    def fail(self, kind: str) -> None:
        assert self.run(
            self.ledger.mark_failed(
                self.oid,
                "boom",
                retryable=kind != "permanent",
                retry_after=5 if kind == "retry_after" else None,
                ambiguous=kind == "ambiguous",
            )
        )
        if kind == "retry_after":
            self.claims -= 1
        self._after(f"fail {kind}")

    @rule()
    def due(self) -> None:
        claimed = self.run(self.ledger.due_retries())
        for o in claimed:
            assert o.needs_marker == o.maybe_delivered
        self.claims += len(claimed)
        self._after("due")

    @precondition(lambda self: self._state() == "failed")
    @rule()
    def wait_for_retry(self) -> None:
        assert self.row is not None and self.row.next_attempt_at is not None
        self.clock.now = max(self.clock.now, self.row.next_attempt_at)
        self.due()

    @rule(minutes=st.integers(min_value=1, max_value=600))
    def advance(self, minutes: int) -> None:
        self.clock.advance(minutes=minutes)

    @rule(deliverable=st.booleans())
    def crash_and_sweep(self, deliverable: bool) -> None:
        self.generation += 1
        self.ledger = self._ledger()
        before = self.row
        swept = self.run(
            self.ledger.sweep_recoverable(
                deliverable_platforms=None if deliverable else {"whatsapp"}
            )
        )
        if not deliverable:
            assert swept == []
        for o in swept:
            assert before is not None
            assert o.needs_marker == (before.state != "pending" or before.maybe_delivered)
        self.claims += len(swept)
        self._after("sweep")

    @rule()
    def operator_retry(self) -> None:
        if self.run(self.ledger.retry(self.oid)):
            self.claims = 0
        self._after("operator retry", revives=True)

    @rule()
    def operator_abandon(self) -> None:
        self.run(self.ledger.abandon(self.oid, "operator"))
        self._after("operator abandon")


LedgerMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=25, deadline=None)
test_ledger_state_machine = LedgerMachine.TestCase


async def test_tables_are_made_lazily_even_inside_a_rolled_back_turn(
    store: SQLiteSessionStore, clock: FakeClock
) -> None:
    fresh = DeliveryLedger(store, clock=clock)  # open() never called
    kwargs = _ONE_REPLY
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await fresh.record_obligation_in(tx, **kwargs)
            raise RuntimeError("turn failed")
    async with store.transaction() as tx:
        assert await fresh.record_obligation_in(tx, **kwargs)
    assert await DeliveryLedger(store, clock=clock).mark_attempting("o1")
    assert (await get(fresh, "o1")).attempts == 1
