"""``python -m bot run`` against the fakes: a voice note is answered with a voice note.

The offline demo model answers from the transcript (the fake OpenAI server's
``/v1/audio/transcriptions``); the reply is spoken by the fake's
``/v1/audio/speech`` (real OGG/Opus bytes) with ``VOICE_REPLIES=auto``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.core.models.speech import is_ogg_opus
from bot.gateway.ledger.obligations import RECOVERED_MARKER
from tests.e2e.botprocess import BotProcess
from tests.e2e.test_media_bots import (
    APP_SECRET,
    VOICE_ID,
    model_env,
    telegram_update,
    whatsapp_content,
)
from tests.fakes.media_files import ogg_opus_bytes
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_voice import is_voice_note
from tests.fakes.whatsapp_webhook import PHONE_NUMBER_ID, WebhookSender

pytestmark = pytest.mark.e2e

ALICE = 111111111  # the private chat of voice.json
HEARD = 'that says: "where is my parcel"'


@pytest.fixture
async def openai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        server.transcript_for = lambda data: "where is my parcel"
        yield server


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        server.add_file(VOICE_ID, ogg_opus_bytes())
        yield server


def telegram_bot(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> BotProcess:
    return BotProcess(
        tmp_path / "data",
        {
            "TELEGRAM_BOT_TOKEN": telegram.token,
            "TELEGRAM_API_BASE_URL": telegram.base_url,
            "VOICE_REPLIES": "auto",
            **model_env(openai),
        },
    )


async def test_a_telegram_voice_note_is_answered_with_a_captioned_voice_note(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    bot = telegram_bot(tmp_path, telegram, openai)
    await bot.start()
    try:
        telegram.push_update(telegram_update("voice", 1))
        (voice,) = await telegram.voice.wait_for(1, within=20)
        telegram.push_update(telegram_update("private_text", 2, text="and a typed question"))
        (typed,) = await telegram.wait_for_sent(1, within=20)
        assert await bot.stop() == 0
    finally:
        await bot.kill()
    assert voice.chat_id == ALICE
    assert voice.caption is not None and HEARD in voice.caption  # the transcript reached the model
    assert is_ogg_opus(voice.file.data)
    (call,) = openai.speech.calls
    assert call.audio == voice.file.data
    assert (call.model, call.voice, call.response_format) == ("gpt-4o-mini-tts", "alloy", "opus")
    assert HEARD.replace('"', "") in call.input.replace('"', "")  # spoken: the reply's text
    assert "and a typed question" in typed.text  # typed in, text out (auto)
    assert len(telegram.voice.sent) == 1
    log = "\n".join(bot.log)
    assert "where is my parcel" not in log


async def test_voice_messages_forbidden_gets_text_and_is_remembered(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    telegram.voice.forbidden.add(ALICE)
    bot = telegram_bot(tmp_path, telegram, openai)
    await bot.start()
    try:
        telegram.push_update(telegram_update("voice", 1))
        (first,) = await telegram.wait_for_sent(1, within=20)
        assert await bot.stop() == 0  # a restart still remembers the refusal
        await bot.start()
        telegram.push_update(telegram_update("voice", 2, message_id=99))
        second = (await telegram.wait_for_sent(2, within=20))[1]
        assert await bot.stop() == 0
    finally:
        await bot.kill()
    assert HEARD in first.text and HEARD in second.text
    assert len(telegram.sent) == 2
    attempts = [r for r in telegram.requests if r.method == "sendVoice"]
    assert len(attempts) == 1  # the second voice note was answered without an attempt
    assert len(openai.speech.calls) == 1  # ... and without a synthesis
    assert telegram.voice.sent == []


async def test_a_speech_service_failure_answers_with_text(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    openai.speech.failures = 100
    bot = telegram_bot(tmp_path, telegram, openai)
    await bot.start()
    try:
        telegram.push_update(telegram_update("voice", 1))
        (sent,) = await telegram.wait_for_sent(1, within=30)
    finally:
        await bot.kill()
    assert HEARD in sent.text
    assert openai.speech.requests >= 1 and openai.speech.calls == []
    assert [r for r in telegram.requests if r.method == "sendVoice"] == []
    assert any("voice reply not synthesized (ModelError)" in line for line in bot.log)


async def test_a_kill_between_synthesis_and_send_ends_with_one_voice_reply(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    telegram.voice.hold_next = 1  # the first sendVoice never arrives: the bot dies first
    bot = telegram_bot(tmp_path, telegram, openai)
    await bot.start()
    telegram.push_update(telegram_update("voice", 1))
    await asyncio.wait_for(telegram.voice.arrived.wait(), 20)
    await bot.kill()  # after tx 2 (the reply and its audio are owed), before the send
    await bot.start()
    try:
        (voice,) = await telegram.voice.wait_for(1, within=20)
        assert await bot.stop() == 0
    finally:
        telegram.release_hangs()
        await bot.kill()
    assert voice.caption is not None and voice.caption.startswith(RECOVERED_MARKER.strip())
    assert HEARD in voice.caption
    assert len(openai.speech.calls) == 1  # the stored audio was resent, not synthesized again
    assert voice.file.data == openai.speech.calls[0].audio
    assert len(telegram.voice.sent) == 1 and telegram.sent == []


async def test_a_kill_during_synthesis_reruns_the_turn_and_answers_once(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    openai.speech.hold_next = 1  # the first synthesis never returns: the bot dies waiting
    bot = telegram_bot(tmp_path, telegram, openai)
    await bot.start()
    telegram.push_update(telegram_update("voice", 1))
    await asyncio.wait_for(openai.speech.arrived.wait(), 20)
    await bot.kill()  # before tx 2: no reply is owed yet, the turn runs again
    await bot.start()
    try:
        (voice,) = await telegram.voice.wait_for(1, within=20)
        assert await bot.stop() == 0
    finally:
        openai.speech.release.set()
        await bot.kill()
    assert voice.caption is not None and HEARD in voice.caption
    assert RECOVERED_MARKER.strip() not in voice.caption  # nothing had been sent before
    assert openai.speech.requests == 2 and len(openai.speech.calls) == 1
    assert len(telegram.voice.sent) == 1 and telegram.sent == []


@pytest.fixture
async def graph() -> AsyncIterator[FakeWhatsAppServer]:
    async with FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token="e2e-token") as server:
        server.add_media("voice-77", ogg_opus_bytes(), "audio/ogg")
        yield server


async def test_a_whatsapp_voice_note_is_answered_with_a_voice_note_then_text_or_text_alone(
    tmp_path: Path, graph: FakeWhatsAppServer, openai: FakeOpenAIServer
) -> None:
    bot = BotProcess(
        tmp_path / "data",
        {
            "WHATSAPP_PHONE_ID": PHONE_NUMBER_ID,
            "WHATSAPP_TOKEN": "e2e-token",
            "WHATSAPP_VERIFY_TOKEN": "verify-me",
            "WHATSAPP_APP_SECRET": APP_SECRET,
            "WHATSAPP_API_BASE_URL": graph.base_url,
            "VOICE_REPLIES": "auto",
            **model_env(openai),
        },
    )
    await bot.start()
    sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
    voice = {**whatsapp_content("voice"), "id": "voice-77"}
    try:
        await sender.post_one(sender.single(sender.message("audio", voice)))
        note, text = await graph.wait_for_sent(2, within=20)
        # Then the speech service fails: the next voice note is answered with text alone.
        openai.speech.failures = 100
        await sender.post_one(sender.single(sender.message("audio", voice)))
        *_, fallback = await graph.wait_for_sent(3, within=20)
    finally:
        await bot.kill()
    assert is_voice_note(note.json) and note.json["audio"]["id"]
    (upload,) = graph.uploads
    assert upload.mime_type.startswith("audio/ogg") and is_ogg_opus(upload.data)
    assert upload.data == openai.speech.calls[0].audio
    assert note.json["audio"]["id"] == upload.media_id
    assert HEARD in text.json["text"]["body"]
    assert fallback.json["type"] == "text" and HEARD in fallback.json["text"]["body"]
    assert len(graph.sent) == 3 and len(openai.speech.calls) == 1
