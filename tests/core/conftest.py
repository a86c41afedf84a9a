"""Shared fixtures for the session-layer tests: a controllable clock and every store kind."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from bot.core.agent import Agent
from bot.core.stores.base import BaseSessionStore
from bot.core.stores.in_memory import SessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from tests.fakes.clock import FakeClock
from tests.pgtest import fresh_schema

STORE_KINDS = ("memory", "sqlite-file", "sqlite-memory", "postgres")


StoreFactory = Callable[..., BaseSessionStore]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def agent() -> Agent:
    return Agent(name="Support", instructions="Help the user.")


@pytest.fixture(params=STORE_KINDS)
async def store_factory(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[StoreFactory]:
    """Builds stores of the parametrised kind (sharing one file for sqlite-file, one schema
    for postgres); closes them."""
    kind: str = request.param
    made: list[BaseSessionStore] = []
    async with AsyncExitStack() as stack:
        dsn = await stack.enter_async_context(fresh_schema()) if kind == "postgres" else ""

        def make(**kwargs: Any) -> BaseSessionStore:
            kwargs.setdefault("clock", clock)
            store: BaseSessionStore
            if kind == "memory":
                store = SessionStore(**kwargs)
            elif kind == "sqlite-file":
                store = SQLiteSessionStore(tmp_path / "chatflow.db", **kwargs)
            elif kind == "postgres":
                from bot.core.stores.postgres import PostgresSessionStore

                store = PostgresSessionStore(dsn, **kwargs)
            else:
                store = SQLiteSessionStore(":memory:", **kwargs)
            made.append(store)
            return store

        yield make
        for store in made:
            await store.close()


@pytest.fixture
def store(store_factory: StoreFactory) -> BaseSessionStore:
    return store_factory()


@pytest.fixture
async def sqlite_file_store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[SQLiteSessionStore]:
    store = SQLiteSessionStore(tmp_path / "chatflow.db", clock=clock)
    yield store
    await store.close()
