"""SQLiteSessionStore specifics: persistence, schema, O(changes) saves, outbox transactions."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from pathlib import Path

import pytest

from bot.core.agent import Agent
from bot.core.messages import Message, Role, ToolCall
from bot.core.sql import Transaction
from bot.core.stores import sqlite as sqlite_store
from bot.core.stores.base import SessionDeletedError
from bot.core.stores.sqlite import SCHEMA_VERSION, SQLiteSessionStore
from bot.core.stores.sqlite_writer import SQLiteWriter
from bot.errors import SchemaVersionError, StorageError
from tests.fakes.clock import FakeClock


def user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


def reply(text: str) -> Message:
    return Message(role=Role.MODEL, content=text)


async def count(store: SQLiteSessionStore, sql: str, *params: object) -> int:
    async with store.transaction() as tx:
        row = await tx.fetchone(sql, params)
    assert row is not None
    return int(row[0])


async def changes(writer: SQLiteWriter) -> int:
    """Rows the writer's connection changed since it opened (read on its thread)."""
    total: int = await writer.call(lambda conn: conn.total_changes)
    return total


# -- construction ------------------------------------------------------------------------


def test_unknown_keyword_is_a_type_error(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        SQLiteSessionStore(db_path=tmp_path / "a.db", busy_timeout=5000)  # type: ignore[call-arg]


@pytest.mark.parametrize("bad", [0, -1], ids=["zero", "negative"])
def test_default_max_turns_must_be_positive(tmp_path: Path, bad: int) -> None:
    with pytest.raises(ValueError):
        SQLiteSessionStore(tmp_path / "a.db", default_max_turns=bad)


def test_db_path_property(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "a.db")
    assert store.db_path == str(tmp_path / "a.db")


# -- persistence -------------------------------------------------------------------------


async def test_survives_close_and_reopen(tmp_path: Path, agent: Agent) -> None:
    billing = Agent(name="Billing", instructions="Billing specialist")
    path = tmp_path / "nested" / "dir" / "chatflow.db"  # parents are created
    async with SQLiteSessionStore(path, default_max_turns=30) as store:
        session = await store.get_or_create("s-101", agent, {"channel": "telegram"})
        session.add_message(Message(role=Role.SYSTEM, content="be kind"))
        session.add_message(user("refund please"))
        session.add_message(
            Message(role=Role.MODEL, tool_calls=[ToolCall(id="c1", name="transfer_to_billing")])
        )
        session.add_message(Message(role=Role.TOOL, tool_call_id="c1", content="Billing"))
        session.active_agent = billing
        session.metadata["tier"] = {"level": 2, "tags": ["vip"]}
        await store.save(session)
        expected = session.history

    reopened = SQLiteSessionStore(path)
    try:
        reopened.set_agent_resolver({"Billing": billing, "Support": agent}.get)
        loaded = await reopened.get("s-101")
        assert loaded is not None
        assert loaded.history == expected
        assert loaded.active_agent is billing
        assert loaded.metadata == {"channel": "telegram", "tier": {"level": 2, "tags": ["vip"]}}
        assert loaded.max_turns == 40
    finally:
        await reopened.close()


async def test_unknown_agent_loads_a_placeholder(
    tmp_path: Path, agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "a.db"
    async with SQLiteSessionStore(path) as store:
        session = await store.get_or_create("s", agent)
        session.active_agent = Agent(name="Billing", instructions="secret instructions")
        session.add_message(user("my card number is 4111"))
        await store.save(session)
    async with SQLiteSessionStore(path) as store:
        store.set_agent_resolver(lambda name: None)
        with caplog.at_level(logging.DEBUG, logger="bot.core.stores.base"):
            loaded = await store.get("s")
    assert loaded is not None
    assert loaded.active_agent.name == "Billing"
    assert loaded.active_agent.tools == ()
    assert loaded.active_agent.instructions == ""
    # DEBUG only: the Runner says at INFO where the conversation goes (N11).
    noted = [r for r in caplog.records if r.name == "bot.core.stores.base"]
    assert [r.levelno for r in noted] == [logging.DEBUG] and "Billing" in noted[0].getMessage()
    assert "4111" not in caplog.text


async def test_get_or_create_falls_back_to_the_default_agent_of_that_name(
    sqlite_file_store: SQLiteSessionStore, agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    await sqlite_file_store.get_or_create("s", agent)
    with caplog.at_level(logging.WARNING):
        loaded = await sqlite_file_store.get_or_create("s", agent)
    assert loaded.active_agent is agent
    assert not caplog.records


@pytest.mark.parametrize(
    "target",
    [":memory:", "file:chatflow-test-shared?mode=memory&cache=shared"],
    ids=["memory", "memory-uri"],
)
async def test_memory_databases_work(target: str, agent: Agent) -> None:
    async with SQLiteSessionStore(target) as store:
        session = await store.get_or_create("s", agent)
        session.add_message(user("hi"))
        await store.save(session)
        loaded = await store.get_or_create("s", agent)
        assert [m.content for m in loaded.history] == ["hi"]
        assert await store.claim_message("m")
        async with store.transaction() as tx:
            assert await tx.fetchone("PRAGMA journal_mode") == ("memory",)


async def test_file_database_uses_wal_and_foreign_keys(
    sqlite_file_store: SQLiteSessionStore,
) -> None:
    async with sqlite_file_store.transaction() as tx:
        assert await tx.fetchone("PRAGMA journal_mode") == ("wal",)
        assert await tx.fetchone("PRAGMA foreign_keys") == (1,)
        assert await tx.fetchone("PRAGMA user_version") == (SCHEMA_VERSION,)
        assert await tx.fetchone("PRAGMA busy_timeout") == (sqlite_store.BUSY_TIMEOUT_MS,)


async def test_corrupt_message_rows_are_skipped_and_cleaned(
    sqlite_file_store: SQLiteSessionStore, agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    store = sqlite_file_store
    session = await store.get_or_create("s", agent)
    session.add_message(user("first"))
    session.add_message(reply("second"))
    await store.save(session)
    async with store.transaction() as tx:
        changed = await tx.execute(
            "UPDATE chatflow_messages SET message_json = ? WHERE session_id = ? AND seq = ?",
            ('{"role": "model", "content": "private text', "s", 1),
        )
        assert changed == 1

    with caplog.at_level(logging.WARNING, logger="bot.core.stores.sqlite"):
        loaded = await store.get_or_create("s", agent)
    assert [m.content for m in loaded.history] == ["first"]
    assert "unreadable message" in caplog.text
    assert "private text" not in caplog.text

    loaded.add_message(user("third"))
    await store.save(loaded)
    assert await count(store, "SELECT COUNT(*) FROM chatflow_messages") == 2


# -- schema ------------------------------------------------------------------------------


async def test_newer_schema_is_refused(tmp_path: Path, agent: Agent) -> None:
    path = tmp_path / "future.db"
    await asyncio.to_thread(_write_user_version, path, SCHEMA_VERSION + 1)
    store = SQLiteSessionStore(path)
    with pytest.raises(SchemaVersionError, match="newer"):
        await store.get_or_create("s", agent)
    await store.close()


async def test_foreign_chatflow_tables_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "legacy.db"
    await asyncio.to_thread(_write_legacy_schema, path)
    store = SQLiteSessionStore(path)
    with pytest.raises(SchemaVersionError, match="another program"):
        await store.open()
    await store.close()


def _write_user_version(path: Path, version: int) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {version}")
    conn.close()


def _write_legacy_schema(path: Path) -> None:
    # The chatflow-agent 0.3.x layout: no seq column, user_version 1.
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE chatflow_messages (id INTEGER PRIMARY KEY, session_id TEXT, "
            "role TEXT, content TEXT, message_json TEXT, created_at TIMESTAMP)"
        )
        conn.execute("PRAGMA user_version = 1")
    conn.close()


async def test_migration_runs_once(tmp_path: Path, agent: Agent) -> None:
    path = tmp_path / "a.db"
    for _ in range(2):
        async with SQLiteSessionStore(path) as store:
            await store.get_or_create("s", agent)
            assert await count(store, "PRAGMA user_version") == SCHEMA_VERSION
            assert await store.list_sessions() == ["s"]


# -- O(changes) saves --------------------------------------------------------------------


async def test_save_touches_only_changed_rows(tmp_path: Path, agent: Agent) -> None:
    async with SQLiteSessionStore(tmp_path / "big.db", default_max_turns=500) as store:
        session = await store.get_or_create("s", agent)
        for i in range(500):
            session.add_message(user(f"u{i}"))
            session.add_message(reply(f"r{i}"))
        await store.save(session)
        assert await count(store, "SELECT COUNT(*) FROM chatflow_messages") == 1000

        conn = store._conn
        assert conn is not None
        statements: list[str] = []
        await conn.set_trace_callback(statements.append)

        before = await changes(conn)
        session.add_message(user("one more"))  # window full: the oldest turn is pruned
        await store.save(session)
        # 1 insert + 2 deleted rows + 1 session row update.
        assert await changes(conn) - before == 4
        writes = [s for s in statements if s.lstrip().split()[0] in ("INSERT", "DELETE", "UPDATE")]
        assert len(writes) == 3

        statements.clear()
        before = await changes(conn)
        session.add_message(reply("short answer"))  # nothing pruned
        await store.save(session)
        assert await changes(conn) - before == 2
        await conn.set_trace_callback(None)

    async with SQLiteSessionStore(tmp_path / "big.db", default_max_turns=500) as store:
        loaded = await store.get_or_create("s", agent)
        assert loaded.history == session.history
        assert await count(store, "SELECT COUNT(*) FROM chatflow_messages") == 1000


# -- transactions and the outbox hook ----------------------------------------------------


async def _create_outbox(store: SQLiteSessionStore) -> None:
    async with store.transaction() as tx:
        await tx.execute("CREATE TABLE outbox (session_id TEXT, body TEXT)")


async def test_save_hook_commits_with_the_session(
    sqlite_file_store: SQLiteSessionStore, agent: Agent
) -> None:
    store = sqlite_file_store
    await _create_outbox(store)
    session = await store.get_or_create("s", agent)
    session.add_message(user("q"))
    session.add_message(reply("a"))

    async def hook(tx: Transaction) -> None:
        # The session's rows are already written in this same transaction.
        row = await tx.fetchone("SELECT COUNT(*) FROM chatflow_messages WHERE session_id = 's'")
        assert row == (2,)
        await tx.execute("INSERT INTO outbox VALUES (?, ?)", ("s", "a"))

    await store.save(session, also=hook)
    assert await count(store, "SELECT COUNT(*) FROM outbox") == 1
    assert await count(store, "SELECT COUNT(*) FROM chatflow_messages") == 2


async def test_failing_hook_commits_nothing(
    sqlite_file_store: SQLiteSessionStore, agent: Agent, clock: FakeClock
) -> None:
    store = sqlite_file_store
    await _create_outbox(store)
    session = await store.get_or_create("s", agent)
    session.add_message(user("q0"))
    await store.save(session)
    updated_before = await _updated_at(store)

    clock.advance(seconds=5)
    session.add_message(user("q1"))
    session.metadata["turns"] = 2

    async def failing_hook(tx: Transaction) -> None:
        await tx.execute("INSERT INTO outbox VALUES (?, ?)", ("s", "lost"))
        raise RuntimeError("ledger exploded")

    with pytest.raises(RuntimeError, match="ledger exploded"):
        await store.save(session, also=failing_hook)
    assert await count(store, "SELECT COUNT(*) FROM outbox") == 0
    assert await count(store, "SELECT COUNT(*) FROM chatflow_messages") == 1
    assert await _updated_at(store) == updated_before

    async def bad_sql(tx: Transaction) -> None:
        await tx.execute("INSERT INTO no_such_table VALUES (1)")

    with pytest.raises(StorageError) as info:
        await store.save(session, also=bad_sql)
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)

    # The session still knows what is unsaved: a plain save writes it once.
    await store.save(session)
    loaded = await store.get_or_create("s", agent)
    assert [m.content for m in loaded.history] == ["q0", "q1"]
    assert loaded.metadata == {"turns": 2}
    assert await count(store, "SELECT COUNT(*) FROM chatflow_messages") == 2


async def _updated_at(store: SQLiteSessionStore) -> str:
    async with store.transaction() as tx:
        row = await tx.fetchone("SELECT updated_at FROM chatflow_sessions WHERE session_id = 's'")
    assert row is not None
    return str(row[0])


async def test_transaction_rolls_back_on_error(sqlite_file_store: SQLiteSessionStore) -> None:
    store = sqlite_file_store
    await _create_outbox(store)
    with pytest.raises(KeyError):
        async with store.transaction() as tx:
            await tx.execute("INSERT INTO outbox VALUES ('s', 'x')")
            assert await store.claim_in(tx, "wamid.1")
            raise KeyError("boom")
    assert await count(store, "SELECT COUNT(*) FROM outbox") == 0
    assert await store.claim_message("wamid.1")  # the claim was rolled back too


async def test_claim_in_shares_the_callers_transaction(
    sqlite_file_store: SQLiteSessionStore,
) -> None:
    store = sqlite_file_store
    await _create_outbox(store)
    async with store.transaction() as tx:
        assert await store.claim_in(tx, "wamid.2")
        assert not await store.claim_in(tx, "wamid.2")
        await tx.executemany("INSERT INTO outbox VALUES (?, ?)", [("s", "1"), ("s", "2")])
        rows = await tx.fetchall("SELECT body FROM outbox ORDER BY body")
        assert rows == [("1",), ("2",)]
    assert not await store.claim_message("wamid.2")


async def test_transaction_object_dies_with_its_block(
    sqlite_file_store: SQLiteSessionStore,
) -> None:
    async with sqlite_file_store.transaction() as tx:
        pass
    with pytest.raises(StorageError, match="ended"):
        await tx.execute("SELECT 1")


async def test_reentrant_use_raises_instead_of_deadlocking(
    sqlite_file_store: SQLiteSessionStore,
) -> None:
    async with sqlite_file_store.transaction():
        with pytest.raises(StorageError, match="inside its own transaction"):
            await sqlite_file_store.get("s")  # same task: would deadlock


async def test_tasks_started_inside_a_transaction_may_use_the_store_later(
    sqlite_file_store: SQLiteSessionStore, agent: Agent
) -> None:
    async with sqlite_file_store.transaction():
        later = asyncio.create_task(sqlite_file_store.get_or_create("s", agent))
    session = await asyncio.wait_for(later, timeout=5)
    assert session.session_id == "s"


async def test_cancelled_commit_still_updates_the_session(
    sqlite_file_store: SQLiteSessionStore, agent: Agent
) -> None:
    store = sqlite_file_store
    session = await store.get_or_create("s", agent)
    conn = store._conn
    assert conn is not None
    loop = asyncio.get_running_loop()
    at_commit = asyncio.Event()
    proceed = threading.Event()

    def trace(sql: str) -> None:  # runs on the store's database thread
        if sql.strip().upper() == "COMMIT" and not proceed.is_set():
            loop.call_soon_threadsafe(at_commit.set)
            proceed.wait(5)

    await conn.set_trace_callback(trace)
    session.add_message(user("q"))
    saving = asyncio.create_task(store.save(session))
    try:
        await at_commit.wait()
        saving.cancel()
        await asyncio.sleep(0)
    finally:
        proceed.set()
    with pytest.raises(asyncio.CancelledError):
        await saving
    await conn.set_trace_callback(None)

    # The commit went through and the context knows it: the next save adds only "a".
    session.add_message(reply("a"))
    await store.save(session)
    loaded = await store.get_or_create("s", agent)
    assert [m.content for m in loaded.history] == ["q", "a"]


async def test_closed_store_refuses_work(tmp_path: Path, agent: Agent) -> None:
    store = SQLiteSessionStore(tmp_path / "a.db")
    await store.get_or_create("s", agent)
    await store.close()
    await store.close()
    with pytest.raises(StorageError, match="closed"):
        await store.get("s")


@pytest.mark.parametrize("as_uri", [False, True], ids=["path", "uri"])
async def test_unopenable_path_is_a_storage_error(tmp_path: Path, as_uri: bool) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    target = str(blocker / "x.db")
    store = SQLiteSessionStore(f"file:{target}?mode=rw" if as_uri else target)
    with pytest.raises(StorageError):
        await store.open()
    await store.close()


# -- two store instances on one file (one process) ---------------------------------------


async def test_two_instances_share_session_locks(tmp_path: Path, agent: Agent) -> None:
    path = tmp_path / "shared.db"
    async with SQLiteSessionStore(path) as one, SQLiteSessionStore(path) as two:
        await one.get_or_create("s", agent)
        inside_one = asyncio.Event()
        release_one = asyncio.Event()
        inside_two = asyncio.Event()

        async def first() -> None:
            async with one.session_lock("s"):
                inside_one.set()
                session = await one.get_or_create("s", agent)
                session.add_message(user("one"))
                await release_one.wait()
                await one.save(session)

        async def second() -> None:
            async with two.session_lock("s"):
                inside_two.set()
                session = await two.get_or_create("s", agent)
                session.add_message(user("two"))
                await two.save(session)

        task_one = asyncio.create_task(first())
        await inside_one.wait()
        task_two = asyncio.create_task(second())
        try:
            for _ in range(20):
                await asyncio.sleep(0)
            assert not inside_two.is_set()
        finally:
            release_one.set()
            results = await asyncio.gather(task_one, task_two, return_exceptions=True)
        assert list(results) == [None, None]
        loaded = await one.get_or_create("s", agent)
        assert [m.content for m in loaded.history] == ["one", "two"]
    assert len(sqlite_store._SHARED_SESSION_LOCKS) == 0


async def test_claims_across_instances_have_one_winner(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    async with SQLiteSessionStore(path) as one, SQLiteSessionStore(path) as two:
        results = await asyncio.gather(
            *(store.claim_message("wamid.Z") for store in [one, two] * 25)
        )
    assert results.count(True) == 1


async def test_deletion_by_another_instance_is_detected(tmp_path: Path, agent: Agent) -> None:
    path = tmp_path / "shared.db"
    async with SQLiteSessionStore(path) as one, SQLiteSessionStore(path) as two:
        held = await one.get_or_create("s", agent)
        held.add_message(user("q"))
        await one.save(held)

        assert await two.delete("s")
        held.add_message(user("after delete"))
        with pytest.raises(SessionDeletedError):
            await one.save(held)
        assert held.deleted

        recreated_held = await one.get_or_create("s2", agent)
        assert await two.delete("s2")
        await two.get_or_create("s2", agent)  # a new session under the same id
        recreated_held.add_message(user("stale"))
        with pytest.raises(SessionDeletedError):
            await one.save(recreated_held)
        loaded = await two.get_or_create("s2", agent)
        assert loaded.history == []


async def test_cascade_removes_message_rows(
    sqlite_file_store: SQLiteSessionStore, agent: Agent
) -> None:
    store = sqlite_file_store
    for sid in ("keep", "drop"):
        session = await store.get_or_create(sid, agent)
        session.add_message(user(sid))
        session.add_message(reply(sid))
        await store.save(session)
    assert await store.delete("drop")
    assert await count(store, "SELECT COUNT(*) FROM chatflow_messages") == 2
    assert (
        await count(store, "SELECT COUNT(*) FROM chatflow_messages WHERE session_id = 'drop'") == 0
    )
