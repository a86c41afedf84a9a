"""The delivery ledger as a whole: ids and marker, schema, owners, invariants over random
sequences, lazily made tables.

The parts have their own files: ``test_ledger_send`` (recording and the marks around a
send), ``test_ledger_sweep`` (retries, sweeps, pruning), ``test_ledger_admin`` (operator).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from bot.core.sql import ensure_schema
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.instances import Owner, _process_start_ticks, is_owner_alive
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import (
    MAX_ATTEMPTS,
    MIGRATIONS,
    RECOVERED_MARKER,
    SENT_TABLE,
    TABLE,
    Obligation,
    compute_obligation_id,
)
from tests.fakes.clock import FakeClock
from tests.gateway.ledger.ledger_support import ONE_REPLY, get, open_ledger

T = TypeVar("T")


@pytest.fixture
async def ledger(store: SQLiteSessionStore, clock: FakeClock) -> DeliveryLedger:
    return await open_ledger(store, clock)


# -- ids, marker, schema ---------------------------------------------------------------


def test_obligation_id_formula() -> None:
    expected = hashlib.sha256(b"k|m|hello").hexdigest()[:24]
    assert compute_obligation_id("k", "m", "hello") == expected
    assert compute_obligation_id("k:topic:1", "m", "x") != compute_obligation_id(
        "k:topic:2", "m", "x"
    )


async def test_schema_4_keeps_the_sent_ids_and_keys_them_by_chat(
    store: SQLiteSessionStore,
) -> None:
    """A ledger at schema 3 (sent ids keyed by platform and id only) moves to 4 with
    its ids; then a second chat's message of the same id is recorded too."""
    async with store.transaction() as tx:
        await ensure_schema(tx, "delivery_ledger", {v: MIGRATIONS[v] for v in (1, 2, 3)})
        await tx.execute(
            f"INSERT INTO {TABLE} (obligation_id, session_key, session_id, platform, chat_id, "
            "thread_id, reply_to, message_ref, content, state, attempts, maybe_delivered, "
            "owner_pid, owner_instance, created_at, fresh_since, updated_at) VALUES "
            "('o-a', 'k', 's', 'telegram', 'a', NULL, NULL, 'm', 'to a', 'delivered', 1, 0, "
            "0, '', 0, 0, 0)"
        )
        await tx.execute(
            f"INSERT INTO {SENT_TABLE} (platform, message_id, obligation_id) "
            "VALUES ('telegram', '5', 'o-a')"
        )
    ledger = DeliveryLedger(store)
    await ledger.open()
    assert await ledger.find_by_sent_id("5", platform="telegram", chat=("a", None)) == "o-a"
    async with store.transaction() as tx:
        rows = await tx.fetchall(f"SELECT platform, chat_id, message_id FROM {SENT_TABLE}")
    assert rows == [("telegram", "a", "5")]


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
    assert ("delivery_ledger", 5) in versions and ("chatflow_buttons", 2) in versions
    assert any("state_next" in i for i in indexes)
    assert any("platform_state" in i for i in indexes)


# -- owners ----------------------------------------------------------------------------


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
    started = _process_start_ticks(parent)
    assert started is not None
    assert is_owner_alive(Owner(parent, "x", started))
    assert not is_owner_alive(Owner(parent, "x", started + 1))
    assert Owner.current().started == _process_start_ticks(os.getpid())


# -- invariants over random operation sequences ----------------------------------------


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
            # The marker only where an earlier attempt may have arrived: a send cut by
            # the crash, or an ambiguous failure; a certain failure reached nobody.
            assert o.needs_marker == (before.state == "attempting" or before.maybe_delivered)
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
    kwargs = ONE_REPLY
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await fresh.record_obligation_in(tx, **kwargs)
            raise RuntimeError("turn failed")
    async with store.transaction() as tx:
        assert await fresh.record_obligation_in(tx, **kwargs)
    assert await DeliveryLedger(store, clock=clock).mark_attempting("o1")
    assert (await get(fresh, "o1")).attempts == 1
