"""What ``FakeTelegramServer`` records and how it refuses: its value types.

The recorded calls (``SentMessage``, ``SentFile``, ``DraftFrame``,
``RecordedRequest``), a file part of a multipart call (``UploadedFile``), the
faults a test injects (``Fault``) and ``ApiError``, which a method handler
raises to answer with Telegram's error body.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_TOKEN",
    "MAX_TEXT_UTF16",
    "ApiError",
    "DraftFrame",
    "Fault",
    "RecordedRequest",
    "SentFile",
    "SentMessage",
    "UploadedFile",
    "utf16_len",
]

DEFAULT_TOKEN = "123456789:AAFakeTokenForTestsOnly_abcdefghijk"
MAX_TEXT_UTF16 = 4096


def utf16_len(text: str) -> int:
    """Telegram's length unit."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


@dataclass(frozen=True)
class DraftFrame:
    """One ``sendMessageDraft`` the fake server accepted."""

    chat_id: int
    """Target private chat."""
    draft_id: int
    """The draft's id (non-zero)."""
    text: str
    """The text shown ("" is Telegram's "Thinking..." placeholder)."""
    at: float
    """``time.monotonic()`` when it arrived."""
    parse_mode: str | None = None
    """Formatting mode, if given."""
    message_thread_id: int | None = None
    """Topic, if given."""


@dataclass(frozen=True)
class SentMessage:
    """One message the fake server accepted."""

    chat_id: int | str
    """Target chat as sent."""
    text: str
    """The text as sent (formatting marks included)."""
    message_id: int
    """Id the server gave the message."""
    message_thread_id: int | None = None
    """Forum topic, if given."""
    reply_parameters: dict[str, Any] | None = None
    """Decoded ``reply_parameters``, if given."""
    parse_mode: str | None = None
    """Formatting mode, if given."""


@dataclass(frozen=True)
class UploadedFile:
    """One file part of a multipart call."""

    filename: str
    """The part's file name."""
    data: bytes = field(repr=False)
    """The bytes received."""
    content_type: str | None = None
    """The part's ``Content-Type``."""


@dataclass(frozen=True)
class SentFile:
    """One ``sendPhoto`` / ``sendDocument`` the fake server accepted."""

    method: str
    """``sendPhoto`` or ``sendDocument``."""
    chat_id: int | str
    """Target chat as sent."""
    message_id: int
    """Id the server gave the message."""
    file: UploadedFile
    """The upload, bytes included."""
    message_thread_id: int | None = None
    """Forum topic, if given."""


@dataclass(frozen=True)
class RecordedRequest:
    """Any Bot API call the server received."""

    method: str
    """Bot API method name, e.g. ``getUpdates``."""
    params: dict[str, Any]
    """Decoded parameters."""


@dataclass(frozen=True)
class Fault:
    """An error answer to inject for the next call of a method."""

    status: int = 500
    """HTTP status and ``error_code``."""
    description: str = "Internal Server Error"
    """Telegram's ``description``."""
    parameters: dict[str, Any] | None = None
    """``ResponseParameters`` (``retry_after``, ``migrate_to_chat_id``)."""
    hang: bool = False
    """Record the call, then answer normally only once ``release_hangs`` is called."""

    @classmethod
    def flood(cls, retry_after: int) -> Fault:
        """429 Too Many Requests with ``parameters.retry_after``."""
        return cls(
            429,
            f"Too Many Requests: retry after {retry_after}",
            {"retry_after": retry_after},
        )

    @classmethod
    def server_error(cls) -> Fault:
        """500 Internal Server Error."""
        return cls(500, "Internal Server Error")

    @classmethod
    def blocked(cls) -> Fault:
        """403: the user blocked the bot."""
        return cls(403, "Forbidden: bot was blocked by the user")

    @classmethod
    def bad_request(cls, description: str) -> Fault:
        """400 with the given description (``Bad Request: ...``)."""
        return cls(400, f"Bad Request: {description}")

    @classmethod
    def hanging(cls) -> Fault:
        """Never answer until ``release_hangs``."""
        return cls(hang=True)


class ApiError(Exception):
    """Raised by a method handler: the server answers with this Bot API error."""

    def __init__(
        self, status: int, description: str, parameters: dict[str, Any] | None = None
    ) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters
