"""The scheduling tools: what they refuse, what they leave for the commit, what they see."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot import (
    cancel_scheduled_message,
    list_scheduled_messages,
    schedule_message,
    scheduling_tools,
)
from bot.core.scheduling import (
    POLICY,
    JobRoute,
    ScheduleRequest,
    SchedulingPolicy,
    apply_in,
    next_occurrence,
)
from bot.core.stores.in_memory import SessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.tools import ToolContext
from tests.fakes.clock import FakeClock

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
async def store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[SQLiteSessionStore]:
    made = SQLiteSessionStore(tmp_path / "chatflow.db", clock=clock)
    await made.open()
    yield made
    await made.close()


def ctx_for(
    store: Any, session_id: str = "s-a", services: dict[str, object] | None = None
) -> ToolContext:
    """A tool context as the gateway's turns give it (its default policy unless given)."""
    if services is None:
        services = {POLICY: SchedulingPolicy()}
    return ToolContext(session_id=session_id, store=store, services=services)


def route(session_id: str, chat_id: str) -> JobRoute:
    return JobRoute(f"key:{session_id}", session_id, "telegram", chat_id, None)


async def call(ctx: ToolContext, tool: Any, **arguments: Any) -> dict[str, Any]:
    result = json.loads(await tool.invoke(ctx, arguments))
    assert isinstance(result, dict)
    return result


async def commit(store: SQLiteSessionStore, ctx: ToolContext, chat_id: str = "100") -> None:
    async with store.transaction() as tx:
        await apply_in(tx, ctx.effects, route(ctx.session_id, chat_id), NOW.timestamp())


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"delay_seconds": 0}, "delay_seconds must be at least 1"),
        ({"delay_seconds": -5}, "delay_seconds must be at least 1"),
        ({}, "give delay_seconds or at"),
        ({"delay_seconds": 5, "at": "2026-03-02T09:00:00+00:00"}, "not both"),
        ({"at": "2026-03-02T09:00:00"}, "has no UTC offset"),
        ({"at": "tomorrow at nine"}, "is not an ISO 8601"),
        ({"at": "2026-03-01T11:59:00+00:00"}, "is in the past"),
        ({"at": "2026-03-01T13:30:00+02:00"}, "is in the past"),  # 11:30 UTC
        ({"delay_seconds": 5, "every": "every monday"}, "not a 5-field cron"),
        ({"delay_seconds": 5, "every": "0 9 * * * *"}, "not a 5-field cron"),
        ({"delay_seconds": 5, "every": "61 9 * * *"}, "not a 5-field cron"),
        ({"delay_seconds": "soon"}, "invalid arguments"),
    ],
)
async def test_bad_requests_get_a_clear_error_and_schedule_nothing(
    store: SQLiteSessionStore, arguments: dict[str, Any], says: str
) -> None:
    ctx = ctx_for(store)
    result = await call(ctx, schedule_message, text="Pay the invoice", **arguments)
    assert says in result["error"]
    assert ctx.effects == []


async def test_an_empty_text_is_refused(store: SQLiteSessionStore) -> None:
    result = await call(ctx_for(store), schedule_message, text="  ", delay_seconds=5)
    assert "text is empty" in result["error"]


@pytest.mark.parametrize("where", ["in-memory store", "no gateway"])
async def test_without_the_bots_database_or_gateway_the_tools_say_so(
    store: SQLiteSessionStore, where: str
) -> None:
    # A Runner alone has no scheduler: a job it "scheduled" would never be sent.
    ctx = ctx_for(SessionStore()) if where == "in-memory store" else ctx_for(store, services={})
    for tool, arguments in (
        (schedule_message, {"text": "x", "delay_seconds": 5}),
        (list_scheduled_messages, {}),
        (cancel_scheduled_message, {"job_id": "job_1"}),
    ):
        assert "not available here" in (await call(ctx, tool, **arguments))["error"]
    assert ctx.effects == []


async def test_a_delay_or_an_offset_time_gives_the_job_id_and_the_utc_due_time(
    store: SQLiteSessionStore,
) -> None:
    ctx = ctx_for(store)
    first = await call(ctx, schedule_message, text="Stretch", delay_seconds=90)
    assert first["due_at_utc"] == "2026-03-01T12:01:30Z"
    second = await call(ctx, schedule_message, text="Call Ana", at="2026-03-02T09:00:00+02:00")
    assert second["due_at_utc"] == "2026-03-02T07:00:00Z"
    assert first["job_id"] != second["job_id"]
    assert [type(e) for e in ctx.effects] == [ScheduleRequest, ScheduleRequest]
    (request, _) = ctx.effects
    assert isinstance(request, ScheduleRequest)
    assert request.job_id == first["job_id"] and request.due_at == NOW.timestamp() + 90


