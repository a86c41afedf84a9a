"""The real bot against a fake Bot API that enforces Telegram's flood limits.

Many replies fall due at once (one ``getUpdates`` batch of DMs, and several
mentions in one group): the bot paces them itself, so Telegram never answers
429, and every reply arrives once.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from tests.e2e.botprocess import BotProcess
from tests.e2e.telegram_bot_fixtures import bot, telegram
from tests.fakes.telegram_server import FakeTelegramServer

__all__ = ["bot", "telegram"]  # the fixtures, imported for this module's tests

DATA = Path(__file__).resolve().parents[1] / "data" / "telegram"
DMS = 90
"""Three seconds' worth of Telegram's 30 messages per second."""
GROUP_MENTIONS = 4
GROUP_ID = -1001234567890


def payload(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return loaded


async def test_replies_due_at_once_are_paced_to_telegrams_limits_with_no_429(
    bot: BotProcess, telegram: FakeTelegramServer
) -> None:
    limits = telegram.enforce_limits()
    dm, mention = payload("private_text"), payload("group_mention")
    for i in range(DMS):
        update = copy.deepcopy(dm)
        user = 200_000_000 + i
        update["message"].update(
            message_id=10 + i,
            text=f"hello number {i}",
            **{"from": {**dm["message"]["from"], "id": user}},
            chat={**dm["message"]["chat"], "id": user},
        )
        telegram.push_update(update)
    for i in range(GROUP_MENTIONS):
        update = copy.deepcopy(mention)
        update["message"].update(
            message_id=500 + i, **{"from": {**mention["message"]["from"], "id": 300_000_000 + i}}
        )
        telegram.push_update(update)
    total = DMS + GROUP_MENTIONS
    sent = await telegram.wait_for_sent(total, within=60)
    assert limits.refusals == {}, f"Telegram refused {dict(limits.refusals)}"
    assert limits.peak(1.0) <= 30
    # Each message answered once: the replies quote every message, none twice.
    quoted = sorted(
        (s.chat_id, s.reply_parameters["message_id"]) for s in sent if s.reply_parameters
    )
    assert len(quoted) == total
    assert len(set(quoted)) == total
    assert sum(1 for s in sent if s.chat_id == GROUP_ID) == GROUP_MENTIONS
    assert not any("refused a send for flood" in line for line in bot.log)
