"""Scheduled jobs that must not hurt anyone else (issue #36): a job that cannot be fired is set
aside alone (G1), a locked conversation delays only its own jobs (G8), a ``run_agent`` job is
charged to and stopped by its owner's budget (G3), revoked owners, ``/reset`` and removals
cancel jobs (G4), and scheduled posts give way to replies in a group's send window (G7)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot import scheduling_tools
from bot.config import Settings
from bot.core.agent import Agent
from bot.core.ids import log_session_id
from bot.core.models.base import Usage
from bot.core.models.scripted import ScriptedModel
from bot.core.runner import Runner
from bot.core.scheduling import JobRoute, ScheduleRequest, apply_in
from bot.core.stores.base import TransactionalStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.usage import ensure_usage_schema_in, record_usage_in
from bot.errors import StorageError
from bot.gateway.access.control import budget_notice
from bot.gateway.access.gate import Gate
from bot.gateway.access.pairing import Pairing
from bot.gateway.access.rate_limits import sender_digest
from bot.gateway.accounting import TokenAccounting
from bot.gateway.aliases import ChatAliases
from bot.gateway.contract import ChatType, SendLimits
from bot.gateway.gateway import Gateway
from bot.gateway.inbox import Inbox, InboxEntry
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import Obligation
from bot.gateway.pacing import AccountPacer
from bot.gateway.proactive.jobs import cancel_jobs
from bot.gateway.proactive.scheduler import Scheduler
from bot.metrics import Metrics
from tests.fakes.adapter import FakeAdapter, make_event
from tests.fakes.clock import FakeClock
from tests.gateway.conftest import SECRET
from tests.pgtest import pg_dsn

__all__ = ["pg_dsn"]

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
T0 = NOW.timestamp()
OWNER = "owner-digest"


def route(n: int, sender: str | None = OWNER) -> JobRoute:
    return JobRoute(f"agent:main:fake:dm:k{n}", f"s-{n}", "fake", f"chat-{n}", None, sender)


async def add(store: TransactionalStore, n: int, *jobs: ScheduleRequest, **kw: Any) -> None:
    async with store.transaction() as tx:
        await apply_in(tx, list(jobs), route(n, **kw), T0)


async def states(store: TransactionalStore) -> dict[str, tuple[str, float, int]]:
    async with store.transaction() as tx:
        rows = await tx.fetchall(
            "SELECT id, state, due_at, fired_count FROM chatflow_scheduled_jobs"
        )
    return {str(r[0]): (str(r[1]), float(r[2]), int(r[3])) for r in rows}


@pytest.fixture
async def clocked(tmp_path: Path) -> AsyncIterator[tuple[SQLiteSessionStore, FakeClock]]:
    clock = FakeClock(NOW)
    store = SQLiteSessionStore(tmp_path / "chatflow.db", clock=clock)
    await store.open()
    yield store, clock
    await store.close()


def scheduler_on(store: TransactionalStore, fired: list[Obligation], **kwargs: Any) -> Scheduler:
    return Scheduler(
        store,
        DeliveryLedger(store),
        Metrics(),
        max_lateness=3600.0,
        on_fired=fired.extend,
        **kwargs,
    )


# -- G1: one job that cannot be fired holds up nobody -----------------------------------


async def test_a_job_whose_next_time_cannot_be_computed_is_set_aside_and_the_rest_go_out(
    clocked: tuple[SQLiteSessionStore, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    store, clock = clocked
    # Written as an older version (or a bug) might have: 30 February never comes.
    await add(store, 1, ScheduleRequest("job_early", "C: meeting now", T0 + 30))
    await add(
        store,
        2,
        ScheduleRequest("job_poison", "A: every 30 Feb", T0 + 60, "0 0 30 2 *"),
        ScheduleRequest("job_same_chat", "A: after the poison", T0 + 90),
    )
    await add(store, 3, ScheduleRequest("job_later", "B: train in 10 minutes", T0 + 120))
    clock.advance(seconds=180)
    fired: list[Obligation] = []
    scheduler = scheduler_on(store, fired)
    with caplog.at_level(logging.INFO, logger="bot.gateway.proactive.scheduler"):
        assert await scheduler.fire_due() == 3
    assert sorted(o.content for o in fired) == [
        "A: after the poison",
        "B: train in 10 minutes",
        "C: meeting now",
    ]
    jobs = await states(store)
    assert jobs["job_poison"][0] == "failed"
    assert {jobs[j][0] for j in ("job_early", "job_same_chat", "job_later")} == {"fired"}
    assert b"chatflow_scheduled_failed_total 1.0" in scheduler._metrics.render()
    (line,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "job_poison" in line.getMessage() and "every 30 Feb" not in line.getMessage()
    assert await scheduler.fire_due() == 0  # set aside for good: the next pass is quiet


async def test_the_loop_goes_on_past_a_job_that_cannot_be_fired(
    clocked: tuple[SQLiteSessionStore, FakeClock],
) -> None:
    store, _ = clocked
    await add(store, 1, ScheduleRequest("job_poison", "x", T0 - 10, "0 0 31 4 *"))
    await add(store, 2, ScheduleRequest("job_b", "B: reminder", T0 - 5))
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
        async with asyncio.timeout(10):
            await got.wait()
    finally:
        stopping.set()
        async with asyncio.timeout(5):
            await task
    assert [o.content for o in fired] == ["B: reminder"]


async def test_a_storage_error_is_not_the_jobs_fault_it_waits_and_fires_later(
    clocked: tuple[SQLiteSessionStore, FakeClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, clock = clocked
    await add(store, 1, ScheduleRequest("job_flaky", "A", T0 - 10))
    await add(store, 2, ScheduleRequest("job_b", "B", T0 - 5))
    fired: list[Obligation] = []
    scheduler = scheduler_on(store, fired)
    real = scheduler._fire
    failures = iter([StorageError("database is locked")])

    async def flaky(job_id: str, due_at: float) -> Any:
        if job_id == "job_flaky":
            for exc in failures:
                raise exc
        return await real(job_id, due_at)

    monkeypatch.setattr(scheduler, "_fire", flaky)
    assert await scheduler.fire_due() == 1
    assert [o.content for o in fired] == ["B"]
    assert (await states(store))["job_flaky"][0] == "scheduled"  # not set aside
    assert await scheduler.next_due() == T0 + scheduler.poll_seconds  # its conversation waits
    assert await scheduler.fire_due() == 0
    clock.advance(seconds=scheduler.poll_seconds)
    assert await scheduler.fire_due() == 1
    assert [o.content for o in fired] == ["B", "A"]


# -- G8: a locked conversation delays only its own jobs --------------------------------


async def test_a_conversation_held_by_a_slow_turn_does_not_delay_another_chats_reminder(
    clocked: tuple[SQLiteSessionStore, FakeClock],
) -> None:
    store, _ = clocked
    await add(store, 1, ScheduleRequest("job_a", "A: reminder", T0 - 20))
    await add(store, 2, ScheduleRequest("job_b", "B: your train leaves in 10 minutes", T0 - 10))
    sent: dict[str, asyncio.Event] = {"A: reminder": asyncio.Event()}
    sent["B: your train leaves in 10 minutes"] = asyncio.Event()

    def on_fired(owed: list[Obligation]) -> None:
        for obligation in owed:
            sent[obligation.content].set()

    scheduler = Scheduler(
        store, DeliveryLedger(store), Metrics(), max_lateness=3600, on_fired=on_fired
    )
    stopping = asyncio.Event()
    release = asyncio.Event()
    locked = asyncio.Event()

    async def slow_turn() -> None:  # chat A's turn: its lock held across a slow model call
        async with store.session_lock("s-1"):
            locked.set()
            await release.wait()

    turn = asyncio.create_task(slow_turn())
    await locked.wait()
    task = asyncio.create_task(scheduler.run(stopping))
    try:
        async with asyncio.timeout(10):
            await sent["B: your train leaves in 10 minutes"].wait()
        assert not sent["A: reminder"].is_set()  # A's own job waits for A's turn ...
        release.set()
        async with asyncio.timeout(10):
            await sent["A: reminder"].wait()  # ... and goes out once it ends
    finally:
        release.set()
        stopping.set()
        async with asyncio.timeout(5):
            await task
            await turn


# -- G3: a run_agent job's turn is its owner's, budget included --------------------------


async def spend(store: TransactionalStore, sender: str, tokens: int) -> None:
    async with store.transaction() as tx:
        await ensure_usage_schema_in(tx)
        await record_usage_in(
            tx,
            session_id="s-1",
            agent="Helper",
            kind="chat",
            model="gpt-test",
            usage=Usage(input_tokens=tokens),
            sender=sender,
            at=NOW,
        )


async def test_a_run_agent_job_is_charged_to_its_owner_and_skipped_once_they_are_over_budget(
    clocked: tuple[SQLiteSessionStore, FakeClock],
) -> None:
    store, clock = clocked
    accounting = TokenAccounting(store, Metrics(), secret=SECRET, max_tokens_per_day=500)
    await accounting.open()
    await add(
        store,
        1,
        ScheduleRequest("job_poem", "Write me a long poem", T0 + 10, "*/5 * * * *", True),
    )
    fired: list[Obligation] = []
    turns: list[InboxEntry] = []
    scheduler = scheduler_on(
        store,
        fired,
        inbox=Inbox(store),
        on_turns=turns.extend,
        accounting=accounting,
        budget_notice=budget_notice,
    )
    clock.advance(seconds=11)
    assert await scheduler.fire_due() == 1
    (entry,) = turns
    # Charged to the person who asked, not to nobody.
    assert entry.event.scheduled_by == OWNER
    assert accounting.sender_key(entry.event) == OWNER
    await spend(store, OWNER, 600)  # that turn was long
    clock.advance(seconds=300)
    assert await scheduler.fire_due() == 0
    assert len(turns) == 1  # no model turn for an owner over the budget
    (notice,) = fired
    assert notice.content == budget_notice() and notice.chat_id == "chat-1"
    state, due, count = (await states(store))["job_poem"]
    assert (state, count) == ("scheduled", 1)  # it repeats, skipping while they are over
    clock.advance(seconds=300)
    assert await scheduler.fire_due() == 0
    assert len(fired) == 1 and len(turns) == 1  # told once a day
    assert (await states(store))["job_poem"][1] > due
    assert b'chatflow_scheduled_skipped_total{reason="over budget"} 2.0' in (
        scheduler._metrics.render()
    )


# -- G4: revoked owners, /reset and removals cancel jobs -------------------------------


def reminder_model(*extra: Any) -> ScriptedModel:
    return ScriptedModel(
        [
            ScriptedModel.call("schedule_message", text="Summary time", delay_seconds=60),
            ScriptedModel.reply("I will send you a summary in a minute."),
            *extra,
        ]
    )


def gateway_on(
    store: SQLiteSessionStore, tmp_path: Path, model: ScriptedModel, **s: Any
) -> Gateway:
    agent = Agent(name="Helper", instructions="x", tools=[*scheduling_tools])
    return Gateway(
        Runner(agent, store, model=model),
        store,
        [FakeAdapter()],
        Settings(data_dir=tmp_path, **s),
        secret=SECRET,
    )


async def test_a_sender_taken_off_the_allow_list_gets_no_more_of_their_jobs(
    tmp_path: Path,
) -> None:
    clock = FakeClock(NOW)
    store = SQLiteSessionStore(tmp_path / "chatflow.db", clock=clock)
    first = gateway_on(store, tmp_path, reminder_model(), allowed_users="42")
    await first.start()
    await first.wait_ready()
    adapter = first.adapters["fake"]
    assert isinstance(adapter, FakeAdapter)
    try:
        assert await adapter.deliver(
            make_event("summary every minute", chat_id="42", sender_id="42")
        )
        await adapter.wait_for_sent(1)
    finally:
        await first.stop(grace=1)
    async with store.transaction() as tx:
        rows = await tx.fetchall("SELECT sender FROM chatflow_scheduled_jobs")
    assert rows == [(sender_digest("fake", "42", SECRET),)]  # a digest, never the raw id
    # The operator removes 42 and restarts.
    second = gateway_on(store, tmp_path, ScriptedModel([]), allowed_users="7")
    await second.start()
    await second.wait_ready()
    try:
        clock.advance(seconds=61)
        assert await second.scheduler.fire_due() == 0
        assert [s for s, *_ in (await states(store)).values()] == ["cancelled"]
        assert await second._dispatcher.drain(5)
        adapter = second.adapters["fake"]
        assert isinstance(adapter, FakeAdapter) and adapter.sent == []
        assert b'chatflow_scheduled_skipped_total{reason="no access"} 1.0' in (
            second.metrics.render()
        )
    finally:
        await second.stop(grace=1)
        await store.close()


async def test_reset_cancels_the_conversations_jobs_and_says_so(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "chatflow.db", clock=FakeClock(NOW))
    gateway = gateway_on(store, tmp_path, reminder_model())
    await gateway.start()
    await gateway.wait_ready()
    adapter = gateway.adapters["fake"]
    assert isinstance(adapter, FakeAdapter)
    try:
        assert await adapter.deliver(make_event("remind me"))
        await adapter.wait_for_sent(1)
        assert await adapter.deliver(make_event("/reset", command="reset"))
        sent = await adapter.wait_for_sent(2)
        assert sent[1].text == (
            f"{gateway.replies.reset} The 1 scheduled message(s) set in it are cancelled too."
        )
        assert [s for s, *_ in (await states(store)).values()] == ["cancelled"]
    finally:
        await gateway.stop(grace=1)
        await store.close()


async def test_pairing_revoke_cancels_the_revoked_senders_jobs_in_every_chat(
    clocked: tuple[SQLiteSessionStore, FakeClock],
) -> None:
    store, _ = clocked
    pairing = Pairing(store, secret=SECRET)
    await pairing.open()
    async with store.transaction() as tx:
        code, _ = await pairing.request_in(tx, "fake", "42")
    assert (await pairing.approve(code))[0] == "approved"
    revoked = sender_digest("fake", "42", SECRET)
    await add(store, 1, ScheduleRequest("job_dm", "x", T0 + 60), sender=revoked)
    await add(store, 2, ScheduleRequest("job_group", "y", T0 + 60), sender=revoked)
    await add(store, 3, ScheduleRequest("job_other", "z", T0 + 60), sender="someone else")
    assert await pairing.revoke("fake:42") == 1
    jobs = await states(store)
    assert {j: s for j, (s, *_) in jobs.items()} == {
        "job_dm": "cancelled",
        "job_group": "cancelled",
        "job_other": "scheduled",
    }


async def test_cancel_jobs_takes_a_conversation_or_a_sender_and_can_erase(
    clocked: tuple[SQLiteSessionStore, FakeClock],
) -> None:
    store, _ = clocked
    await add(store, 1, ScheduleRequest("job_1", "a", T0 + 60), ScheduleRequest("job_2", "b", T0))
    await add(store, 2, ScheduleRequest("job_3", "c", T0 + 60), sender="ana")
    async with store.transaction() as tx:
        await tx.execute("UPDATE chatflow_scheduled_jobs SET state = 'fired' WHERE id = 'job_2'")
    assert await cancel_jobs(store, platform="fake", sender="ana") == 1
    assert await cancel_jobs(store, platform="fake", sender="ana") == 0
    assert (await states(store))["job_3"][0] == "cancelled"
    # Erasing removes every row of the conversation, its texts and chat id with it.
    assert await cancel_jobs(store, session_id="s-1", erase=True) == 1
    assert set(await states(store)) == {"job_3"}
    with pytest.raises(ValueError, match="give session_id"):
        await cancel_jobs(store, sender="ana")


async def test_cancel_jobs_logs_the_conversation_hashed_never_its_raw_id(
    clocked: tuple[SQLiteSessionStore, FakeClock], caplog: pytest.LogCaptureFixture
) -> None:
    store, _ = clocked
    await add(store, 1, ScheduleRequest("job_1", "a", T0 + 60))
    with caplog.at_level(logging.INFO, logger="bot.gateway.proactive.jobs"):
        assert await cancel_jobs(store, session_id="s-1", why="reset") == 1
    (line,) = [r.getMessage() for r in caplog.records if "cancelled" in r.getMessage()]
    assert f"of session {log_session_id('s-1')} cancelled" in line  # hashed unless marked safe


async def test_the_owner_of_a_job_is_judged_as_their_own_message_would_be_now(
    clocked: tuple[SQLiteSessionStore, FakeClock],
) -> None:
    store, _ = clocked
    aliases = ChatAliases(store)
    await aliases.open()
    pairing = Pairing(store, secret=SECRET)
    await pairing.open()
    ana = sender_digest("telegram", "42", SECRET)

    def gate(**settings: Any) -> Gate:
        made = Settings(data_dir=Path("unused"), **settings)
        mode = made.effective_access_mode
        return Gate(made, aliases, SECRET, pairing=pairing if mode == "pairing" else None)

    async def admits(g: Gate, chat: str, kind: ChatType, who: str | None) -> bool:
        return await g.admits_owner("telegram", chat, kind, who)

    assert await admits(gate(), "-100", "group", ana)  # open
    listed = gate(allowed_users="42")
    assert await admits(listed, "-100", "group", ana)
    assert not await admits(listed, "-100", "group", sender_digest("telegram", "7", SECRET))
    assert await admits(listed, "42", "dm", None)  # an older job: the DM's chat is its owner
    assert not await admits(listed, "-100", "group", None)
    assert await admits(gate(allowed_chats="-100"), "-100", "group", None)
    paired = gate(access_mode="pairing")
    assert not await admits(paired, "42", "dm", ana)
    async with store.transaction() as tx:
        code, _ = await pairing.request_in(tx, "telegram", "42")
    await pairing.approve(code)
    assert await admits(paired, "42", "dm", ana)
    await pairing.revoke("telegram:42")
    assert not await admits(paired, "42", "dm", ana)  # read now: no cache to outlive it


async def test_members_of_a_group_share_one_count_through_the_gateway(tmp_path: Path) -> None:
    """G7 through the real turn: the tool reads the chat from the turn's session key."""
    store = SQLiteSessionStore(tmp_path / "chatflow.db", clock=FakeClock(NOW))
    twice = ScriptedModel.calls(
        ("schedule_message", {"text": "a", "delay_seconds": 60}),
        ("schedule_message", {"text": "b", "delay_seconds": 60}),
    )
    model = ScriptedModel(
        [
            twice,
            ScriptedModel.reply("two set"),
            ScriptedModel.call("schedule_message", text="c", delay_seconds=60),
            ScriptedModel.reply("sorry"),
        ]
    )
    gateway = gateway_on(store, tmp_path, model, max_scheduled_per_chat=2)
    await gateway.start()
    await gateway.wait_ready()
    adapter = gateway.adapters["fake"]
    assert isinstance(adapter, FakeAdapter)
    try:
        for n, member in enumerate(("ana", "bob"), start=1):
            event = make_event(
                "@bot remind us",
                chat_id="-100",
                chat_type="group",
                sender_id=member,
                mentions_bot=True,
            )
            assert await adapter.deliver(event)
            await adapter.wait_for_sent(n)
        refused = str(model.requests[-1].messages[-1].content)
        assert "already has 2 scheduled messages" in refused
        assert len(await states(store)) == 2
    finally:
        await gateway.stop(grace=1)
        await store.close()