async def test_every_alone_starts_at_the_schedules_next_time(store: SQLiteSessionStore) -> None:
    ctx = ctx_for(store)
    result = await call(ctx, schedule_message, text="Standup", every="30  9 * * 1")
    assert result["due_at_utc"] == "2026-03-02T09:30:00Z"  # 1 March 2026 is a Sunday
    assert result["repeats"] == "30 9 * * 1 (UTC)"


def test_next_occurrence_is_utc_arithmetic() -> None:
    start = datetime(2026, 3, 29, 0, 30, tzinfo=UTC).timestamp()  # a DST night in Europe
    assert next_occurrence("0 * * * *", start) == start + 1800
    assert next_occurrence("0 9 * * *", start) == start + 8.5 * 3600


async def test_the_limit_per_chat_counts_stored_and_pending_jobs(
    store: SQLiteSessionStore,
) -> None:
    services: dict[str, object] = {POLICY: SchedulingPolicy(max_per_chat=3)}
    earlier = ctx_for(store, services=services)
    for n in range(2):
        await call(earlier, schedule_message, text=f"r{n}", delay_seconds=60 + n)
    await commit(store, earlier)
    ctx = ctx_for(store, services=services)
    assert "job_id" in await call(ctx, schedule_message, text="third", delay_seconds=60)
    refused = await call(ctx, schedule_message, text="fourth", delay_seconds=60)
    assert "already has 3 scheduled messages" in refused["error"]
    assert len(ctx.effects) == 1
    # Another chat has its own count.
    other = ctx_for(store, "s-b", services)
    assert "job_id" in await call(other, schedule_message, text="x", delay_seconds=60)


async def test_the_default_limit_is_twenty(store: SQLiteSessionStore) -> None:
    ctx = ctx_for(store)
    for n in range(20):
        assert "job_id" in await call(ctx, schedule_message, text=f"r{n}", delay_seconds=60)
    assert "error" in await call(ctx, schedule_message, text="r20", delay_seconds=60)


async def test_list_and_cancel_see_only_this_chats_jobs(store: SQLiteSessionStore) -> None:
    mine = ctx_for(store, "s-a")
    theirs = ctx_for(store, "s-b")
    my_job = (await call(mine, schedule_message, text="mine", delay_seconds=60))["job_id"]
    their_job = (await call(theirs, schedule_message, text="theirs", delay_seconds=60))["job_id"]
    await commit(store, mine, "100")
    await commit(store, theirs, "200")

    ctx = ctx_for(store, "s-a")
    listed = await call(ctx, list_scheduled_messages)
    assert [(j["job_id"], j["text"]) for j in listed["scheduled"]] == [(my_job, "mine")]
    refused = await call(ctx, cancel_scheduled_message, job_id=their_job)
    assert "no scheduled message" in refused["error"]
    assert (
        "no scheduled message" in (await call(ctx, cancel_scheduled_message, job_id="x"))["error"]
    )
    assert (await call(ctx, cancel_scheduled_message, job_id=my_job))["status"] == "cancelled"
    assert (await call(ctx, list_scheduled_messages))["scheduled"] == []
    await commit(store, ctx)
    async with store.transaction() as tx:
        rows = await tx.fetchall(
            "SELECT id, state, chat_id FROM chatflow_scheduled_jobs ORDER BY chat_id"
        )
    assert rows == [(my_job, "cancelled", "100"), (their_job, "scheduled", "200")]


async def test_a_job_scheduled_and_cancelled_in_one_turn_is_not_left_scheduled(
    store: SQLiteSessionStore,
) -> None:
    ctx = ctx_for(store)
    job = (await call(ctx, schedule_message, text="oops", delay_seconds=60))["job_id"]
    listed = await call(ctx, list_scheduled_messages)
    assert [j["job_id"] for j in listed["scheduled"]] == [job]
    await call(ctx, cancel_scheduled_message, job_id=job)
    await commit(store, ctx)
    async with store.transaction() as tx:
        assert await tx.fetchall("SELECT state FROM chatflow_scheduled_jobs") == [("cancelled",)]


def test_the_three_tools_are_one_list() -> None:
    assert scheduling_tools == [schedule_message, list_scheduled_messages, cancel_scheduled_message]
    assert [t.name for t in scheduling_tools] == [
        "schedule_message",
        "list_scheduled_messages",
        "cancel_scheduled_message",
    ]


async def test_run_agent_is_accepted_and_stored_with_the_job(store: SQLiteSessionStore) -> None:
    ctx = ctx_for(store)
    result = await call(
        ctx, schedule_message, text="Ask how the exam went", delay_seconds=60, run_agent=True
    )
    assert result["status"] == "scheduled"
    (request,) = ctx.effects
    assert isinstance(request, ScheduleRequest)
    assert request.run_agent
    await commit(store, ctx)
    async with store.transaction() as tx:
        rows = await tx.fetchall("SELECT text, run_agent FROM chatflow_scheduled_jobs")
    assert rows == [("Ask how the exam went", 1)]


