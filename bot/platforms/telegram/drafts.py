"""Telegram drafts (``sendMessageDraft``, Bot API 9.3+): the answer shown as it grows.

Private chats only (the method is for them); groups show typing. A draft is
ephemeral (Telegram drops it after about 30 s) and is never the delivery: the
gateway sends the final text with ``sendMessage`` through its ledger. So a
failed draft costs nothing but the preview, and ``send_draft`` never retries.

Formatting is the final's: the adapter's ``parse_mode``, and plain text when
Telegram cannot parse it (a half-written answer often has an unclosed ``*``).
A text longer than one message shows its last part, the one being written,
cut where ``send`` will cut the final.
"""

from __future__ import annotations

import logging
from typing import Literal

from telegram.error import BadRequest

from bot.errors import PlatformError
from bot.gateway.contract import MessageEvent, SendPacer
from bot.platforms.telegram.errors import map_telegram_errors
from bot.platforms.telegram.mapping import GENERAL_TOPIC_ID, PLATFORM
from bot.platforms.telegram.pacing import take_turn
from bot.platforms.telegram.request import AppType
from bot.platforms.text import split_text, utf16_len

__all__ = ["DRAFT_INTERVAL", "TelegramDrafts", "draft_text"]

logger = logging.getLogger(__name__)

DRAFT_INTERVAL = 1.0
"""Seconds between two drafts of one answer (Telegram's flood limits allow about
one message per second per chat)."""

_MAX_UTF16 = 4096
_PARSE_ERROR = "can't parse entities"


def draft_text(text: str) -> str:
    """What a draft of ``text`` shows: all of it, or its last 4096-unit part."""
    if utf16_len(text) <= _MAX_UTF16:
        return text
    parts = split_text(text, _MAX_UTF16, length=utf16_len)
    return parts[-1] if parts else ""


class TelegramDrafts:
    """The draft hooks of ``TelegramAdapter`` (a mixin over its attributes)."""

    _app: AppType | None
    _token: str
    _parse_mode: Literal["Markdown", "MarkdownV2", "HTML"] | None
    pacer: SendPacer | None

    draft_seconds: float = DRAFT_INTERVAL
    """Seconds between two drafts of one answer."""

    def draft_interval(self, event: MessageEvent) -> float | None:
        """``draft_seconds`` in a private chat; ``None`` (typing only) elsewhere."""
        return self.draft_seconds if event.source.chat_type == "dm" else None

    async def send_draft(self, event: MessageEvent, draft_id: int, text: str) -> None:
        """``sendMessageDraft`` of ``text`` (``""``: Telegram's "Thinking..." placeholder);
        skipped when the account's pacer has replies waiting."""
        app = self._app
        if app is None:
            raise PlatformError("Telegram adapter is not started", platform=PLATFORM)
        source = event.source
        try:
            chat = int(source.chat_id)
            thread = source.thread_id
            topic = int(thread) if thread not in (None, GENERAL_TOPIC_ID) else None
        except ValueError as exc:
            raise PlatformError(
                "Telegram draft ids must be numeric", platform=PLATFORM, code="bad_id"
            ) from exc
        shown = draft_text(text)
        if not await take_turn(self.pacer, chat, optional=True):
            return  # replies are waiting for the account's budget: no preview now
        with map_telegram_errors(self._token):
            if self._parse_mode is not None and shown:
                try:
                    await app.bot.send_message_draft(
                        chat, draft_id, shown, message_thread_id=topic, parse_mode=self._parse_mode
                    )
                    return
                except BadRequest as exc:
                    if _PARSE_ERROR not in str(exc).lower():
                        raise
                    logger.debug("Telegram could not parse a draft's formatting; plain text")
            await app.bot.send_message_draft(chat, draft_id, shown, message_thread_id=topic)
