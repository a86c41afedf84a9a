"""Shared fixtures: an adapter started against its fake platform server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bot.gateway.contract import MessageEvent
from bot.platforms.telegram.adapter import TelegramAdapter
from bot.platforms.whatsapp.adapter import WhatsAppAdapter
from tests.fakes.telegram_server import FakeTelegramServer
from tests.fakes.whatsapp_server import FakeWhatsAppServer


async def _accept(event: MessageEvent) -> bool:
    return True


@pytest.fixture
async def telegram_on_fake() -> AsyncIterator[tuple[TelegramAdapter, FakeTelegramServer]]:
    async with FakeTelegramServer() as server:
        made = TelegramAdapter(server.token, base_url=server.base_url, poll_timeout=1)
        await made.start(_accept)
        try:
            yield made, server
        finally:
            await made.stop()


@pytest.fixture
async def whatsapp_on_fake() -> AsyncIterator[tuple[WhatsAppAdapter, FakeWhatsAppServer]]:
    async with FakeWhatsAppServer() as graph:
        adapter = WhatsAppAdapter(
            graph.phone_id,
            "test-token",
            verify_token="vt",
            app_secret="secret",
            api_base_url=graph.base_url,
            send_pause=0,
        )
        await adapter.start(_accept)
        try:
            yield adapter, graph
        finally:
            await adapter.stop()
