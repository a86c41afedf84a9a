"""Sending a spoken reply to Telegram: ``sendVoice`` with the OGG/Opus bytes.

Uploaded as multipart (PTB's ``InputFile``) into the reply's topic, quoting the
message it answers, with the reply's text as the caption when the gateway found
it fits (``voice_caption_limit``: 1,024 UTF-16 units). A caption Telegram cannot
parse in the adapter's formatting is sent again plain, as texts are. A person
whose privacy settings refuse voice notes makes Telegram answer 400
``VOICE_MESSAGES_FORBIDDEN``: that becomes ``PlatformError(code=VOICE_FORBIDDEN)``,
and the gateway sends the text instead and sends no more voice notes there.
``TelegramVoice`` is the adapter's ``send_voice`` hook, kept here as a mixin.
"""

from __future__ import annotations

from typing import Literal

from telegram import InputFile, Message, ReplyParameters
from telegram.error import BadRequest

from bot.errors import PlatformError
from bot.gateway.contract import VOICE_FORBIDDEN, OutgoingFile, SendPacer, SendResult
from bot.platforms.telegram.errors import map_telegram_errors
from bot.platforms.telegram.mapping import GENERAL_TOPIC_ID, PLATFORM
from bot.platforms.telegram.pacing import take_turn
from bot.platforms.telegram.request import AppType

__all__ = ["MAX_CAPTION_UTF16", "TelegramVoice"]

MAX_CAPTION_UTF16 = 1024
"""Telegram's caption limit for media messages, in UTF-16 code units."""

_FORBIDDEN = "voice_messages_forbidden"
_PARSE_ERROR = "can't parse entities"


class TelegramVoice:
    """``send_voice`` for ``TelegramAdapter`` (which provides the members below)."""

    voice_caption_limit: int = MAX_CAPTION_UTF16
    """Telegram shows up to 1,024 UTF-16 units under a voice note."""

    _token: str
    _migrated: dict[str, int]
    _parse_mode: Literal["Markdown", "MarkdownV2", "HTML"] | None
    pacer: SendPacer | None

    def _require_app(self) -> AppType:
        raise NotImplementedError

    async def send_voice(
        self,
        chat_id: str,
        voice: OutgoingFile,
        *,
        caption: str | None = None,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """``sendVoice`` of ``voice`` (OGG/Opus) with ``caption``; ``PlatformError``
        (``code=VOICE_FORBIDDEN`` when the person accepts no voice notes)."""
        app = self._require_app()
        target: int | str = self._migrated.get(chat_id) or (
            int(chat_id) if chat_id.lstrip("-").isdigit() else chat_id
        )
        try:
            topic = int(thread_id) if thread_id not in (None, GENERAL_TOPIC_ID) else None
            reply = (
                ReplyParameters(
                    message_id=int(reply_to.rsplit(":", 1)[-1]), allow_sending_without_reply=True
                )
                if reply_to
                else None
            )
        except ValueError as exc:
            raise PlatformError(
                "Telegram thread and reply ids must be numeric", platform=PLATFORM, code="bad_id"
            ) from exc
        with map_telegram_errors(self._token):
            try:
                sent = await self._send_voice(app, target, voice, caption, topic, reply)
            except BadRequest as exc:
                text = str(exc).lower()
                if _FORBIDDEN in text:
                    raise PlatformError(
                        "Telegram: the person's privacy settings refuse voice notes",
                        platform=PLATFORM,
                        code=VOICE_FORBIDDEN,
                    ) from exc
                if caption is None or self._parse_mode is None or _PARSE_ERROR not in text:
                    raise
                sent = await self._send_voice(app, target, voice, caption, topic, reply, plain=True)
        return SendResult(message_ids=[str(sent.message_id)])

    async def _send_voice(
        self,
        app: AppType,
        chat_id: int | str,
        voice: OutgoingFile,
        caption: str | None,
        topic: int | None,
        reply: ReplyParameters | None,
        *,
        plain: bool = False,
    ) -> Message:
        await take_turn(self.pacer, chat_id)
        message: Message = await app.bot.send_voice(
            chat_id,
            InputFile(voice.data, filename=voice.file_name),
            caption=caption,
            parse_mode=None if plain or caption is None else self._parse_mode,
            message_thread_id=topic,
            reply_parameters=reply,
        )
        return message
