"""Sending files to WhatsApp: upload the bytes, then an image or document message.

``POST /<version>/<phone id>/media`` (pywa's ``upload_media``, multipart,
through ``WHATSAPP_API_BASE_URL``) answers a media id; an ``image`` or
``document`` message then names it. One message per file, in order, paced
like the parts of a long text (Meta's pair rate limit). A failure after some
files went out is ``ambiguous``, so the ledger's resend carries the marker.
``WhatsAppFiles`` is the adapter's ``send_attachments`` hook, kept here as a mixin.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

import httpx
from pywa_async.client import WhatsApp
from pywa_async.errors import WhatsAppError

from bot.errors import PlatformError
from bot.gateway.contract import OutgoingFile, SendPacer, SendResult
from bot.platforms.whatsapp.errors import api_error, transport_error
from bot.platforms.whatsapp.payload import PLATFORM, is_group_chat_id

__all__ = ["WhatsAppFiles", "send_files"]

logger = logging.getLogger(__name__)


class _Ids(Protocol):
    def add(self, item: str) -> bool: ...

    def __contains__(self, item: object) -> bool: ...


async def _send_one(wa: WhatsApp, chat_id: str, file: OutgoingFile) -> str:
    media = await wa.upload_media(
        media=file.data,
        mime_type=file.mime_type,
        filename=file.file_name,
        media_type="image" if file.kind == "image" else "document",
    )
    if file.kind == "image":
        sent = await wa.send_image(to=chat_id, image=media)
    else:
        sent = await wa.send_document(to=chat_id, document=media, filename=file.file_name)
    return str(sent.id)


async def send_files(
    wa: WhatsApp,
    chat_id: str,
    files: Sequence[OutgoingFile],
    *,
    pause: float,
    pacer: SendPacer | None = None,
) -> SendResult:
    """Upload and send each of ``files`` to ``chat_id``, each at its ``pacer`` turn;
    ``PlatformError`` on failure."""
    ids: list[str] = []
    for index, file in enumerate(files):
        if index and pause > 0:
            await asyncio.sleep(pause)
        if pacer is not None:
            await pacer.turn(chat_id, group=is_group_chat_id(chat_id))
        try:
            ids.append(await _send_one(wa, chat_id, file))
        except WhatsAppError as exc:
            # api_error/transport_error mark a failure after earlier files ambiguous.
            raise api_error(exc, index, len(files)) from exc
        except httpx.HTTPError as exc:
            raise transport_error(exc, index, len(files)) from exc
    logger.debug("WhatsApp sent %d file(s)", len(ids))
    return SendResult(message_ids=ids)


class WhatsAppFiles:
    """``send_attachments`` for ``WhatsAppAdapter`` (which provides the members below)."""

    _wa: WhatsApp | None
    _sent_ids: _Ids
    send_pause: float
    pacer: SendPacer | None

    async def send_attachments(
        self,
        chat_id: str,
        files: Sequence[OutgoingFile],
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Upload ``files`` and send each as an image or document message (a group id is
        answered in the group); ``thread_id`` is ignored, WhatsApp has no threads."""
        wa = self._wa
        if wa is None:
            raise PlatformError(
                "WhatsApp adapter is not started", platform=PLATFORM, retryable=True
            )
        result = await send_files(wa, chat_id, files, pause=self.send_pause, pacer=self.pacer)
        for message_id in result.message_ids:
            self._sent_ids.add(message_id)  # a reply quoting the file is a reply to the bot
        return result
