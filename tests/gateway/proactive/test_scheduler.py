"""Scheduled messages through the gateway: written in tx 2, fired once, late, dropped, repeated."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot import scheduling_tools
from bot.config import Settings
from bot.core.agent import Agent
from bot.core.messages import Role
from bot.core.models.scripted import ScriptedModel
from bot.core.runner import Runner
from bot.core.scheduling import JobRoute, ScheduleRequest, apply_in
from bot.core.stores.base import TransactionalStore
from bot.core.stores.postgres import PostgresSessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.gateway import Gateway
from bot.gateway.inbox import Inbox, InboxEntry
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import Obligation
from bot.gateway.proactive.scheduler import Scheduler
from bot.metrics import Metrics
from tests.fakes.adapter import FakeAdapter, make_event
from tests.fakes.clock import FakeClock
from tests.gateway.conftest import SECRET
from tests.gateway.ledger.ledger_support import dead_owner
from tests.pgtest import pg_dsn

__all__ = ["pg_dsn"]

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
T0 = NOW.timestamp()
ROUTE = JobRoute("agent:main:fake:dm:k1", "s-1", "fake", "chat-1", "7")


@dataclass
class Rig:
    gateway: Gateway
    adapter: FakeAdapter
    store: SQLiteSessionStore
    clock: FakeClock


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    clock = FakeClock(NOW)
    store = SQLiteSessionStore(tmp_path / "chatflow.db", clock=clock)
    model = ScriptedModel(
        [
            ScriptedModel.call(
                "schedule_message", text="Reminder: your table at 8 (chat 999)", delay_seconds=60
            ),
            ScriptedModel.reply("Done, I will remind you in a minute."),
        ]
    )
    agent = Agent(name="Helper", instructions="x", tools=[*scheduling_tools])
    adapter = FakeAdapter()
    gateway = Gateway(
        Runner(agent, store, model=model),
        store,
        [adapter],
        Settings(data_dir=tmp_path),
        secret=SECRET,
    )
    await gateway.start()
    await gateway.wait_ready()
    try:
        yield Rig(gateway, adapter, store, clock)
    finally:
        await gateway.stop(grace=1)
        await store.close()


async def jobs(store: TransactionalStore) -> list[tuple[Any, ...]]:
    async with store.transaction() as tx:
        return await tx.fetchall(
            "SELECT platform, chat_id, thread_id, text, state, due_at, fired_count "
            "FROM chatflow_scheduled_jobs ORDER BY id"
        )


async def test_a_turn_schedules_into_its_own_chat_and_the_message_goes_out_once(
    rig: Rig,
) -> None:
    event = make_event("remind me in a minute", chat_id="chat-1", thread_id="7")
    assert await rig.adapter.deliver(event)
    (answer,) = await rig.adapter.wait_for_sent(1)
    assert answer.text == "Done, I will remind you in a minute."
    # The route is the inbound message's: an id the model wrote in the text changes nothing.
    text = "Reminder: your table at 8 (chat 999)"
    assert await jobs(rig.store) == [("fake", "chat-1", "7", text, "scheduled", T0 + 60, 0)]
    rig.gateway.scheduler.wake()
    assert await rig.gateway.scheduler.fire_due() == 0  # not due yet
    rig.clock.advance(seconds=61)
    rig.gateway.scheduler.wake()
    sent = await rig.adapter.wait_for_sent(2)
    assert (sent[1].chat_id, sent[1].thread_id, sent[1].text) == ("chat-1", "7", text)
    assert await rig.gateway.scheduler.fire_due() == 0
    assert [row[4:] for row in await jobs(rig.store)] == [("fired", T0 + 60, 1)]
    assert await rig.gateway._dispatcher.drain(5)
    assert len(rig.adapter.sent) == 2
    assert b"chatflow_scheduled_fired_total 1.0" in rig.gateway.metrics.render()


async def test_a_sent_reminder_joins_its_conversation_once_as_the_agents_message(
    rig: Rig,
) -> None:
    """The model (and the console) must know what the bot said on its own: the text is
    in the history, once, even when a second pass finds the job already fired."""
    event = make_event("remind me in a minute", chat_id="chat-1", thread_id="7")
    assert await rig.adapter.deliver(event)
    await rig.adapter.wait_for_sent(1)
    assert await rig.gateway._dispatcher.drain(5)
    (job,) = await jobs(rig.store)
    rig.clock.advance(seconds=61)
    scheduler = rig.gateway.scheduler
    assert await scheduler.fire_due() == 1
    assert await scheduler._fire("any", T0 + 60) is None  # nothing to claim: no history
    await rig.adapter.wait_for_sent(2)
    session_ids = await rig.store.list_sessions()
    (session,) = [await rig.store.get(sid) for sid in session_ids]
    assert session is not None
    said = [(m.role, m.content, m.agent) for m in session.history if m.content == job[3]]
    assert said == [(Role.MODEL, job[3], "Helper")]


async def test_a_rolled_back_turn_schedules_nothing(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "chatflow.db")
    # The model schedules, then answers with nothing: the turn fails and rolls back.
    model = ScriptedModel(
        [
            ScriptedModel.call("schedule_message", text="never", delay_seconds=5),
            ScriptedModel.reply(""),
        ]
    )
    agent = Agent(name="Helper", instructions="x", tools=[*scheduling_tools])
    adapter = FakeAdapter()
    gateway = Gateway(
        Runner(agent, store, model=model),
        store,
        [adapter],
        Settings(data_dir=tmp_path),
        secret=SECRET,
    )
    await gateway.start()
    await gateway.wait_ready()
    try:
        assert await adapter.deliver(make_event("remind me"))
        (apology,) = await adapter.wait_for_sent(1)
        assert apology.text == gateway.replies.apology
        assert await jobs(store) == []
    finally:
        await gateway.stop(grace=1)
        await store.close()


def scheduler_on(store: TransactionalStore, fired: list[Obligation], **kwargs: Any) -> Scheduler:
    return Scheduler(
        store,
        DeliveryLedger(store),
        Metrics(),
        max_lateness=kwargs.pop("max_lateness", 3600.0),
        on_fired=fired.extend,
        **kwargs,
    )


async def add_job(store: TransactionalStore, due_at: float, cron: str | None = None) -> None:
    async with store.transaction() as tx:
        await apply_in(tx, [ScheduleRequest("job_1", "Water the plants", due_at, cron)], ROUTE, T0)


@pytest.fixture
async def clocked(tmp_path: Path) -> AsyncIterator[tuple[SQLiteSessionStore, FakeClock]]:
    clock = FakeClock(NOW)
    store = SQLiteSessionStore(tmp_path / "chatflow.db", clock=clock)
    await store.open()
    yield store, clock
    await store.close()


async def test_a_job_late_within_the_limit_fires_once(
    clocked: tuple[SQLiteSessionStore, FakeClock],
) -> None:
    store, clock = clocked
    fired: list[Obligation] = []
    await add_job(store, T0 + 60)
    clock.advance(seconds=3000)  # the bot was down
    scheduler = scheduler_on(store, fired)
    assert await scheduler.fire_due() == 1
    assert await scheduler_on(store, fired).fire_due() == 0  # a second process: nothing
    (obligation,) = fired
    assert obligation.content == "Water the plants"
    assert (obligation.chat_id, obligation.thread_id) == ("chat-1", "7")
    assert obligation.message_ref == f"schedule:job_1@{T0 + 60!r}"


async def test_a_job_too_late_is_dropped_and_counted(
    clocked: tuple[SQLiteSessionStore, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    store, clock = clocked
    await add_job(store, T0 + 60)
    clock.advance(seconds=3600 + 61)
    fired: list[Obligation] = []
    scheduler = scheduler_on(store, fired)
    with caplog.at_level("INFO", logger="bot.gateway.proactive.scheduler"):
        assert await scheduler.fire_due() == 0
    assert fired == []
    assert [row[4] for row in await jobs(store)] == ["dropped"]
    assert b"chatflow_scheduled_dropped_total 1.0" in scheduler._metrics.render()
    (line,) = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert "job_1" in line and "Water" not in line and "chat-1" not in line


async def test_a_repeat_follows_the_schedule_not_the_late_fire_time(
    clocked: tuple[SQLiteSessionStore, FakeClock],
) -> None:
    store, clock = clocked
    daily = datetime(2026, 3, 2, 9, 0, tzinfo=UTC).timestamp()
    await add_job(store, daily, cron="0 9 * * *")
    clock.now = datetime(2026, 3, 2, 9, 47, 13, tzinfo=UTC)  # 47 minutes late
    fired: list[Obligation] = []
    scheduler = scheduler_on(store, fired)
    assert await scheduler.fire_due() == 1
    assert [row[4:] for row in await jobs(store)] == [("scheduled", daily + 86400, 1)]
    clock.now = datetime(2026, 3, 3, 9, 0, tzinfo=UTC)
    assert await scheduler.fire_due() == 1
    assert len({o.obligation_id for o in fired}) == 2  # one per occurrence
    # Down for three days: the missed runs are not sent, the next one is on the grid.
    clock.now = datetime(2026, 3, 7, 10, 30, tzinfo=UTC)
    assert await scheduler.fire_due() == 0
    next_due = datetime(2026, 3, 8, 9, 0, tzinfo=UTC).timestamp()
    assert [row[4:] for row in await jobs(store)] == [("scheduled", next_due, 2)]


async def test_the_loop_fires_a_due_job_and_stops(
    clocked: tuple[SQLiteSessionStore, FakeClock],
) -> None:
    store, _ = clocked
    await add_job(store, T0)
    got = asyncio.Event()
    fired: list[Obligation] = []

    def on_fired(owed: list[Obligation]) -> None:
        fired.extend(owed)
        got.set()

    scheduler = Scheduler(
        store, DeliveryLedger(store), Metrics(), max_lateness=60, on_fired=on_fired
    )
    stopping = asyncio.Event()
    task = asyncio.create_task(scheduler.run(stopping))
    try:
        async with asyncio.timeout(5):
            await got.wait()
    finally:
        stopping.set()
        async with asyncio.timeout(5):
            await task
    assert len(fired) == 1


async def test_two_processes_on_postgres_fire_a_due_job_once(pg_dsn: str) -> None:
    clock = FakeClock(NOW)
    first = PostgresSessionStore(pg_dsn, clock=clock)
    second = PostgresSessionStore(pg_dsn, clock=clock)
    async with first, second:
        await add_job(first, T0 - 5)
        fired: list[Obligation] = []
        counts = await asyncio.gather(
            *(scheduler_on(s, fired).fire_due() for s in (first, second, first, second))
        )
        assert sum(counts) == 1 and len(fired) == 1
        async with first.transaction() as tx:
            rows = await tx.fetchall(
                "SELECT content FROM chatflow_delivery_obligations WHERE message_ref LIKE ?",
                ("schedule:%",),
            )
        assert rows == [("Water the plants",)]
        assert [row[4:] for row in await jobs(second)] == [("fired", T0 - 5, 1)]


async def test_a_job_fired_by_a_process_that_died_before_sending_is_sent_once_at_start(
    tmp_path: Path,
) -> None:
    store = SQLiteSessionStore(tmp_path / "chatflow.db")
    await add_job(store, T0)
    async with store.transaction() as tx:  # due a minute ago, by the real clock
        await tx.execute("UPDATE chatflow_scheduled_jobs SET due_at = ?", (time.time() - 60,))
    fired: list[Obligation] = []
    dead = Scheduler(
        store,
        DeliveryLedger(store, owner=dead_owner()),
        Metrics(),
        max_lateness=3600,
        on_fired=fired.extend,
    )
    assert await dead.fire_due() == 1  # claimed and owed: then the process "died"
    model = ScriptedModel([])
    adapter = FakeAdapter(name="fake")
    gateway = Gateway(
        Runner(Agent(name="A", instructions="x"), store, model=model),
        store,
        [adapter],
        Settings(data_dir=tmp_path),
        secret=SECRET,
    )
    await gateway.start()
    try:
        await gateway.wait_ready()
        (sent,) = await adapter.wait_for_sent(1)
        assert (sent.chat_id, sent.thread_id, sent.text) == ("chat-1", "7", "Water the plants")
        assert await gateway.scheduler.fire_due() == 0
        assert await gateway._dispatcher.drain(5)
        assert len(adapter.sent) == 1
    finally:
        await gateway.stop(grace=1)
        await store.close()


async def inbox_rows(store: TransactionalStore) -> list[tuple[Any, ...]]:
    async with store.transaction() as tx:
        return await tx.fetchall(
            "SELECT message_id, session_key, session_id, state FROM chatflow_inbox "
            "ORDER BY received_at, message_id"
        )


def last_prompt(model: ScriptedModel) -> str:
    return str(model.requests[-1].messages[-1].content)


async def test_a_run_agent_job_runs_one_marked_turn_in_its_session_and_is_answered_once(
    tmp_path: Path,
) -> None:
    clock = FakeClock(NOW)
    store = SQLiteSessionStore(tmp_path / "chatflow.db", clock=clock)
    model = ScriptedModel(
        [
            ScriptedModel.call(
                "schedule_message", text="Ask how the exam went", delay_seconds=60, run_agent=True
            ),
            ScriptedModel.reply("Good luck! I will ask you later."),
            ScriptedModel.reply("So, how did the exam go?"),
        ]
    )
    agent = Agent(name="Helper", instructions="x", tools=[*scheduling_tools])
    adapter = FakeAdapter()
    gateway = Gateway(
        Runner(agent, store, model=model),
        store,
        [adapter],
        Settings(data_dir=tmp_path),
        secret=SECRET,
    )
    await gateway.start()
    await gateway.wait_ready()
    try:
        assert await adapter.deliver(make_event("exam today", chat_id="chat-1", thread_id="7"))
        await adapter.wait_for_sent(1)
        ((_, session_key, session_id, _),) = await inbox_rows(store)
        clock.advance(seconds=61)
        gateway.scheduler.wake()
        sent = await adapter.wait_for_sent(2)
        assert (sent[1].chat_id, sent[1].thread_id, sent[1].text) == (
            "chat-1",
            "7",
            "So, how did the exam go?",
        )
        # The model reads the job's text as its own reminder, not as the user's words.
        assert last_prompt(model) == "[Scheduled reminder] Ask how the exam went"
        job_ref = f"schedule:{(await jobs_ids(store))[0]}@{T0 + 60!r}"
        assert (await inbox_rows(store))[1] == (job_ref, session_key, session_id, "done")
        event = await gateway.inbox.journaled_event(job_ref)
        assert event is not None and event.scheduled
        assert await gateway._dispatcher.drain(5)
        # A replay of the claim (the job row read as still due) is a duplicate.
        async with store.transaction() as tx:
            await tx.execute(
                "UPDATE chatflow_scheduled_jobs SET state = 'scheduled', due_at = ?", (T0 + 60,)
            )
        assert await gateway.scheduler.fire_due() == 0
        assert await gateway._dispatcher.drain(5)
        assert len(adapter.sent) == 2
        assert len(await inbox_rows(store)) == 2
        async with store.transaction() as tx:
            owed = await tx.fetchall(
                "SELECT content FROM chatflow_delivery_obligations WHERE message_ref = ?",
                (job_ref,),
            )
        assert owed == [("So, how did the exam go?",)]
    finally:
        await gateway.stop(grace=1)
        await store.close()


async def jobs_ids(store: TransactionalStore) -> list[str]:
    async with store.transaction() as tx:
        return [str(r[0]) for r in await tx.fetchall("SELECT id FROM chatflow_scheduled_jobs")]


async def test_a_run_agent_job_claimed_before_a_crash_is_run_from_the_journal_once(
    tmp_path: Path,
) -> None:
    store = SQLiteSessionStore(tmp_path / "chatflow.db")
    await store.open()
    async with store.transaction() as tx:  # due a minute ago, by the real clock
        request = ScheduleRequest("job_1", "Water the plants", time.time() - 60, run_agent=True)
        await apply_in(tx, [request], ROUTE, T0)
    turns: list[InboxEntry] = []
    owed: list[Obligation] = []
    dead = Scheduler(
        store,
        DeliveryLedger(store, owner=dead_owner()),
        Metrics(),
        max_lateness=3600,
        on_fired=owed.extend,
        inbox=Inbox(store, owner="dead-process"),
        on_turns=turns.extend,
    )
    assert await dead.fire_due() == 1  # claimed and journaled: then the process "died"
    assert owed == [] and turns[0].session_id == ROUTE.session_id
    model = ScriptedModel([ScriptedModel.reply("Time to water the plants!")])
    adapter = FakeAdapter(name="fake")
    # Pairing mode would refuse a stranger: a scheduled turn is nobody's message.
    settings = Settings(data_dir=tmp_path, access_mode="pairing")
    gateway = Gateway(
        Runner(Agent(name="A", instructions="x"), store, model=model),
        store,
        [adapter],
        settings,
        secret=SECRET,
    )
    await gateway.start()
    try:
        await gateway.wait_ready()
        (sent,) = await adapter.wait_for_sent(1)
        assert (sent.chat_id, sent.thread_id, sent.text) == (
            "chat-1",
            "7",
            "Time to water the plants!",
        )
        assert last_prompt(model) == "[Scheduled reminder] Water the plants"
        assert await gateway.scheduler.fire_due() == 0
        assert await gateway._dispatcher.drain(5)
        assert len(adapter.sent) == 1
        ((_, session_key, session_id, state),) = await inbox_rows(store)
        assert (session_key, session_id, state) == (ROUTE.session_key, ROUTE.session_id, "done")
        assert await store.get(ROUTE.session_id) is not None  # the job's session, not a new one
    finally:
        await gateway.stop(grace=1)
        await store.close()
