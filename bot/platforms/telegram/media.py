"""Downloading a user's file from Telegram: ``getFile``, then the file endpoint.

The bytes come from ``TELEGRAM_FILE_BASE_URL`` (PTB's ``base_file_url``;
derived from ``TELEGRAM_API_BASE_URL`` when unset, and a local Bot API server
serves both). The Bot API hands bots files of at most 20 MB; ``getFile``
answers a larger one with "file is too big", which the user is told plainly.
A ``file_id`` stays valid, so a re-run after a crash simply asks again. The
URL holds the token: it is never logged, nor is an exception text that could
quote it.

``file_size`` is optional in ``getFile``'s answer (and a local Bot API server
serves files up to 2 GB), so the limit is also enforced while the bytes arrive:
the download is streamed here, with a byte counter, instead of PTB's
``download_as_bytearray``, which reads the whole file into memory first. A
local Bot API server in ``--local`` mode answers a file path on this machine;
it is read with the same limit.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
from telegram import Bot
from telegram.error import BadRequest, TelegramError

from bot.errors import MediaError, PlatformError
from bot.gateway.contract import MediaAttachment
from bot.platforms.media_download import media_gone, media_too_big, read_capped
from bot.platforms.telegram.errors import translate_error
from bot.platforms.telegram.mapping import PLATFORM

__all__ = ["FileDownloads", "fetch_file"]

logger = logging.getLogger(__name__)


class FileDownloads:
    """The adapter's file downloads: ``fetch_file`` over one HTTP client of its own
    (PTB's reads a whole body at once), made on the first file."""

    def __init__(self, timeouts: tuple[float, float, float, float]) -> None:
        """``timeouts``: (connect, read, write, pool) seconds, as the adapter's requests."""
        connect, read, write, pool = timeouts
        self._timeout = httpx.Timeout(connect=connect, read=read, write=write, pool=pool)
        self._http: httpx.AsyncClient | None = None

    async def fetch(self, bot: Bot, media: MediaAttachment, *, max_bytes: int, token: str) -> bytes:
        """``fetch_file`` with this client."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self._timeout)
        return await fetch_file(bot, media, max_bytes=max_bytes, token=token, http=self._http)

    async def aclose(self) -> None:
        """Close the client (a later ``fetch`` makes a new one)."""
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()


async def fetch_file(
    bot: Bot, media: MediaAttachment, *, max_bytes: int, token: str, http: httpx.AsyncClient
) -> bytes:
    """The bytes of ``media`` (``MediaError`` if too big or gone, ``PlatformError`` else);
    ``http`` downloads the file."""
    if media.file_id is None:
        raise MediaError("That message has no file I can download.")
    try:
        file = await bot.get_file(media.file_id)
    except BadRequest as exc:
        if "too big" in str(exc).lower():
            raise media_too_big(media, max_bytes) from exc
        logger.debug("Telegram getFile refused: %s", type(exc).__name__)
        raise media_gone(media) from exc
    except TelegramError as exc:
        raise translate_error(exc, token=token) from exc
    if file.file_size is not None and file.file_size > max_bytes:
        raise media_too_big(media, max_bytes)
    location = file.file_path
    if not location:
        logger.info("Telegram getFile answered no file path")
        raise media_gone(media)
    if not location.startswith(("http://", "https://")):
        return await asyncio.to_thread(_read_local, Path(location), media, max_bytes)
    try:
        return await _stream(http, _encoded(location), media, max_bytes)
    except httpx.HTTPError as exc:
        # Not chained: httpx's message names the URL, which holds the token.
        logger.info("Telegram file download failed: %s", type(exc).__name__)
        raise PlatformError(
            "Telegram file download failed", platform=PLATFORM, retryable=True
        ) from None


def _encoded(url: str) -> str:
    """``url`` with its path percent-encoded (file names may hold spaces or non-ASCII)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=quote(parts.path)))


async def _stream(
    http: httpx.AsyncClient, url: str, media: MediaAttachment, max_bytes: int
) -> bytes:
    async with http.stream("GET", url) as response:
        if response.status_code >= 500:
            logger.info("Telegram file download answered HTTP %d", response.status_code)
            raise PlatformError(
                f"Telegram file download answered HTTP {response.status_code}",
                platform=PLATFORM,
                retryable=True,
                code=response.status_code,
            )
        if response.status_code >= 400:
            logger.info("Telegram file download answered HTTP %d", response.status_code)
            raise media_gone(media)
        return await read_capped(response, media, max_bytes)


def _read_local(path: Path, media: MediaAttachment, max_bytes: int) -> bytes:
    try:
        with path.open("rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        logger.info("Telegram local file unreadable: %s", type(exc).__name__)
        raise media_gone(media) from exc
    if len(data) > max_bytes:
        raise media_too_big(media, max_bytes)
    return data
