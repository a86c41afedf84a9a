"""Inbox, ledger, registry and gateway on PostgreSQL, several store instances at once.

Each ``PostgresSessionStore`` has its own pools, so two instances in one test
behave like two processes: they race for rows through the server only.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

import asyncpg
import pytest

from bot.config import Settings
from bot.core.agent import Agent
from bot.core.models.base import ModelResponse
from bot.core.models.scripted import RecordedCall, ScriptedModel
from bot.core.runner import Runner
from bot.core.stores.postgres import PostgresSessionStore
from bot.errors import ConfigurationError
from bot.gateway.aliases import ChatAliases
from bot.gateway.gateway import Gateway
from bot.gateway.inbox import Inbox, InboxClaimLostError
from bot.gateway.instances import InstanceRegistry, Owner
from bot.gateway.keys import load_or_create_shared_secret
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import RECOVERED_MARKER, compute_obligation_id
from tests.fakes.adapter import FakeAdapter, make_event
from tests.gateway.conftest import build_event
from tests.pgtest import pg_dsn
from tests.pgtest import wait_until as until

__all__ = ["pg_dsn"]

LEASE = 1.0
"""Short leases keep the takeover tests fast; renewals run every LEASE / 3."""


@pytest.fixture
async def stores(pg_dsn: str) -> AsyncIterator[Callable[[], Awaitable[PostgresSessionStore]]]:
    """Opens store instances on the test schema (think: one per process); closes them."""
    async with AsyncExitStack() as stack:

        async def make() -> PostgresSessionStore:
            store = PostgresSessionStore(pg_dsn)
            await stack.enter_async_context(store)
            return store

        yield make


StoreMaker = Callable[[], Awaitable[PostgresSessionStore]]


async def record(ledger: DeliveryLedger, store: PostgresSessionStore, i: int) -> str:
    key = f"agent:main:fake:dm:chat_{i:012x}"
    oid = compute_obligation_id(key, f"fake:{i}", f"reply {i}")
    async with store.transaction() as tx:
        await ledger.record_obligation_in(
            tx,
            obligation_id=oid,
            session_key=key,
            session_id=f"fake-{i:016x}",
            platform="fake",
            chat_id=str(i),
            thread_id=None,
            reply_to=None,
            content=f"reply {i}",
            message_ref=f"fake:{i}",
        )
    return oid


# -- schema ------------------------------------------------------------------------------


async def test_every_component_migrates_once_when_five_processes_start_together(
    stores: StoreMaker, pg_dsn: str
) -> None:
    made = [await stores() for _ in range(5)]

    async def open_all(store: PostgresSessionStore) -> None:
        await Inbox(store).open()
        await DeliveryLedger(store).open()
        await ChatAliases(store).open()
        await InstanceRegistry(store).open()
        await load_or_create_shared_secret(store)

    await asyncio.gather(*(open_all(store) for store in made))
    await asyncio.gather(*(open_all(store) for store in made))  # again: nothing to do
    conn = await asyncpg.connect(pg_dsn)
    try:
        rows = await conn.fetch("SELECT component, version FROM chatflow_schema_versions")
        tables = await conn.fetch(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND column_name IN "
            "('received_at', 'attempts', 'owner_instance')"
        )
    finally:
        await conn.close()
    assert {str(r[0]): r[1] for r in rows} == {
        "session_store": 3,
        "session_leases": 2,
        "inbox": 3,
        "delivery_ledger": 5,
        "chatflow_buttons": 2,
        "chat_aliases": 1,
        "instances": 1,
        "secrets": 1,
    }
    types = {(r["table_name"], r["column_name"]): r["data_type"] for r in tables}
    # SQLite's REAL and INTEGER became 8-byte types (a 4-byte REAL cannot hold Unix times).
    assert types[("chatflow_inbox", "received_at")] == "double precision"
    assert types[("chatflow_inbox", "attempts")] == "bigint"
    assert types[("chatflow_inbox", "owner_instance")] == "text"


async def test_the_installation_secret_is_shared_by_every_process(stores: StoreMaker) -> None:
    made = [await stores() for _ in range(3)]
    secrets = await asyncio.gather(*(load_or_create_shared_secret(s) for s in made * 3))
    assert len(set(secrets)) == 1
    assert len(secrets[0]) == 32


# -- inbox ---------------------------------------------------------------------------------


async def test_one_message_accepted_concurrently_by_two_processes_is_journaled_once(
    stores: StoreMaker,
) -> None:
    one, two = await stores(), await stores()
    inboxes = [Inbox(one, owner="a"), Inbox(two, owner="b")]
    event = build_event("whatsapp:wamid.1")
    results = await asyncio.gather(
        *(
            inbox.accept(event, session_key="k", session_id="fake-0000000000000001")
            for inbox in inboxes * 10
        )
    )
    assert results.count(True) == 1
    async with one.transaction() as tx:
        rows = await tx.fetchall("SELECT message_id FROM chatflow_inbox WHERE state = 'received'")
    assert [str(r[0]) for r in rows] == [event.message_id]


async def test_recovery_takes_only_dead_owners_rows_each_once(stores: StoreMaker) -> None:
    seeder = Inbox(await stores(), owner="dead")
    alive = Inbox(await stores(), owner="alive")
    for i in range(30):
        await seeder.accept(build_event(f"fake:dead:{i}"), session_key="k", session_id="fake-1")
    for i in range(5):
        await alive.accept(build_event(f"fake:alive:{i}"), session_key="k", session_id="fake-2")
    rescuers = [Inbox(await stores(), owner=f"r{i}") for i in range(3)]
    live = {"alive", "r0", "r1", "r2"}
    results = await asyncio.gather(*(r.recover(3600, live_owners=live) for r in rescuers))
    taken = [entry.event.message_id for result in results for entry in result]
    assert sorted(taken) == sorted(f"fake:dead:{i}" for i in range(30))
    assert all(entry.attempts == 0 for result in results for entry in result)  # no runs yet
    # Now every row has a live owner: a second round takes nothing.
    again = await asyncio.gather(*(r.recover(3600, live_owners=live) for r in rescuers))
    assert again == [[], [], []]


async def test_a_taken_over_turn_cannot_commit_in_the_old_owner(stores: StoreMaker) -> None:
    store_a, store_b = await stores(), await stores()
    old, new = Inbox(store_a, owner="a"), Inbox(store_b, owner="b")
    event = build_event("fake:1")
    assert await old.accept(event, session_key="k", session_id="fake-1")
    (entry,) = await new.recover(3600, live_owners={"b"})  # a's lease expired
    assert entry.event.message_id == "fake:1"
    with pytest.raises(InboxClaimLostError):
        async with store_a.transaction() as tx:
            await old.mark_done_in(tx, "fake:1")
    async with store_b.transaction() as tx:
        assert await new.mark_done_in(tx, "fake:1")
    with pytest.raises(InboxClaimLostError):  # and once done, it stays someone else's
        async with store_a.transaction() as tx:
            await old.mark_done_in(tx, "fake:1")


# -- ledger --------------------------------------------------------------------------------


async def test_two_processes_sweeping_claim_each_dead_owners_reply_once(
    stores: StoreMaker,
) -> None:
    seed_store = await stores()
    crashed = DeliveryLedger(seed_store, owner=Owner(os.getpid(), "crashed-instance"))
    ids = {await record(crashed, seed_store, i) for i in range(60)}
    sweepers = [DeliveryLedger(await stores(), owner=Owner(1, f"sweeper-{i}")) for i in range(2)]
    # "crashed-instance" holds no lease: dead, whatever its pid says.
    results = await asyncio.gather(*(s.sweep_recoverable() for s in sweepers))
    claimed = [ob.obligation_id for result in results for ob in result]
    assert sorted(claimed) == sorted(ids)
    assert all(ob.state == "attempting" and ob.attempts == 1 for r in results for ob in r)


async def test_updates_around_a_send_are_fenced_by_owner(stores: StoreMaker) -> None:
    store = await stores()
    mine = DeliveryLedger(store, owner=Owner(1, "mine"))
    other = DeliveryLedger(await stores(), owner=Owner(2, "other"))
    oid = await record(mine, store, 1)
    (claimed,) = await other.sweep_recoverable()  # "mine" holds no lease
    assert claimed.obligation_id == oid
    # The stalled first owner wakes up: it may neither start a send nor fail the row.
    assert not await mine.mark_attempting(oid)
    assert not await mine.mark_failed(oid, "timeout", retryable=True)
    row = await other.get(oid)
    assert row is not None and row.state == "attempting"
    assert await other.mark_failed(oid, "timeout", retryable=True)


async def test_a_waiting_row_and_a_certain_failure_are_resent_unmarked(stores: StoreMaker) -> None:
    store = await stores()
    crashed = DeliveryLedger(store, owner=Owner(1, "crashed"))
    waiting, refused, cut = [await record(crashed, store, i) for i in range(3)]
    for oid in (waiting, refused, cut):
        assert await crashed.mark_attempting(oid)
    assert await crashed.mark_waiting(waiting, "waiting: fake is not connected", wait=0)
    assert await crashed.mark_failed(refused, "400", retryable=True, retry_after=0)
    taker = DeliveryLedger(await stores(), owner=Owner(2, "taker"))
    claimed = {o.obligation_id: o for o in await taker.sweep_recoverable()}
    assert {oid: o.needs_marker for oid, o in claimed.items()} == {
        waiting: False,
        refused: False,
        cut: True,  # cut by the death: it may have arrived
    }
    assert claimed[waiting].attempts == 1
    assert await taker.mark_delivered(waiting, ["m1"]) and await taker.mark_delivered(
        refused, ["m2"]
    )
    # The cut send's marker is remembered even if its resend then fails for sure.
    assert await taker.mark_failed(cut, "400", retryable=True, retry_after=0)
    (again,) = await DeliveryLedger(await stores(), owner=Owner(3, "third")).sweep_recoverable()
    assert again.obligation_id == cut and again.needs_marker


# -- leases --------------------------------------------------------------------------------


async def test_work_of_a_process_whose_lease_expires_is_taken_over(stores: StoreMaker) -> None:
    store_a, store_b = await stores(), await stores()
    # Different live pids: registering reaps same-host registrations whose process is gone.
    reg_a = InstanceRegistry(store_a, owner=Owner(os.getppid(), "a-instance"), lease_seconds=LEASE)
    reg_b = InstanceRegistry(store_b, owner=Owner(os.getpid(), "b-instance"), lease_seconds=LEASE)
    await reg_a.start()
    await reg_b.start()
    try:
        ledger_a = DeliveryLedger(store_a, owner=reg_a.owner, liveness=reg_a.is_alive)
        ledger_b = DeliveryLedger(store_b, owner=reg_b.owner, liveness=reg_b.is_alive)
        oid = await record(ledger_a, store_a, 1)
        assert await ledger_a.mark_attempting(oid)  # a is sending when it stops
        assert {i.instance_id for i in await reg_b.others()} == {"a-instance"}
        # a renews: its rows stay its own, even after more than one lease has passed.
        assert await ledger_b.sweep_recoverable() == []
        await asyncio.sleep(LEASE * 1.5)  # a span of time is the point here, not a wait
        assert await ledger_b.sweep_recoverable() == []
        # a stops renewing (frozen, or killed without a goodbye). Its renewals stop
        # reaching the database; cancelling its task instead could cut a renewal off in
        # the middle of its transaction, which a frozen process never does.
        renew = reg_a.renew

        async def frozen() -> bool:
            return True

        reg_a.renew = frozen  # type: ignore[method-assign]
        await until(lambda: _dead(reg_b, reg_a.owner), within=LEASE * 10)
        (taken,) = await ledger_b.sweep_recoverable()
        assert taken.obligation_id == oid
        assert taken.needs_marker  # a may have sent it already
        assert taken.outgoing_text.startswith(RECOVERED_MARKER)
        # When a comes back it renews an expired lease and says so; the row stays b's.
        reg_a.renew = renew  # type: ignore[method-assign]
        assert not await reg_a.renew()
        assert not await ledger_a.mark_attempting(oid)
    finally:
        await reg_a.stop()
        await reg_b.stop()
    assert await reg_b.live() == []


async def _dead(registry: InstanceRegistry, owner: Owner) -> bool:
    return not await registry.is_alive(owner)


async def test_a_clean_stop_frees_the_work_at_once(stores: StoreMaker) -> None:
    store_a, store_b = await stores(), await stores()
    reg_a = InstanceRegistry(store_a, owner=Owner(os.getpid(), "a"), lease_seconds=60)
    await reg_a.start()
    ledger_b = DeliveryLedger(store_b, owner=Owner(os.getpid(), "b"))
    oid = await record(DeliveryLedger(store_a, owner=reg_a.owner), store_a, 1)
    assert await ledger_b.sweep_recoverable() == []
    await reg_a.stop()
    (taken,) = await ledger_b.sweep_recoverable()
    assert taken.obligation_id == oid and not taken.needs_marker  # it was still pending


async def test_a_restart_on_the_same_host_reaps_its_dead_predecessor(
    stores: StoreMaker,
) -> None:
    store = await stores()
    child = await asyncio.create_subprocess_exec("true")
    await child.wait()  # a pid that no longer runs
    assert child.pid is not None
    ghost = InstanceRegistry(store, owner=Owner(child.pid, "ghost"), lease_seconds=600)
    await ghost.register()
    fresh = InstanceRegistry(await stores(), owner=Owner(os.getpid(), "fresh"), lease_seconds=600)
    assert "ghost" in {i.instance_id for i in await fresh.live()}
    await fresh.register()
    assert {i.instance_id for i in await fresh.live()} == {"fresh"}
    # A live process of this host is left alone.
    sibling = InstanceRegistry(store, owner=Owner(os.getppid(), "sibling"), lease_seconds=600)
    await sibling.register()
    await fresh.register()
    assert {i.instance_id for i in await fresh.live()} == {"fresh", "sibling"}


async def test_polling_is_refused_beside_another_live_process(stores: StoreMaker) -> None:
    from bot.app import POLLING_CONFLICT_MESSAGE, check_polling_alone

    store = await stores()
    me = InstanceRegistry(store, owner=Owner(os.getpid(), "me"), lease_seconds=60)
    await me.register()
    polling = Settings(telegram_bot_token="123:abc")
    await check_polling_alone(polling, me)  # alone: fine
    other = InstanceRegistry(await stores(), owner=Owner(os.getppid(), "other"), lease_seconds=60)
    await other.register()
    with pytest.raises(ConfigurationError) as info:
        await check_polling_alone(polling, me)
    assert str(info.value) == POLLING_CONFLICT_MESSAGE
    assert info.value.setting == "TELEGRAM_WEBHOOK_URL"
    webhook = Settings(
        telegram_bot_token="123:abc",
        telegram_webhook_url="https://bot.example.com/webhooks/telegram",
        telegram_webhook_secret="s3cret",
    )
    await check_polling_alone(webhook, me)


# -- two gateways ----------------------------------------------------------------------------


@dataclass
class Node:
    gateway: Gateway
    adapter: FakeAdapter
    model: ScriptedModel
    registry: InstanceRegistry


async def test_a_stalled_process_loses_its_turn_to_the_one_that_took_it_over(
    stores: StoreMaker, tmp_path: object
) -> None:
    """Process a stalls inside the model past its lease; b takes the message over and
    answers; when a wakes up its commit is refused: one turn, one reply."""
    agent = Agent(name="Helper", instructions="Be helpful.")
    secret = b"k" * 32
    in_model = asyncio.Event()
    wake_a = asyncio.Event()

    async def stall(call: RecordedCall) -> ModelResponse:
        in_model.set()
        await wake_a.wait()
        return ScriptedModel.reply("answer from a")

    nodes: list[Node] = []
    nodes_spec = (
        ("a", os.getppid(), [stall]),
        ("b", os.getpid(), [ScriptedModel.reply("answer from b")]),
    )
    for name, pid, steps in nodes_spec:
        store = await stores()
        registry = InstanceRegistry(
            store, owner=Owner(pid, f"{name}-instance"), lease_seconds=LEASE
        )
        await registry.start()
        model = ScriptedModel(steps)
        adapter = FakeAdapter()
        settings = Settings(data_dir=tmp_path)
        gateway = Gateway(
            Runner(agent, store, model=model),
            store,
            [adapter],
            settings,
            secret=secret,
            instances=registry,
        )
        await gateway.start()
        await gateway.wait_ready()
        nodes.append(Node(gateway, adapter, model, registry))
    a, b = nodes
    try:
        assert await a.adapter.deliver(make_event("hello"))
        await in_model.wait()
        assert a.registry._task is not None
        a.registry._task.cancel()  # a freezes: no renewals while it waits on the model
        # b takes the row over and runs the turn as soon as a lets go of the session.
        await until(lambda: _dead(b.registry, a.registry.owner), within=LEASE * 10)
        await until(lambda: _recovered_by(b), within=LEASE * 10)
        wake_a.set()
        sent = await b.adapter.wait_for_sent(1)
        assert [s.text for s in sent] == ["answer from b"]
        assert await a.gateway._dispatcher.drain(5)
        assert a.adapter.sent == []  # a's commit was refused: nothing to send
        history = await b.gateway.store.get(await _only_session(b))
        assert history is not None
        assert [m.content for m in history.history] == ["hello", "answer from b"]
    finally:
        wake_a.set()
        for node in nodes:
            await node.gateway.stop(grace=1)
            await node.registry.stop()


async def _recovered_by(node: Node) -> bool:
    """The message is ``node``'s: taken over here or by its own sweep (whichever came first)."""
    await node.gateway.take_over()
    async with node.gateway.store.transaction() as tx:
        row = await tx.fetchone("SELECT owner_instance FROM chatflow_inbox")
    return row is not None and row[0] == node.registry.owner.instance_id


async def _only_session(node: Node) -> str:
    (session_id,) = await node.gateway.store.list_sessions()
    return session_id
