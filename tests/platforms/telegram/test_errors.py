"""Telegram error translation: PTB and httpx exceptions to ``PlatformError``, by type."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from telegram.error import BadRequest, ChatMigrated, Forbidden, NetworkError, RetryAfter, TimedOut

from bot.platforms.telegram.errors import translate_error

TOKEN = "123456789:AAtestTOKENvalue_for_respx_only"


@pytest.mark.parametrize(
    ("retry_after", "seconds"),
    [(5, 5.0), (timedelta(seconds=7), 7.0)],
    ids=["int", "timedelta"],
)
def test_retry_after_int_or_timedelta(
    retry_after: int | timedelta, seconds: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The opt-in an adapter sets: RetryAfter's constructor warns without it.
    monkeypatch.setenv("PTB_TIMEDELTA", "true")
    error_ = translate_error(RetryAfter(retry_after))
    assert error_.retry_after == seconds
    assert error_.retryable


def _chained(outer: NetworkError, cause: BaseException) -> NetworkError:
    try:
        raise outer from cause
    except NetworkError as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "retryable", "ambiguous"),
    [
        (Forbidden("Forbidden: bot was kicked from the group chat"), False, False),
        (BadRequest("Bad Request: message to reply not found"), False, False),
        (ChatMigrated(-100999), False, False),
        (_chained(TimedOut(), httpx.ReadTimeout("r")), True, True),
        (_chained(TimedOut(), httpx.ConnectTimeout("c")), True, False),
        (
            _chained(
                TimedOut("Pool timeout: All connections in the connection pool are occupied."),
                httpx.PoolTimeout("p"),
            ),
            True,
            False,
        ),
        (TimedOut(), True, True),
        (NetworkError("Bad Gateway"), True, False),
        (_chained(NetworkError("httpx.ReadError"), httpx.ReadError("r")), True, True),
    ],
    ids=[
        "forbidden",
        "bad-request",
        "migrated-twice",
        "read-timeout",
        "connect-timeout",
        "pool-timeout-message",
        "timeout-unknown-cause",
        "status-5xx",
        "read-error",
    ],
)
def test_translate_error_rules(exc: Exception, retryable: bool, ambiguous: bool) -> None:
    translated = translate_error(exc)  # type: ignore[arg-type]
    assert translated.retryable is retryable
    assert translated.ambiguous is ambiguous
    assert translated.platform == "telegram"


def test_translate_error_redacts_token() -> None:
    translated = translate_error(NetworkError(f"failed for {TOKEN}"), token=TOKEN)
    assert TOKEN not in str(translated)


@pytest.mark.parametrize(
    ("exc", "ambiguous"),
    [
        (TimedOut("Pool timeout: Request was *not* sent to Telegram."), True),
        (_chained(TimedOut("All connections are busy"), httpx.PoolTimeout("p")), False),
        (_chained(TimedOut("Pool timeout: not sent"), httpx.ReadTimeout("r")), True),
        (_chained(TimedOut(), httpx.WriteTimeout("w")), True),
        (_chained(TimedOut(), httpx.ConnectTimeout("c")), False),
    ],
    ids=[
        "pool-wording-without-cause",
        "pool-timeout-reworded",
        "read-timeout-with-pool-wording",
        "write-timeout",
        "connect-timeout",
    ],
)
def test_ambiguity_follows_the_httpx_cause_not_the_wording(exc: TimedOut, ambiguous: bool) -> None:
    translated = translate_error(exc)
    assert translated.ambiguous is ambiguous
    assert translated.retryable
    assert translated.code == "timeout"
