"""``python -m bot send`` beside the real bot (``python -m bot run``) and the fake Bot API."""

from __future__ import annotations

import time
from pathlib import Path

from tests.e2e.botprocess import BotProcess
from tests.e2e.telegram_bot_fixtures import bot, telegram
from tests.e2e.test_telegram_bot import update
from tests.fakes.telegram_server import FakeTelegramServer

__all__ = ["bot", "telegram"]  # the fixtures, imported for this module's tests

CHAT_ID = 111111111  # the private chat of tests/data/telegram/private_text.json


async def test_a_message_sent_to_a_running_bot_goes_out_once_within_seconds(
    bot: BotProcess, telegram: FakeTelegramServer
) -> None:
    text = "Your parcel #1001 shipped today."
    code, out, err = await bot.command("send", f"telegram:{CHAT_ID}", text)
    handed = time.monotonic()
    assert code == 0, err
    assert out.startswith("sent to the running bot: ")
    (sent,) = await telegram.wait_for_sent(1, within=10)
    latency = time.monotonic() - handed
    print(f"\noperator send picked up and delivered {latency:.2f} s after the command returned")
    assert latency < 10
    assert (sent.chat_id, sent.text) == (CHAT_ID, text)

    # The conversation goes on: the next reply follows it, and nothing was sent twice.
    telegram.push_update(update("private_text", 1, text="thanks!"))
    sent_all = await telegram.wait_for_sent(2, within=20)
    assert [s.text for s in sent_all].count(text) == 1
    assert len(telegram.sent) == 2
    log = "\n".join(bot.log)
    assert text not in log and str(CHAT_ID) not in log


async def test_a_message_queued_with_no_bot_running_is_sent_once_when_it_starts(
    tmp_path: Path, telegram: FakeTelegramServer
) -> None:
    process = BotProcess(
        tmp_path / "data",
        {"TELEGRAM_BOT_TOKEN": telegram.token, "TELEGRAM_API_BASE_URL": telegram.base_url},
    )
    text = "We are open again tomorrow at 9."
    code, out, err = await process.command("send", f"telegram:{CHAT_ID}", text)
    assert code == 0, err
    assert out.startswith("queued ") and "sent when the bot starts" in out
    assert telegram.sent == []
    await process.start()
    try:
        (sent,) = await telegram.wait_for_sent(1, within=20)
        assert (sent.chat_id, sent.text) == (CHAT_ID, text)
        telegram.push_update(update("private_text", 1, text="great"))
        await telegram.wait_for_sent(2, within=20)
        assert [s.text for s in telegram.sent].count(text) == 1
    finally:
        await process.kill()
