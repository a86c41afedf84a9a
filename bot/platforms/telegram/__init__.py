"""Telegram, through python-telegram-bot: the adapter and what it is made of.

- ``adapter``: ``TelegramAdapter`` (start, send, typing, the webhook route);
- ``mapping``: an ``Update`` into a ``MessageEvent`` (``map_update``);
- ``polling`` and ``webhook``: the two ways updates arrive;
- ``request``: the PTB application and its HTTP client;
- ``errors``: PTB's errors into ``PlatformError`` with retry facts (``translate_error``);
- ``drafts``: streamed previews (``sendMessageDraft``);
- ``media`` and ``send_media``: files in and out.
"""

from __future__ import annotations

from bot.platforms.telegram.adapter import TelegramAdapter
from bot.platforms.telegram.errors import translate_error
from bot.platforms.telegram.mapping import GENERAL_TOPIC_ID, map_update
from bot.platforms.telegram.webhook import WEBHOOK_PATH

__all__ = [
    "GENERAL_TOPIC_ID",
    "WEBHOOK_PATH",
    "TelegramAdapter",
    "map_update",
    "translate_error",
]