# -- #36: never-occurring crons, field errors, repeats, chats, time zones ----------------


@pytest.mark.parametrize(
    "arguments",
    [
        {"every": "0 0 30 2 *", "delay_seconds": 60},  # 30 February, given a first run
        {"every": "0 0 31 4 *", "at": "2026-03-02T09:00:00+00:00"},  # 31 April
        {"every": "0 0 30 2 *"},
    ],
)
async def test_a_cron_that_never_occurs_is_refused_when_scheduled(
    store: SQLiteSessionStore, arguments: dict[str, Any]
) -> None:
    """G1: croniter accepts the syntax, but the scheduler could never compute a next time."""
    ctx = ctx_for(store)
    result = await call(ctx, schedule_message, text="Happy leap day", **arguments)
    assert "never occurs" in result["error"]
    assert ctx.effects == []


@pytest.mark.parametrize(
    ("every", "says"),
    [
        ("61 25 * * 9", "minute 61 is out of range (0-59)"),
        ("0 25 * * *", "hour 25 is out of range (0-23)"),
        ("0 9 32 * *", "day of the month 32 is out of range (1-31)"),
        ("0 9 * 13 *", "month 13 is out of range (1-12)"),
        ("0 9 * * 1-9", "day of the week 9 is out of range (0-7)"),
        ("0 9 * * 1,2", None),
        ("*/15 9-17 * * mon-fri", None),
        ("0 9 * * 1#2", None),
        ("0 9 * *", "it has 4 fields, not 5"),
    ],
)
async def test_a_cron_error_names_the_field_out_of_range(
    store: SQLiteSessionStore, every: str, says: str | None
) -> None:
    """N12: the model is told which value to fix, not only that the cron is wrong."""
    policy = SchedulingPolicy(min_repeat_seconds=60)
    result = await call(
        ctx_for(store, services={POLICY: policy}), schedule_message, text="x", every=every
    )
    if says is None:
        assert "job_id" in result, result
    else:
        assert says in result["error"]


@pytest.mark.parametrize(
    ("every", "gap"),
    [
        ("* * * * *", 60),
        ("*/2 * * * *", 120),
        ("0,2 9 * * *", 120),
        ("1,59 0,23 * * *", 120),  # 23:59 and, after midnight, 00:01
    ],
)
async def test_a_repeat_more_often_than_the_minimum_is_refused(
    store: SQLiteSessionStore, every: str, gap: int
) -> None:
    """G7: ``MIN_REPEAT_SECONDS`` (300 by default) between two runs, midnight included."""
    ctx = ctx_for(store)
    result = await call(ctx, schedule_message, text="Drink water", every=every)
    assert f"repeats {gap} s apart" in result["error"]
    assert "at least 300 s apart" in result["error"]
    assert ctx.effects == []
    for fine in ("*/5 * * * *", "0 9 * * *", "0,30 9 * * 1"):
        assert "job_id" in await call(ctx, schedule_message, text="ok", every=fine)
    lenient = ctx_for(store, services={POLICY: SchedulingPolicy(min_repeat_seconds=60)})
    assert "job_id" in await call(lenient, schedule_message, text="ok", every="* * * * *")


def group_ctx(store: Any, chat: str, member: str, services: dict[str, object]) -> ToolContext:
    """A group member's own conversation (``GROUP_SESSIONS_PER_USER``), as the gateway
    builds its session key."""
    key = f"agent:main:telegram:group:{chat}:user:{member}"
    return ToolContext(
        session_id=f"s-{chat}-{member}",
        store=store,
        services=services,
        metadata={"session_key": key},
    )


async def commit_group(store: SQLiteSessionStore, ctx: ToolContext, chat: str) -> None:
    key = str(ctx.metadata["session_key"])
    async with store.transaction() as tx:
        await apply_in(
            tx,
            ctx.effects,
            JobRoute(key, ctx.session_id, "telegram", chat, None),
            NOW.timestamp(),
        )


