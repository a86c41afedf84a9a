"""Inbox owners on SQLite: rows name the process that accepted or recovered them, recovery
can leave live owners' rows alone, and the commit stays unfenced (one process per file)."""

from __future__ import annotations

import pytest

from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.inbox import Inbox
from bot.gateway.instances import InstanceRegistry, Owner
from tests.fakes.clock import FakeClock
from tests.gateway.conftest import EventFactory


async def owners(store: SQLiteSessionStore) -> dict[str, str | None]:
    async with store.transaction() as tx:
        rows = await tx.fetchall("SELECT message_id, owner_instance FROM chatflow_inbox")
    return {str(m): o for m, o in rows}


async def test_rows_carry_their_owner_and_change_it_when_recovered(
    store: SQLiteSessionStore, make_event: EventFactory, clock: FakeClock
) -> None:
    a = Inbox(store, owner="a", clock=clock)
    b = Inbox(store, owner="b", clock=clock)
    await a.accept(make_event("telegram:1:1"), session_key="k", session_id="telegram-1")
    await b.accept(make_event("telegram:1:2"), session_key="k", session_id="telegram-1")
    assert await owners(store) == {"telegram:1:1": "a", "telegram:1:2": "b"}

    # b is the only live process: it takes a's row, and only that one.
    (entry,) = await b.recover(3600, live_owners={"b"})
    assert entry.event.message_id == "telegram:1:1"
    assert await owners(store) == {"telegram:1:1": "b", "telegram:1:2": "b"}
    assert await b.recover(3600, live_owners={"b"}) == []
    # Without a live set (start-up on SQLite) every received row comes back.
    assert {e.event.message_id for e in await a.recover(3600)} == {"telegram:1:1", "telegram:1:2"}


async def test_sqlite_commits_are_not_fenced(
    store: SQLiteSessionStore, make_event: EventFactory
) -> None:
    a, b = Inbox(store, owner="a"), Inbox(store, owner="b")
    await a.accept(make_event("telegram:1:1"), session_key="k", session_id="telegram-1")
    async with store.transaction() as tx:
        assert await b.mark_done_in(tx, "telegram:1:1")  # one process per file: no takeover
    async with store.transaction() as tx:
        assert not await a.mark_done_in(tx, "telegram:1:1")


def test_the_registry_is_for_postgres_only(store: SQLiteSessionStore) -> None:
    with pytest.raises(ValueError, match="PostgreSQL"):
        InstanceRegistry(store, owner=Owner(1, "x"))
