"""The one place where PTB and httpx exceptions become ``PlatformError``, by type.

- ``RetryAfter`` (429): retryable, ``retry_after`` set.
- ``Forbidden`` (blocked, kicked), ``BadRequest``, ``InvalidToken``: permanent.
- Transport failures (``NetworkError``, ``TimedOut`` included): retryable.
  They are ``ambiguous`` (the message may have reached Telegram) unless the
  request provably never left: the chained httpx exception is a connect
  error, a connect timeout or a pool timeout. A read or write timeout, or a
  dropped connection, is ambiguous. A 5xx answer is retryable, not ambiguous.
- ``Conflict`` (409: another poller or a webhook): its own code, permanent.

Messages are redacted (PTB's ``InvalidToken`` quotes the token), and
``log_failure`` keeps exception messages, which can quote ids and texts, at DEBUG.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import timedelta

import httpx
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)

from bot.errors import ChatflowError, PlatformError
from bot.platforms.telegram.mapping import PLATFORM

__all__ = [
    "REFUSED",
    "log_failure",
    "map_telegram_errors",
    "partly_sent",
    "redact",
    "translate_error",
]

# The adapter's logger: the split into modules does not rename what operators filter on.
logger = logging.getLogger("bot.platforms.telegram")

REFUSED = "Telegram update %s (%s) not accepted by the gateway (%s); Telegram offers it again"
"""``log_failure`` message for an update ``on_event`` raised for: (update id, log ref)."""

# PTB raises TimedOut for pool and connect timeouts (never sent) and read and write
# timeouts (may have arrived) alike; the chained httpx exception tells them apart.
_NOT_SENT_CAUSES = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def _retry_after_seconds(value: int | float | timedelta) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(value)


def _transport_cause(exc: BaseException) -> BaseException | None:
    """The httpx exception behind a PTB error, if a transport failure caused it."""
    seen: set[int] = set()
    current: BaseException | None = exc.__cause__ or exc.__context__
    while current is not None and id(current) not in seen:
        if isinstance(current, httpx.HTTPError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def translate_error(exc: TelegramError, *, token: str = "") -> PlatformError:
    """Map a PTB error to ``PlatformError`` (see the module docstring for the rules)."""
    name = type(exc).__name__
    message = redact(str(exc), token)
    if isinstance(exc, RetryAfter):
        return PlatformError(
            f"Telegram flood control: {message}",
            platform=PLATFORM,
            retryable=True,
            retry_after=_retry_after_seconds(exc.retry_after),
            code=429,
        )
    if isinstance(exc, Forbidden):
        return PlatformError(f"Telegram refused: {message}", platform=PLATFORM, code=403)
    if isinstance(exc, InvalidToken):
        return PlatformError(
            "Telegram rejected the bot token (TELEGRAM_BOT_TOKEN)", platform=PLATFORM, code=401
        )
    if isinstance(exc, ChatMigrated):
        return PlatformError(
            "Telegram group was migrated to a supergroup", platform=PLATFORM, code="migrated"
        )
    if isinstance(exc, BadRequest):
        return PlatformError(f"Telegram bad request: {message}", platform=PLATFORM, code=400)
    if isinstance(exc, NetworkError):  # TimedOut included
        cause = _transport_cause(exc)
        if cause is not None:
            ambiguous = not isinstance(cause, _NOT_SENT_CAUSES)
        else:
            # No transport cause: an error status (5xx), or a timeout that may have been sent.
            ambiguous = isinstance(exc, TimedOut)
        return PlatformError(
            f"Telegram network error ({name}): {message}",
            platform=PLATFORM,
            retryable=True,
            ambiguous=ambiguous,
            code="timeout" if isinstance(exc, TimedOut) else "network",
        )
    if isinstance(exc, Conflict):
        return PlatformError(f"Telegram conflict: {message}", platform=PLATFORM, code=409)
    return PlatformError(f"Telegram error ({name}): {message}", platform=PLATFORM)


@contextlib.contextmanager
def map_telegram_errors(token: str) -> Iterator[None]:
    """Raise any PTB error from the block as its ``PlatformError`` (``translate_error``)."""
    try:
        yield
    except TelegramError as exc:
        raise translate_error(exc, token=token) from exc


def redact(text: str, token: str) -> str:
    """``text`` with the bot token replaced by ``<token>``."""
    if token:
        text = text.replace(token, "<token>")
    return text


def log_failure(exc: BaseException, msg: str, *args: object, level: int = logging.ERROR) -> None:
    """Log ``msg % (*args, type of exc)``; the exception (it can quote texts, ids) at DEBUG."""
    refused = isinstance(exc, ChatflowError)  # the gateway is busy or its storage failed
    logger.log(logging.WARNING if refused else level, msg, *args, type(exc).__name__)
    logger.debug("Telegram failure detail", exc_info=exc)


def partly_sent(error: PlatformError, sent: int, total: int, what: str) -> PlatformError:
    """``error`` after ``sent`` of ``total`` messages of one reply went out: ambiguous,
    so the ledger resends the whole reply with the marker."""
    return PlatformError(
        f"{error} (after {sent} of {total} {what} were sent)",
        platform=PLATFORM,
        retryable=error.retryable,
        retry_after=error.retry_after,
        ambiguous=True,
        code=error.code,
    )
