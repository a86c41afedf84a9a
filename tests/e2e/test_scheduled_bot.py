"""``python -m bot run`` against the fakes: a message the model schedules arrives once, on time,
and once again (not twice, not never) when the bot is SIGKILLed before it is due.

The fake OpenAI server is scripted to call ``schedule_message(delay_seconds=3)`` on
the example reminder agent (``agents/reminders.py``), as a model asked for a reminder would.
The last test shares one bot between several chats (issue #36): a job that can never
fire does not stop another chat's reminder (G1), and a ``run_agent`` job's turns count
against, and stop at, the daily token budget of the person who scheduled it (G3).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.core.scheduling import JobRoute, ScheduleRequest, apply_in
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.access.control import budget_notice
from tests.e2e.botprocess import BotProcess
from tests.e2e.test_telegram_bot import update
from tests.fakes.openai_server import FakeOpenAIServer, FakeResponse, RecordedRequest
from tests.fakes.telegram_server import FakeTelegramServer, SentMessage

CHAT_ID = 111111111  # the private chat of tests/data/telegram/private_text.json
REMINDER = "Time to take the cake out of the oven!"
ANSWER = "Done: I will remind you in 3 seconds."
LATER = "You are welcome."


@pytest.fixture
async def openai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        server.add(
            server.call("schedule_message", text=REMINDER, delay_seconds=3),
            server.reply(ANSWER),
            server.reply(LATER),
        )
        yield server


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


@pytest.fixture
async def bot(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> AsyncIterator[BotProcess]:
    process = BotProcess(
        tmp_path / "data",
        {
            "TELEGRAM_BOT_TOKEN": telegram.token,
            "TELEGRAM_API_BASE_URL": telegram.base_url,
            "OPENAI_API_KEY": openai.api_key,
            "OPENAI_BASE_URL": openai.base_url,
            "DEFAULT_MODEL": "gpt-test",
            "AGENTS_MODULE": "agents.reminders",
        },
    )
    await process.start()
    yield process
    await process.kill()


async def _wait_for_text(telegram: FakeTelegramServer, text: str, within: float) -> list[str]:
    """Wait until ``text`` was sent (replies resent with the marker may come first)."""
    deadline = time.monotonic() + within
    count = 1
    while True:
        sent = await telegram.wait_for_sent(count, within=max(0.1, deadline - time.monotonic()))
        if any(s.text == text for s in sent):
            return [s.text for s in sent]
        count = len(sent) + 1


async def _answered_then_thanked(telegram: FakeTelegramServer, count: int) -> list[str]:
    """Say thanks, wait for that answer: everything sent before it has been sent."""
    telegram.push_update(update("private_text", 2, text="thanks", message_id=11))
    sent = await telegram.wait_for_sent(count, within=20)
    assert sent[-1].text == LATER
    return [s.text for s in sent]


async def test_a_scheduled_message_arrives_once_3_to_10_seconds_later(
    bot: BotProcess, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    telegram.push_update(update("private_text", 1, text="remind me in 3 s about the cake"))
    (answer,) = await telegram.wait_for_sent(1, within=20)
    answered = time.monotonic()
    assert answer.text == ANSWER
    tool_result = openai.chat_requests[1].messages[-1]
    assert tool_result["role"] == "tool" and '"job_id": "job_' in tool_result["content"]
    sent = await telegram.wait_for_sent(2, within=12)
    delay = time.monotonic() - answered
    assert (sent[1].chat_id, sent[1].text) == (CHAT_ID, REMINDER)
    assert 2.0 <= delay <= 10.0, delay  # due 3 s after the tool call, just before the answer
    assert await _answered_then_thanked(telegram, 3) == [ANSWER, REMINDER, LATER]
    log = "\n".join(bot.log)
    assert REMINDER not in log and str(CHAT_ID) not in log
    assert "scheduled job job_" in log


async def test_a_bot_killed_before_the_due_time_sends_it_once_after_the_restart(
    bot: BotProcess, telegram: FakeTelegramServer
) -> None:
    telegram.push_update(update("private_text", 1, text="remind me in 3 s about the cake"))
    await telegram.wait_for_sent(1, within=20)
    await bot.kill()  # SIGKILL: the job exists only in the database now
    await bot.start()
    texts = await _wait_for_text(telegram, REMINDER, within=20)
    texts = await _answered_then_thanked(telegram, len(texts) + 1)
    assert texts.count(REMINDER) == 1


async def test_a_run_agent_job_runs_a_turn_at_the_due_time_and_its_answer_arrives_once(
    tmp_path: Path, telegram: FakeTelegramServer
) -> None:
    prompt = "Ask whether the cake came out well"
    followup = "How did the cake turn out?"
    async with FakeOpenAIServer() as openai:
        openai.add(
            openai.call("schedule_message", text=prompt, delay_seconds=3, run_agent=True),
            openai.reply(ANSWER),
            openai.reply(followup),
            openai.reply(LATER),
        )
        process = BotProcess(
            tmp_path / "data",
            {
                "TELEGRAM_BOT_TOKEN": telegram.token,
                "TELEGRAM_API_BASE_URL": telegram.base_url,
                "OPENAI_API_KEY": openai.api_key,
                "OPENAI_BASE_URL": openai.base_url,
                "DEFAULT_MODEL": "gpt-test",
                "AGENTS_MODULE": "agents.reminders",
            },
        )
        await process.start()
        try:
            telegram.push_update(update("private_text", 1, text="check on the cake in 3 s"))
            (answer,) = await telegram.wait_for_sent(1, within=20)
            assert answer.text == ANSWER
            sent = await telegram.wait_for_sent(2, within=12)
            assert (sent[1].chat_id, sent[1].text) == (CHAT_ID, followup)
            # The scheduled turn's prompt is the job's text, marked as the model's own reminder.
            scheduled = openai.chat_requests[2].messages[-1]
            assert scheduled["role"] == "user"
            assert scheduled["content"] == f"[Scheduled reminder] {prompt}"
            assert await _answered_then_thanked(telegram, 3) == [ANSWER, followup, LATER]
            log = "\n".join(process.log)
            assert prompt not in log and str(CHAT_ID) not in log
        finally:
            await process.kill()


# -- one bot, several chats: a poisoned job and a spent budget (issue #36 G1, G3) -----------

TRAIN = "Your train leaves in 10 minutes."
NEVER = "Leap day party!"
POEM = "Roses are red, the budget is spent."
FIRST_POEM = "Write a poem"
SECOND_POEM = "Write another poem"
CHAT_A, CHAT_C = 222222222, 444444444


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _shared_model(openai: FakeOpenAIServer) -> Callable[[RecordedRequest], FakeResponse]:
    """Answers by what the conversation asked, whatever order the chats' calls come in."""
    first_call = {
        "remind me every 30 February": openai.call(
            "schedule_message", text=NEVER, every="0 0 30 2 *", delay_seconds=60
        ),
        "remind me in 3 s about the train": openai.call(
            "schedule_message", text=TRAIN, delay_seconds=3
        ),
        "two poems please": openai.tool_calls(
            openai.tool_call(
                "schedule_message", {"text": FIRST_POEM, "delay_seconds": 2, "run_agent": True}
            ),
            openai.tool_call(
                "schedule_message", {"text": SECOND_POEM, "delay_seconds": 9, "run_agent": True}
            ),
        ),
        f"[Scheduled reminder] {FIRST_POEM}": openai.reply(POEM, prompt_tokens=600),
        f"[Scheduled reminder] {SECOND_POEM}": openai.reply("A poem nobody pays for."),
    }

    def respond(record: RecordedRequest) -> FakeResponse:
        messages = record.messages
        asked = next(_text(m) for m in reversed(messages) if m["role"] == "user")
        if messages[-1]["role"] == "tool":
            return openai.reply(f"Done: {asked}.")
        return first_call.get(asked) or openai.reply("ok")

    return respond


