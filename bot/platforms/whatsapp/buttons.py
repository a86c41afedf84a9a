"""WhatsApp buttons: interactive reply buttons (up to 3) or a list message (4 to 10).

The reply's text is the interactive message's body (at most 1,024 characters):
a longer text goes first as ordinary messages and the interactive message
carries its last part. Reply button titles are cut to 20 characters, list row
titles to 24 (the whole label then goes in the row's description), and made
unique; every id is the gateway's opaque token (at most 256 characters, never
the tool's value). A tap comes back as ``interactive.button_reply`` or
``list_reply`` with that id (``bot.platforms.whatsapp.payload``). WhatsApp has
no callback answer: a refused tap's notice is sent as a short text message.
When the 24-hour window is closed the reply goes through ``send`` (a template)
with the choices as numbered lines. ``WhatsAppButtons`` is the adapter's mixin.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import httpx
from pywa.types.callback import Button, Section, SectionList, SectionRow
from pywa_async.client import WhatsApp
from pywa_async.errors import WhatsAppError

from bot.errors import PlatformError
from bot.gateway.contract import (
    MessageEvent,
    OutgoingButton,
    SendPacer,
    SendResult,
    numbered_choices,
)
from bot.platforms.text import split_text
from bot.platforms.whatsapp.errors import api_error, transport_error
from bot.platforms.whatsapp.payload import PLATFORM
from bot.platforms.whatsapp.send_media import _Ids

__all__ = [
    "MAX_BODY_CHARS",
    "MAX_BUTTON_TITLE",
    "MAX_REPLY_BUTTONS",
    "MAX_ROW_TITLE",
    "WhatsAppButtons",
    "interactive_buttons",
    "titles",
]

logger = logging.getLogger(__name__)

MAX_REPLY_BUTTONS = 3
"""Reply buttons one interactive message may carry; more become a list message."""
MAX_BUTTON_TITLE = 20
"""Longest reply button title."""
MAX_ROW_TITLE = 24
"""Longest list row title."""
MAX_ROW_DESCRIPTION = 72
"""Longest list row description."""
MAX_BODY_CHARS = 1024
"""Longest body of an interactive message."""
MAX_ID_CHARS = 256
"""Longest button or row id."""
LIST_BUTTON = "Choose"
"""The list message's button (at most 20 characters)."""
LIST_SECTION = "Options"
"""The list's one section title (at most 24 characters)."""


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def titles(labels: Sequence[str], limit: int) -> list[str]:
    """``labels`` cut to ``limit`` characters and made unique (`` (2)`` and so on)."""
    out: list[str] = []
    for label in labels:
        title = _cut(label, limit)
        n = 2
        while title in out:
            suffix = f" ({n})"
            title = _cut(label, limit - len(suffix)) + suffix
            n += 1
        out.append(title)
    return out


def interactive_buttons(buttons: Sequence[OutgoingButton]) -> list[Button] | SectionList:
    """pywa's reply buttons (up to 3) or list (4 to 10) for ``buttons``."""
    for button in buttons:
        if not 1 <= len(button.token) <= MAX_ID_CHARS:
            raise PlatformError(
                "a button token does not fit WhatsApp's id", platform=PLATFORM, code="bad_id"
            )
    labels = [b.label for b in buttons]
    if len(buttons) <= MAX_REPLY_BUTTONS:
        names = titles(labels, MAX_BUTTON_TITLE)
        return [Button(title=t, callback_data=b.token) for t, b in zip(names, buttons, strict=True)]
    names = titles(labels, MAX_ROW_TITLE)
    rows = [
        SectionRow(
            title=t,
            callback_data=b.token,
            # The whole label when the title had to be cut.
            description=None if t == b.label else _cut(b.label, MAX_ROW_DESCRIPTION),
        )
        for t, b in zip(names, buttons, strict=True)
    ]
    return SectionList(button_title=LIST_BUTTON, sections=[Section(title=LIST_SECTION, rows=rows)])


class WhatsAppButtons:
    """``send_with_buttons`` and ``answer_tap`` for ``WhatsAppAdapter`` (which provides the
    members below)."""

    _wa: WhatsApp | None
    _sent_ids: _Ids
    pacer: SendPacer | None

    async def send(
        self,
        chat_id: str,
        text: str,
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        raise NotImplementedError

    async def _window_closed(self, chat_id: str) -> bool:
        raise NotImplementedError

    async def _take_turn(self, chat_id: str, *, optional: bool = False) -> bool:
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
        """The text with ``buttons`` as an interactive message (its last part, if long)."""
        wa = self._wa
        if wa is None:
            raise PlatformError(
                "WhatsApp adapter is not started", platform=PLATFORM, retryable=True
            )
        if not buttons or await self._window_closed(chat_id):
            # A template cannot carry our buttons: the choices go as numbered lines.
            listed = f"{text}\n\n{numbered_choices(buttons)}" if buttons else text
            return await self.send(chat_id, listed, thread_id=thread_id, reply_to=reply_to)
        chunks = split_text(text, MAX_BODY_CHARS)
        if not chunks:
            raise PlatformError("nothing to send: the text is blank", platform=PLATFORM)
        markup = interactive_buttons(buttons)
        ids: list[str] = []
        if len(chunks) > 1:
            head = await self.send(chat_id, "\n".join(chunks[:-1]), reply_to=reply_to)
            ids.extend(head.message_ids)
            reply_to = None
        await self._take_turn(chat_id)
        try:
            sent = await wa.send_message(
                to=chat_id, text=chunks[-1], buttons=markup, reply_to_message_id=reply_to
            )
        except WhatsAppError as exc:
            raise api_error(exc, len(ids), len(ids) + 1) from exc
        except httpx.HTTPError as exc:
            raise transport_error(exc, len(ids), len(ids) + 1) from exc
        self._sent_ids.add(sent.id)  # a reply quoting it is a reply to the bot
        ids.append(sent.id)
        return SendResult(message_ids=ids)

    async def answer_tap(self, event: MessageEvent, notice: str | None) -> None:
        """WhatsApp has no callback answer: a notice (a refused tap) is sent as a short
        free-form text, and only inside the person's 24-hour window. Never as the paid
        template (a tap on yesterday's buttons would cost a message each), never
        retried, and skipped when the pacer has no room for it; never raises."""
        wa = self._wa
        if notice is None or wa is None:
            return
        chat_id = event.source.chat_id
        try:
            if await self._window_closed(chat_id):
                logger.info("WhatsApp tap notice not sent: outside the 24-hour window")
                return
            if not await self._take_turn(chat_id, optional=True):
                logger.info("WhatsApp tap notice not sent: no room in the send pace")
                return
            sent = await wa.send_message(to=chat_id, text=notice)
        except Exception as exc:  # best effort: the tap itself is decided
            # Meta's 131047 (window closed on its clock) included: no template fallback.
            logger.warning("WhatsApp tap notice not sent (%s)", type(exc).__name__)
            return
        self._sent_ids.add(sent.id)
