"""Tracing end to end on SQLite: ``python -m bot run`` exporting to a fake OTLP/HTTP collector.

The scenario and what it checks are in ``tests.e2e.tracing_scenario``; the
PostgreSQL run is ``tests/e2e/test_tracing_pg.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.botprocess import BotProcess
from tests.e2e.tracing_scenario import bot_env, run_tracing_scenario
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.otlp_server import FakeOtlpServer
from tests.fakes.telegram_server import FakeTelegramServer

pytestmark = pytest.mark.e2e


async def test_one_trace_per_message_linked_resends_and_no_content(tmp_path: Path) -> None:
    async with (
        FakeTelegramServer() as telegram,
        FakeOpenAIServer() as openai,
        FakeOtlpServer() as otlp,
    ):
        bot = BotProcess(tmp_path / "data", bot_env(telegram, openai, otlp))
        await bot.start()
        try:
            await run_tracing_scenario(bot, telegram, openai, otlp)
        finally:
            await bot.kill()
