"""The shape of a log line, a JSON object or a line of text, for every process of the bot.

The tracing exporter (``bot/tracing/child.py``) runs as a script that imports none of
the bot, and writes on the stderr it shares with the bot: it loads this file by its
path, so this module imports nothing of the bot either. One shape, whoever writes.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

__all__ = ["JsonLines", "text_lines"]


class JsonLines(logging.Formatter):
    """One JSON object per line: time, level, logger, message (then, in ``fields`` of a
    subclass, what it adds), and the exception's traceback, if any, last."""

    def fields(self, record: logging.LogRecord) -> dict[str, object]:
        """The line's fields before the traceback."""
        return {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }

    def format(self, record: logging.LogRecord) -> str:
        line = self.fields(record)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def text_lines() -> logging.Formatter:
    """A line of text, for a person at a terminal: time, level, logger, message."""
    return logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
