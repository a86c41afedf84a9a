"""The gate with access control, through the whole gateway, on SQLite and PostgreSQL.

A fake adapter pushes events in, a scripted model counts the model calls, and
the stores run on a hand-moved clock, so windows and code expiry are exact.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from bot.config import Settings
from bot.core.agent import Agent
from bot.core.models.scripted import ScriptedModel
from bot.core.runner import Runner
from bot.core.stores.base import TransactionalStore
from bot.gateway.access.control import NOT_ADMITTED_ERROR, PAIRING_ERROR, RATE_LIMITED_ERROR
from bot.gateway.access.pairing import Pairing
from bot.gateway.events import MessageEvent
from bot.gateway.gateway import Gateway
from bot.gateway.inbox import Inbox
from bot.gateway.keys import build_session_key, session_id_for
from tests.fakes.adapter import FakeAdapter, make_event
from tests.fakes.clock import FakeClock
from tests.gateway.access.access_support import StoreFactory, databases

__all__ = ["databases"]

SECRET = b"g" * 32
CODE = re.compile(r"\b[A-Z0-9]{6,12}\b")


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
    """Starts a gateway (a new store each time: a restart) with the given settings."""
    bots: list[Bot] = []

    async def make(*, replies: int = 0, **settings: Any) -> Bot:
        store = await databases()
        model = ScriptedModel()
        model.add(*(ScriptedModel.reply(f"answer {n}") for n in range(replies)))
        runner = Runner(Agent(name="Helper", instructions="Help."), store, model=model)
        adapter = FakeAdapter()
        cfg = Settings(**settings)
        gateway = Gateway(runner, store, [adapter], cfg, secret=SECRET)
        await gateway.start()
        await gateway.wait_ready()
        bot = Bot(gateway, adapter, model, store)
        bots.append(bot)
        return bot

    yield make
    for bot in bots:
        await bot.gateway.stop(grace=1)


async def inbox_errors(store: TransactionalStore) -> list[str | None]:
    async with store.transaction() as tx:
        rows = await tx.fetchall("SELECT state, error FROM chatflow_inbox ORDER BY received_at")
    assert {state for state, _ in rows} <= {"done"}
    return [error for _, error in rows]


# -- rate limits --------------------------------------------------------------------------


async def test_a_flood_costs_no_model_call_past_the_limit_and_one_notice(start: Start) -> None:
    bot = await start(replies=3, rate_limit_messages=3, rate_limit_window_seconds=60)
    events = [make_event(f"spam {n}", sender_id="flooder") for n in range(40)]
    for event in events:
        assert await bot.adapter.deliver(event)  # accepted (journaled): no redelivery
    await bot.settle()
    assert len(bot.model.requests) == 3
    texts = bot.texts()
    assert texts[:3] == ["answer 0", "answer 1", "answer 2"]
    assert len(texts) == 4  # three answers and the one notice
    assert "faster than I can answer" in texts[3]
    assert "spam" not in texts[3]
    assert bot.adapter.sent[3].reply_to == events[3].platform_message_id
    errors = await inbox_errors(bot.store)  # every row closed: nothing re-run at a restart
    assert errors.count(None) == 3 and errors.count(RATE_LIMITED_ERROR) == 37
    # a platform redelivering a limited message gets "duplicate", not a turn
    assert not await bot.adapter.deliver(events[10])
    metrics = bot.gateway.metrics.render().decode()
    assert 'chatflow_messages_rate_limited_total{platform="fake"} 37.0' in metrics


async def test_a_notice_never_overtakes_turns_accepted_while_recovery_runs(
    databases: StoreFactory,
) -> None:
    """D15: `printf 'one\\ntwo\\nthree' | RATE_LIMIT_MESSAGES=2 chatflow chat` at start-up."""
    store = await databases()
    model = ScriptedModel([ScriptedModel.reply("answer 0"), ScriptedModel.reply("answer 1")])
    runner = Runner(Agent(name="Helper", instructions="Help."), store, model=model)
    adapter = FakeAdapter()
    gateway = Gateway(runner, store, [adapter], Settings(rate_limit_messages=2), secret=SECRET)
    release = asyncio.Event()
    recover = gateway._queue_recovered

    async def slow_recovery() -> None:
        await release.wait()
        await recover()

    gateway._queue_recovered = slow_recovery  # type: ignore[method-assign]
    try:
        await gateway.start()
        for text in ("one", "two", "three"):
            assert await adapter.deliver(make_event(text, sender_id="quick"))
        release.set()
        await gateway.wait_ready()
        assert await gateway._dispatcher.drain(10)
        texts = [s.text for s in adapter.sent]
        assert texts[:2] == ["answer 0", "answer 1"] and "faster" in texts[2]
    finally:
        await gateway.stop(grace=1)


async def test_senders_under_the_limit_are_unaffected_by_a_flood(start: Start) -> None:
    bot = await start(replies=4, rate_limit_messages=2)
    for n in range(20):
        await bot.adapter.deliver(make_event(f"spam {n}", sender_id="flooder", chat_id="c1"))
        if n in (5, 15):
            await bot.adapter.deliver(make_event("hello", sender_id="calm", chat_id="c2"))
    await bot.settle()
    calm = [s.text for s in bot.adapter.sent if s.chat_id == "c2"]
    assert len(calm) == 2 and all(t.startswith("answer") for t in calm)
    assert not any("faster" in s.text for s in bot.adapter.sent if s.chat_id == "c2")
    assert len(bot.model.requests) == 4


async def test_group_messages_count_against_the_sender(start: Start) -> None:
    bot = await start(replies=3, rate_limit_messages=3)
    for chat in ("g1", "g2"):
        await bot.adapter.deliver(
            make_event(
                "@bot hi", sender_id="ana", chat_id=chat, chat_type="group", mentions_bot=True
            )
        )
    await bot.adapter.deliver(make_event("hi", sender_id="ana", chat_id="dm-ana"))
    # Ana is at her limit wherever she writes; Bea, in the same group, is not
    await bot.adapter.deliver(
        make_event("@bot me", sender_id="ana", chat_id="g1", chat_type="group", mentions_bot=True)
    )
    await bot.settle()
    assert len(bot.model.requests) == 3
    bot.model.add(ScriptedModel.reply("for bea"))
    await bot.adapter.deliver(
        make_event("@bot me", sender_id="bea", chat_id="g1", chat_type="group", mentions_bot=True)
    )
    await bot.settle()
    assert bot.texts()[-1] == "for bea"


async def test_a_new_window_serves_the_sender_again_and_may_notice_again(
    start: Start, clock: FakeClock
) -> None:
    bot = await start(replies=4, rate_limit_messages=2, rate_limit_window_seconds=30)
    for n in range(4):
        await bot.adapter.deliver(make_event(f"a{n}", sender_id="s"))
    await bot.settle()
    clock.advance(seconds=31)
    for n in range(4):
        await bot.adapter.deliver(make_event(f"b{n}", sender_id="s"))
    await bot.settle()
    assert len(bot.model.requests) == 4
    notices = [t for t in bot.texts() if "faster" in t]
    assert len(notices) == 2


async def test_a_restart_in_the_middle_of_a_window_keeps_the_count(
    start: Start, clock: FakeClock
) -> None:
    first = await start(replies=2, rate_limit_messages=3)
    for n in range(2):
        await first.adapter.deliver(make_event(f"m{n}", sender_id="s"))
    await first.settle()
    await first.gateway.stop(grace=1)
    await first.store.close()
    clock.advance(seconds=20)
    second = await start(replies=1, rate_limit_messages=3)
    for n in range(3):
        await second.adapter.deliver(make_event(f"n{n}", sender_id="s"))
    await second.settle()
    assert len(second.model.requests) == 1  # 2 before the restart + 1 = the limit
    assert second.texts()[0] == "answer 0"
    assert "faster" in second.texts()[1] and len(second.texts()) == 2


async def test_without_a_limit_nothing_is_counted(start: Start) -> None:
    bot = await start(replies=5)
    for n in range(5):
        await bot.adapter.deliver(make_event(f"m{n}", sender_id="s"))
    await bot.settle()
    assert len(bot.model.requests) == 5
    async with bot.store.transaction() as tx:
        exists = await tx.fetchall(
            "SELECT component FROM chatflow_schema_versions WHERE component = 'rate_limits'"
        )
    assert exists == []


# -- pairing ------------------------------------------------------------------------------


async def test_a_stranger_gets_a_code_and_no_turn_then_is_served_once_approved(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    bot = await start(replies=1, access_mode="pairing")
    await bot.adapter.deliver(make_event("hello?", sender_id="stranger"))
    await bot.adapter.deliver(make_event("/start", sender_id="stranger", command="start"))
    await bot.settle()
    assert bot.model.requests == []
    (first,) = bot.texts()  # told once: the second message gets no answer
    (code,) = CODE.findall(first)
    assert "hello" not in first
    pairing = bot.gateway.access.pairing
    assert pairing is not None
    assert (await pairing.approve(code))[0] == "approved"
    await bot.adapter.deliver(make_event("now?", sender_id="stranger"))
    await bot.settle()
    assert bot.texts()[-1] == "answer 0"
    assert len(bot.model.requests) == 1
    assert all(code not in r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)
    metrics = bot.gateway.metrics.render().decode()
    assert 'chatflow_pairing_requests_total{platform="fake"} 2.0' in metrics


async def test_strangers_in_groups_are_ignored_unless_the_group_is_allowed(start: Start) -> None:
    bot = await start(
        replies=2, access_mode="pairing", allowed_chats="open-group", allowed_users="vip"
    )

    def group(chat: str, sender: str) -> MessageEvent:
        return make_event(
            "@bot hi", sender_id=sender, chat_id=chat, chat_type="group", mentions_bot=True
        )

    assert not await bot.adapter.deliver(group("g1", "stranger"))
    assert await bot.adapter.deliver(group("open-group", "stranger"))
    assert await bot.adapter.deliver(make_event("hi", sender_id="vip"))
    await bot.settle()
    assert sorted(bot.texts()) == ["answer 0", "answer 1"]
    async with bot.store.transaction() as tx:
        (count,) = await tx.fetchone("SELECT COUNT(*) FROM chatflow_inbox") or (0,)
    assert count == 2  # the ignored message was never stored


async def test_pairing_and_rate_limits_together_limit_the_codes_sent(start: Start) -> None:
    bot = await start(access_mode="pairing", rate_limit_messages=2)
    for n in range(6):
        await bot.adapter.deliver(make_event(f"let me in {n}", sender_id="stranger"))
    await bot.settle()
    texts = bot.texts()
    assert len(texts) == 2  # the code once, then the one notice
    assert "pairing code" in texts[0] and "faster" in texts[1]
    assert bot.model.requests == []


async def test_a_stranger_is_told_a_code_once_per_its_lifetime_without_rate_limits(
    start: Start, clock: FakeClock
) -> None:
    """F11: pairing on, no rate limit (the default): 30 DMs cost one bot message."""
    bot = await start(access_mode="pairing")
    for n in range(30):
        await bot.adapter.deliver(make_event(f"let me in {n}", sender_id="stranger"))
    await bot.adapter.deliver(make_event("me too", sender_id="other"))
    await bot.settle()
    texts = bot.texts()
    assert len(texts) == 2 and all("pairing code" in text for text in texts)
    assert await inbox_errors(bot.store) == [PAIRING_ERROR] * 31
    clock.advance(seconds=Settings().pairing_code_ttl_seconds + 1)
    await bot.adapter.deliver(make_event("still here", sender_id="stranger"))
    await bot.settle()
    assert len(bot.texts()) == 3  # a new code, told once again
    assert bot.model.requests == []


async def test_a_stranger_message_left_by_a_crash_is_not_run_after_the_restart(
    start: Start, databases: StoreFactory
) -> None:
    """Crash between tx 1 and the access check: recovery judges the message again."""
    store = await databases()
    inbox = Inbox(store)
    event = make_event("sneak in", sender_id="stranger")
    key = build_session_key(event.source, secret=SECRET)
    assert await inbox.accept(event, session_key=key, session_id=session_id_for(key))
    bot = await start(access_mode="pairing")
    await bot.settle()
    assert bot.model.requests == []
    assert len(bot.texts()) == 1 and "pairing code" in bot.texts()[0]


async def test_allowlist_mode_is_todays_allow_lists(start: Start) -> None:
    bot = await start(replies=1, access_mode="allowlist", allowed_users="friend")
    assert not await bot.adapter.deliver(make_event("hi", sender_id="stranger"))
    assert await bot.adapter.deliver(make_event("hi", sender_id="friend"))
    await bot.settle()
    assert bot.texts() == ["answer 0"]
    assert bot.gateway.access.pairing is None


async def test_an_approval_from_another_process_reaches_the_running_bot(
    start: Start, databases: StoreFactory
) -> None:
    bot = await start(replies=1, access_mode="pairing")
    await bot.adapter.deliver(make_event("hi", sender_id="stranger"))
    await bot.settle()
    (code,) = CODE.findall(bot.texts()[0])
    cli = Pairing(await databases(), secret=SECRET)
    assert (await cli.approve(code))[0] == "approved"
    await bot.adapter.deliver(make_event("hi again", sender_id="stranger"))
    await bot.settle()
    assert bot.texts()[-1] == "answer 0"


async def test_a_recovered_message_no_longer_admitted_is_closed_in_silence(
    start: Start, databases: StoreFactory
) -> None:
    store = await databases()
    event = make_event(
        "@bot hi", sender_id="stranger", chat_id="g1", chat_type="group", mentions_bot=True
    )
    key = build_session_key(event.source, secret=SECRET)
    assert await Inbox(store).accept(event, session_key=key, session_id=session_id_for(key))
    bot = await start(access_mode="pairing")
    await bot.settle()
    assert bot.texts() == [] and bot.model.requests == []
    assert await inbox_errors(bot.store) == [NOT_ADMITTED_ERROR]
