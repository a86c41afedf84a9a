"""``python -m bot run`` against the fakes: a tool's image reaches the user on Telegram and
WhatsApp, and a kill in the middle of sending it ends with the whole reply resent once.

The fake OpenAI server is scripted to call the test agent's ``send_chart`` tool
(``tests.fakes.media_agents``), which returns a small JPEG beside its text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.gateway.ledger.obligations import RECOVERED_MARKER
from tests.e2e.botprocess import BotProcess
from tests.e2e.test_media_bots import telegram_update
from tests.fakes.media_agents import CHART_NAME
from tests.fakes.media_files import jpeg_bytes
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer, Fault
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_webhook import PHONE_NUMBER_ID, WebhookSender

APP_SECRET = "e2e-media-out-secret"
ANSWER = "Here is your sales chart."


@pytest.fixture
async def openai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        server.add(server.call("send_chart", title="sales"), server.reply(ANSWER))
        yield server


def env(openai: FakeOpenAIServer, **more: str) -> dict[str, str]:
    return {
        "OPENAI_API_KEY": openai.api_key,
        "OPENAI_BASE_URL": openai.base_url,
        "DEFAULT_MODEL": "gpt-test",
        "AGENTS_MODULE": "tests.fakes.media_agents",
        **more,
    }


def telegram_bot(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> BotProcess:
    return BotProcess(
        tmp_path / "data",
        env(openai, TELEGRAM_BOT_TOKEN=telegram.token, TELEGRAM_API_BASE_URL=telegram.base_url),
    )


def assert_private(bot: BotProcess) -> None:
    log = "\n".join(bot.log)
    assert CHART_NAME not in log and "chart please" not in log


async def test_a_tools_image_reaches_the_telegram_user(
    tmp_path: Path, openai: FakeOpenAIServer
) -> None:
    async with FakeTelegramServer() as telegram:
        bot = telegram_bot(tmp_path, telegram, openai)
        await bot.start()
        try:
            telegram.push_update(telegram_update("private_text", 1, text="chart please"))
            (text,) = await telegram.wait_for_sent(1, within=20)
            (photo,) = await telegram.wait_for_files(1, within=20)
        finally:
            await bot.kill()
    assert text.text == ANSWER
    assert (photo.method, photo.chat_id) == ("sendPhoto", text.chat_id)
    assert photo.file.data == jpeg_bytes() and photo.file.filename == CHART_NAME
    tool_result = openai.chat_requests[1].messages[-1]
    assert tool_result["role"] == "tool" and "attached" in tool_result["content"]
    assert_private(bot)


async def test_a_tools_image_reaches_the_whatsapp_user(
    tmp_path: Path, openai: FakeOpenAIServer
) -> None:
    async with FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token="e2e-token") as graph:
        bot = BotProcess(
            tmp_path / "data",
            env(
                openai,
                WHATSAPP_PHONE_ID=PHONE_NUMBER_ID,
                WHATSAPP_TOKEN="e2e-token",
                WHATSAPP_VERIFY_TOKEN="verify-me",
                WHATSAPP_APP_SECRET=APP_SECRET,
                WHATSAPP_API_BASE_URL=graph.base_url,
            ),
        )
        await bot.start()
        sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
        try:
            assert (await sender.post_one(sender.text("chart please"))).status_code == 200
            ((message, upload),) = await graph.wait_for_media_sent(1, within=20)
            text = graph.sent[0]
        finally:
            await bot.kill()
    assert text.json["text"]["body"] == ANSWER
    assert message.json["type"] == "image" and message.json["to"] == text.json["to"]
    assert (upload.data, upload.mime_type, upload.filename) == (
        jpeg_bytes(),
        "image/jpeg",
        CHART_NAME,
    )
    assert_private(bot)


async def test_a_kill_while_the_photo_is_sent_resends_the_whole_reply_marked_once(
    tmp_path: Path, openai: FakeOpenAIServer
) -> None:
    async with FakeTelegramServer() as telegram:
        telegram.inject("sendPhoto", Fault.hanging())
        bot = telegram_bot(tmp_path, telegram, openai)
        await bot.start()
        telegram.push_update(telegram_update("private_text", 1, text="chart please"))
        await telegram.wait_for_request("sendPhoto", 1, within=20)
        await bot.kill()  # the text went out, the photo's answer never came back
        telegram.release_hangs()
        await bot.start()
        try:
            first, again = await telegram.wait_for_sent(2, within=20)
            await telegram.wait_for_files(2, within=20)
            assert await bot.stop() == 0  # a clean stop drains: a third copy would be sent
        finally:
            await bot.kill()
        assert first.text == ANSWER
        assert again.text == RECOVERED_MARKER + ANSWER
        assert len(telegram.sent) == 2
        assert [f.file.data for f in telegram.files_sent] == [jpeg_bytes(), jpeg_bytes()]
    assert len(openai.chat_requests) == 2  # the turn ran once: the resend is the ledger's
