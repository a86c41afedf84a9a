"""Downloading a user's file from WhatsApp: media id -> short-lived URL -> bytes.

``GET /<version>/<media id>`` (pywa's raw ``api.get_media_url``, through
``WHATSAPP_API_BASE_URL``) answers a URL valid for about five minutes; the
bytes are then fetched from it with the same bearer token, read in chunks and
cut off past ``max_bytes``. The media id lasts much longer than its URL, so a
re-run after a crash asks for a fresh URL. Neither the URL nor the bytes are
logged.

The token can manage the whole WhatsApp Business account, and the URL comes
from an answer: it goes only where ``MediaHosts`` allows (Meta's media hosts
over https, the API base's own origin, which has the token anyway, and what
``WHATSAPP_MEDIA_HOSTS`` adds). Redirects are followed by hand: within one
origin with the token, to another allowed origin without it, anywhere else not
at all. The lookup answer is read leniently: only ``url`` is needed (pywa's
typed answer fails on a missing ``sha256``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx
from pywa_async.client import WhatsApp
from pywa_async.errors import WhatsAppError

from bot.errors import ConfigurationError, MediaError, PlatformError
from bot.gateway.contract import MediaAttachment
from bot.platforms.media_download import media_gone, media_too_big, read_capped
from bot.platforms.whatsapp.errors import RETRYABLE_CODES
from bot.platforms.whatsapp.payload import PLATFORM

__all__ = ["META_MEDIA_HOSTS", "MediaHosts", "fetch_media"]

logger = logging.getLogger(__name__)

META_MEDIA_HOSTS = ("lookaside.fbsbx.com", "*.fbcdn.net", "*.whatsapp.net")
"""Where Meta's media lookups point (https only); ``*.`` matches any subdomain."""
_MAX_REDIRECTS = 3
Origin = tuple[str, str, int]
"""``(scheme, host, port)``."""


def _origin(url: httpx.URL) -> Origin:
    port = url.port or (443 if url.scheme == "https" else 80)
    return url.scheme, url.host.lower(), port


@dataclass(frozen=True)
class MediaHosts:
    """Where the Graph token may go to download media (see the module docstring)."""

    hosts: frozenset[str]
    """Host names or ``*.domain`` patterns, reached over https."""
    origins: frozenset[Origin]
    """Exact origins, any scheme the operator wrote (the API base's, loopback fakes)."""

    @classmethod
    def build(cls, api_base_url: str, extra: Iterable[str] = ()) -> MediaHosts:
        """Meta's hosts, ``api_base_url``'s origin and ``extra`` (``WHATSAPP_MEDIA_HOSTS``).

        ``ConfigurationError`` names the setting for an entry that is neither a host
        name, a ``*.domain`` pattern nor an ``http(s)://host[:port]`` origin.
        """
        hosts = set(META_MEDIA_HOSTS)
        origins = {_origin(httpx.URL(api_base_url))}
        for raw in extra:
            entry = raw.strip().lower()
            if not entry:
                continue
            if "://" in entry:
                try:
                    url = httpx.URL(entry)
                except httpx.InvalidURL:
                    raise _bad_entry(raw) from None
                if url.scheme not in ("http", "https") or not url.host or url.path != "/":
                    raise _bad_entry(raw)
                origins.add(_origin(url))
                continue
            name = entry.removeprefix("*.")
            if not name or "/" in name or ":" in name or "*" in name or "." not in name:
                raise _bad_entry(raw)
            hosts.add(entry)
        return cls(frozenset(hosts), frozenset(origins))

    def allows(self, url: httpx.URL) -> bool:
        """Whether the token may be sent to ``url``."""
        if _origin(url) in self.origins:
            return True
        if url.scheme != "https":
            return False
        host = url.host.lower()
        return any(
            host.endswith(pattern[1:]) if pattern.startswith("*.") else host == pattern
            for pattern in self.hosts
        )


def _bad_entry(entry: str) -> ConfigurationError:
    return ConfigurationError(
        f"WHATSAPP_MEDIA_HOSTS: {entry!r} is not a host, *.domain or http(s)://host:port",
        setting="WHATSAPP_MEDIA_HOSTS",
    )


async def fetch_media(
    wa: WhatsApp,
    media: MediaAttachment,
    *,
    max_bytes: int,
    http: httpx.AsyncClient,
    hosts: MediaHosts,
) -> bytes:
    """The bytes of ``media`` (``MediaError`` if too big, gone or not at an allowed
    host; ``PlatformError`` else). ``http`` is the client pywa sends with: its
    headers carry the token."""
    if media.file_id is None:
        raise MediaError("That message has no file I can download.")
    url, size = await _lookup(wa, media)
    if size is not None and size > max_bytes:
        raise media_too_big(media, max_bytes)
    try:
        return await _download(http, hosts, url, media, max_bytes)
    except httpx.HTTPError as exc:
        raise PlatformError(
            "WhatsApp media download failed", platform=PLATFORM, retryable=True
        ) from exc


async def _lookup(wa: WhatsApp, media: MediaAttachment) -> tuple[httpx.URL, int | None]:
    assert media.file_id is not None
    try:
        answer: Any = await wa.api.get_media_url(media.file_id)
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
        raise media_gone(media) from exc  # an unknown or expired media id: ask again
    except httpx.HTTPError as exc:
        raise PlatformError(
            "could not reach WhatsApp for the media", platform=PLATFORM, retryable=True
        ) from exc
    raw_url = answer.get("url") if isinstance(answer, dict) else None
    try:
        url = httpx.URL(raw_url) if isinstance(raw_url, str) else None
    except httpx.InvalidURL:
        url = None
    if url is None or not url.is_absolute_url:
        logger.warning("WhatsApp media lookup answered without a usable URL")
        raise media_gone(media)
    size = answer.get("file_size")
    return url, size if isinstance(size, int) and not isinstance(size, bool) else None


async def _download(
    http: httpx.AsyncClient,
    hosts: MediaHosts,
    url: httpx.URL,
    media: MediaAttachment,
    max_bytes: int,
) -> bytes:
    with_token = True
    for _ in range(_MAX_REDIRECTS + 1):
        if not hosts.allows(url):
            # The host is not secret (the URL is: it is a bearer of its own).
            logger.warning(
                "WhatsApp media URL refused: %s://%s is not an allowed media host "
                "(WHATSAPP_MEDIA_HOSTS)",
                url.scheme,
                url.host,
            )
            raise media_gone(media)
        request = http.build_request("GET", url)
        if not with_token:
            request.headers.pop("Authorization", None)
        response = await http.send(request, stream=True, follow_redirects=False)
        try:
            if response.is_redirect and "location" in response.headers:
                target = url.join(response.headers["location"])
                # Another origin never gets the token, even an allowed one.
                with_token = with_token and _origin(target) == _origin(url)
                url = target
                continue
            if response.status_code >= 400:
                logger.info("WhatsApp media download answered HTTP %d", response.status_code)
                raise media_gone(media)
            return await read_capped(response, media, max_bytes)
        finally:
            await response.aclose()
    logger.info("WhatsApp media download redirected more than %d times", _MAX_REDIRECTS)
    raise media_gone(media)
