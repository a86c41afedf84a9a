"""Telegram buttons: inline keyboards out, callback answers and keyboard removal.

A reply with buttons carries an inline keyboard (one button per row) on its
last part; each button's ``callback_data`` is the gateway's opaque token (at
most 64 bytes, never the tool's value). Labels are sent as the buttons' text,
which Telegram never parses, so a label's ``<b>`` or ``*`` shows as typed;
where a label goes into formatted text, ``escape_markup`` escapes it for the
parse mode. A tap is answered once (``answerCallbackQuery``) and, once
accepted, its keyboard removed (``editMessageReplyMarkup`` without a
keyboard). Both are best effort and log no ids or labels. ``TelegramButtons``
is the adapter's mixin for these hooks.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Sequence
from typing import Literal

from telegram import InlineKeyboardButton, InlineKeyboardMarkup

from bot.errors import PlatformError
from bot.gateway.contract import MessageEvent, OutgoingButton, SendPacer, SendResult
from bot.platforms.telegram.errors import map_telegram_errors
from bot.platforms.telegram.request import AppType

__all__ = ["MAX_CALLBACK_BYTES", "TelegramButtons", "escape_markup", "inline_keyboard"]

logger = logging.getLogger(__name__)

MAX_CALLBACK_BYTES = 64
"""Telegram's limit on ``callback_data``."""
MAX_NOTICE_CHARS = 200
"""Telegram's limit on an ``answerCallbackQuery`` text."""

ParseMode = Literal["Markdown", "MarkdownV2", "HTML"]

_MARKDOWN_V2 = re.compile(r"([_*\[\]()~`>#+\-=|{}.!\\])")
_MARKDOWN = re.compile(r"([_*`\[])")


def escape_markup(text: str, parse_mode: ParseMode | None) -> str:
    """``text`` escaped so that ``parse_mode`` shows it as typed (labels, values, any data)."""
    if parse_mode == "HTML":
        return html.escape(text, quote=False)
    if parse_mode == "MarkdownV2":
        return _MARKDOWN_V2.sub(r"\\\1", text)
    if parse_mode == "Markdown":
        return _MARKDOWN.sub(r"\\\1", text)
    return text


def inline_keyboard(buttons: Sequence[OutgoingButton]) -> InlineKeyboardMarkup:
    """One button per row, its text the label as typed, its ``callback_data`` the token."""
    for button in buttons:
        if not 1 <= len(button.token.encode()) <= MAX_CALLBACK_BYTES:
            raise PlatformError(
                "a button token does not fit Telegram's callback_data",
                platform="telegram",
                code="bad_callback_data",
            )
    return InlineKeyboardMarkup(
        [[InlineKeyboardButton(b.label, callback_data=b.token)] for b in buttons]
    )


class TelegramButtons:
    """``send_with_buttons``, ``answer_tap`` and ``remove_keyboard`` for ``TelegramAdapter``
    (which provides the members below)."""

    _token: str
    _migrated: dict[str, int]
    _app: AppType | None
    pacer: SendPacer | None

    async def send(
        self,
        chat_id: str,
        text: str,
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
        reply_markup: InlineKeyboardMarkup | None = None,
    ) -> SendResult:
        raise NotImplementedError

    async def send_with_buttons(
        self,
        chat_id: str,
        text: str,
        buttons: Sequence[OutgoingButton],
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """``send`` with an inline keyboard of ``buttons`` on the last part."""
        markup = inline_keyboard(buttons) if buttons else None
        return await self.send(
            chat_id, text, thread_id=thread_id, reply_to=reply_to, reply_markup=markup
        )

    async def answer_tap(self, event: MessageEvent, notice: str | None) -> None:
        """``answerCallbackQuery`` for the tap (``notice`` shown as a toast); never raises."""
        app = self._app
        if app is None or event.callback_id is None:
            return
        text = notice[:MAX_NOTICE_CHARS] if notice else None
        try:
            with map_telegram_errors(self._token):
                await app.bot.answer_callback_query(event.callback_id, text=text)
        except Exception as exc:  # best effort: the tap itself is decided
            logger.warning("Telegram answerCallbackQuery failed (%s)", type(exc).__name__)

    async def remove_keyboard(self, event: MessageEvent) -> None:
        """Take the used keyboard off its message (``editMessageReplyMarkup``); never raises."""
        app = self._app
        if app is None or event.keyboard_message_id is None:
            return
        chat = event.source.chat_id
        target: int | str = self._migrated.get(chat) or (
            int(chat) if chat.lstrip("-").isdigit() else chat
        )
        try:
            with map_telegram_errors(self._token):
                # No reply_markup at all: Telegram then removes the inline keyboard
                # (PTB would send an empty keyboard as ``{}``, which is no keyboard).
                await app.bot.edit_message_reply_markup(target, int(event.keyboard_message_id))
        except Exception as exc:  # an old or already edited message: nothing to do
            logger.debug("Telegram keyboard not removed (%s)", type(exc).__name__)
