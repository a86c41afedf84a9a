"""PostgresSessionStore specifics: migrations under concurrent start, locks and claims across
store instances (each instance has its own pools: like separate processes), crash release."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap

import asyncpg
import pytest

from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.session import SessionContext
from bot.core.sql import Transaction
from bot.core.stores.pgconnect import ConnectionOptions
from bot.core.stores.postgres import SCHEMA_VERSION, PostgresSessionStore
from bot.errors import SchemaVersionError, StorageError
from tests.fakes.clock import FakeClock
from tests.pgtest import pg_dsn, with_search_path
from tests.pgtest import wait_until as until

__all__ = ["pg_dsn"]  # the fixture, imported for this module's tests


def user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


def texts(session: SessionContext | None) -> list[str | None]:
    assert session is not None
    return [m.content for m in session.history]


async def scalar(dsn: str, sql: str, *args: object) -> object:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


async def lease_holder(dsn: str, session_id: str) -> str:
    """Who holds ``session_id``'s lease ('' when free or never taken)."""
    value = await scalar(
        dsn,
        "SELECT coalesce(max(owner_instance), '') FROM chatflow_session_leases "
        "WHERE session_id = $1",
        session_id,
    )
    assert isinstance(value, str)
    return value


# -- construction ------------------------------------------------------------------------


def test_unknown_keyword_and_bad_dsn_are_refused() -> None:
    with pytest.raises(TypeError):
        PostgresSessionStore("postgresql://h/db", busy_timeout=5)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="postgresql://"):
        PostgresSessionStore("sqlite:///x.db")
    with pytest.raises(ValueError):
        PostgresSessionStore("postgresql://h/db", min_pool=5, max_pool=2)


def test_repr_hides_the_password() -> None:
    store = PostgresSessionStore("postgresql://bot:s3cret@db:5432/chatflow")
    assert "s3cret" not in repr(store)
    assert "postgresql://bot:***@db:5432/chatflow" in repr(store)


async def test_unreachable_server_is_a_storage_error_without_the_password() -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = PostgresSessionStore(f"postgresql://bot:s3cret@127.0.0.1:{port}/chatflow")
    with pytest.raises(StorageError) as info:
        await store.open()
    assert "s3cret" not in str(info.value)
    await store.close()


async def test_a_server_that_never_answers_is_named_with_what_timed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    accepted = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, and never a byte back
        accepted.set()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = PostgresSessionStore(
        f"postgresql://bot:s3cret@127.0.0.1:{port}/chatflow",
        options=ConnectionOptions(connect_timeout=0.3),
    )
    try:
        with pytest.raises(StorageError) as info:
            await store.open()
    finally:
        await store.close()
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
    assert accepted.is_set()
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message and "no answer within 0.3 s" in message
    assert "s3cret" not in message


