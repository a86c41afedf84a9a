"""``python -m bot run`` against the fakes: a message the model schedules arrives once, on time,
and once again (not twice, not never) when the bot is SIGKILLed before it is due.

The fake OpenAI server is scripted to call ``schedule_message(delay_seconds=3)`` on
the example reminder agent (``agents/reminders.py``), as a model asked for a reminder would.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.botprocess import BotProcess
from tests.e2e.test_telegram_bot import update
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer

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
