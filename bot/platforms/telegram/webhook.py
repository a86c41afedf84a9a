"""The Telegram webhook call: ``POST /webhooks/telegram`` on the bot's own HTTP server.

The call is answered 200 only after the gateway's ``on_event`` returned for
its update; any other answer makes Telegram deliver the update again later,
as an unmoved offset does when polling (``telegram_polling``).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from bot.errors import ChatflowError
from bot.gateway.contract import EventHandler, MessageEvent
from bot.logs import log_ref
from bot.platforms.telegram.errors import REFUSED, log_failure
from bot.platforms.telegram.request import read_update

__all__ = ["SECRET_HEADER", "WEBHOOK_PATH", "handle_webhook"]

# The adapter's logger: the split into modules does not rename what operators filter on.
logger = logging.getLogger("bot.platforms.telegram")

WEBHOOK_PATH = "/webhooks/telegram"
"""Path of the webhook route ``routes()`` returns."""
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
"""Header in which Telegram repeats the ``secret_token`` given to ``setWebhook``."""


async def handle_webhook(
    request: Request,
    *,
    secret: str | None,
    on_event: EventHandler | None,
    map_update: Callable[[Mapping[str, Any]], MessageEvent | None],
) -> Response:
    """Answer one webhook call; ``on_event`` is None while the adapter is not running (503).

    403 for a missing or wrong secret, 400 for a body that is no update, 200
    for an update that maps to no event or that ``on_event`` accepted, and
    503 (retryable refusal) or 500 when ``on_event`` raised.
    """
    expected = (secret or "").encode()
    given = request.headers.get(SECRET_HEADER, "").encode()
    if not expected or not hmac.compare_digest(given, expected):
        logger.warning("Telegram webhook call with a missing or wrong secret token refused")
        return PlainTextResponse("Forbidden", status_code=403)
    if on_event is None:
        return PlainTextResponse("Not ready", status_code=503)
    try:
        payload = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError, RecursionError):
        # RecursionError: JSON nested deeper than the parser's stack.
        return PlainTextResponse("Malformed JSON", status_code=400)
    if not isinstance(payload, dict) or not isinstance(payload.get("update_id"), int):
        return PlainTextResponse("Not an update", status_code=400)
    # 200 for an update PTB cannot read, as polling moves past it: a redelivery
    # would fail the same way, for as long as Telegram keeps retrying.
    event = map_update(payload) if read_update(payload) is not None else None
    if event is None:
        return PlainTextResponse("ok")
    try:
        await on_event(event)
    except Exception as exc:
        # Any non-2xx makes Telegram redeliver later; nothing was confirmed.
        log_failure(exc, REFUSED, payload["update_id"], log_ref(event.message_id))
        retryable = isinstance(exc, ChatflowError) and exc.retryable
        return PlainTextResponse("Retry later", status_code=503 if retryable else 500)
    return PlainTextResponse("ok")
