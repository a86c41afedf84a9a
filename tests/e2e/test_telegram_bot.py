"""The real bot (long polling through PTB over HTTP) against the fake Bot API."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from bot.gateway.ledger.obligations import RECOVERED_MARKER
from tests.e2e.botprocess import BotProcess
from tests.e2e.telegram_bot_fixtures import bot, telegram
from tests.fakes.telegram_server import FakeTelegramServer, Fault

__all__ = ["bot", "telegram"]  # the fixtures, imported for this module's tests

DATA = Path(__file__).resolve().parents[1] / "data" / "telegram"


def update(name: str, update_id: int, **message: Any) -> dict[str, Any]:
    payload: dict[str, Any] = copy.deepcopy(json.loads((DATA / f"{name}.json").read_text()))
    payload["update_id"] = update_id
    payload["message"].update(message)
    return payload


async def test_dm_and_group_mention_are_answered_and_plain_group_talk_is_not(
    bot: BotProcess, telegram: FakeTelegramServer
) -> None:
    telegram.push_update(update("private_text", 1, text="hello there"))
    (dm,) = await telegram.wait_for_sent(1, within=20)
    assert dm.chat_id == 111111111
    assert "Triage" in dm.text
    assert dm.reply_parameters is not None and dm.reply_parameters["message_id"] == 10

    telegram.push_update(update("group_plain", 2))
    telegram.push_update(update("group_mention", 3))
    sent = await telegram.wait_for_sent(2, within=20)
    assert sent[1].chat_id == -1001234567890
    assert sent[1].reply_parameters is not None and sent[1].reply_parameters["message_id"] == 20
    # the plain group message got no answer: the mention came after it and is the only reply
    assert len(telegram.sent) == 2
    log = "\n".join(bot.log)
    assert telegram.token not in log and "hello there" not in log


async def test_reply_lost_to_a_kill_during_send_is_resent_with_the_marker(
    bot: BotProcess, telegram: FakeTelegramServer
) -> None:
    telegram.inject("sendMessage", Fault.hanging())
    telegram.push_update(update("private_text", 1, text="where is my order #1001?"))
    await telegram.wait_for_request("sendMessage", 1, within=20)
    await bot.kill()
    telegram.release_hangs()  # the held send now "arrives"
    await bot.start()
    sent = await telegram.wait_for_sent(2, within=20)
    assert not sent[0].text.startswith(RECOVERED_MARKER)
    assert sent[1].text.startswith(RECOVERED_MARKER)
    assert "1001" in sent[1].text


async def test_an_update_redelivered_after_a_restart_is_answered_once(
    bot: BotProcess, telegram: FakeTelegramServer
) -> None:
    telegram.push_update(update("private_text", 1, text="only once"))
    await telegram.wait_for_sent(1, within=20)
    assert await bot.stop() == 0
    # Telegram offers the same update again (e.g. its offset confirmation was lost).
    telegram.push_update(update("private_text", 2, text="only once"))
    telegram.push_update(update("private_text", 3, text="next", message_id=11))
    await bot.start()
    sent = await telegram.wait_for_sent(2, within=20)
    assert "next" in sent[1].text
    assert len(telegram.sent) == 2