def _dm(update_id: int, chat_id: int, text: str) -> dict[str, Any]:
    person = {"id": chat_id, "is_bot": False, "first_name": f"P{chat_id % 10}"}
    chat = {"id": chat_id, "first_name": person["first_name"], "type": "private"}
    return update(
        "private_text", update_id, text=text, message_id=update_id, chat=chat, **{"from": person}
    )


async def _wait_until_sent(
    telegram: FakeTelegramServer, wanted: Callable[[SentMessage], bool], within: float
) -> list[SentMessage]:
    deadline = time.monotonic() + within
    count = 1
    while True:
        sent = await telegram.wait_for_sent(count, within=max(0.1, deadline - time.monotonic()))
        if any(wanted(s) for s in sent):
            return sent
        count = len(sent) + 1


async def _seed_poisoned_job(data: Path) -> None:
    """A job an older version let through: due now, with a cron that has no next date."""
    await asyncio.to_thread(data.mkdir, parents=True)
    store = SQLiteSessionStore(data / "chatflow.db")
    await store.open()
    route = JobRoute(
        "agent:main:telegram:dm:poisoned", "telegram-00000000000000aa", "telegram", "333", None
    )
    async with store.transaction() as tx:
        request = ScheduleRequest("job_poisoned", NEVER, time.time() - 1, "0 0 30 2 *")
        await apply_in(tx, [request], route, time.time())
    await store.close()


