"""The inbound journal: dedup claim + row in one transaction, recovery, poison, pruning."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import SchemaVersionError, StorageError
from bot.gateway.events import MessageEvent, SessionSource
from bot.gateway.inbox import (
    GAVE_UP_ERROR,
    MAX_RECOVERIES,
    Inbox,
    InboxEntry,
    event_from_dict,
    event_to_dict,
)
from bot.gateway.keys import build_session_key, session_id_for
from tests.fakes.clock import FakeClock

from .conftest import EventFactory, build_event

SECRET = b"k" * 32


def _route(event: MessageEvent) -> dict[str, str]:
    key = build_session_key(event.source, secret=SECRET)
    return {"session_key": key, "session_id": session_id_for(key)}


async def _rows(store: SQLiteSessionStore) -> dict[str, tuple[str, str | None, int]]:
    async with store.transaction() as tx:
        rows = await tx.fetchall("SELECT message_id, state, error, attempts FROM chatflow_inbox")
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


async def _close(
    store: SQLiteSessionStore, inbox: Inbox, message_id: str, error: str | None = None
) -> bool:
    """Mark a message done in a transaction of its own, as a turn's tx 2 does."""
    async with store.transaction() as tx:
        return await inbox.mark_done_in(tx, message_id, error)


@pytest.fixture
async def inbox(store: SQLiteSessionStore, clock: FakeClock) -> Inbox:
    made = Inbox(store, clock=clock)
    await made.open()
    return made


# -- schema -------------------------------------------------------------------


async def test_open_is_idempotent_and_versioned(store: SQLiteSessionStore) -> None:
    inbox = Inbox(store)
    await inbox.open()
    await inbox.open()
    async with store.transaction() as tx:
        rows = await tx.fetchall(
            "SELECT version FROM chatflow_schema_versions WHERE component = 'inbox'"
        )
        indexes = await tx.fetchall("PRAGMA index_list(chatflow_inbox)")
    assert rows == [(3,)]  # 2 added the owner column, 3 the receipt's trace context
    assert any("state_received" in str(ix[1]) for ix in indexes)


async def test_a_newer_schema_is_refused(store: SQLiteSessionStore) -> None:
    await Inbox(store).open()
    async with store.transaction() as tx:
        await tx.execute(
            "UPDATE chatflow_schema_versions SET version = 99 WHERE component = 'inbox'"
        )
    with pytest.raises(SchemaVersionError):
        await Inbox(store).open()


# -- event round trip ---------------------------------------------------------------

texts = st.text(max_size=50)
opt = st.none() | st.text(min_size=1, max_size=20)


@settings(max_examples=50)
@given(
    text=texts,
    thread=opt,
    reply=opt,
    command=opt,
    chat_type=st.sampled_from(["dm", "group", "channel"]),
    flags=st.tuples(st.booleans(), st.booleans()),
    when=st.datetimes(timezones=st.just(UTC)),
)
def test_event_round_trips_without_raw(
    text: str,
    thread: str | None,
    reply: str | None,
    command: str | None,
    chat_type: str,
    flags: tuple[bool, bool],
    when: datetime,
) -> None:
    source = SessionSource("whatsapp", "5511", chat_type, "5511", thread_id=thread)  # type: ignore[arg-type]
    event = build_event(
        "wamid.X",
        source=source,
        text=text,
        reply_to_id=reply,
        command=command,
        mentions_bot=flags[0],
        replies_to_bot=flags[1],
        timestamp=when,
        raw={"secret": "payload"},
    )
    data = event_to_dict(event)
    assert "raw" not in data
    back = event_from_dict(json.loads(json.dumps(data)))
    assert back == event
    assert back.raw == {}


def test_event_from_dict_ignores_unknown_keys() -> None:
    data = event_to_dict(build_event())
    data["future_field"] = 1
    data["source"]["future_source_field"] = 2
    assert event_from_dict(data) == build_event()


# -- accept -------------------------------------------------------------------------


async def test_accept_once_then_duplicate(
    inbox: Inbox, store: SQLiteSessionStore, make_event: EventFactory
) -> None:
    event = make_event()
    assert await inbox.accept(event, **_route(event)) is True
    assert await inbox.accept(event, **_route(event)) is False
    assert await _rows(store) == {event.message_id: ("received", None, 0)}
    assert await store.is_message_processed(event.message_id)


async def test_concurrent_accepts_of_one_message_yield_one_true(
    inbox: Inbox, make_event: EventFactory
) -> None:
    event = make_event()
    results = await asyncio.gather(*(inbox.accept(event, **_route(event)) for _ in range(5)))
    assert sorted(results) == [False, False, False, False, True]


