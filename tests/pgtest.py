"""PostgreSQL for tests: the server ``scripts/with-postgres.sh`` starts, one schema per test.

``CHATFLOW_TEST_DATABASE_URL`` names the test database. Unset, the PostgreSQL
tests are skipped locally; in CI (``CI`` set) they fail instead, so a CI run
can never pass by skipping them. Each test gets a schema of its own (a random
name, dropped afterwards) and a DSN whose ``search_path`` points at it, so
tests never see each other's rows.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import pytest

DSN_ENV = "CHATFLOW_TEST_DATABASE_URL"


def pg_test_dsn() -> str:
    """The test database URL; skips the test (fails it in CI) when it is not set."""
    dsn = os.environ.get(DSN_ENV, "").strip()
    if dsn:
        return dsn
    if os.environ.get("CI"):
        pytest.fail(f"{DSN_ENV} is not set in CI: .ci/run starts PostgreSQL for these tests")
    pytest.skip(f"{DSN_ENV} is not set (scripts/with-postgres.sh or `make test-pg` sets it)")


def with_search_path(dsn: str, schema: str) -> str:
    """``dsn`` with ``search_path`` set to ``schema`` (asyncpg passes it as a server setting)."""
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "search_path"]
    query.append(("search_path", schema))
    return urlunsplit(parts._replace(query=urlencode(query)))


@asynccontextmanager
async def fresh_schema(dsn: str | None = None) -> AsyncIterator[str]:
    """A new empty schema for the block; yields a DSN that uses it, drops it afterwards."""
    base = dsn or pg_test_dsn()
    schema = "t_" + secrets.token_hex(6)
    conn = await asyncpg.connect(base)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}")
    finally:
        await conn.close()
    try:
        yield with_search_path(base, schema)
    finally:
        conn = await asyncpg.connect(base)
        try:
            # Sessions still connected to the schema (a killed bot's) must not block the drop.
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")
        finally:
            await conn.close()


@pytest.fixture
async def pg_dsn() -> AsyncIterator[str]:
    """A DSN on a fresh schema of the test database."""
    async with fresh_schema() as dsn:
        yield dsn


async def wait_until(predicate: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    """Re-check ``predicate`` until it holds, failing after ``within`` seconds.

    For state only the database server knows (a lock waiter, an expired lease),
    which no event in this process announces.
    """
    async with asyncio.timeout(within):
        while not await predicate():  # noqa: ASYNC110 - server state: nothing to await on
            await asyncio.sleep(0.02)