async def test_the_schema_named_in_search_path_is_created(pg_dsn: str, agent: Agent) -> None:
    schema = "t_new_" + os.urandom(4).hex()
    dsn = with_search_path(pg_dsn, schema)
    store = PostgresSessionStore(dsn)
    try:
        session = await store.get_or_create("s1", agent)
        session.add_message(user("hello"))
        await store.save(session)
        assert texts(await store.get("s1")) == ["hello"]
    finally:
        await store.close()
        await scalar(pg_dsn, f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    # (the drop above also proves the tables were made in that schema, not elsewhere)


# -- migrations --------------------------------------------------------------------------


async def test_concurrent_first_opens_migrate_once(pg_dsn: str, agent: Agent) -> None:
    stores = [PostgresSessionStore(pg_dsn) for _ in range(5)]
    try:
        await asyncio.gather(*(store.open() for store in stores))
        await asyncio.gather(*(s.get_or_create(f"s{i}", agent) for i, s in enumerate(stores)))
        assert sorted(await stores[0].list_sessions()) == [f"s{i}" for i in range(5)]
    finally:
        await asyncio.gather(*(store.close() for store in stores))
    version = await scalar(
        pg_dsn, "SELECT version FROM chatflow_schema_versions WHERE component = 'session_store'"
    )
    assert version == SCHEMA_VERSION
    # A later start finds nothing to do and keeps the data.
    async with PostgresSessionStore(pg_dsn) as again:
        assert len(await again.list_sessions()) == 5


async def test_newer_schema_is_refused(pg_dsn: str) -> None:
    async with PostgresSessionStore(pg_dsn):
        pass
    conn = await asyncpg.connect(pg_dsn)
    await conn.execute(
        "UPDATE chatflow_schema_versions SET version = 99 WHERE component = 'session_store'"
    )
    await conn.close()
    store = PostgresSessionStore(pg_dsn)
    with pytest.raises(SchemaVersionError, match="newer"):
        await store.open()
    await store.close()


async def test_foreign_chatflow_tables_are_refused(pg_dsn: str) -> None:
    conn = await asyncpg.connect(pg_dsn)
    await conn.execute("CREATE TABLE chatflow_messages (id INTEGER PRIMARY KEY, content TEXT)")
    await conn.close()
    store = PostgresSessionStore(pg_dsn)
    with pytest.raises(SchemaVersionError, match="another program"):
        await store.open()
    await store.close()


# -- transactions ------------------------------------------------------------------------


async def test_save_hook_commits_with_the_session_or_not_at_all(pg_dsn: str, agent: Agent) -> None:
    async with PostgresSessionStore(pg_dsn) as store:
        async with store.transaction() as tx:
            await tx.execute("CREATE TABLE outbox (session_id TEXT, body TEXT)")
        session = await store.get_or_create("s", agent)
        session.add_message(user("q0"))

        async def hook(tx: Transaction) -> None:
            row = await tx.fetchone(
                "SELECT COUNT(*) FROM chatflow_messages WHERE session_id = ?", ("s",)
            )
            assert row == (1,)
            assert await tx.execute("INSERT INTO outbox VALUES (?, ?)", ("s", "a0")) == 1

        await store.save(session, also=hook)

        session.add_message(user("q1"))

        async def failing(tx: Transaction) -> None:
            await tx.execute("INSERT INTO outbox VALUES (?, ?)", ("s", "lost"))
            await tx.execute("INSERT INTO no_such_table VALUES (1)")

        with pytest.raises(StorageError) as info:
            await store.save(session, also=failing)
        assert isinstance(info.value.__cause__, asyncpg.UndefinedTableError)
        async with store.transaction() as tx:
            assert await tx.fetchall("SELECT body FROM outbox") == [("a0",)]
        await store.save(session)  # the unsaved message is still pending: written once
        assert texts(await store.get("s")) == ["q0", "q1"]


async def test_reentrant_use_raises_instead_of_using_a_second_connection(pg_dsn: str) -> None:
    async with PostgresSessionStore(pg_dsn) as store, store.transaction():
        with pytest.raises(StorageError, match="inside its own transaction"):
            await store.get("s")


async def test_closed_store_refuses_work(pg_dsn: str, agent: Agent) -> None:
    store = PostgresSessionStore(pg_dsn)
    await store.get_or_create("s", agent)
    await store.close()
    await store.close()
    with pytest.raises(StorageError, match="closed"):
        await store.get("s")


# -- several store instances (as several processes would) --------------------------------


async def test_session_lock_serialises_turns_across_instances(pg_dsn: str, agent: Agent) -> None:
    async with PostgresSessionStore(pg_dsn) as one, PostgresSessionStore(pg_dsn) as two:
        await one.get_or_create("s", agent)
        inside_one = asyncio.Event()
        release_one = asyncio.Event()
        inside_two = asyncio.Event()

        async def turn(
            store: PostgresSessionStore,
            label: str,
            inside: asyncio.Event,
            release: asyncio.Event | None,
        ) -> None:
            async with store.session_lock("s"):
                inside.set()
                session = await store.get_or_create("s", agent)
                session.add_message(user(label))
                if release is not None:
                    await release.wait()
                await store.save(session)

        first = asyncio.create_task(turn(one, "one", inside_one, release_one))
        await inside_one.wait()
        second = asyncio.create_task(turn(two, "two", inside_two, None))
        try:
            await until(lambda: _waiting(two))  # two polls the server, not a local lock
            assert not inside_two.is_set()
        finally:
            release_one.set()
            results = await asyncio.gather(first, second, return_exceptions=True)
        assert list(results) == [None, None]
        assert texts(await one.get("s")) == ["one", "two"]
        assert len(one._session_locks) == len(two._session_locks) == 0
        assert await _no_locks(one, pg_dsn)


async def _waiting(store: PostgresSessionStore) -> bool:
    return store.leases.waiting > 0


async def test_different_sessions_do_not_wait_for_each_other(pg_dsn: str) -> None:
    async with (
        PostgresSessionStore(pg_dsn) as one,
        PostgresSessionStore(pg_dsn) as two,
        one.session_lock("s-1"),
    ):
        await asyncio.wait_for(_enter(two, "s-2"), timeout=5)


async def _enter(store: PostgresSessionStore, session_id: str) -> None:
    async with store.session_lock(session_id):
        pass


async def test_a_killed_holder_releases_the_session_lock(pg_dsn: str) -> None:
    async with PostgresSessionStore(pg_dsn) as store:
        await store.open()
        script = textwrap.dedent(
            f"""
            import asyncio
            from bot.core.stores.postgres import PostgresSessionStore
            async def main():
                store = PostgresSessionStore({pg_dsn!r}, session_lease_seconds=1.5)
                async with store.session_lock("s"):
                    print("locked", flush=True)
                    await asyncio.sleep(120)
            asyncio.run(main())
            """
        )
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE
        )
        try:
            assert holder.stdout is not None
            assert (await asyncio.wait_for(holder.stdout.readline(), 20)).strip() == b"locked"
            entered = asyncio.Event()

            async def take() -> None:
                async with store.session_lock("s"):
                    entered.set()

            taker = asyncio.create_task(take())
            await until(lambda: _waiting(store))
            # The live holder renews its lease: still held past its first expiry.
            first = await scalar(pg_dsn, "SELECT max(expires_at) FROM chatflow_session_leases")
            await until(lambda: _later(pg_dsn, first))
            assert not entered.is_set()
            os.kill(holder.pid, signal.SIGKILL)  # the process dies holding the lease
            await asyncio.wait_for(taker, timeout=10)
            assert entered.is_set()
        finally:
            if holder.returncode is None:
                holder.kill()
            await holder.wait()


