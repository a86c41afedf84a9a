"""Voice notes out: Telegram ``sendVoice`` and WhatsApp's ``audio`` with ``voice: true``,
against the fake Bot API and the fake Graph API."""

from __future__ import annotations

import pytest

from bot.core.models.speech import silent_ogg_opus
from bot.errors import PlatformError
from bot.gateway.contract import VOICE_FORBIDDEN, OutgoingFile
from bot.platforms.telegram.adapter import TelegramAdapter
from bot.platforms.whatsapp.adapter import WhatsAppAdapter
from tests.fakes.telegram_server import FakeTelegramServer, Fault
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_voice import is_voice_note

NOTE = OutgoingFile("voice", silent_ogg_opus(), "audio/ogg", "voice.ogg")


async def test_telegram_sends_the_note_with_its_caption_into_the_topic_quoting(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer],
) -> None:
    telegram, server = telegram_on_fake
    assert telegram.voice_caption_limit == 1024
    result = await telegram.send_voice(
        "111111111", NOTE, caption="It ships Friday.", thread_id="7", reply_to="telegram:1:55"
    )
    (sent,) = server.voice.sent
    assert (sent.chat_id, sent.caption, sent.message_thread_id) == (
        111111111,
        "It ships Friday.",
        7,
    )
    assert sent.reply_parameters is not None and sent.reply_parameters["message_id"] == 55
    assert sent.file.data == NOTE.data and sent.file.filename == "voice.ogg"
    assert result.message_ids == [str(sent.message_id)]
    assert server.sent == []


async def test_telegram_voice_messages_forbidden_has_its_own_code(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer],
) -> None:
    telegram, server = telegram_on_fake
    server.voice.forbidden.add(111111111)
    with pytest.raises(PlatformError) as caught:
        await telegram.send_voice("111111111", NOTE)
    assert caught.value.code == VOICE_FORBIDDEN and not caught.value.retryable
    server.inject("sendVoice", Fault.bad_request("chat not found"))
    with pytest.raises(PlatformError) as other:
        await telegram.send_voice("222222222", NOTE)
    assert other.value.code == 400


async def test_telegram_a_caption_that_does_not_parse_is_sent_plain(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer],
) -> None:
    telegram, server = telegram_on_fake
    telegram._parse_mode = "MarkdownV2"
    server.inject("sendVoice", Fault.bad_request("can't parse entities: unclosed"))
    await telegram.send_voice("111111111", NOTE, caption="50% *off")
    (sent,) = server.voice.sent
    assert sent.caption == "50% *off"
    calls = [r for r in server.requests if r.method == "sendVoice"]
    assert [c.params.get("parse_mode") for c in calls] == ["MarkdownV2", None]


async def test_whatsapp_uploads_ogg_and_sends_an_audio_message_marked_voice(
    whatsapp_on_fake: tuple[WhatsAppAdapter, FakeWhatsAppServer],
) -> None:
    adapter, graph = whatsapp_on_fake
    assert adapter.voice_caption_limit == 0  # the text goes as its own message
    result = await adapter.send_voice("5491155550000", NOTE, reply_to="wamid.abc")
    (upload,) = graph.uploads
    assert (upload.data, upload.mime_type) == (NOTE.data, "audio/ogg")
    (message,) = graph.sent
    assert is_voice_note(message.json)
    assert message.json["audio"] == {"id": upload.media_id, "voice": True}
    assert message.json["context"] == {"message_id": "wamid.abc"}
    assert result.message_ids == graph.sent_wamids
    assert result.message_ids[0] in adapter._sent_ids


async def test_whatsapp_sends_no_note_outside_the_window(
    whatsapp_on_fake: tuple[WhatsAppAdapter, FakeWhatsAppServer],
) -> None:
    adapter, graph = whatsapp_on_fake

    class Closed:
        async def is_open(self, platform: str, chat_id: str, length: float) -> bool | None:
            return False

    adapter.windows = Closed()
    with pytest.raises(PlatformError) as caught:
        await adapter.send_voice("5491155550000", NOTE)
    assert caught.value.code == "window_closed" and not caught.value.retryable
    assert graph.uploads == [] and graph.sent == []
