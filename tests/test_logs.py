"""Logging set-up: libraries that print URLs (and so tokens) stay below INFO."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from bot.logs import JsonFormatter, configure_logging, quiet_console_logs


@pytest.fixture(autouse=True)
def _restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize(
    "library",
    ["httpx", "httpx2", "httpcore", "telegram", "telegram.ext", "pywa_async", "openai"],
    ids=str,
)
def test_url_logging_libraries_are_quiet_at_info(library: str) -> None:
    configure_logging("INFO", "text")
    assert not logging.getLogger(library).isEnabledFor(logging.INFO)
    assert logging.getLogger("bot.gateway").isEnabledFor(logging.INFO)


def test_json_lines_carry_extra_fields() -> None:
    record = logging.makeLogRecord(
        {"name": "bot.x", "levelname": "INFO", "msg": "turn in %s", "args": ("s-1",)}
    )
    record.session_id = "telegram-0123456789abcdef"
    payload = json.loads(JsonFormatter().format(record))
    assert payload["message"] == "turn in s-1"
    assert payload["session_id"] == "telegram-0123456789abcdef"


def test_console_mode_shows_only_warnings() -> None:
    configure_logging("INFO", "text")
    quiet_console_logs()
    (handler,) = logging.getLogger().handlers
    assert handler.level == logging.WARNING
