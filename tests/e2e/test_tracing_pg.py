"""Tracing end to end on PostgreSQL: the scenario of ``tests.e2e.tracing_scenario``, with the
ledger's and the jobs' trace context in PostgreSQL columns (``DATABASE_URL``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.botprocess import BotProcess
from tests.e2e.tracing_scenario import bot_env, run_tracing_scenario
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.otlp_server import FakeOtlpServer
from tests.fakes.telegram_server import FakeTelegramServer
from tests.pgtest import pg_dsn

__all__ = ["pg_dsn"]  # the fixture, imported for this module's test

pytestmark = pytest.mark.e2e


async def test_one_trace_per_message_and_linked_resends_on_postgres(
    tmp_path: Path, pg_dsn: str
) -> None:
    async with (
        FakeTelegramServer() as telegram,
        FakeOpenAIServer() as openai,
        FakeOtlpServer() as otlp,
    ):
        env = {**bot_env(telegram, openai, otlp), "DATABASE_URL": pg_dsn}
        bot = BotProcess(tmp_path / "data", env)
        await bot.start()
        try:
            await run_tracing_scenario(bot, telegram, openai, otlp, {"dsn": pg_dsn})
        finally:
            await bot.kill()
