"""The one place where pywa and httpx exceptions from a send become ``PlatformError``.

- A Meta error (``WhatsAppError``) is retryable when its code is in
  ``RETRYABLE_CODES``, pywa calls it transient, or the HTTP status is 5xx;
  ``retry_after`` comes from a ``Retry-After`` header (1 s for a throughput
  refusal, 130429, without one: the gateway pauses the number). Every other code is
  permanent; auth codes are logged at ERROR (the operator must act).
- A transport error (``httpx.HTTPError``) is retryable, and ``ambiguous``
  unless the request provably never left: a connect error, a connect timeout
  or a pool timeout.
- A failure after earlier parts of the same text were sent is ``ambiguous``:
  a resend would repeat them.
"""

from __future__ import annotations

import logging

import httpx
from pywa_async.errors import WhatsAppError

from bot.errors import PlatformError
from bot.platforms.whatsapp.payload import PLATFORM
from bot.platforms.whatsapp.templates import REENGAGEMENT_CODE, TEMPLATE_ERROR_CODES

__all__ = [
    "RETRYABLE_CODES",
    "THROUGHPUT_CODE",
    "THROUGHPUT_RETRY_AFTER",
    "api_error",
    "transport_error",
]

# The adapter's logger: the split into modules does not rename what operators filter on.
logger = logging.getLogger("bot.platforms.whatsapp")

THROUGHPUT_CODE = 130429
"""Meta's refusal past the number's messages per second."""
THROUGHPUT_RETRY_AFTER = 1.0
"""The pause a throughput refusal asks for when Meta names none (its window is 1 s)."""

RETRYABLE_CODES: frozenset[int] = frozenset(
    {
        4,  # too many API calls (app level)
        80007,  # WABA rate limit
        130429,  # throughput (messages per second per number)
        131048,  # spam rate limit
        131056,  # pair rate: too many messages to one user
        1,  # API unknown
        2,  # API service temporarily unavailable
        131000,  # something went wrong
        131016,  # service unavailable
    }
)
"""Meta error codes worth retrying later with backoff; every other code is permanent."""

_AUTH_CODES = frozenset({0, 3, 10, 190, *range(200, 300)})


def api_error(exc: WhatsAppError, index: int, total: int) -> PlatformError:
    """The ``PlatformError`` for Meta's refusal of part ``index`` (0-based) of ``total``."""
    code = exc.code
    status = exc.status_code
    # A template Meta refuses stays refused until the operator fixes it, whatever the status.
    retryable = code not in TEMPLATE_ERROR_CODES and (
        code in RETRYABLE_CODES
        or exc.is_transient is True
        or (status is not None and status >= 500)
    )
    retry_after = None
    if exc.raw_response is not None:
        retry_after = _retry_after(exc.raw_response.headers.get("retry-after"))
    if code == THROUGHPUT_CODE and retry_after is None:
        # Meta sends no Retry-After here: the number's window is one second.
        retry_after = THROUGHPUT_RETRY_AFTER
    level = logging.ERROR if code in _AUTH_CODES else logging.WARNING
    logger.log(
        level,
        "WhatsApp send failed: error code %s (%s, HTTP %s, %s) at part %d/%d",
        code,
        type(exc).__name__,
        status,
        "retryable" if retryable else "permanent",
        index + 1,
        total,
    )
    if code == REENGAGEMENT_CODE:
        what = "the 24-hour customer service window is closed; only a template can be sent"
    elif code in TEMPLATE_ERROR_CODES:
        what = f"template refused: {exc.message}"
    else:
        what = exc.message
    return PlatformError(
        f"WhatsApp error {code}: {what}",
        platform=PLATFORM,
        code=code,
        retryable=retryable,
        retry_after=retry_after,
        # Earlier parts already went out: a resend would repeat them.
        ambiguous=index > 0,
    )


def transport_error(exc: httpx.HTTPError, index: int, total: int) -> PlatformError:
    """The ``PlatformError`` for a transport failure of part ``index`` (0-based) of ``total``."""
    # Errors raised before the request left this host: it certainly did not arrive.
    not_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    ambiguous = index > 0 or not not_sent
    logger.warning(
        "WhatsApp send failed: %s at part %d/%d (%s)",
        type(exc).__name__,
        index + 1,
        total,
        "may have arrived" if ambiguous else "not sent",
    )
    return PlatformError(
        f"WhatsApp request failed: {type(exc).__name__}",
        platform=PLATFORM,
        retryable=True,
        ambiguous=ambiguous,
    )


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None
