"""How the adapter sets up python-telegram-bot: its ``Application`` and two request tweaks.

- ``_TypingExemptRateLimiter``: PTB's rate limiter, except for chat actions (only
  without the gateway's pacer, ``bot.platforms.telegram.pacing``).
- ``_ReadableUpdatesRequest``: the getUpdates transport, which cuts an update
  PTB cannot read down to its ``update_id`` so that it cannot stall polling.

PTB's ``Updater`` is left out (``updater(None)``): ``telegram_polling`` polls.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from telegram import Update
from telegram.ext import AIORateLimiter, Application, ApplicationBuilder
from telegram.request import BaseRequest, HTTPXRequest, RequestData

from bot.platforms.telegram.errors import log_failure

__all__ = ["API_CONNECTIONS", "AppType", "build_application", "read_update"]

AppType = Application[Any, Any, Any, Any, Any, Any]
"""PTB's ``Application`` with the default context types the adapter uses."""


_EXEMPT = frozenset({"sendChatAction", "sendMessageDraft"})


class _TypingExemptRateLimiter(AIORateLimiter):
    """PTB's limiter, minus chat actions and drafts.

    Typing is refreshed every few seconds; counted against the 20 messages per
    minute of a group it would starve the replies it announces. Drafts (about one
    a second per private chat) would queue the final replies behind them; their
    own flood control is a 429 that pauses them (``bot.gateway.streaming``).
    """

    async def process_request(
        self,
        callback: Callable[..., Coroutine[Any, Any, bool | dict[str, Any] | list[dict[str, Any]]]],
        args: Any,
        kwargs: dict[str, Any],
        endpoint: str,
        data: dict[str, Any],
        rate_limit_args: int | None,
    ) -> bool | dict[str, Any] | list[dict[str, Any]]:
        if endpoint in _EXEMPT:
            return await callback(*args, **kwargs)
        return await super().process_request(
            callback, args, kwargs, endpoint, data, rate_limit_args
        )


def read_update(item: Any) -> Update | None:
    """``item`` as an ``Update``, or None (one WARNING line) if PTB cannot read it."""
    try:
        return Update.de_json(item, None)
    except Exception as exc:
        update_id = item.get("update_id") if isinstance(item, dict) else None
        ref = update_id if isinstance(update_id, int) else "?"
        log_failure(exc, "Telegram update %s unreadable (%s); skipped", ref, level=logging.WARNING)
        return None


def _readable_updates(payload: bytes) -> bytes:
    """A getUpdates answer with every update PTB cannot read cut down to its ``update_id``."""
    try:
        body = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return payload  # PTB reports an unreadable answer itself
    if not isinstance(body, dict) or not isinstance(body.get("result"), list):
        return payload
    readable: list[Any] = []
    changed = False
    for item in body["result"]:
        if read_update(item) is None:
            changed = True
            update_id = item.get("update_id") if isinstance(item, dict) else None
            if isinstance(update_id, int) and not isinstance(update_id, bool):
                readable.append({"update_id": update_id})
            continue
        readable.append(item)
    if not changed:
        return payload
    body["result"] = readable
    return json.dumps(body).encode()


class _ReadableUpdatesRequest(HTTPXRequest):
    """The getUpdates transport: an update PTB cannot read never blocks the ones after it.

    PTB parses a whole getUpdates batch at once: one update it cannot read
    (a malformed payload, a field whose type changed in a newer Bot API) fails
    the batch every time, so polling would stall for good, and PTB logs the
    raw batch, texts and user ids included, at CRITICAL. Here such an update
    is reduced to its ``update_id``: it maps to no event and the offset moves on.
    """

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        # Any: PTB types these with an alias from its private ``_utils`` module.
        read_timeout: Any = BaseRequest.DEFAULT_NONE,
        write_timeout: Any = BaseRequest.DEFAULT_NONE,
        connect_timeout: Any = BaseRequest.DEFAULT_NONE,
        pool_timeout: Any = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        code, payload = await super().do_request(
            url,
            method,
            request_data=request_data,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            connect_timeout=connect_timeout,
            pool_timeout=pool_timeout,
        )
        if code == 200 and url.rsplit("/", 1)[-1].lower() == "getupdates":
            payload = _readable_updates(payload)
        return code, payload


API_CONNECTIONS = 16
"""Connections to the Bot API for everything but ``getUpdates`` (PTB's default is 256).

The pacer lets at most 30 messages a second through, so a few connections carry
them at any latency Telegram shows, with room for uploads that hold one for a
while. More costs CPU on every request: httpcore looks at every kept connection,
with a system call each, whenever a request starts or ends (1.6 against 2.8 ms of
CPU per ``sendMessage`` with 30 in flight, ``bench/README.md``)."""


def _file_url_for(base_url: str) -> str:
    """``https://host/bot`` -> ``https://host/file/bot`` (Bot API servers' layout)."""
    head, _, tail = base_url.rstrip("/").rpartition("/")
    return f"{head}/file/{tail}"


def build_application(
    token: str,
    base_url: str,
    timeouts: tuple[float, float, float, float],
    file_base_url: str | None = None,
    *,
    rate_limited: bool = True,
) -> AppType:
    """A PTB ``Application`` without an ``Updater``, with both tweaks installed.

    ``timeouts`` are (connect, read, write, pool) seconds for every request;
    ``file_base_url`` is where files are downloaded (else derived from ``base_url``).
    ``rate_limited=False`` leaves PTB's limiter out: the gateway's pacer paces the
    requests, and PTB's leaky bucket would let bursts of twice the limit through.
    """
    connect, read, write, pool = timeouts
    builder = (
        ApplicationBuilder()
        .token(token)
        .base_url(base_url)
        .base_file_url(file_base_url or _file_url_for(base_url))
        .updater(None)
        .connect_timeout(connect)
        .read_timeout(read)
        .write_timeout(write)
        .pool_timeout(pool)
        .connection_pool_size(API_CONNECTIONS)
        .get_updates_request(
            _ReadableUpdatesRequest(
                connect_timeout=connect,
                read_timeout=read,
                write_timeout=write,
                pool_timeout=pool,
            )
        )
    )
    if rate_limited:
        limited: AppType = builder.rate_limiter(_TypingExemptRateLimiter(max_retries=0)).build()
        return limited
    app: AppType = builder.build()
    return app
