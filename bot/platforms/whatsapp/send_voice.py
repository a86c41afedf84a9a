"""Sending a spoken reply to WhatsApp: upload the OGG/Opus file, then a voice message.

``POST /<version>/<phone id>/media`` (``audio/ogg``) answers a media id; an
``audio`` message with ``"voice": true`` names it, so WhatsApp shows it as a
voice note (the play button and waveform of a recording) rather than an audio
file. WhatsApp's audio messages carry no caption: the gateway sends the text
after it (``VOICE_WITH_TEXT``). Outside the person's 24-hour window no voice
note may be sent at all: that is refused here before any request, and the
gateway sends the text, which becomes the template. ``WhatsAppVoice`` is the
adapter's ``send_voice`` hook, kept here as a mixin.
"""

from __future__ import annotations

import httpx
from pywa_async.client import WhatsApp
from pywa_async.errors import WhatsAppError

from bot.errors import PlatformError
from bot.gateway.contract import OutgoingFile, SendResult
from bot.platforms.whatsapp.errors import api_error, transport_error
from bot.platforms.whatsapp.payload import PLATFORM
from bot.platforms.whatsapp.send_media import _Ids

__all__ = ["VOICE_MIME_TYPE", "WhatsAppVoice"]

VOICE_MIME_TYPE = "audio/ogg"
"""The upload's type: OGG with the Opus codec, the only format WhatsApp plays as a voice note."""


class WhatsAppVoice:
    """``send_voice`` for ``WhatsAppAdapter`` (which provides the members below)."""

    _wa: WhatsApp | None
    _sent_ids: _Ids

    async def _take_turn(self, chat_id: str, *, optional: bool = False) -> bool:
        raise NotImplementedError

    async def _window_closed(self, chat_id: str) -> bool:
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
        """Upload ``voice`` and send it as a voice note quoting ``reply_to``; ``caption``
        must be ``None`` (WhatsApp audio has none); ``PlatformError`` on failure."""
        wa = self._wa
        if wa is None:
            raise PlatformError(
                "WhatsApp adapter is not started", platform=PLATFORM, retryable=True
            )
        if caption is not None:
            raise ValueError("WhatsApp voice notes carry no caption")
        if await self._window_closed(chat_id):
            raise PlatformError(
                "WhatsApp 24-hour window closed: no voice note can be sent",
                platform=PLATFORM,
                code="window_closed",
            )
        await self._take_turn(chat_id)
        try:
            media = await wa.upload_media(
                media=voice.data,
                mime_type=VOICE_MIME_TYPE,
                filename=voice.file_name,
                media_type="audio",
            )
            sent = await wa.send_audio(
                to=chat_id, audio=media, is_voice=True, reply_to_message_id=reply_to
            )
        except WhatsAppError as exc:
            raise api_error(exc, 0, 1) from exc
        except httpx.HTTPError as exc:
            raise transport_error(exc, 0, 1) from exc
        self._sent_ids.add(str(sent.id))  # a reply quoting the note is a reply to the bot
        return SendResult(message_ids=[str(sent.id)])
