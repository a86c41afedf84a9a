"""The PostgreSQL store against a network that fails: every wait ends, and says what it knows.

A fault proxy (``tests.faultproxy``) between the store and the test server goes
silent or cuts connections; a listener that accepts and never answers plays a
dead first host of a multi-host URL.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.stores.pgconnect import ConnectionOptions, application_name
from bot.core.stores.postgres import PostgresSessionStore
from bot.errors import CommitOutcomeUnknownError, DatabaseUnavailableError
from tests.faultproxy import FaultProxy
from tests.pgtest import pg_dsn

__all__ = ["pg_dsn"]

FAST = ConnectionOptions(
    connect_timeout=0.5,
    statement_timeout=1.0,
    acquire_timeout=1.0,
    keepalive_idle=1,
    keepalive_interval=1,
    keepalive_count=2,
    tcp_user_timeout=2.0,
    application_name=application_name("test-instance"),
)


def through(dsn: str, port: int, *, first: int | None = None) -> str:
    """``dsn`` pointed at ``127.0.0.1:port`` (after ``127.0.0.1:first``, if given)."""
    parts = urlsplit(dsn)
    auth = parts.netloc.rpartition("@")[0]
    hosts = f"127.0.0.1:{port}" if first is None else f"127.0.0.1:{first},127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{auth}@{hosts}" if auth else hosts))


@pytest.fixture
async def proxy(pg_dsn: str) -> AsyncIterator[FaultProxy]:
    port = urlsplit(pg_dsn).port
    assert port is not None
    async with FaultProxy(port) as made:
        yield made


async def test_a_silent_first_host_is_skipped_within_its_own_timeout(pg_dsn: str) -> None:
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepts, never answers: a host that died under its address

    dead = await asyncio.start_server(silent, "127.0.0.1", 0)
    dead_port = dead.sockets[0].getsockname()[1]
    port = urlsplit(pg_dsn).port
    assert port is not None
    dsn = through(pg_dsn, port, first=dead_port) + "&target_session_attrs=read-write"
    store = PostgresSessionStore(dsn, options=FAST)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        async with asyncio.timeout(8):
            await store.ping()
        assert loop.time() - started < 5  # one host's timeout, not asyncpg's overall one
        assert held  # the first host was tried
        assert f"127.0.0.1:{dead_port},127.0.0.1:{port}" in repr(store)  # shown, redacted
    finally:
        await store.close()
        dead.close()
        for writer in held:
            writer.close()


async def test_connections_carry_keepalives_and_name_their_instance(
    pg_dsn: str, proxy: FaultProxy
) -> None:
    async with PostgresSessionStore(through(pg_dsn, proxy.port), options=FAST) as store:
        pool, _ = await store._pools()
        async with pool.acquire() as conn:
            sock = conn._transport.get_extra_info("socket")  # type: ignore[attr-defined]
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 2000
            name = await conn.fetchval("SHOW application_name")
            idle = await conn.fetchval("SHOW idle_in_transaction_session_timeout")
        assert name == "chatflow/test-instance"
        assert idle == "1min"


async def test_a_statement_to_a_silent_server_fails_as_unavailable_in_time(
    pg_dsn: str, proxy: FaultProxy
) -> None:
    async with PostgresSessionStore(through(pg_dsn, proxy.port), options=FAST) as store:
        await store.ping()
        proxy.silence()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(DatabaseUnavailableError):
            async with asyncio.timeout(10):
                async with store.transaction() as tx:
                    await tx.fetchall("SELECT 1")
        assert loop.time() - started < 6
        await proxy.heal()
        await store.ping()  # and it works again once the network does


async def test_a_commit_whose_answer_is_lost_is_unknown_not_failed_and_reads_back(
    pg_dsn: str, proxy: FaultProxy
) -> None:
    async with PostgresSessionStore(through(pg_dsn, proxy.port), options=FAST) as store:
        async with store.transaction() as tx:
            await tx.execute("CREATE TABLE probe (n INTEGER)")
        with pytest.raises(CommitOutcomeUnknownError):
            async with asyncio.timeout(10):
                async with store.transaction() as tx:
                    await tx.execute("INSERT INTO probe (n) VALUES (1)")
                    proxy.silence(replies_only=True)  # COMMIT reaches the server; its answer not
        await proxy.heal()
        conn = await asyncpg.connect(pg_dsn)
        try:
            # It did commit: reported as unknown, never as failed.
            assert await conn.fetchval(f"SELECT count(*) FROM {await _schema(store)}.probe") == 1
        finally:
            await conn.close()


async def test_a_cut_connection_is_unavailable_and_the_pool_reconnects(
    pg_dsn: str, proxy: FaultProxy
) -> None:
    async with PostgresSessionStore(through(pg_dsn, proxy.port), options=FAST) as store:
        await store.ping()
        await proxy.cut()
        with pytest.raises(DatabaseUnavailableError):
            async with asyncio.timeout(10):
                await store.ping()
        await proxy.heal()
        async with asyncio.timeout(10):
            await store.ping()


async def _schema(store: PostgresSessionStore) -> str:
    async with store.transaction() as tx:
        row = await tx.fetchone("SELECT current_schema()")
    assert row is not None
    return str(row[0])


async def test_the_session_cache_is_forgotten_when_the_database_goes_away(
    pg_dsn: str, proxy: FaultProxy
) -> None:
    agent = Agent(name="A", instructions="")
    async with PostgresSessionStore(through(pg_dsn, proxy.port), options=FAST) as store:
        session = await store.get_or_create("s", agent)
        session.add_message(Message(role=Role.USER, content="hi"))
        await store.save(session)
        assert "s" in store._cache
        await proxy.cut()
        with pytest.raises(DatabaseUnavailableError):
            async with asyncio.timeout(10):
                await store.ping()
        # The server that answers next may be a promoted standby without the last commits.
        assert "s" not in store._cache
        await proxy.heal()


async def test_a_rollback_to_a_silent_server_ends_in_time(pg_dsn: str, proxy: FaultProxy) -> None:
    # The body fails on its own (not the database) after the network went silent: the
    # ROLLBACK that follows must not wait for an answer forever.
    async with PostgresSessionStore(through(pg_dsn, proxy.port), options=FAST) as store:
        await store.ping()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(LookupError):
            async with asyncio.timeout(10):
                async with store.transaction() as tx:
                    await tx.fetchall("SELECT 1")
                    proxy.silence()
                    raise LookupError("the caller's own failure")
        assert loop.time() - started < 6
        await proxy.heal()
        await store.ping()
