"""Token accounting through the whole gateway, on SQLite and PostgreSQL: each turn's
calls recorded in its commit (and apart when it fails), the ``/metrics`` counters,
and ``MAX_TOKENS_PER_SENDER_PER_DAY``: one notice a UTC day, no model call, shared
by every process on one database.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from bot.config import Settings
from bot.core.agent import Agent
from bot.core.models.base import Usage
from bot.core.models.scripted import ScriptedModel
from bot.core.runner import Runner
from bot.core.stores.base import TransactionalStore
from bot.gateway.access.control import OVER_BUDGET_ERROR
from bot.gateway.access.rate_limits import sender_digest
from bot.gateway.gateway import Gateway
from tests.fakes.adapter import FakeAdapter, make_event
from tests.fakes.clock import FakeClock
from tests.gateway.access.access_support import StoreFactory, databases

__all__ = ["databases"]

SECRET = b"b" * 32
NOTICE = "today's usage limit"


@dataclass
class Bot:
    gateway: Gateway
    adapter: FakeAdapter
    model: ScriptedModel
    store: TransactionalStore

    async def settle(self) -> None:
        assert await self.gateway._dispatcher.drain(10)

    def texts(self) -> list[str]:
        return [s.text for s in self.adapter.sent]


Start = Callable[..., Awaitable[Bot]]


@pytest.fixture
async def start(databases: StoreFactory) -> AsyncIterator[Start]:
    """Starts a gateway on one more store of the test's database (a restart, or a
    second process)."""
    bots: list[Bot] = []

    async def make(**settings: Any) -> Bot:
        store = await databases()
        model = ScriptedModel()
        runner = Runner(Agent(name="Helper", instructions="Help."), store, model=model)
        adapter = FakeAdapter()
        gateway = Gateway(runner, store, [adapter], Settings(**settings), secret=SECRET)
        await gateway.start()
        await gateway.wait_ready()
        bot = Bot(gateway, adapter, model, store)
        bots.append(bot)
        return bot

    yield make
    for bot in bots:
        await bot.gateway.stop(grace=1)


def spent(prompt: int, completion: int, cached: int = 0, reasoning: int = 0) -> Usage:
    return Usage(
        input_tokens=prompt,
        output_tokens=completion,
        cached_input_tokens=cached,
        reasoning_tokens=reasoning,
    )


async def usage_rows(store: TransactionalStore) -> list[tuple[Any, ...]]:
    async with store.transaction() as tx:
        return await tx.fetchall(
            "SELECT session_id, agent, kind, model, sender, day, prompt_tokens, "
            "cached_prompt_tokens, completion_tokens, reasoning_tokens FROM chatflow_usage "
            "ORDER BY id"
        )


async def history_of(bot: Bot, session_id: str) -> list[str]:
    session = await bot.store.get(session_id)
    return [] if session is None else [m.content or "" for m in session.history]


async def inbox_errors(store: TransactionalStore) -> list[str | None]:
    async with store.transaction() as tx:
        rows = await tx.fetchall("SELECT error FROM chatflow_inbox ORDER BY received_at")
    return [row[0] for row in rows]


# -- recording ------------------------------------------------------------------------


async def test_each_model_call_of_a_turn_is_recorded_in_its_commit(
    start: Start, clock: FakeClock
) -> None:
    bot = await start()
    calling = ScriptedModel.calls(("nothing_here", {}))
    calling.usage = spent(120, 10, cached=0, reasoning=4)
    bot.model.add(
        calling, ScriptedModel.reply("done", usage=spent(300, 20, cached=256, reasoning=8))
    )
    event = make_event("hello", sender_id="ana")
    assert await bot.adapter.deliver(event)
    await bot.settle()
    assert bot.texts() == ["done"]
    rows = await usage_rows(bot.store)
    digest = sender_digest("fake", "ana", SECRET)
    day = clock.now.date().isoformat()
    model_name = bot.gateway.runner._models["Helper"][1]
    [session_id] = {row[0] for row in rows}
    assert [row[1:] for row in rows] == [
        ("Helper", "chat", model_name, digest, day, 120, 0, 10, 4),
        ("Helper", "chat", model_name, digest, day, 300, 256, 20, 8),
    ]
    assert "ana" not in str(rows)  # senders are stored as digests only
    assert await history_of(bot, session_id)  # the turn itself committed
    metrics = bot.gateway.metrics.render().decode()
    assert 'chatflow_tokens_total{agent="Helper",call="chat",kind="prompt"} 420.0' in metrics
    assert 'chatflow_tokens_total{agent="Helper",call="chat",kind="cached_prompt"} 256.0' in metrics
    assert 'chatflow_tokens_total{agent="Helper",call="chat",kind="completion"} 30.0' in metrics
    assert 'chatflow_tokens_total{agent="Helper",call="chat",kind="reasoning"} 12.0' in metrics


async def test_a_failed_turn_rolls_back_its_history_but_records_its_billed_calls(
    start: Start,
) -> None:
    bot = await start()
    # An empty answer fails the turn after the provider billed the call.
    bot.model.add(ScriptedModel.reply("", usage=spent(500, 1)))
    assert await bot.adapter.deliver(make_event("hello", sender_id="ana"))
    await bot.settle()
    assert len(bot.texts()) == 1  # the apology
    rows = await usage_rows(bot.store)
    assert [(row[2], row[6], row[8]) for row in rows] == [("chat", 500, 1)]
    assert await history_of(bot, rows[0][0]) == []  # rolled back, byte for byte
    metrics = bot.gateway.metrics.render().decode()
    assert 'chatflow_tokens_total{agent="Helper",call="chat",kind="prompt"} 500.0' in metrics


# -- the daily budget ------------------------------------------------------------------


async def test_over_the_budget_a_sender_is_told_once_a_day_and_costs_no_model_call(
    start: Start, clock: FakeClock
) -> None:
    bot = await start(max_tokens_per_sender_per_day=100)
    bot.model.add(ScriptedModel.reply("first", usage=spent(80, 30)))
    assert await bot.adapter.deliver(make_event("one", sender_id="ana"))
    await bot.settle()
    # 110 tokens today: every further message of the day starts no turn.
    later = [make_event(f"more {n}", sender_id="ana") for n in range(4)]
    for event in later:
        assert await bot.adapter.deliver(event)
    await bot.settle()
    assert len(bot.model.requests) == 1
    texts = bot.texts()
    assert texts[0] == "first"
    assert len(texts) == 2 and NOTICE in texts[1]  # the one notice, not four
    assert bot.adapter.sent[1].reply_to == later[0].platform_message_id
    errors = await inbox_errors(bot.store)
    assert errors == [None] + [OVER_BUDGET_ERROR] * 4
    rows = await usage_rows(bot.store)
    # Like a rate-limited message: not in the history.
    assert await history_of(bot, rows[0][0]) == ["one", "first"]
    # Another sender is not affected.
    bot.model.add(ScriptedModel.reply("hi bea", usage=spent(10, 2)))
    assert await bot.adapter.deliver(make_event("hello", sender_id="bea", chat_id="chat-2"))
    await bot.settle()
    assert bot.texts()[-1] == "hi bea"
    metrics = bot.gateway.metrics.render().decode()
    assert 'chatflow_messages_over_budget_total{platform="fake"} 4.0' in metrics
    # The next UTC day serves the sender again, and would notice again.
    clock.now = (clock.now + timedelta(days=1)).replace(hour=0, minute=0, second=1)
    bot.model.add(ScriptedModel.reply("new day", usage=spent(90, 20)))
    assert await bot.adapter.deliver(make_event("again", sender_id="ana"))
    await bot.settle()
    assert bot.texts()[-1] == "new day"
    for n in range(2):
        assert await bot.adapter.deliver(make_event(f"over {n}", sender_id="ana"))
    await bot.settle()
    assert sum(NOTICE in text for text in bot.texts()) == 2


async def test_commands_that_call_no_model_are_answered_over_the_budget(start: Start) -> None:
    bot = await start(max_tokens_per_sender_per_day=10)
    bot.model.add(ScriptedModel.reply("ok", usage=spent(10, 1)))
    assert await bot.adapter.deliver(make_event("one", sender_id="ana"))
    await bot.settle()
    assert await bot.adapter.deliver(make_event("/help", sender_id="ana", command="help"))
    await bot.settle()
    assert len(bot.texts()) == 2 and NOTICE not in bot.texts()[1]


async def test_the_budget_is_shared_by_two_processes_on_one_database(start: Start) -> None:
    first = await start(max_tokens_per_sender_per_day=50)
    second = await start(max_tokens_per_sender_per_day=50)
    first.model.add(ScriptedModel.reply("from one", usage=spent(40, 20)))
    assert await first.adapter.deliver(make_event("hello", sender_id="ana"))
    await first.settle()
    # The other process counts what the first one recorded, and gives the notice.
    assert await second.adapter.deliver(make_event("more", sender_id="ana"))
    await second.settle()
    assert len(second.texts()) == 1 and NOTICE in second.texts()[0]
    # ...once: the first process, asked next, says nothing more that day.
    assert await first.adapter.deliver(make_event("still there?", sender_id="ana"))
    await first.settle()
    assert first.texts() == ["from one"]
    assert len(first.model.requests) == 1 and second.model.requests == []


async def test_without_a_budget_nothing_is_judged_and_no_notice_table_is_made(
    start: Start,
) -> None:
    bot = await start()
    bot.model.add(*(ScriptedModel.reply(f"a{n}", usage=spent(10_000, 1)) for n in range(3)))
    for n in range(3):
        assert await bot.adapter.deliver(make_event(f"m{n}", sender_id="ana"))
    await bot.settle()
    assert bot.texts() == ["a0", "a1", "a2"]
    async with bot.store.transaction() as tx:
        rows = await tx.fetchall(
            "SELECT component FROM chatflow_schema_versions WHERE component = 'budget_notices'"
        )
    assert rows == []


async def test_two_processes_judging_at_once_give_one_notice(start: Start) -> None:
    first = await start(max_tokens_per_sender_per_day=50)
    second = await start(max_tokens_per_sender_per_day=50)
    first.model.add(ScriptedModel.reply("spent", usage=spent(60, 1)))
    assert await first.adapter.deliver(make_event("hello", sender_id="ana"))
    await first.settle()
    events = [make_event(f"m{n}", sender_id="ana") for n in range(6)]
    delivered = await asyncio.gather(
        *(
            bot.adapter.deliver(event)
            for bot, event in zip([first, second] * 3, events, strict=True)
        )
    )
    assert all(delivered)
    await first.settle()
    await second.settle()
    notices = [t for bot in (first, second) for t in bot.texts() if NOTICE in t]
    assert len(notices) == 1
    assert len(first.model.requests) == 1 and second.model.requests == []