async def test_the_limit_counts_every_member_of_a_group_together(
    store: SQLiteSessionStore,
) -> None:
    """G7: ``MAX_SCHEDULED_PER_CHAT`` is per chat: a second member cannot add another 20."""
    services: dict[str, object] = {POLICY: SchedulingPolicy(max_per_chat=3)}
    ana = group_ctx(store, "g1", "ana", services)
    for n in range(2):
        assert "job_id" in await call(ana, schedule_message, text=f"a{n}", delay_seconds=60)
    await commit_group(store, ana, "-100")
    bob = group_ctx(store, "g1", "bob", services)
    assert "job_id" in await call(bob, schedule_message, text="b0", delay_seconds=60)
    refused = await call(bob, schedule_message, text="b1", delay_seconds=60)
    assert "already has 3 scheduled messages" in refused["error"]
    # Another group, and a topic of the same group, count by themselves.
    other = group_ctx(store, "g2", "bob", services)
    assert "job_id" in await call(other, schedule_message, text="x", delay_seconds=60)
    topic = ToolContext(
        session_id="s-topic",
        store=store,
        services=services,
        metadata={"session_key": "agent:main:telegram:group:g1:topic:7"},
    )
    assert "job_id" in await call(topic, schedule_message, text="x", delay_seconds=60)


async def test_every_follows_the_time_zone_the_model_names(store: SQLiteSessionStore) -> None:
    """G12: "every Monday at 9" asked in Berlin is 09:00 Berlin time, stored with its zone."""
    ctx = ctx_for(store)
    result = await call(
        ctx, schedule_message, text="Standup", every="0 9 * * 1", timezone="Europe/Berlin"
    )
    assert result["due_at_utc"] == "2026-03-02T08:00:00Z"  # CET, UTC+1
    assert result["due_at_local"] == "2026-03-02T09:00:00+01:00 (Europe/Berlin)"
    assert result["repeats"] == "0 9 * * 1 (Europe/Berlin)"
    (request,) = ctx.effects
    assert isinstance(request, ScheduleRequest)
    assert request.timezone == "Europe/Berlin"
    await commit(store, ctx)
    listed = await call(ctx_for(store), list_scheduled_messages)
    assert listed["scheduled"][0]["every"] == "0 9 * * 1 (Europe/Berlin)"
    async with store.transaction() as tx:
        assert await tx.fetchall("SELECT timezone FROM chatflow_scheduled_jobs") == [
            ("Europe/Berlin",)
        ]
    bad = await call(ctx, schedule_message, text="x", every="0 9 * * 1", timezone="Mars/Olympus")
    assert "'Mars/Olympus' is not an IANA time zone name" in bad["error"]
    # A clock time without an offset is read in the zone given.
    local = await call(
        ctx, schedule_message, text="x", at="2026-03-02T09:00:00", timezone="Europe/Berlin"
    )
    assert local["due_at_utc"] == "2026-03-02T08:00:00Z"


async def test_the_hosts_default_zone_applies_when_the_model_names_none(
    store: SQLiteSessionStore,
) -> None:
    services: dict[str, object] = {POLICY: SchedulingPolicy(timezone="America/New_York")}
    result = await call(
        ctx_for(store, services=services), schedule_message, text="x", every="0 9 * * *"
    )
    assert result["due_at_utc"] == "2026-03-01T14:00:00Z"  # EST, UTC-5
    assert result["repeats"] == "0 9 * * * (America/New_York)"


def test_a_berlin_monday_nine_stays_nine_across_both_dst_changes() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    at = datetime(2026, 3, 20, tzinfo=UTC).timestamp()
    seen = []
    for _ in range(34):  # through 29 March (CEST) and 25 October (CET)
        at = next_occurrence("0 9 * * 1", at, "Europe/Berlin")
        seen.append(datetime.fromtimestamp(at, berlin))
    assert {(d.weekday(), d.hour, d.minute) for d in seen} == {(0, 9, 0)}
    offsets = [d.utcoffset() for d in seen]
    assert offsets[0] == timedelta(hours=1) and offsets[1] == timedelta(hours=2)
    assert offsets[-1] == timedelta(hours=1)
    assert [b - a for a, b in itertools.pairwise(seen)] == [timedelta(days=7)] * 33
    # In UTC the same cron is an hour off Berlin's clock half the year (the review's G12).
    utc_runs = [next_occurrence("0 8 * * 1", datetime(2026, 3, 27, tzinfo=UTC).timestamp())]
    assert datetime.fromtimestamp(utc_runs[0], berlin).hour == 10


@settings(max_examples=150, deadline=None)
@given(
    start=st.datetimes(
        min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 31), timezones=st.just(UTC)
    ),
    hour=st.integers(0, 23).filter(lambda h: h != 2),  # 02:xx is skipped once a year
    minute=st.integers(0, 59),
)
def test_a_daily_time_in_berlin_is_that_time_every_day(
    start: datetime, hour: int, minute: int
) -> None:
    """G12 property: the next run of "m h * * *" in Europe/Berlin is h:m Berlin time, after
    the start and no more than a day (plus the hour a DST change adds) later."""
    after = start.timestamp()
    at = next_occurrence(f"{minute} {hour} * * *", after, "Europe/Berlin")
    local = datetime.fromtimestamp(at, ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute) == (hour, minute)
    assert after < at <= after + 25 * 3600
