"""On PostgreSQL: takeover state and sign-outs shared by processes, and the console's queries.

Two stores on one database stand for two processes. Skipped without
``CHATFLOW_TEST_DATABASE_URL`` (failed in CI): ``scripts/with-postgres.sh`` sets it.
"""

from __future__ import annotations

from pathlib import Path

from bot.config import Settings
from bot.console import queries
from bot.console.auth import ConsoleAuth, Principal
from bot.console.guard import Guard
from bot.console.sessions import ConsoleSessions
from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.models.scripted import ScriptedModel
from bot.core.runner import Runner
from bot.core.stores.postgres import PostgresSessionStore
from bot.gateway.gateway import Gateway
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.takeover import OperatorDesk, Takeovers
from tests.console.conftest import SECRET
from tests.fakes.adapter import FakeAdapter, make_event
from tests.pgtest import pg_dsn

__all__ = ["pg_dsn"]


async def test_takeover_is_shared_by_processes_and_the_queries_run(pg_dsn: str) -> None:
    one, two = PostgresSessionStore(pg_dsn), PostgresSessionStore(pg_dsn)
    await one.open()
    await two.open()
    now = [0.0]
    try:
        await DeliveryLedger(one).open()
        await queries.open_schema(one)  # what the console does when it starts
        writer = Takeovers(one)
        reader = Takeovers(two, refresh_seconds=2.0, clock=lambda: now[0])
        agent = Agent(name="Helper", instructions="x")
        for n, text in enumerate(("hello 100%_ sure", "other words")):
            session = await one.get_or_create(f"telegram-{n:016x}", agent, {"platform": "telegram"})
            session.add_message(Message(role=Role.USER, content=text))
            await one.save(session)

        assert not await reader.is_taken_over("telegram-0000000000000000")
        assert await writer.take_over("telegram-0000000000000000")
        now[0] = 2.0
        assert await reader.is_taken_over("telegram-0000000000000000")

        rows, cursor = await queries.list_conversations(two, platform="telegram", limit=1)
        assert len(rows) == 1 and cursor is not None
        more, _ = await queries.list_conversations(two, before=cursor)
        assert {rows[0].session_id, more[0].session_id} == {
            "telegram-0000000000000000",
            "telegram-0000000000000001",
        }
        found, _ = await queries.list_conversations(two, search="100%_ SURE")
        assert [(r.session_id, r.taken_over, r.messages) for r in found] == [
            ("telegram-0000000000000000", True, 1)
        ]
        assert await queries.list_conversations(two, search="100%x") == ([], None)
        items = await queries.transcript(two, "telegram-0000000000000000")
        assert [i.message.content for i in items] == ["hello 100%_ sure"]
        version, taken, owed = await queries.recent_changes(two, "telegram-0000000000000000", 0.0)
        assert version is not None and taken == 1 and owed[0] == 0
        assert await queries.ledger_counts(two) == dict.fromkeys(queries.UNDELIVERED, 0)
        assert await queries.ledger_rows(two) == []

        assert await writer.hand_back("telegram-0000000000000000")
        now[0] = 4.0
        assert not await reader.is_taken_over("telegram-0000000000000000")
    finally:
        await one.close()
        await two.close()


async def test_takeover_and_an_operator_reply_on_postgres_across_two_gateways(
    pg_dsn: str, tmp_path: Path
) -> None:
    """Process A's operator takes over; process B's next message starts no turn."""
    made: list[tuple[Gateway, PostgresSessionStore]] = []

    async def gateway(adapter: FakeAdapter, model: ScriptedModel) -> Gateway:
        store = PostgresSessionStore(pg_dsn)
        await store.open()
        runner = Runner(Agent(name="Helper", instructions="x"), store, model=model)
        started = Gateway(runner, store, [adapter], Settings(data_dir=tmp_path), secret=SECRET)
        made.append((started, store))
        await started.start()
        await started.wait_ready()
        return started

    try:
        adapter_a, model_a = FakeAdapter(), ScriptedModel([ScriptedModel.reply("hi")])
        adapter_b, model_b = FakeAdapter(), ScriptedModel()
        a = await gateway(adapter_a, model_a)
        b = await gateway(adapter_b, model_b)
        b.turns.takeovers = Takeovers(b.store, refresh_seconds=0.0)  # no 2 s wait here
        assert await adapter_a.deliver(make_event("hello", message_id="fake:chat-1:1"))
        await adapter_a.wait_for_sent(1)
        (session_id,) = await a.store.list_sessions()
        await a.turns.takeovers.take_over(session_id)

        assert await adapter_b.deliver(make_event("a person?", message_id="fake:chat-1:2"))
        assert await b._dispatcher.drain(5)
        assert model_b.requests == [] and adapter_b.sent == []

        # The inbox reads the same on both: waiting, two unread until one opens it.
        await queries.open_schema(a.store)
        (waiting,) = await queries.needing_a_person(b.store)
        assert (waiting.session_id, waiting.state, waiting.unread) == (session_id, "waiting", 2)
        await queries.mark_read(a.store, session_id)
        (row,), _ = await queries.list_conversations(b.store)
        assert row.unread == 0 and row.preview == "a person?"

        desk = OperatorDesk(a.store, a.ledger, a.outbox, a.adapters)
        assert await desk.reply(session_id, "Yes, a person.", nonce="e" * 32)
        sent = await adapter_a.wait_for_sent(2)
        assert sent[1].text == "Yes, a person."
        answered = await queries.conversation(b.store, session_id)
        assert answered is not None and answered.state == "human"
        session = await b.store.get(session_id)
        assert session is not None
        assert [m.content for m in session.history] == [
            "hello",
            "hi",
            "a person?",
            "Yes, a person.",
        ]
    finally:
        for started, store in made:
            await started.stop(grace=1)
            await store.close()


async def test_a_sign_out_in_one_process_ends_the_session_in_every_process(pg_dsn: str) -> None:
    one, two = PostgresSessionStore(pg_dsn), PostgresSessionStore(pg_dsn)
    await one.open()
    await two.open()
    try:
        auth = ConsoleAuth("console-token-for-tests-0123456789", SECRET)
        first = Guard(auth, "/console", ConsoleSessions(one))
        second = Guard(auth, "/console", ConsoleSessions(two))
        cookie = await first.sign_in()
        session = auth.session_of(cookie)
        assert session is not None
        assert await second.sessions.active(session)  # signed in on one, valid on both
        await second.sign_out(Principal(session=session))
        assert not await first.sessions.active(session)
        assert not await second.sessions.active(session)
    finally:
        await one.close()
        await two.close()
