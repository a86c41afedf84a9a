"""The console's read-only queries at scale, and its live stream."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from bot.console import queries
from bot.console.queries import inbox
from bot.console.sse import CHANGED, _changes
from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.takeover import Takeovers

SESSIONS = 100_000
STEP = 100
"""SQLite VM instructions per progress-handler call."""


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteSessionStore]:
    made = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
    await made.open()
    await Takeovers(made).open()
    await DeliveryLedger(made).open()
    await queries.open_schema(made)
    yield made
    await made.close()


async def test_a_deep_page_of_100000_sessions_reads_a_range_not_the_table(
    store: SQLiteSessionStore,
) -> None:
    rows = [
        (
            f"{'telegram' if n % 2 else 'whatsapp'}-{n:016x}",
            "Helper",
            '{"platform": "telegram", "chat_type": "dm"}',
            f"2026-01-01T00:00:{n % 60:02d}.{n:06d}+00:00",
            f"2026-01-{1 + n % 28:02d}T{n % 24:02d}:00:00.{n:06d}+00:00",
        )
        for n in range(SESSIONS)
    ]
    async with store.transaction() as tx:
        await tx.executemany(
            "INSERT INTO chatflow_sessions (session_id, active_agent_name, metadata_json, "
            "created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
            rows,
        )
        # Two messages each: a page that counted (or sorted) every session would show.
        await tx.executemany(
            "INSERT INTO chatflow_messages (session_id, seq, role, message_json, created_at) "
            'VALUES (?, ?, \'user\', \'{"role": "user", "content": "hi"}\', ?)',
            [(row[0], seq, row[3]) for row in rows for seq in (0, 1)],
        )
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(20):  # walk 20 pages in
        page, cursor = await queries.list_conversations(store, before=cursor)
        assert len(page) == queries.PAGE_SIZE and cursor is not None
        assert not seen & {r.session_id for r in page}
        seen |= {r.session_id for r in page}
    # Work is counted in SQLite's own VM steps (a progress handler on the store's
    # connection), not in seconds: the same on a busy machine as on an idle one.
    steps = [0]

    def count(conn: sqlite3.Connection, handler: Callable[[], int] | None) -> None:
        conn.set_progress_handler(handler, STEP)

    def tick() -> int:
        steps[0] += STEP
        return 0

    writer = store._conn
    assert writer is not None
    await writer.call(lambda conn: count(conn, tick))
    page, _ = await queries.list_conversations(store, before=cursor)
    filtered, _ = await queries.list_conversations(store, platform="whatsapp", before=cursor)
    await writer.call(lambda conn: count(conn, None))
    assert len(page) == len(filtered) == queries.PAGE_SIZE
    assert all(r.session_id.startswith("whatsapp-") for r in filtered)
    assert [r.last_activity for r in page] == sorted((r.last_activity for r in page), reverse=True)
    assert all(r.messages == 2 for r in page)
    # A page walks an index range; counting or sorting every session would take
    # at least one step per row, SESSIONS and more.
    assert steps[0] < SESSIONS, steps[0]


async def test_the_stream_says_changed_when_the_session_is_saved(
    store: SQLiteSessionStore,
) -> None:
    agent = Agent(name="Helper", instructions="x")
    session = await store.get_or_create("fake-0123456789abcdef", agent)
    session.add_message(Message(role=Role.USER, content="first"))
    await store.save(session)
    events: asyncio.Queue[str] = asyncio.Queue()

    async def read() -> None:
        async for chunk in _changes(store, "fake-0123456789abcdef", poll=0.02, lifetime=30):
            await events.put(chunk)

    reader = asyncio.create_task(read())
    try:
        assert await asyncio.wait_for(events.get(), 5) == "retry: 1000\n\n" + CHANGED
        session.add_message(Message(role=Role.USER, content="second"))
        await store.save(session)
        assert await asyncio.wait_for(events.get(), 5) == CHANGED
        await Takeovers(store).take_over("fake-0123456789abcdef")
        assert await asyncio.wait_for(events.get(), 5) == CHANGED
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def test_a_search_looks_through_a_bounded_window_and_continues(
    store: SQLiteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inbox, "SEARCH_WINDOW", 10)  # the list's page of the package
    agent = Agent(name="Helper", instructions="x")
    for n in range(30):
        session = await store.get_or_create(f"fake-{n:016x}", agent)
        text = "the NEEDLE" if n in (3, 4) else f"hay {n}"
        session.add_message(Message(role=Role.USER, content=text))
        await store.save(session)
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        rows, cursor = await queries.list_conversations(store, search="needle", before=cursor)
        pages.append([r.session_id for r in rows])
        if cursor is None:
            break
    # Newest first: sessions 29..20, 19..10, then 9..0 where the needles are.
    assert pages == [[], [], ["fake-0000000000000004", "fake-0000000000000003"]]


async def test_a_takeover_the_agent_asked_for_is_highlighted(store: SQLiteSessionStore) -> None:
    agent = Agent(name="Helper", instructions="x")
    session = await store.get_or_create("fake-0123456789abcdef", agent)
    session.add_message(Message(role=Role.USER, content="a person please"))
    await store.save(session)
    takeovers = Takeovers(store)
    async with store.transaction() as tx:
        await takeovers.take_over_in(tx, "fake-0123456789abcdef", "wants a refund")
    row = await queries.conversation(store, "fake-0123456789abcdef")
    assert row is not None and row.taken_over and row.requested == "wants a refund"
    await takeovers.hand_back("fake-0123456789abcdef")
    await takeovers.take_over("fake-0123456789abcdef")
    row = await queries.conversation(store, "fake-0123456789abcdef")
    assert row is not None and row.taken_over and row.requested is None


async def test_the_terminal_conversation_is_not_called_you(store: SQLiteSessionStore) -> None:
    # N19: titled "you" (the terminal's name for its user) beside "You: ..." previews of
    # the operator's own messages: two people called "you".
    agent = Agent(name="Helper", instructions="x")
    metadata = {"platform": "console", "chat_type": "dm", "sender_name": "you"}
    session = await store.get_or_create("console-0123456789abcdef", agent, metadata)
    session.add_message(Message(role=Role.USER, content="hi"))
    await store.save(session)
    row = await queries.conversation(store, "console-0123456789abcdef")
    assert row is not None and row.title == "Terminal user"
