"""Downloading a user's file from Telegram: ``getFile``, then the file endpoint.

The bytes come from ``TELEGRAM_FILE_BASE_URL`` (PTB's ``base_file_url``;
derived from ``TELEGRAM_API_BASE_URL`` when unset, and a local Bot API server
serves both). The Bot API hands bots files of at most 20 MB; ``getFile``
answers a larger one with "file is too big", which the user is told plainly.
A ``file_id`` stays valid, so a re-run after a crash simply asks again. The
URL holds the token: it is never logged.
"""

from __future__ import annotations

import logging

from telegram import Bot
from telegram.error import BadRequest, TelegramError

from bot.errors import MediaError
from bot.gateway.contract import MediaAttachment
from bot.platforms.telegram_errors import translate_error

__all__ = ["fetch_file"]

logger = logging.getLogger(__name__)

_NOUN = {"image": "photo", "voice": "voice note", "audio": "audio file"}


def _too_big(media: MediaAttachment, max_bytes: int) -> MediaError:
    noun = _NOUN.get(media.kind, "file")
    return MediaError(
        f"Your {noun} is too big for me (the limit is {max_bytes / (1024 * 1024):g} MB)."
    )


async def fetch_file(bot: Bot, media: MediaAttachment, *, max_bytes: int, token: str) -> bytes:
    """The bytes of ``media`` (``MediaError`` if too big or gone, ``PlatformError`` else)."""
    if media.file_id is None:
        raise MediaError("That message has no file I can download.")
    try:
        file = await bot.get_file(media.file_id)
        if file.file_size is not None and file.file_size > max_bytes:
            raise _too_big(media, max_bytes)
        data = bytes(await file.download_as_bytearray())
    except BadRequest as exc:
        if "too big" in str(exc).lower():
            raise _too_big(media, max_bytes) from exc
        logger.debug("Telegram getFile refused: %s", type(exc).__name__)
        raise MediaError(
            f"I couldn't download your {_NOUN.get(media.kind, 'file')}; please send it again."
        ) from exc
    except TelegramError as exc:
        raise translate_error(exc, token=token) from exc
    if len(data) > max_bytes:
        raise _too_big(media, max_bytes)
    return data
