"""Stores on SQLite and PostgreSQL for the access-control tests, on one hand-moved clock.

``databases`` is parametrised over both databases: each call of the factory it
yields opens one more store on the same database (think: a restart, or a second
process), all on the test's ``FakeClock``. The PostgreSQL case skips without
``CHATFLOW_TEST_DATABASE_URL`` (and fails in CI), like every PostgreSQL test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from bot.core.stores.base import TransactionalStore
from bot.core.stores.sqlite import SQLiteSessionStore
from tests.fakes.clock import FakeClock
from tests.pgtest import fresh_schema

StoreFactory = Callable[[], Awaitable[TransactionalStore]]


@pytest.fixture(params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="pg")])
async def databases(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[StoreFactory]:
    """A factory of stores on one database (SQLite file or fresh PostgreSQL schema)."""
    async with AsyncExitStack() as stack:
        if request.param == "sqlite":
            path = tmp_path / "chatflow.db"

            async def make() -> TransactionalStore:
                store = SQLiteSessionStore(path, clock=clock)
                await stack.enter_async_context(store)
                return store

        else:
            from bot.core.stores.postgres import PostgresSessionStore

            dsn = await stack.enter_async_context(fresh_schema())

            async def make() -> TransactionalStore:
                store = PostgresSessionStore(dsn, clock=clock)
                await stack.enter_async_context(store)
                return store

        yield make
