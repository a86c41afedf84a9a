"""The scheduling tools: what they refuse, what they leave for the commit, what they see."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

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
