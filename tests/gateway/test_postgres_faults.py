"""The gateway on PostgreSQL when the database fails: nothing stranded, zombies fenced.

Each test names the mechanism it checks (``bot.gateway.resume`` and the
registry's self-fencing in ``bot.gateway.instances``): a turn interrupted by
the database's absence is resumed without an apology, an unknown COMMIT is
read back, a process's own quiet rows are picked up, a lapsed lease holds a
send back, a taker ends the expired owner's database sessions, and a process
back from an outage waits a grace period before taking anyone's work.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from bot.config import Settings
from bot.core.agent import Agent
from bot.core.models.base import ModelResponse
from bot.core.models.scripted import RecordedCall, ScriptedModel, Step
from bot.core.runner import Runner
from bot.core.stores import postgres as pg
from bot.core.stores.pgconnect import ConnectionOptions, application_name
from bot.core.stores.postgres import PostgresSessionStore
from bot.gateway.gateway import Gateway, Replies
from bot.gateway.instances import InstanceRegistry, Owner
from bot.gateway.ledger.obligations import RECOVERED_MARKER
from tests.fakes.adapter import FakeAdapter, make_event
from tests.pgtest import pg_dsn
from tests.pgtest import wait_until as until

__all__ = ["pg_dsn"]

LEASE = 1.0
SECRET = b"k" * 32
APOLOGY = Replies().apology


@dataclass
class Node:
    gateway: Gateway
    adapter: FakeAdapter
    model: ScriptedModel
    registry: InstanceRegistry
    store: PostgresSessionStore


NodeMaker = Callable[..., Awaitable[Node]]


@pytest.fixture
async def nodes(pg_dsn: str, tmp_path: Path) -> AsyncIterator[NodeMaker]:
    """Gateways on the test schema, each with its own store, lease and fake platform."""
    async with AsyncExitStack() as stack:
        made: list[Node] = []

        async def make(
            name: str, steps: list[Step], *, pid: int | None = None, grace: float = 0.0
        ) -> Node:
            instance = f"{name}-instance"
            store = PostgresSessionStore(
                pg_dsn, options=ConnectionOptions(application_name=application_name(instance))
            )
            await stack.enter_async_context(store)
            registry = InstanceRegistry(
                store, owner=Owner(pid or os.getpid(), instance), lease_seconds=LEASE
            )
            registry.grace_seconds = grace
            await registry.start()
            model = ScriptedModel(steps)
            adapter = FakeAdapter()
            gateway = Gateway(
                Runner(Agent(name="Helper", instructions="Be helpful."), store, model=model),
                store,
                [adapter],
                Settings(data_dir=tmp_path / name),
                secret=SECRET,
                instances=registry,
            )
            await gateway.start()
            await gateway.wait_ready()
            node = Node(gateway, adapter, model, registry, store)
            made.append(node)
            return node

        try:
            yield make
        finally:
            for node in made:
                await node.gateway.stop(grace=1)
                await node.registry.stop()


def fail_once(monkeypatch: pytest.MonkeyPatch, *, after_commit: bool = False) -> asyncio.Event:
    """Once armed, the turn's tx 2 (the transaction that closes an inbox row) meets a dead
    connection: at that statement, or (``after_commit``) right after its COMMIT reached
    the server. Returns the event that arms it."""
    armed = asyncio.Event()
    fired: list[bool] = []
    doomed: set[int] = set()  # ids of the transactions to fail at their COMMIT
    execute = pg._PgTransaction.execute
    send_commit = pg._PgTransaction._send_commit

    async def failing_execute(self: pg._PgTransaction, sql: str, params: Sequence[Any] = ()) -> int:
        if armed.is_set() and not fired and "SET state = 'done'" in sql:
            if not after_commit:
                fired.append(True)
                raise pg._error("SQL statement failed", asyncpg.ConnectionDoesNotExistError("x"))
            doomed.add(id(self))
        return await execute(self, sql, params)

    async def committed_then_lost(self: pg._PgTransaction) -> None:
        await send_commit(self)
        if id(self) in doomed and not fired:
            fired.append(True)  # the server committed; its answer never came back
            raise asyncpg.ConnectionDoesNotExistError("connection lost after COMMIT")

    monkeypatch.setattr(pg._PgTransaction, "execute", failing_execute)
    monkeypatch.setattr(pg._PgTransaction, "_send_commit", committed_then_lost)
    return armed


def arm_on_model(armed: asyncio.Event, text: str) -> Callable[[RecordedCall], ModelResponse]:
    def step(call: RecordedCall) -> ModelResponse:
        armed.set()  # the next statement (or COMMIT) is the turn's tx 2
        return ScriptedModel.reply(text)

    return step


# -- nothing stranded ---------------------------------------------------------------------


async def test_a_turn_the_database_interrupted_is_resumed_without_an_apology(
    nodes: NodeMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    armed = fail_once(monkeypatch)
    node = await nodes("a", [])
    node.model.add(arm_on_model(armed, "first try"), ScriptedModel.reply("answer"))
    assert await node.adapter.deliver(make_event("hello"))
    sent = await node.adapter.wait_for_sent(1)
    assert [s.text for s in sent] == ["answer"]  # run again once back, never an apology
    assert await node.gateway._dispatcher.drain(5)
    assert [s.text for s in node.adapter.sent] == ["answer"]
    assert APOLOGY not in [s.text for s in node.adapter.sent]


async def test_an_unknown_commit_is_read_back_and_its_reply_sent_once(
    nodes: NodeMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    armed = fail_once(monkeypatch, after_commit=True)
    node = await nodes("a", [])
    node.model.add(arm_on_model(armed, "the answer"))
    assert await node.adapter.deliver(make_event("hello"))
    sent = await node.adapter.wait_for_sent(1)
    # Its tx 2 did commit: the reply goes out once, unmarked (it was never sent), and the
    # turn is not run again (the model was asked once).
    assert [s.text for s in sent] == ["the answer"]
    assert await node.gateway._dispatcher.drain(5)
    assert [s.text for s in node.adapter.sent] == ["the answer"]
    assert len(node.model.requests) == 1
    history = await node.store.get((await node.store.list_sessions())[0])
    assert history is not None and [m.content for m in history.history] == [
        "hello",
        "the answer",
    ]


async def test_a_live_processs_own_quiet_row_is_picked_up_without_a_restart(
    nodes: NodeMaker,
) -> None:
    node = await nodes("a", [ScriptedModel.reply("late answer")])
    event = make_event("accepted, then its answer was lost")
    # Journaled under this process (tx 1 committed; the webhook heard 500 and the
    # redelivery was a duplicate): nothing in the process holds it.
    assert await node.gateway.inbox.accept(event, session_key="k", session_id="fake-1")
    sent = await node.adapter.wait_for_sent(1, timeout=LEASE * 15)
    assert [s.text for s in sent] == ["late answer"]


# -- fencing --------------------------------------------------------------------------------


async def test_a_lapsed_lease_holds_a_send_back_and_drops_a_row_taken_over(
    nodes: NodeMaker,
) -> None:
    in_model = asyncio.Event()
    go_on = asyncio.Event()

    async def slow(call: RecordedCall) -> ModelResponse:
        in_model.set()
        await go_on.wait()
        return ScriptedModel.reply("from a")

    a = await nodes("a", [slow], pid=os.getppid())
    b = await nodes("b", [], grace=3600)  # b takes nothing over until the test says so
    assert await a.adapter.deliver(make_event("hello"))
    await in_model.wait()
    renew = a.registry.renew

    async def frozen() -> bool:
        return True

    a.registry.renew = frozen  # type: ignore[method-assign]  # a's renewals stop landing
    await until(lambda: _dead(b.registry, a.registry.owner), within=LEASE * 10)
    assert not a.registry.holds_lease()
    # a commits its turn before b takes the row, then finds its lease lapsed at the send:
    # it must not send until it renews, and then only a row still its own.
    go_on.set()
    await until(lambda: _attempting(a.store), within=10)
    b.registry.grace_seconds = 0
    await b.gateway.take_over()
    taken = await b.adapter.wait_for_sent(1, timeout=LEASE * 10)
    assert [s.text for s in taken] == [RECOVERED_MARKER + "from a"]
    a.registry.renew = renew  # type: ignore[method-assign]
    assert await a.gateway._dispatcher.drain(LEASE * 10)
    assert a.adapter.sent == []  # the taker's marked copy is the only one


async def test_a_taker_ends_the_expired_owners_sessions_so_its_locks_are_freed(
    nodes: NodeMaker, pg_dsn: str
) -> None:
    a = await nodes("a", [], pid=os.getppid())
    b = await nodes("b", [])
    held = asyncio.Event()
    release = asyncio.Event()

    async def hold() -> None:
        async with a.store.session_lock("fake-1"):
            held.set()
            await release.wait()

    holder = asyncio.create_task(hold())
    await held.wait()
    assert a.registry._task is not None
    a.registry._task.cancel()  # a freezes, its session lock held
    await until(lambda: _dead(b.registry, a.registry.owner), within=LEASE * 10)
    await b.gateway.take_over()  # ends a's backends first
    async with asyncio.timeout(5):
        async with b.store.session_lock("fake-1"):
            pass  # the lock is b's at once, not when a thaws
    release.set()
    await asyncio.gather(holder, return_exceptions=True)


async def test_after_an_outage_nothing_is_taken_over_within_the_grace(
    nodes: NodeMaker,
) -> None:
    in_model = asyncio.Event()

    async def hang(call: RecordedCall) -> ModelResponse:
        in_model.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    a = await nodes("a", [hang], pid=os.getppid())
    b = await nodes("b", [ScriptedModel.reply("from b")], grace=3600)
    assert await a.adapter.deliver(make_event("hello"))
    await in_model.wait()
    assert a.registry._task is not None
    a.registry._task.cancel()
    await until(lambda: _dead(b.registry, a.registry.owner), within=LEASE * 10)
    # b was cut off too and just renewed again: it waits for the others to renew first.
    b.registry._note_failed()
    await b.registry.renew()
    b.registry.grace_seconds = LEASE * 3
    assert not b.registry.may_take_over()
    assert await b.gateway.take_over() == 0
    assert await _owner(b.store) == "a-instance"
    await until(lambda: _taken(b), within=LEASE * 10)  # after the grace: taken
    sent = await b.adapter.wait_for_sent(1)
    assert [s.text for s in sent] == ["from b"]


async def _taken(node: Node) -> bool:
    await node.gateway.take_over()
    return await _owner(node.store) == node.registry.instance_id


async def _owner(store: PostgresSessionStore) -> str | None:
    async with store.transaction() as tx:
        row = await tx.fetchone("SELECT owner_instance FROM chatflow_inbox")
    return None if row is None else str(row[0])


async def _attempting(store: PostgresSessionStore) -> bool:
    async with store.transaction() as tx:
        row = await tx.fetchone("SELECT state FROM chatflow_delivery_obligations")
    return row is not None and row[0] == "attempting"


async def _dead(registry: InstanceRegistry, owner: Owner) -> bool:
    return not await registry.is_alive(owner)


async def test_a_renewal_the_database_forgot_is_reported_as_lost_commits(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with PostgresSessionStore(pg_dsn) as store:
        registry = InstanceRegistry(store, owner=Owner(os.getpid(), "me"), lease_seconds=60)
        await registry.register()
        await registry.renew()
        assert registry.lost_commits == 0
        # A failover to a standby that had not received the last renewal: the row is older.
        async with store.transaction() as tx:
            await tx.execute("UPDATE chatflow_instances SET renewed_at = renewed_at - 5")
        await registry.renew()
        assert registry.lost_commits == 1
        assert "the database lost acknowledged commits" in caplog.text
        await registry.stop()