async def test_a_poisoned_job_stops_no_other_chat_and_a_spent_budget_stops_scheduled_turns(
    tmp_path: Path, telegram: FakeTelegramServer
) -> None:
    data = tmp_path / "data"
    await _seed_poisoned_job(data)
    async with FakeOpenAIServer() as openai:
        openai.responder = _shared_model(openai)
        process = BotProcess(
            data,
            {
                "TELEGRAM_BOT_TOKEN": telegram.token,
                "TELEGRAM_API_BASE_URL": telegram.base_url,
                "OPENAI_API_KEY": openai.api_key,
                "OPENAI_BASE_URL": openai.base_url,
                "DEFAULT_MODEL": "gpt-test",
                "AGENTS_MODULE": "agents.reminders",
                "MAX_TOKENS_PER_SENDER_PER_DAY": "500",
            },
        )
        await process.start()
        try:
            telegram.push_update(_dm(1, CHAT_A, "remind me every 30 February"))
            telegram.push_update(_dm(2, CHAT_ID, "remind me in 3 s about the train"))
            telegram.push_update(_dm(3, CHAT_C, "two poems please"))
            # G1: the job that can never fire was set aside; B's reminder, due after it,
            # arrives (before, every pass raised at the poisoned job, for ever).
            await _wait_until_sent(
                telegram, lambda s: (s.chat_id, s.text) == (CHAT_ID, TRAIN), within=30
            )
            # ... and asking for 30 February again is refused when scheduled.
            results = [_text(r.messages[-1]) for r in openai.chat_requests]
            assert any("never occurs" in result for result in results), results
            # G3: the first poem's turn cost 600 tokens, charged to C, so the second
            # poem's turn is skipped and C is told once (before, it ran on nobody's budget).
            sent = await _wait_until_sent(
                telegram, lambda s: (s.chat_id, s.text) == (CHAT_C, budget_notice()), within=40
            )
            to_c = [s.text for s in sent if s.chat_id == CHAT_C]
            assert POEM in to_c
            prompts = [_text(r.messages[-1]) for r in openai.chat_requests]
            assert f"[Scheduled reminder] {SECOND_POEM}" not in prompts
            async with httpx.AsyncClient(timeout=10) as client:
                metrics = (await client.get(f"{process.url}/metrics")).text
            assert "chatflow_scheduled_failed_total 1.0" in metrics
            assert 'chatflow_scheduled_skipped_total{reason="over budget"} 1.0' in metrics
            log = "\n".join(process.log)
            assert "scheduled job job_poisoned set aside as failed" in log
            assert NEVER not in log and POEM not in log
        finally:
            await process.kill()
    store = SQLiteSessionStore(data / "chatflow.db")
    async with store.transaction() as tx:
        rows = await tx.fetchall("SELECT text, state FROM chatflow_scheduled_jobs")
    await store.close()
    states = {str(text): str(state) for text, state in rows}
    assert states[NEVER] == "failed" and states[TRAIN] == "fired"
    assert states[FIRST_POEM] == "fired" and states[SECOND_POEM] == "dropped"
