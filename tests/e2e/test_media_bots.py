"""``python -m bot run`` against the fakes: photos, voice notes and PDFs on both platforms,
kills during the download, the transcription and the turn, and reply-to context.

The chat model is the offline demo (it answers media plainly, from what it was
given) unless a test points ``DEFAULT_MODEL`` at the fake OpenAI server; voice
notes are transcribed by the fake OpenAI server's ``/v1/audio/transcriptions``.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.botprocess import BotProcess
from tests.fakes.media_files import jpeg_bytes, ogg_opus_bytes, pdf_bytes
from tests.fakes.openai_server import FakeOpenAIServer, RecordedRequest
from tests.fakes.telegram_server import FakeTelegramServer, Fault
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_webhook import PHONE_NUMBER_ID, USER_WA_ID, WebhookSender, real_wamid

DATA = Path(__file__).resolve().parents[1] / "data"
APP_SECRET = "e2e-media-secret"
PHOTO_ID = "AgACAgQAAxkBAAIBsmbE2"  # the largest size in photo_caption.json
VOICE_ID = "AwACAgQAAxkBAAIBtG"  # voice.json
INVOICE = pdf_bytes("Invoice 4471", "Total due: 129.00 EUR")


def telegram_update(name: str, update_id: int, **message: Any) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads((DATA / "telegram" / f"{name}.json").read_text())
    payload = copy.deepcopy(payload)
    payload["update_id"] = update_id
    payload["message"].update(message)
    return payload


def pdf_update(update_id: int) -> dict[str, Any]:
    document = {
        "file_id": "BQACAgQAAxkBAAIBdoc",
        "file_unique_id": "AgADdoc",
        "file_name": "invoice.pdf",
        "mime_type": "application/pdf",
        "file_size": len(INVOICE),
    }
    update = telegram_update("private_text", update_id, message_id=30, document=document)
    del update["message"]["text"]
    return update


def whatsapp_content(name: str) -> dict[str, Any]:
    """The media object of a recorded pywa payload (``image``, ``audio``, ``document``)."""
    body = json.loads((DATA / "whatsapp" / f"{name}.json").read_text())
    (message,) = body["entry"][0]["changes"][0]["value"]["messages"]
    content: dict[str, Any] = message[message["type"]]
    return content


@pytest.fixture
async def openai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


def model_env(openai: FakeOpenAIServer, model: str = "offline") -> dict[str, str]:
    return {
        "OPENAI_API_KEY": openai.api_key,
        "OPENAI_BASE_URL": openai.base_url,
        "DEFAULT_MODEL": model,
        "TRANSCRIPTION_MODEL": "whisper-1",
    }


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        server.add_file(PHOTO_ID, jpeg_bytes())
        server.add_file(VOICE_ID, ogg_opus_bytes())
        server.add_file("BQACAgQAAxkBAAIBdoc", INVOICE)
        yield server


def telegram_bot(tmp_path: Path, telegram: FakeTelegramServer, env: dict[str, str]) -> BotProcess:
    return BotProcess(
        tmp_path / "data",
        {
            "TELEGRAM_BOT_TOKEN": telegram.token,
            "TELEGRAM_API_BASE_URL": telegram.base_url,
            **env,
        },
    )


async def test_telegram_photo_voice_and_pdf_are_answered_from_their_content(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    openai.transcripts.append("where is my parcel")
    bot = telegram_bot(tmp_path, telegram, model_env(openai))
    await bot.start()
    try:
        telegram.push_update(telegram_update("photo_caption", 1))
        (photo,) = await telegram.wait_for_sent(1, within=20)
        telegram.push_update(telegram_update("voice", 2))
        await telegram.wait_for_sent(2, within=20)
        telegram.push_update(pdf_update(3))
        sent = await telegram.wait_for_sent(3, within=20)
    finally:
        await bot.kill()
    assert "I received a photo" in photo.text and "What is this bird?" in photo.text
    assert 'that says: "where is my parcel"' in sent[1].text
    assert "invoice.pdf" in sent[2].text and "Invoice 4471" in sent[2].text
    assert openai.transcription_files == [("whisper-1", "voice-note.ogg", ogg_opus_bytes())]
    log = "\n".join(bot.log)
    for private in ("What is this bird?", "where is my parcel", "invoice.pdf", "4471"):
        assert private not in log


async def test_a_telegram_photo_reaches_a_vision_model_as_an_image_part(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    openai.add(openai.reply("A small white square, not a bird."))
    bot = telegram_bot(tmp_path, telegram, model_env(openai, "gpt-test"))
    await bot.start()
    try:
        telegram.push_update(telegram_update("photo_caption", 1))
        (sent,) = await telegram.wait_for_sent(1, within=20)
    finally:
        await bot.kill()
    assert sent.text == "A small white square, not a bird."
    (request,) = openai.chat_requests
    assert openai.validation_errors == []
    assert request.images == [("image/jpeg", jpeg_bytes())]
    assert request.messages[-1]["content"][0]["text"].startswith("What is this bird?")


async def test_a_kill_during_the_download_ends_with_one_answer_that_used_the_photo(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    telegram.inject("getFile", Fault.hanging())
    bot = telegram_bot(tmp_path, telegram, model_env(openai))
    await bot.start()
    telegram.push_update(telegram_update("photo_caption", 1))
    await telegram.wait_for_request("getFile", 1, within=20)
    await bot.kill()  # tx 1 is done (the offset moved), the download never finished
    telegram.release_hangs()
    await bot.start()
    try:
        (sent,) = await telegram.wait_for_sent(1, within=20)
        assert await bot.stop() == 0  # a clean stop drains: a second answer would be sent
    finally:
        await bot.kill()
    assert "I received a photo" in sent.text and "What is this bird?" in sent.text
    assert len(telegram.sent) == 1


async def test_a_kill_during_the_turn_ends_with_one_answer_that_used_the_photo(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    openai.add(openai.held(openai.reply("never sent")))
    openai.responder = lambda request: openai.reply("A white square.")
    called = asyncio.Event()
    openai.on_request = lambda request: called.set()
    bot = telegram_bot(tmp_path, telegram, model_env(openai, "gpt-test"))
    await bot.start()
    telegram.push_update(telegram_update("photo_caption", 1))
    await asyncio.wait_for(called.wait(), 20)  # the first run's model call is in flight
    await bot.kill()
    await bot.start()
    try:
        (sent,) = await telegram.wait_for_sent(1, within=20)
        assert await bot.stop() == 0
    finally:
        await bot.kill()
    assert sent.text == "A white square."
    first, second = openai.chat_requests
    # The re-run read the photo from DATA_DIR/media: no second download was needed.
    assert first.images == second.images == [("image/jpeg", jpeg_bytes())]
    assert telegram.downloads == [f"files/{PHOTO_ID}.bin"]


async def test_a_kill_during_transcription_ends_with_one_answer_that_used_the_voice(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    reached = asyncio.Event()

    def kill_switch(request: RecordedRequest) -> None:
        reached.set()

    openai.transcription_hook = kill_switch
    openai.transcripts.extend(["call me back", "call me back"])
    bot = telegram_bot(tmp_path, telegram, model_env(openai))
    await bot.start()
    telegram.push_update(telegram_update("voice", 1))
    await asyncio.wait_for(reached.wait(), 20)
    await bot.kill()
    openai.transcription_hook = None
    await bot.start()
    try:
        (sent,) = await telegram.wait_for_sent(1, within=20)
        assert await bot.stop() == 0
    finally:
        await bot.kill()
    assert 'that says: "call me back"' in sent.text
    assert len(telegram.sent) == 1


@pytest.fixture
async def graph() -> AsyncIterator[FakeWhatsAppServer]:
    async with FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token="e2e-token") as server:
        server.add_media("1003383421387256", jpeg_bytes(), "image/jpeg")
        server.add_media("voice-77", ogg_opus_bytes(), "audio/ogg")
        server.add_media("doc-88", INVOICE, "application/pdf")
        yield server


def whatsapp_bot(
    tmp_path: Path, graph: FakeWhatsAppServer, env: dict[str, str] | None = None
) -> BotProcess:
    return BotProcess(
        tmp_path / "data",
        {
            "WHATSAPP_PHONE_ID": PHONE_NUMBER_ID,
            "WHATSAPP_TOKEN": "e2e-token",
            "WHATSAPP_VERIFY_TOKEN": "verify-me",
            "WHATSAPP_APP_SECRET": APP_SECRET,
            "WHATSAPP_API_BASE_URL": graph.base_url,
            **(env or {}),
        },
    )


async def test_whatsapp_photo_voice_and_pdf_are_answered_from_their_content(
    tmp_path: Path, graph: FakeWhatsAppServer, openai: FakeOpenAIServer
) -> None:
    openai.transcripts.append("my order never arrived")
    bot = whatsapp_bot(tmp_path, graph, model_env(openai))
    await bot.start()
    sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
    voice = {**whatsapp_content("voice"), "id": "voice-77"}
    document = {**whatsapp_content("document"), "id": "doc-88", "filename": "invoice.pdf"}
    try:
        assert (await sender.post_one(sender.image("¿Tenéis esta talla?"))).status_code == 200
        await graph.wait_for_sent(1, within=20)
        await sender.post_one(sender.single(sender.message("audio", voice)))
        await graph.wait_for_sent(2, within=20)
        await sender.post_one(sender.single(sender.message("document", document)))
        sent = await graph.wait_for_sent(3, within=20)
    finally:
        await bot.kill()
    texts = [s.json["text"]["body"] for s in sent]
    assert "I received a photo" in texts[0] and "¿Tenéis esta talla?" in texts[0]
    assert 'that says: "my order never arrived"' in texts[1]
    assert "invoice.pdf" in texts[2] and "Invoice 4471" in texts[2]
    assert graph.media_downloads == ["1003383421387256", "voice-77", "doc-88"]
    log = "\n".join(bot.log)
    for private in ("Tenéis", "never arrived", "invoice.pdf", "4471", "media-download"):
        assert private not in log


async def test_a_whatsapp_reply_to_the_bot_shows_the_model_what_it_quoted(
    tmp_path: Path, graph: FakeWhatsAppServer
) -> None:
    bot = whatsapp_bot(tmp_path, graph)
    await bot.start()
    sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
    try:
        await sender.post_one(sender.text("hello"))
        await graph.wait_for_sent(1, within=20)
        # The inbound reply carries only context.id: the wamid of the bot's answer.
        await sender.post_one(sender.reply("is that so?", to_wamid=graph.sent_wamids[0]))
        sent = await graph.wait_for_sent(2, within=20)
    finally:
        await bot.kill()
    echoed = sent[1].json["text"]["body"]
    assert '[Replying to your earlier message: "[offline demo] Triage here.' in echoed
    assert "is that so?" in echoed


async def test_a_whatsapp_reply_to_the_users_own_message_shows_it_from_the_journal(
    tmp_path: Path, graph: FakeWhatsAppServer, openai: FakeOpenAIServer
) -> None:
    openai.add(openai.reply("Let me check."), openai.reply("It ships today."))
    bot = whatsapp_bot(tmp_path, graph, model_env(openai, "gpt-test"))
    await bot.start()
    sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
    first = real_wamid(USER_WA_ID)
    try:
        await sender.post_one(sender.text("where is order 1001?", wamid=first))
        await graph.wait_for_sent(1, within=20)
        # A reply carries only context.id: here the wamid of the user's own message.
        quote = {"from": USER_WA_ID, "id": first}
        await sender.post_one(sender.text("any news?", context=quote))
        await graph.wait_for_sent(2, within=20)
    finally:
        await bot.kill()
    assert openai.chat_requests[1].messages[-1]["content"] == (
        '[Replying to their own earlier message: "where is order 1001?"]\nany news?'
    )
