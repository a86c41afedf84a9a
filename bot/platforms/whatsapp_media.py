"""Downloading a user's file from WhatsApp: media id -> short-lived URL -> bytes.

``GET /<version>/<media id>`` (pywa's ``get_media_url``, through
``WHATSAPP_API_BASE_URL``) answers a URL valid for about five minutes; the
bytes are then fetched from it with the same bearer token (pywa's
``stream_media_bytes``), read in chunks and cut off past ``max_bytes``. The
media id lasts much longer than its URL, so a re-run after a crash asks for a
fresh URL. Neither the URL nor the bytes are logged.
"""

from __future__ import annotations

import logging

import httpx
from pywa_async.client import WhatsApp
from pywa_async.errors import WhatsAppError

from bot.errors import MediaError, PlatformError
from bot.gateway.contract import MediaAttachment
from bot.platforms.whatsapp_errors import RETRYABLE_CODES
from bot.platforms.whatsapp_payload import PLATFORM

__all__ = ["fetch_media"]

logger = logging.getLogger(__name__)

_NOUN = {"image": "photo", "voice": "voice note", "audio": "audio file"}


def _noun(media: MediaAttachment) -> str:
    return _NOUN.get(media.kind, "file")


def _too_big(media: MediaAttachment, max_bytes: int) -> MediaError:
    return MediaError(
        f"Your {_noun(media)} is too big for me (the limit is {max_bytes / (1024 * 1024):g} MB)."
    )


def _gone(media: MediaAttachment) -> MediaError:
    return MediaError(f"I couldn't download your {_noun(media)}; please send it again.")


async def fetch_media(wa: WhatsApp, media: MediaAttachment, *, max_bytes: int) -> bytes:
    """The bytes of ``media`` (``MediaError`` if too big or gone, ``PlatformError`` else)."""
    if media.file_id is None:
        raise MediaError("That message has no file I can download.")
    try:
        info = await wa.get_media_url(media.file_id)
    except WhatsAppError as exc:
        status = exc.status_code
        logger.info("WhatsApp media lookup failed: error code %s (HTTP %s)", exc.code, status)
        if exc.code in RETRYABLE_CODES or exc.is_transient or (status or 0) >= 500:
            raise PlatformError(
                f"WhatsApp media lookup failed ({exc.code})",
                platform=PLATFORM,
                retryable=True,
                code=exc.code,
            ) from exc
        raise _gone(media) from exc  # an unknown or expired media id: ask again
    except httpx.HTTPError as exc:
        raise PlatformError(
            "could not reach WhatsApp for the media", platform=PLATFORM, retryable=True
        ) from exc
    if info.file_size and info.file_size > max_bytes:
        raise _too_big(media, max_bytes)
    chunks: list[bytes] = []
    total = 0
    try:
        async with wa.api.stream_media_bytes(media_url=info.url) as response:
            if response.status_code >= 400:
                logger.info("WhatsApp media download answered HTTP %d", response.status_code)
                raise _gone(media)
            async for chunk in response.aiter_bytes():
                total += len(chunk)
                if total > max_bytes:
                    raise _too_big(media, max_bytes)
                chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise PlatformError(
            "WhatsApp media download failed", platform=PLATFORM, retryable=True
        ) from exc
    return b"".join(chunks)