# -- G7: scheduled posts give way to replies in a group's window ---------------------------


class SimClock:
    """Simulated time for several sleepers: ``run`` wakes them in time order."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + max(seconds, 0.0), next(self._seq), future))
        await future

    async def run(self, until: float) -> None:
        while True:
            for _ in range(20):  # let everything woken run until it sleeps again
                await asyncio.sleep(0)
            if not self._sleepers or self._sleepers[0][0] > until:
                return
            at, _, future = heapq.heappop(self._sleepers)
            self.now = max(self.now, at)
            future.set_result(None)


async def test_forty_scheduled_posts_a_minute_never_make_a_groups_replies_wait() -> None:
    """The review's G7 pacer simulation: 40 job posts a minute to one Telegram group and one
    member's reply each minute. Before, the reply waited 119 s after one minute and 672 s
    after ten; now it goes within seconds, and the posts use the rest of the window."""
    clock = SimClock()
    pacer = AccountPacer(
        SendLimits(per_second=30, per_chat_second=1, group_per_minute=20),
        clock=clock,
        sleep=clock.sleep,
    )
    group = "-100777"
    posted: list[float] = []
    replies: list[float] = []
    tasks: list[asyncio.Task[None]] = []

    async def post() -> None:
        await pacer.make_way(group, group=True)
        await pacer.turn(group, group=True)
        posted.append(clock.now)

    async def reply() -> None:
        owed = clock.now
        await pacer.turn(group, group=True)
        replies.append(clock.now - owed)

    async def traffic() -> None:
        for _ in range(10):
            for n in range(40):
                tasks.append(asyncio.create_task(post()))
                if n == 20:
                    tasks.append(asyncio.create_task(reply()))
                await clock.sleep(1.5)

    tasks.append(asyncio.create_task(traffic()))
    await clock.run(until=600.0)
    assert len(replies) == 10
    assert max(replies) < 5.0, replies
    # The posts are not starved either: three quarters of the window, every minute.
    assert len(posted) >= 9 * 14
    sent = sorted(posted)
    assert all(sum(1 for t in sent if start <= t < start + 60) <= 15 for start in sent)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# -- the same SQL on PostgreSQL ------------------------------------------------------------


async def test_on_postgres_the_chat_count_a_set_aside_job_and_cancel_jobs(pg_dsn: str) -> None:
    from bot.core.scheduling import POLICY, SchedulingPolicy, schedule_message
    from bot.core.stores.postgres import PostgresSessionStore
    from bot.core.tools import ToolContext

    clock = FakeClock(NOW)
    store = PostgresSessionStore(pg_dsn, clock=clock)
    async with store:
        key = "agent:main:telegram:group:g1:user:ana"
        members = JobRoute(key, "s-ana", "telegram", "-100", None, "ana")
        async with store.transaction() as tx:
            await apply_in(tx, [ScheduleRequest("job_ana", "a", T0 + 60)], members, T0)
        services: dict[str, object] = {POLICY: SchedulingPolicy(max_per_chat=1)}
        bob = ToolContext(
            session_id="s-bob",
            store=store,
            services=services,
            metadata={"session_key": "agent:main:telegram:group:g1:user:bob"},
        )
        refused = await schedule_message.invoke(bob, {"text": "b", "delay_seconds": 60})
        assert "already has 1 scheduled messages" in refused
        await add(store, 2, ScheduleRequest("job_poison", "x", T0 - 5, "0 0 30 2 *"))
        await add(store, 3, ScheduleRequest("job_ok", "y", T0 - 1))
        fired: list[Obligation] = []
        scheduler = scheduler_on(store, fired)
        assert await scheduler.fire_due() == 1
        assert [o.content for o in fired] == ["y"]
        assert await scheduler.next_due() == T0 + 60
        assert await cancel_jobs(store, platform="telegram", sender="ana") == 1
        assert await cancel_jobs(store, session_id="s-2", erase=True) == 0
        jobs = await states(store)
        assert {j: s for j, (s, *_) in jobs.items()} == {
            "job_ana": "cancelled",
            "job_ok": "fired",
        }


async def test_jobs_written_before_owners_and_zones_were_stored_still_fire(
    clocked: tuple[SQLiteSessionStore, FakeClock],
) -> None:
    """Migration 2 adds ``sender`` and ``timezone``: an older row has neither (UTC, no owner)."""
    from bot.core.scheduling import COMPONENT, MIGRATIONS
    from bot.core.sql import ensure_schema

    store, _ = clocked
    async with store.transaction() as tx:
        await ensure_schema(tx, COMPONENT, {1: MIGRATIONS[1]})
        await tx.execute(
            "INSERT INTO chatflow_scheduled_jobs (id, session_key, session_id, platform, "
            "chat_id, thread_id, text, run_agent, cron, due_at, state, created_at, fired_count) "
            "VALUES ('job_old', 'agent:main:fake:dm:k1', 's-1', 'fake', 'chat-1', NULL, "
            "'old', 0, '0 9 * * *', ?, 'scheduled', ?, 0)",
            (T0 - 60, T0 - 3600),
        )
    fired: list[Obligation] = []
    scheduler = scheduler_on(store, fired)
    await scheduler.open()
    assert await scheduler.fire_due() == 1
    next_nine = datetime(2026, 3, 2, 9, 0, tzinfo=UTC).timestamp()
    assert (await states(store))["job_old"] == ("scheduled", next_nine, 1)
