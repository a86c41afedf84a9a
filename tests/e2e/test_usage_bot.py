"""Token accounting end to end: ``python -m bot run`` against the fake Telegram and OpenAI
servers, the fake reporting cached prompt tokens as OpenAI does.

A few turns later ``python -m bot usage`` (another process, same ``DATA_DIR``, the
bot still running) shows the cached tokens, ``/metrics`` has the counters, and with
``MAX_TOKENS_PER_SENDER_PER_DAY`` small a sender over it gets one notice and no
more model calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.botprocess import BotProcess
from tests.e2e.test_telegram_bot import update
from tests.fakes.openai_server import FakeOpenAIServer, FakeResponse, RecordedRequest
from tests.fakes.telegram_server import FakeTelegramServer

pytestmark = pytest.mark.e2e

PROMPT = 1_500
CACHED = 1_024  # OpenAI caches prompt prefixes in steps of 128 from 1,024 tokens
COMPLETION = 20
NOTICE = "today's usage limit"

BotFactory = Callable[..., BotProcess]


def answer(record: RecordedRequest) -> FakeResponse:
    """Every answer reports a cache hit on the prompt's prefix, like a long session."""
    return FakeOpenAIServer.reply(
        f"answer to {record.messages[-1]['content']}",
        prompt_tokens=PROMPT,
        completion_tokens=COMPLETION,
        cached_tokens=CACHED,
    )


@pytest.fixture
async def openai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer(responder=answer) as server:
        yield server


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


@pytest.fixture
async def bots(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> AsyncIterator[BotFactory]:
    made: list[BotProcess] = []

    def make(**env: str) -> BotProcess:
        bot = BotProcess(
            tmp_path / "data",
            {
                "TELEGRAM_BOT_TOKEN": telegram.token,
                "TELEGRAM_API_BASE_URL": telegram.base_url,
                "OPENAI_API_KEY": openai.api_key,
                "OPENAI_BASE_URL": openai.base_url,
                "DEFAULT_MODEL": "gpt-4o-mini",
                **env,
            },
        )
        made.append(bot)
        return bot

    yield make
    for bot in made:
        await bot.kill()


async def fetch_metrics(bot: BotProcess) -> str:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"{bot.url}/metrics")).text


async def test_usage_and_metrics_show_the_cached_tokens_the_provider_reported(
    bots: BotFactory, telegram: FakeTelegramServer, tmp_path: Path
) -> None:
    bot = bots()
    await bot.start()
    for n in range(3):
        telegram.push_update(update("private_text", n + 1, text=f"question {n}", message_id=n + 10))
    sent = await telegram.wait_for_sent(3, within=30)
    assert [f"answer to question {n}" in s.text for n, s in enumerate(sent)] == [True] * 3

    code, out, err = await bot.command("usage")
    assert code == 0, err
    header, *rows, total = out.splitlines()
    assert header.split() == [
        "day",
        "agent",
        "calls",
        "prompt",
        "cached",
        "completion",
        "reasoning",
        "total",
    ]
    assert [row.split()[1] for row in rows] == ["Triage"]
    calls, prompt, cached, completion, reasoning, tokens = total.split()[1:]
    assert (int(calls), int(prompt), int(cached), int(completion)) == (
        3,
        3 * PROMPT,
        3 * CACHED,
        3 * COMPLETION,
    )
    assert (int(reasoning), int(tokens)) == (0, 3 * (PROMPT + COMPLETION))

    prices = tmp_path / "prices.json"
    prices.write_text('{"gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.6}}')
    # The first usage above is the real CLI; this one runs in the test process.
    code, out, err = await bot.command_in_process("usage", "--days", "1", MODEL_PRICES=str(prices))
    assert code == 0, err
    # 3 x ((1500 - 1024) x 0.15 + 1024 x 0.075 + 20 x 0.6) per million = $0.000481
    assert out.splitlines()[-1].endswith("$0.0005")

    metrics = await fetch_metrics(bot)
    for kind, value in (
        ("prompt", 3 * PROMPT),
        ("cached_prompt", 3 * CACHED),
        ("completion", 3 * COMPLETION),
    ):
        line = f'chatflow_tokens_total{{agent="Triage",call="chat",kind="{kind}"}} {value}.0'
        assert line in metrics
    assert 'kind="reasoning"' not in metrics  # the provider reported none: nothing invented


async def test_a_sender_over_the_daily_budget_is_told_once_and_costs_no_model_call(
    bots: BotFactory, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    bot = bots(MAX_TOKENS_PER_SENDER_PER_DAY="1000")
    await bot.start()
    telegram.push_update(update("private_text", 1, text="first question", message_id=10))
    (first,) = await telegram.wait_for_sent(1, within=30)
    assert "answer to first question" in first.text
    # 1,520 tokens spent: the next messages start no turn; the first of them earns the notice.
    for n in range(3):
        telegram.push_update(update("private_text", n + 2, text=f"more {n}", message_id=n + 11))
    # /help calls no model and is answered over the budget: in the same lane, it comes
    # after whatever the three messages before it were owed.
    command = [{"type": "bot_command", "offset": 0, "length": 5}]
    telegram.push_update(update("private_text", 5, text="/help", message_id=14, entities=command))
    sent = await telegram.wait_for_sent(3, within=30)
    assert NOTICE in sent[1].text
    assert NOTICE not in sent[2].text and "more" not in sent[2].text
    assert sum(NOTICE in s.text for s in telegram.sent) == 1
    assert len(openai.chat_requests) == 1
    metrics = await fetch_metrics(bot)
    assert 'chatflow_messages_over_budget_total{platform="telegram"} 3.0' in metrics
    log = "\n".join(bot.log)
    assert "more 0" not in log and "over the daily token budget" in log
