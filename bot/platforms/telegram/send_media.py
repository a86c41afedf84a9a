"""Sending files to Telegram: ``sendPhoto`` for images, ``sendDocument`` for the rest.

Uploaded as multipart bytes (PTB's ``InputFile``), one message per file, in
order, into the same topic as the reply's text. Telegram takes photos up to
10 MB; a larger image goes as a document, which Telegram allows up to 50 MB.
A failure after some files went out is ``ambiguous`` (part of the reply
arrived), so the ledger's resend carries the marker. ``TelegramFiles`` is the
adapter's ``send_attachments`` hook, kept here as a mixin.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from telegram import Bot, InputFile, Message

from bot.errors import PlatformError
from bot.gateway.contract import OutgoingFile, SendPacer, SendResult
from bot.platforms.telegram.errors import map_telegram_errors, partly_sent
from bot.platforms.telegram.mapping import GENERAL_TOPIC_ID, PLATFORM
from bot.platforms.telegram.pacing import take_turn
from bot.platforms.telegram.request import AppType

__all__ = ["MAX_PHOTO_BYTES", "TelegramFiles", "send_files"]

logger = logging.getLogger(__name__)

MAX_PHOTO_BYTES = 10 * 1024 * 1024
"""Telegram's limit for ``sendPhoto``; larger images are sent with ``sendDocument``."""


async def _send_one(bot: Bot, chat_id: int | str, file: OutgoingFile, topic: int | None) -> Message:
    upload = InputFile(file.data, filename=file.file_name)
    if file.kind == "image" and len(file.data) <= MAX_PHOTO_BYTES:
        photo: Message = await bot.send_photo(chat_id, upload, message_thread_id=topic)
        return photo
    document: Message = await bot.send_document(chat_id, upload, message_thread_id=topic)
    return document


async def send_files(
    bot: Bot,
    chat_id: int | str,
    files: Sequence[OutgoingFile],
    *,
    thread_id: str | None,
    token: str,
    pacer: SendPacer | None = None,
) -> SendResult:
    """Send ``files`` to ``chat_id`` (topic ``thread_id``), each at its ``pacer`` turn;
    ``PlatformError`` on failure."""
    try:
        topic = int(thread_id) if thread_id not in (None, GENERAL_TOPIC_ID) else None
    except ValueError as exc:
        raise PlatformError(
            "Telegram thread ids must be numeric", platform=PLATFORM, code="bad_id"
        ) from exc
    ids: list[str] = []
    for index, file in enumerate(files):
        await take_turn(pacer, chat_id)
        try:
            with map_telegram_errors(token):
                sent = await _send_one(bot, chat_id, file, topic)
        except PlatformError as error:
            logger.warning(
                "Telegram file %d of %d not sent: %s (retryable=%s)",
                index + 1,
                len(files),
                error,
                error.retryable,
            )
            if not ids:
                raise
            raise partly_sent(error, len(ids), len(files), "files") from error
        ids.append(str(sent.message_id))
    return SendResult(message_ids=ids)


class TelegramFiles:
    """``send_attachments`` for ``TelegramAdapter`` (which provides the members below)."""

    _token: str
    _migrated: dict[str, int]
    pacer: SendPacer | None

    def _require_app(self) -> AppType:
        raise NotImplementedError

    async def send_attachments(
        self,
        chat_id: str,
        files: Sequence[OutgoingFile],
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Send ``files`` after a reply's text: photos by ``sendPhoto``, others by
        ``sendDocument``, into the chat it moved to if it became a supergroup."""
        app = self._require_app()
        target: int | str = self._migrated.get(chat_id) or (
            int(chat_id) if chat_id.lstrip("-").isdigit() else chat_id
        )
        return await send_files(
            app.bot, target, files, thread_id=thread_id, token=self._token, pacer=self.pacer
        )
