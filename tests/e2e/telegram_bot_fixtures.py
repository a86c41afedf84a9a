"""The real bot against the fake Bot API: the fixtures the Telegram e2e modules share.

Import them into a test module (and list them in its ``__all__``) to use them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.botprocess import BotProcess
from tests.fakes.telegram_server import FakeTelegramServer

__all__ = ["bot", "telegram"]


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegramServer]:
    """A fake Bot API on 127.0.0.1, closed after the test."""
    async with FakeTelegramServer() as server:
        yield server


@pytest.fixture
async def bot(tmp_path: Path, telegram: FakeTelegramServer) -> AsyncIterator[BotProcess]:
    """``python -m bot run`` polling ``telegram``; killed after the test."""
    process = BotProcess(
        tmp_path / "data",
        {"TELEGRAM_BOT_TOKEN": telegram.token, "TELEGRAM_API_BASE_URL": telegram.base_url},
    )
    await process.start()
    yield process
    await process.kill()