async def test_a_cancelled_wait_leaves_no_lock_behind(pg_dsn: str) -> None:
    async with PostgresSessionStore(pg_dsn) as one, PostgresSessionStore(pg_dsn) as two:
        release = asyncio.Event()
        held = asyncio.Event()

        async def hold() -> None:
            async with one.session_lock("s"):
                held.set()
                await release.wait()

        holder = asyncio.create_task(hold())
        await held.wait()
        waiter = asyncio.create_task(_enter(two, "s"))
        await until(lambda: _waiting(two))
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        release.set()
        await holder
        await asyncio.wait_for(_enter(two, "s"), timeout=5)
        await until(lambda: _no_locks(one, pg_dsn))


async def test_a_transaction_cancelled_at_any_point_stays_cancelled_and_returns_its_connection(
    pg_dsn: str,
) -> None:
    """Cancelled at each of its await points in turn (the release among them), a
    transaction ends cancelled, never with another error, and the pool gets its
    connection back: the next transactions still run on a pool of two."""

    async def write(tx: Transaction, n: int) -> None:
        await tx.execute("INSERT INTO probe (n) VALUES (?)", (n,))

    async with PostgresSessionStore(pg_dsn, min_pool=0, max_pool=2) as store:
        async with store.transaction() as tx:
            await tx.execute("CREATE TABLE probe (n INTEGER)")
        outcomes: set[str] = set()
        for steps in range(120):

            async def one(n: int = steps) -> None:
                async with store.transaction() as tx:
                    await write(tx, n)

            task = asyncio.create_task(one())
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                outcomes.add("cancelled")
            else:
                outcomes.add("done")
            assert task.cancelled() or task.exception() is None
        assert outcomes == {"cancelled", "done"}
        for n in range(4):
            async with asyncio.timeout(5):
                async with store.transaction() as tx:
                    await write(tx, 1000 + n)


async def _no_locks(store: PostgresSessionStore, dsn: str) -> bool:
    return await lease_holder(dsn, "s") == "" and store.leases.waiting == 0


async def _later(dsn: str, first: object) -> bool:
    return bool(
        await scalar(dsn, "SELECT max(expires_at) > $1 FROM chatflow_session_leases", first)
    )


async def test_claims_across_instances_have_one_winner(pg_dsn: str) -> None:
    async with PostgresSessionStore(pg_dsn) as one, PostgresSessionStore(pg_dsn) as two:
        results = await asyncio.gather(
            *(store.claim_message("wamid.Z") for store in [one, two] * 25)
        )
    assert results.count(True) == 1


async def test_a_stale_context_from_another_instance_is_refused(pg_dsn: str, agent: Agent) -> None:
    async with PostgresSessionStore(pg_dsn) as one, PostgresSessionStore(pg_dsn) as two:
        first = await one.get_or_create("s", agent)
        stale = await two.get_or_create("s", agent)
        first.add_message(user("turn A"))
        await one.save(first)
        stale.add_message(user("turn B"))
        with pytest.raises(StorageError, match="changed in the store"):
            await two.save(stale)
        assert texts(await two.get("s")) == ["turn A"]


async def test_deletion_by_another_instance_is_detected(pg_dsn: str, agent: Agent) -> None:
    clock = FakeClock()
    async with (
        PostgresSessionStore(pg_dsn, clock=clock) as one,
        PostgresSessionStore(pg_dsn, clock=clock) as two,
    ):
        held = await one.get_or_create("s", agent)
        assert await two.delete("s")
        clock.advance(seconds=1)
        await two.get_or_create("s", agent)  # a new session under the same id
        held.add_message(user("stale"))
        from bot.core.stores.base import SessionDeletedError

        with pytest.raises(SessionDeletedError):
            await one.save(held)
        assert texts(await two.get("s")) == []


async def test_concurrent_creation_from_two_instances(pg_dsn: str, agent: Agent) -> None:
    async with PostgresSessionStore(pg_dsn) as one, PostgresSessionStore(pg_dsn) as two:
        made = await asyncio.gather(
            *(store.get_or_create("s", agent, {"n": i}) for i, store in enumerate([one, two] * 5))
        )
        assert {m.session_id for m in made} == {"s"}
        assert await one.list_sessions() == ["s"]
        metadata = (await two.get("s")).metadata  # type: ignore[union-attr]
        assert metadata in ({"n": i} for i in range(10))


async def test_connections_detect_a_dead_host_within_seconds(pg_dsn: str) -> None:
    async with PostgresSessionStore(pg_dsn) as store:
        async with store.transaction() as tx:
            row = await tx.fetchone("SHOW tcp_keepalives_idle")
            schema = await tx.fetchone("SELECT current_schema()")
        assert row == ("5",)  # seconds, not the server's default of hours
        assert schema is not None and schema[0].startswith("t_")  # the DSN's settings kept
