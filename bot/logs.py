"""Logging set-up: text on a terminal, JSON lines elsewhere; noisy libraries quietened."""

from __future__ import annotations

import hashlib
import logging
import sys
from typing import Literal

from bot.log_lines import JsonLines, text_lines
from bot.tracing import spans

__all__ = ["JsonFormatter", "configure_logging", "log_ref", "quiet_console_logs", "writes_json"]

# httpx logs every request URL at INFO, and Telegram URLs carry the bot token.
_QUIET = (
    "httpx",
    "httpx2",  # the openai SDK's own fork of httpx
    "httpcore",
    "httpcore2",
    "telegram",
    "telegram.ext",
    "pywa",
    "pywa_async",
    "uvicorn",
    "uvicorn.error",
    "openai",
    "hpack",
)

_STANDARD = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


class JsonFormatter(JsonLines):
    """One JSON object per line: time, level, logger, message, the current span's ids
    and any ``extra`` fields."""

    def fields(self, record: logging.LogRecord) -> dict[str, object]:
        payload = super().fields(record)
        ids = spans.log_ids()  # made inside a span (tracing on): one grep joins them
        if ids is not None:
            payload["trace_id"], payload["span_id"] = ids
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                payload[key] = value if isinstance(value, str | int | float | bool) else repr(value)
        return payload


def writes_json(fmt: Literal["auto", "text", "json"] = "auto") -> bool:
    """Whether logs go out as JSON lines: asked for, or ``auto`` with no terminal on stderr."""
    return fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())


def configure_logging(level: str = "INFO", fmt: Literal["auto", "text", "json"] = "auto") -> None:
    """Configure the root logger once for the process."""
    use_json = writes_json(fmt)
    handler = logging.StreamHandler(sys.stderr)
    if use_json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(text_lines())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    quiet = max(logging.WARNING, logging.getLevelName(level))
    for name in _QUIET:
        logging.getLogger(name).setLevel(quiet)


def quiet_console_logs() -> None:
    """Show only warnings on the terminal while a person chats in it.

    INFO lines would land in the middle of the conversation; they are still
    there with ``LOG_LEVEL=DEBUG`` or ``INFO`` set explicitly.
    """
    for handler in logging.getLogger().handlers:
        handler.setLevel(max(handler.level, logging.WARNING))


def log_ref(value: str, prefix: str = "msg") -> str:
    """A log-safe stand-in for an external id: ``<prefix>_<12hex>``.

    Message ids embed phone numbers or chat ids (a WhatsApp wamid is base64
    around the sender's number), and user and chat ids often are phone numbers,
    so logs carry this instead. It is unkeyed so that every process, and a
    reader holding only the raw id, computes the same reference; the price is
    that a reference to a bare phone number can be reversed by enumerating
    numbers, so prefer a message id's reference over a sender's.
    """
    return f"{prefix}_{hashlib.sha256(value.encode('utf-8')).hexdigest()[:12]}"
