"""What a platform adapter hands the gateway: where a message comes from and what it says."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = ["ChatType", "MessageEvent", "SessionSource"]

ChatType = Literal["dm", "group", "channel"]


@dataclass(frozen=True, slots=True)
class SessionSource:
    """Where a message comes from. Raw ids: hash them before they reach a session table."""

    platform: str
    """Adapter name, e.g. ``"telegram"`` or ``"whatsapp"``."""
    chat_id: str
    """Raw platform chat id (a Telegram chat id, a WhatsApp ``wa_id`` or ``group_id``)."""
    chat_type: ChatType
    """``dm``, ``group`` or ``channel``."""
    sender_id: str
    """Raw platform id of the person who wrote."""
    thread_id: str | None = None
    """Topic or thread inside the chat (Telegram forum topic, Google-Chat thread)."""
    chat_name: str | None = None
    """Display name of the chat, for humans only."""
    sender_name: str | None = None
    """Display name of the sender, for humans only."""

    def __post_init__(self) -> None:
        if self.chat_type not in ("dm", "group", "channel"):
            raise ValueError(f"chat_type must be dm, group or channel, not {self.chat_type!r}")
        if not self.platform or not self.chat_id or not self.sender_id:
            raise ValueError("platform, chat_id and sender_id must be non-empty")


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class MessageEvent:
    """One inbound message, normalised by an adapter."""

    platform: str
    """Adapter name."""
    message_id: str
    """Platform-unique dedup id (``telegram:<chat>:<msg>``, a WhatsApp ``wamid``)."""
    source: SessionSource
    """Where it comes from."""
    text: str
    """The text (or caption) with the bot's own mention stripped."""
    platform_message_id: str | None = None
    """The platform's own id of this message (Telegram ``message_id``, WhatsApp wamid);
    the answer quotes it."""
    reply_to_id: str | None = None
    """Platform id of the message this one replies to, if it is a reply."""
    replies_to_bot: bool = False
    """True when it replies to one of the bot's own messages."""
    mentions_bot: bool = False
    """True when it @mentions the bot (entity-based, not a substring)."""
    command: str | None = None
    """Bot command addressed to this bot, without slash or ``@bot`` (``"start"``)."""
    media_kind: str | None = None
    """Kind of attachment (``photo``, ``voice``...) when the message carries one."""
    timestamp: datetime = field(default_factory=_now)
    """When the platform says it was sent."""
    migrate_from_chat_id: str | None = None
    """Set on a notice that this chat replaced another (Telegram group -> supergroup);
    such an event carries no text and starts no turn."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The platform payload, kept for adapters; never logged."""

    @property
    def addressed(self) -> bool:
        """Whether the message is clearly meant for the bot in a group."""
        return self.mentions_bot or self.replies_to_bot or self.command is not None