async def test_accepts_through_two_connections_yield_one_true(
    tmp_path: Path, clock: FakeClock, make_event: EventFactory
) -> None:
    stores = [SQLiteSessionStore(tmp_path / "shared.db", clock=clock) for _ in range(2)]
    try:
        inboxes = [Inbox(s) for s in stores]
        for ib in inboxes:
            await ib.open()
        event = make_event()
        results = await asyncio.gather(
            *(ib.accept(event, **_route(event)) for ib in inboxes for _ in range(3))
        )
        assert results.count(True) == 1
    finally:
        for s in stores:
            await s.close()


async def test_an_existing_row_still_counts_as_duplicate_after_the_claim_expired(
    inbox: Inbox, store: SQLiteSessionStore, clock: FakeClock, make_event: EventFactory
) -> None:
    event = make_event()
    assert await inbox.accept(event, **_route(event))
    clock.advance(days=9)  # past the 8-day dedup TTL, row not pruned yet
    assert not await store.is_message_processed(event.message_id)
    assert await inbox.accept(event, **_route(event)) is False


async def test_accept_raises_when_storage_fails(
    inbox: Inbox, store: SQLiteSessionStore, make_event: EventFactory
) -> None:
    await store.close()
    with pytest.raises(StorageError):
        await inbox.accept(make_event(), **_route(make_event()))


async def test_accept_opens_the_table_lazily(
    store: SQLiteSessionStore, make_event: EventFactory
) -> None:
    event = make_event()
    assert await Inbox(store).accept(event, **_route(event))


# -- done ---------------------------------------------------------------------------


async def test_mark_done_in_commits_with_the_turn(
    inbox: Inbox, store: SQLiteSessionStore, make_event: EventFactory
) -> None:
    event = make_event()
    await inbox.accept(event, **_route(event))
    async with store.transaction() as tx:
        assert await inbox.mark_done_in(tx, event.message_id)
    assert (await _rows(store))[event.message_id][0] == "done"
    assert await inbox.recover(3600) == []


async def test_mark_done_in_rolls_back_with_the_turn(
    inbox: Inbox, store: SQLiteSessionStore, make_event: EventFactory
) -> None:
    event = make_event()
    await inbox.accept(event, **_route(event))
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await inbox.mark_done_in(tx, event.message_id)
            raise RuntimeError("the save failed")
    assert (await _rows(store))[event.message_id][0] == "received"
    assert [e.event for e in await inbox.recover(3600)] == [event]


async def test_mark_done_in_records_an_error(
    inbox: Inbox, store: SQLiteSessionStore, make_event: EventFactory
) -> None:
    event = make_event()
    await inbox.accept(event, **_route(event))
    assert await _close(store, inbox, event.message_id, error="ModelError")
    assert await _close(store, inbox, event.message_id) is False  # already done
    assert (await _rows(store))[event.message_id] == ("done", "ModelError", 0)


# -- recover ------------------------------------------------------------------------


