"""Telegram drafts (``sendMessageDraft``) against the fake Bot API: private chats only,
the final's formatting and fallback, the last part of a long answer, flood control."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bot.errors import PlatformError
from bot.gateway.contract import MessageEvent, SessionSource
from bot.platforms.telegram.adapter import TelegramAdapter
from bot.platforms.telegram.drafts import draft_text
from bot.platforms.text import split_text, utf16_len
from tests.fakes.telegram_server import FakeTelegramServer, Fault

DM = 111111111
GROUP = -1001234567890


def event(chat_id: int, chat_type: str = "dm") -> MessageEvent:
    return MessageEvent(
        platform="telegram",
        message_id=f"telegram:{chat_id}:10",
        source=SessionSource("telegram", str(chat_id), chat_type, "7"),  # type: ignore[arg-type]
        text="hi",
    )


async def accepted(_: MessageEvent) -> bool:
    return True


@pytest.fixture
async def server() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as fake:
        yield fake


@pytest.fixture
async def adapter(server: FakeTelegramServer) -> AsyncIterator[TelegramAdapter]:
    made = TelegramAdapter(server.token, base_url=server.base_url, poll_timeout=1)
    await made.start(accepted)
    yield made
    await made.stop()


def test_drafts_are_for_private_chats_only(adapter: TelegramAdapter) -> None:
    assert adapter.draft_interval(event(DM)) == 1.0
    assert adapter.draft_interval(event(GROUP, "group")) is None


async def test_a_draft_goes_out_with_the_final_formatting(
    server: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    await adapter.send_draft(event(DM), 42, "Your order *ships* tomorrow")
    (frame,) = server.drafts
    assert (frame.chat_id, frame.draft_id) == (DM, 42)
    assert frame.text == "Your order *ships* tomorrow"
    assert frame.parse_mode == "Markdown"


async def test_a_half_written_markup_falls_back_to_plain_text(
    server: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    await adapter.send_draft(event(DM), 42, "Your order *ships tomor")
    (frame,) = server.drafts  # the refused formatted attempt is not recorded
    assert frame.text == "Your order *ships tomor"
    assert frame.parse_mode is None
    assert [r.method for r in server.requests].count("sendMessageDraft") == 2


async def test_a_long_answer_shows_the_part_being_written(
    server: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    text = ("A sentence of the long answer. " * 200) + "The end."
    await adapter.send_draft(event(DM), 42, text)
    (frame,) = server.drafts
    assert utf16_len(frame.text) <= 4096
    assert frame.text == split_text(text, 4096, length=utf16_len)[-1]
    assert frame.text.endswith("The end.")
    assert draft_text("short") == "short"


async def test_flood_control_on_a_draft_is_a_platform_error_with_retry_after(
    server: FakeTelegramServer, adapter: TelegramAdapter
) -> None:
    server.inject("sendMessageDraft", Fault.flood(3))
    with pytest.raises(PlatformError) as info:
        await adapter.send_draft(event(DM), 42, "Hello")
    assert info.value.retry_after == 3
    assert server.drafts == []
