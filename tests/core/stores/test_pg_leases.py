"""Session leases on PostgreSQL (issue #38): turns hold no connection while they run,
one turn per session across processes, and a turn whose lease was taken over saves
nothing. Each store instance has its own pool and owner: like separate processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.config import load_settings
from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.stores.pgconnect import ConnectionOptions
from bot.core.stores.postgres import PostgresSessionStore
from bot.database import open_store
from bot.errors import SessionLeaseLostError
from tests.pgtest import pg_dsn, wait_until

__all__ = ["pg_dsn"]


def user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


async def test_turns_on_a_pool_of_two_all_run_at_once(
    pg_dsn: str, agent: Agent, tmp_path: Path
) -> None:
    """Ten turns whose model is still thinking, on DATABASE_CONNECTIONS=2: all inside their
    session at once (a held lock connection per turn allowed four), and all save."""
    store = open_store(
        load_settings(data_dir=tmp_path, database_url=pg_dsn, database_connections=2)
    )
    assert isinstance(store, PostgresSessionStore)
    inside = 0
    all_inside = asyncio.Event()

    async def turn(n: int) -> None:
        nonlocal inside
        async with store.session_lock(f"s-{n}"):
            session = await store.get_or_create(f"s-{n}", agent)
            inside += 1
            if inside == 10:
                all_inside.set()
            await all_inside.wait()  # the model thinks until every turn is in
            session.add_message(user(f"hello {n}"))
            await store.save(session)

    async with store:
        await asyncio.wait_for(asyncio.gather(*(turn(n) for n in range(10))), 30)
        assert store.connection_waiters == 0
        for n in range(10):
            session = await store.get(f"s-{n}")
            assert session is not None
            assert [m.content for m in session.history] == [f"hello {n}"]
        assert len(store.leases) == 0


async def test_a_turn_whose_lease_was_taken_over_saves_nothing(pg_dsn: str, agent: Agent) -> None:
    async with (
        PostgresSessionStore(pg_dsn, session_lease_seconds=30) as one,
        PostgresSessionStore(pg_dsn) as two,
    ):
        await one.get_or_create("s", agent)
        async with one.session_lock("s"):
            stale = await one.get_or_create("s", agent)
            stale.add_message(user("from the frozen process"))
            # One's process froze past its lease: the lease expired, unrenewed.
            async with one.transaction() as tx:
                await tx.execute(
                    "UPDATE chatflow_session_leases SET expires_at = clock_timestamp() "
                    "- interval '1 second' WHERE session_id = ?",
                    ("s",),
                )
            async with two.session_lock("s"):
                fresh = await two.get_or_create("s", agent)
                fresh.add_message(user("from the taker"))
                await two.save(fresh)
            with pytest.raises(SessionLeaseLostError):
                await one.save(stale)
        session = await two.get("s")
        assert session is not None
        assert [m.content for m in session.history] == ["from the taker"]


async def test_two_processes_racing_one_session_run_its_turns_one_at_a_time(
    pg_dsn: str, agent: Agent
) -> None:
    """Turns of one session from two processes never overlap; each process's turns run in
    the order they arrived; every turn is saved once."""
    async with PostgresSessionStore(pg_dsn) as one, PostgresSessionStore(pg_dsn) as two:
        await one.get_or_create("s", agent)
        running = 0
        overlaps = 0
        order: list[str] = []

        async def turn(store: PostgresSessionStore, label: str) -> None:
            nonlocal running, overlaps
            async with store.session_lock("s"):
                running += 1
                overlaps += running > 1
                session = await store.get_or_create("s", agent)
                await asyncio.sleep(0)  # the model: other turns get the loop meanwhile
                session.add_message(user(label))
                await store.save(session)
                order.append(label)
                running -= 1

        labels = [f"{'ab'[n % 2]}{n}" for n in range(12)]
        tasks = []
        for label in labels:  # arrival order: each turn starts after the one before
            store = one if label[0] == "a" else two
            tasks.append(asyncio.create_task(turn(store, label)))
            await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert overlaps == 0
        for prefix in "ab":
            mine = [label for label in order if label[0] == prefix]
            assert mine == [label for label in labels if label[0] == prefix]
        session = await one.get("s")
        assert session is not None
        assert [m.content for m in session.history] == order


async def tickets(dsn: str, session_id: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM chatflow_session_waiters WHERE session_id = $1",
                session_id,
            )
        )
    finally:
        await conn.close()


async def test_a_hand_over_never_jumps_a_waiter_of_another_process(pg_dsn: str) -> None:
    """A holds the session; W1 (process B) waits for it in the database; W2 (A) and W3
    (B) ask next, each behind its own process's turn. They run one at a time, W1 first:
    A's hand-over to its own W2 never jumps W1 (polling alone served W2 first). W2 and
    W3 reach the database only when the turn before them in their own process ends, so
    between the two the database serves whichever gets there first."""
    async with (
        PostgresSessionStore(pg_dsn, lease_owner="process-a") as a,
        PostgresSessionStore(pg_dsn, lease_owner="process-b") as b,
    ):
        order: list[str] = []
        running = 0
        overlaps = 0

        async def turn(store: PostgresSessionStore, label: str, asked: asyncio.Event) -> None:
            nonlocal running, overlaps
            asked.set()
            async with store.session_lock("s"):
                running += 1
                overlaps += running > 1
                order.append(label)
                await asyncio.sleep(0)  # the model
                running -= 1

        release = asyncio.Event()
        holding = asyncio.Event()

        async def hold() -> None:
            async with a.session_lock("s"):
                holding.set()
                await release.wait()
                order.append("a")

        holder = asyncio.create_task(hold())
        await holding.wait()
        asked = [asyncio.Event() for _ in range(3)]
        w1 = asyncio.create_task(turn(b, "w1", asked[0]))

        async def w1_queued() -> bool:
            return await tickets(pg_dsn, "s") == 1

        await wait_until(w1_queued)  # W1 found the session held and drew a ticket
        w2 = asyncio.create_task(turn(a, "w2", asked[1]))
        await asked[1].wait()  # queued behind A's holder in A
        w3 = asyncio.create_task(turn(b, "w3", asked[2]))
        await asked[2].wait()  # queued behind W1 in B
        release.set()
        await asyncio.wait_for(asyncio.gather(holder, w1, w2, w3), 30)
        assert order[:2] == ["a", "w1"]
        assert sorted(order[2:]) == ["w2", "w3"]
        assert overlaps == 0
        assert await tickets(pg_dsn, "s") == 0


async def test_a_waiter_that_gives_up_leaves_the_queue(pg_dsn: str) -> None:
    """A cancelled waiter deletes its ticket: the session is not held up for the ticket's
    lease (30 s here) behind a turn that no longer waits."""
    async with (
        PostgresSessionStore(pg_dsn, lease_owner="a", session_lease_seconds=30) as a,
        PostgresSessionStore(pg_dsn, lease_owner="b", session_lease_seconds=30) as b,
    ):
        async with a.session_lock("s"):
            waiter = asyncio.create_task(b.session_lock("s").__aenter__())

            async def queued() -> bool:
                return await tickets(pg_dsn, "s") == 1

            await wait_until(queued)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert await tickets(pg_dsn, "s") == 0 and b.leases.queued == 0
        async with asyncio.timeout(5), b.session_lock("s"):
            pass


def test_a_transaction_pooler_gets_no_startup_settings_but_the_name() -> None:
    options = ConnectionOptions(application_name="chatflow/x", pooler="transaction")
    assert options.server_settings() == {"application_name": "chatflow/x"}
    assert "tcp_user_timeout" in ConnectionOptions().server_settings()


async def test_doctor_sees_a_direct_connection_and_counts_the_connections(
    pg_dsn: str, tmp_path: Path
) -> None:
    from bot.doctor import _check_database

    result = await _check_database(
        load_settings(data_dir=tmp_path, database_url=pg_dsn, database_connections=6)
    )
    assert result.ok and not result.warning
    assert "6 connections per process" in result.detail
    assert "connected to the server directly" in result.detail


async def test_through_pgbouncer_in_transaction_mode(
    pg_dsn: str, agent: Agent, tmp_path: Path
) -> None:
    """Two stores (processes) through PgBouncer: turns of one session never overlap, the
    lease statements and saves work without session state, doctor sees the pooler."""
    from bot.doctor import _check_database
    from tests.pgbouncer import bouncer

    async with bouncer(pg_dsn, pool_size=4) as through:
        pooled = ConnectionOptions(pooler="transaction")
        async with (
            PostgresSessionStore(through, options=pooled, max_pool=3) as one,
            PostgresSessionStore(through, options=pooled, max_pool=3) as two,
        ):
            running = {f"s-{n}": 0 for n in range(3)}
            overlaps = 0

            async def turn(store: PostgresSessionStore, n: int) -> None:
                nonlocal overlaps
                sid = f"s-{n % 3}"
                async with store.session_lock(sid):
                    running[sid] += 1
                    overlaps += running[sid] > 1
                    session = await store.get_or_create(sid, agent)
                    await asyncio.sleep(0.01)  # the model
                    session.add_message(user(f"m{n}"))
                    await store.save(session)
                    running[sid] -= 1

            # One session at a time per lease: the turns of one session never overlap.
            await asyncio.wait_for(
                asyncio.gather(*(turn((one, two)[n % 2], n) for n in range(3))), 60
            )
            await asyncio.wait_for(
                asyncio.gather(*(turn((one, two)[n % 2], 3) for n in range(6))), 60
            )
            assert overlaps == 0
            session = await one.get("s-0")
            assert session is not None and len(session.history) == 7
        result = await _check_database(
            load_settings(data_dir=tmp_path, database_url=through, database_pooler="transaction")
        )
        assert result.ok and "a pooler or proxy is in front" in result.detail, result.detail


async def test_a_takeover_frees_the_sessions_of_an_expired_instance(
    pg_dsn: str, agent: Agent
) -> None:
    """A process half-frozen (its instance lease expired, its store still renewing its
    session leases) loses its conversations to the process that takes its work over."""
    from bot.gateway.instances import InstanceRegistry, Owner

    async with PostgresSessionStore(pg_dsn) as one, PostgresSessionStore(pg_dsn) as two:
        frozen = InstanceRegistry(one, owner=Owner(1, "frozen"), lease_seconds=1)
        taker = InstanceRegistry(two, owner=Owner(2, "taker"), lease_seconds=30)
        assert one.leases.owner == "frozen"
        await frozen.register()
        await taker.register()
        async with one.session_lock("s"):
            stale = await one.get_or_create("s", agent)
            stale.add_message(user("stale"))

            async def expired() -> bool:
                await taker.end_backends_of_expired()
                return await lease_owner(pg_dsn, "s") == ""

            await wait_until(expired, within=10)
            async with asyncio.timeout(5), two.session_lock("s"):
                pass
            with pytest.raises(SessionLeaseLostError):
                await one.save(stale)


async def test_a_takeover_sweeps_the_tickets_of_an_expired_instance(
    pg_dsn: str, agent: Agent
) -> None:
    """A dead instance's place in a session's queue goes at the takeover, not a lease
    later; a half-frozen one whose ticket was swept still gets the session in turn."""
    from bot.gateway.instances import InstanceRegistry, Owner

    async with PostgresSessionStore(pg_dsn) as one, PostgresSessionStore(pg_dsn) as two:
        frozen = InstanceRegistry(one, owner=Owner(1, "frozen-w"), lease_seconds=1)
        taker = InstanceRegistry(two, owner=Owner(2, "taker-w"), lease_seconds=30)
        await frozen.register()
        await taker.register()
        owner_inside: list[str] = []

        async def wait_in_one() -> None:
            async with one.session_lock("s"):
                owner_inside.append(await lease_owner(pg_dsn, "s"))

        async with two.session_lock("s"):
            waiter = asyncio.create_task(wait_in_one())

            async def swept() -> bool:
                await taker.end_backends_of_expired()
                return await tickets(pg_dsn, "s") == 0 and one.leases.queued == 1

            await wait_until(swept, within=10)
        await asyncio.wait_for(waiter, 5)
        assert owner_inside == ["frozen-w"]


async def lease_owner(dsn: str, session_id: str) -> str:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return str(
            await conn.fetchval(
                "SELECT owner_instance FROM chatflow_session_leases WHERE session_id = $1",
                session_id,
            )
        )
    finally:
        await conn.close()


async def test_tasks_waiting_for_a_pooled_connection_are_counted(pg_dsn: str) -> None:
    async with PostgresSessionStore(pg_dsn, max_pool=1) as store:
        await store.open()
        release = asyncio.Event()
        inside = asyncio.Event()

        async def hold() -> None:
            async with store.transaction():
                inside.set()
                await release.wait()

        holder = asyncio.create_task(hold())
        await inside.wait()
        waiter = asyncio.create_task(store.claim_message("m-1"))
        async with asyncio.timeout(5):
            while store.connection_waiters == 0:  # noqa: ASYNC110 - a counter, no event
                await asyncio.sleep(0)
        assert store.connection_waiters == 1
        release.set()
        await asyncio.gather(holder, waiter)
        assert store.connection_waiters == 0