async def test_recover_returns_fresh_rows_oldest_first_and_expires_old_ones(
    inbox: Inbox,
    store: SQLiteSessionStore,
    clock: FakeClock,
    make_event: EventFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = make_event("telegram:42:1", text="very private old text")
    await inbox.accept(old, **_route(old))
    clock.advance(minutes=20)
    first = make_event("telegram:42:2", text="first")
    await inbox.accept(first, **_route(first))
    clock.advance(minutes=1)
    second = make_event("telegram:42:3", text="second")
    await inbox.accept(second, **_route(second))
    clock.advance(minutes=1)

    with caplog.at_level(logging.DEBUG, logger="bot.gateway.inbox"):
        entries = await inbox.recover(freshness_seconds=600)

    assert [e.event for e in entries] == [first, second]
    assert entries[0] == InboxEntry(
        event=first,
        session_key=_route(first)["session_key"],
        session_id=_route(first)["session_id"],
        received_at=datetime(2025, 1, 1, 12, 20, tzinfo=UTC),
        attempts=0,
    )
    rows = await _rows(store)
    assert rows[old.message_id][0] == "expired"
    # waiting in the queue when the process died counts nothing against a message
    assert rows[first.message_id] == ("received", None, 0)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings, "expiry must be logged"
    assert "private" not in caplog.text and "telegram:42:1" not in caplog.text


async def test_recover_never_expires_a_lasting_row_however_old(
    inbox: Inbox, store: SQLiteSessionStore, clock: FakeClock, make_event: EventFactory
) -> None:
    # An approval decided while no bot ran (``python -m bot approvals approve``): the
    # person's yes is carried out when the bot comes back, even hours later.
    decided = make_event("approval:0a1b2c3d4e5f", text="")
    message = make_event("telegram:42:1", text="hello")
    for event in (decided, message):
        await inbox.accept(event, **_route(event))
    clock.advance(hours=5)

    entries = await inbox.recover(freshness_seconds=3600, lasting=("approval:",))

    assert [e.event for e in entries] == [decided]
    rows = await _rows(store)
    assert rows[message.message_id][0] == "expired"


async def test_a_message_that_keeps_crashing_while_alone_is_given_up(
    inbox: Inbox,
    store: SQLiteSessionStore,
    make_event: EventFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    poison = make_event("telegram:42:1")
    bystander = make_event("telegram:42:2")
    for event in (poison, bystander):
        await inbox.accept(event, **_route(event))
    for crashes in range(MAX_RECOVERIES):
        entries = await inbox.recover(3600)
        assert [(e.attempts, e.gave_up) for e in entries] == [(crashes, False), (0, False)]
        await inbox.mark_started_alone(poison.message_id)  # ...and the process dies
    with caplog.at_level(logging.WARNING, logger="bot.gateway.inbox"):
        entries = await inbox.recover(3600)
    assert [(e.event, e.gave_up) for e in entries] == [(poison, True), (bystander, False)]
    assert "apology" in caplog.text
    assert poison.message_id not in caplog.text
    # the gateway closes it (with its apology) in the same way as any failed turn
    await _close(store, inbox, poison.message_id, error=GAVE_UP_ERROR)
    assert (await _rows(store))[poison.message_id] == ("done", GAVE_UP_ERROR, MAX_RECOVERIES)


async def test_an_unreadable_row_is_closed_not_crashed_on(
    inbox: Inbox, store: SQLiteSessionStore, make_event: EventFactory
) -> None:
    event = make_event()
    await inbox.accept(event, **_route(event))
    async with store.transaction() as tx:
        await tx.execute("UPDATE chatflow_inbox SET event_json = '{not json'")
    assert await inbox.recover(3600) == []
    assert (await _rows(store))[event.message_id][:2] == ("done", "unreadable inbox row")


async def test_recovered_rows_survive_a_restart(
    tmp_path: Path, clock: FakeClock, make_event: EventFactory
) -> None:
    path = tmp_path / "restart.db"
    first = SQLiteSessionStore(path, clock=clock)
    event = make_event(text="¿sigues ahí?", raw={"dropped": True})
    await Inbox(first).accept(event, **_route(event))
    await first.close()  # the process dies before tx 2

    second = SQLiteSessionStore(path, clock=clock)
    try:
        entries = await Inbox(second, clock=clock).recover(3600)
    finally:
        await second.close()
    assert [e.event for e in entries] == [event]
    assert entries[0].event.raw == {}


# -- prune --------------------------------------------------------------------------


async def test_prune_deletes_only_old_settled_rows(
    inbox: Inbox, store: SQLiteSessionStore, clock: FakeClock, make_event: EventFactory
) -> None:
    done, expired, waiting = (make_event(f"telegram:42:{i}") for i in (1, 2, 3))
    for e in (done, expired, waiting):
        await inbox.accept(e, **_route(e))
    await _close(store, inbox, done.message_id)
    clock.advance(hours=2)
    await inbox.recover(60)  # expires all 'received' rows
    fresh = make_event("telegram:42:4")
    await inbox.accept(fresh, **_route(fresh))
    await _close(store, inbox, fresh.message_id)
    async with store.transaction() as tx:
        await tx.execute(
            "UPDATE chatflow_inbox SET state = 'received' WHERE message_id = ?",
            (waiting.message_id,),
        )
    clock.advance(days=7)
    assert await inbox.prune() == 2
    states = {message_id: row[0] for message_id, row in (await _rows(store)).items()}
    assert states == {waiting.message_id: "received", fresh.message_id: "done"}


async def test_prune_works_through_large_backlogs_in_batches(
    inbox: Inbox, store: SQLiteSessionStore, clock: FakeClock
) -> None:
    then = clock().timestamp()
    async with store.transaction() as tx:
        await tx.executemany(
            "INSERT INTO chatflow_inbox (message_id, platform, session_key, session_id, "
            "event_json, state, attempts, received_at, updated_at) "
            "VALUES (?, 'telegram', 'k', 's', '{}', 'done', 0, ?, ?)",
            [(f"m{i}", then, then) for i in range(1234)],
        )
    clock.advance(days=8)
    assert await inbox.prune() == 1234
    assert await _rows(store) == {}
