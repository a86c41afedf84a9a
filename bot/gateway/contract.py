"""The adapter contract: what a platform hands the gateway, and what the gateway asks of it.

The gateway owns this port; platforms implement it (``bot.platforms``
subclass ``PlatformAdapter`` to inherit the optional hooks' defaults) and the
gateway knows no platform.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from starlette.routing import BaseRoute

from bot.core.buttons import Button
from bot.errors import MediaError, PlatformError

__all__ = [
    "VOICE_FORBIDDEN",
    "ChatType",
    "EventHandler",
    "MediaAttachment",
    "MessageEvent",
    "OutgoingButton",
    "OutgoingFile",
    "PlatformAdapter",
    "SendLimits",
    "SendPacer",
    "SendResult",
    "ServiceWindows",
    "SessionSource",
    "StatusFailedHandler",
    "numbered_choices",
]

ChatType = Literal["dm", "group", "channel"]

VOICE_FORBIDDEN = "voice_forbidden"
"""``PlatformError.code`` of a voice note the chat does not accept (Telegram's
``VOICE_MESSAGES_FORBIDDEN``): the reply goes as text, and the chat gets no more."""


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
class MediaAttachment:
    """What came attached to a message: a reference to fetch, never the bytes.

    ``kind`` is ``image``, ``voice``, ``audio``, ``document``, ``location`` or
    ``contact``. Files carry the platform's id (``file_id``: a Telegram
    ``file_id`` or a WhatsApp media id, which outlives the short-lived URL);
    locations and contacts carry their content. Sizes and MIME types are what
    the platform *claims*: the gateway checks the bytes.
    """

    kind: str
    """``image``, ``voice``, ``audio``, ``document``, ``location`` or ``contact``."""
    file_id: str | None = None
    """The platform's id to download the file by."""
    unique_id: str | None = None
    """A stable id of the file itself (Telegram ``file_unique_id``), if the platform has one."""
    mime_type: str | None = None
    """Claimed MIME type."""
    size: int | None = None
    """Claimed size in bytes."""
    file_name: str | None = None
    """The sender's file name (documents); never logged."""
    latitude: float | None = None
    """Locations: latitude."""
    longitude: float | None = None
    """Locations: longitude."""
    title: str | None = None
    """A venue's name, or a contact's display name."""
    address: str | None = None
    """A venue's address."""
    phones: tuple[str, ...] = ()
    """A contact's phone numbers."""


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
    reply_to_text: str | None = None
    """What the replied-to message says, when the platform tells (Telegram: the
    highlighted quote, else its text or caption, or its kind such as ``[photo]``)."""
    reply_to_sender: str | None = None
    """Display name of who wrote the replied-to message (not the bot), for the model."""
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
    media: tuple[MediaAttachment, ...] = ()
    """Attachments the gateway fetches after tx 1 and gives the turn (``text`` is the caption)."""
    scheduled: bool = False
    """Not from a person: a ``run_agent`` job the scheduler journaled at its due time
    (``text`` carries ``SCHEDULED_MARKER``); the gate and access control let it through."""
    scheduled_by: str | None = None
    """On a scheduled turn: the ``sender_digest`` of the person who scheduled the job
    (the scheduler screened them and their budget); its tokens are charged to them."""
    button: Button | None = None
    """The button a tap chose (set by the gateway once the tap's token is resolved; the
    ``text`` is then its label)."""
    tap_token: str | None = None
    """Set by an adapter on a button tap: the token the platform sent back
    (``callback_data``, a reply id); the gateway resolves it to ``button``."""
    callback_id: str | None = None
    """The platform's id of the tap to answer (Telegram callback query id)."""
    keyboard_message_id: str | None = None
    """Platform id of the message that carried the tapped keyboard (to remove it)."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The platform payload, kept for adapters; never logged."""

    @property
    def addressed(self) -> bool:
        """Whether the message is clearly meant for the bot in a group."""
        return self.mentions_bot or self.replies_to_bot or self.command is not None


EventHandler = Callable[[MessageEvent], Awaitable[bool]]
"""The gateway's entry point. It returns once the event is durably accepted
(``True``) or judged a duplicate or ignored (``False``); an adapter confirms the
update to its platform (webhook 200, polling offset) only after it returns, and
must not confirm if it raises."""

StatusFailedHandler = Callable[[str, str], Awaitable[None]]
"""``(platform message id, error)`` for a reply the platform reports undelivered."""


@dataclass(frozen=True, slots=True)
class SendResult:
    """What a successful send produced."""

    message_ids: list[str] = field(default_factory=list)
    """Platform ids of the messages sent, one per part, in order."""


@dataclass(frozen=True, slots=True)
class OutgoingFile:
    """A file to send after a reply's text (a tool's ``Attachment``, read back from the media
    store). Its bytes and name are never logged."""

    kind: Literal["image", "document", "voice"]
    """``image``: a photo (Telegram ``sendPhoto``, WhatsApp image); ``document``: a file;
    ``voice``: an OGG/Opus voice note (``send_voice``)."""
    data: bytes = field(repr=False)
    """The bytes."""
    mime_type: str
    """Its MIME type (checked when the tool returned it)."""
    file_name: str
    """The name the user sees."""
    path: Path | None = None
    """Where it is stored (``DATA_DIR/media/...``), for channels that show a path."""

    def describe(self) -> str:
        """``photo "chart.png"`` / ``file "report.pdf"``: how a text-only channel names it."""
        what = {"image": "photo", "voice": "voice note"}.get(self.kind, "file")
        return f'{what} "{self.file_name}"'


@dataclass(frozen=True, slots=True)
class OutgoingButton:
    """A button to show under a reply: the opaque token a tap sends back, and the label.
    The tool's value never reaches the platform; labels are data, never markup."""

    token: str
    """Short random url-safe id (Telegram ``callback_data``, a WhatsApp reply id)."""
    label: str
    """What the person sees."""


def numbered_choices(buttons: Sequence[OutgoingButton]) -> str:
    """``1. Yes`` lines: how a channel without buttons shows them (and the person types
    the number or the label)."""
    return "\n".join(f"{n}. {b.label}" for n, b in enumerate(buttons, 1))


@dataclass(frozen=True, slots=True)
class SendLimits:
    """How fast one platform account may send: what its platform documents.

    The gateway paces every request of the account to these (``SendPacer``);
    an adapter declares them as its ``send_limits``.
    """

    per_second: int
    """Requests of the whole account in any rolling second (Telegram 30, WhatsApp 80)."""
    per_chat_second: int | None = None
    """Messages to one chat in any rolling second (Telegram 1); ``None``: no such limit."""
    group_per_minute: int | None = None
    """Messages to one group in any rolling minute (Telegram 20); ``None``: no such limit."""

    def __post_init__(self) -> None:
        for value in (self.per_second, self.per_chat_second, self.group_per_minute):
            if value is not None and value < 1:
                raise ValueError("send limits must be at least 1")


@runtime_checkable
class SendPacer(Protocol):
    """The gateway's outbound scheduler of one platform account (see ``SendLimits``).

    An adapter awaits ``turn`` right before it writes each request, and the gateway
    tells it about the platform's flood refusals through ``refused``.
    """

    async def turn(self, chat_id: str, *, group: bool = False, optional: bool = False) -> bool:
        """Wait until a request to ``chat_id`` may be written; True then.

        ``optional`` (typing, draft previews): never waits; False means skip this one
        (the account has a backlog or is paused)."""
        ...

    def refused(self, retry_after: float | None) -> None:
        """The platform refused a request for flood (429, 130429): pause the account
        for ``retry_after`` seconds (1 s if it did not say)."""
        ...


class ServiceWindows(Protocol):
    """When people last wrote, for platforms whose free-form replies expire (WhatsApp)."""

    async def is_open(self, platform: str, chat_id: str, length: float) -> bool | None:
        """Whether ``chat_id`` wrote within the last ``length`` seconds; ``None``: never
        recorded (try free-form and let the platform decide)."""
        ...


@runtime_checkable
class PlatformAdapter(Protocol):
    """A messaging platform as the gateway sees it.

    Errors from ``send`` are ``PlatformError`` with ``retryable``,
    ``retry_after`` and ``ambiguous`` set as the platform's answer allows. The
    members after ``send`` are optional hooks: an adapter that subclasses this
    class inherits their defaults.
    """

    name: str
    """Platform name used in session keys and ledger rows."""
    max_text_len: int
    """Longest text one platform message may carry; ``send`` splits longer text."""

    @property
    def is_connected(self) -> bool:
        """True once ``start`` succeeded and until ``stop``."""
        ...

    async def start(self, on_event: EventHandler) -> None:
        """Connect and begin delivering events to ``on_event``; return once running."""
        ...

    async def stop(self) -> None:
        """Stop receiving and release resources; idempotent."""
        ...

    async def send(
        self,
        chat_id: str,
        text: str,
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Send ``text`` (split into ordered parts if needed) to a chat."""
        ...

    # -- optional hooks (defaults for subclasses) ------------------------------------

    on_status_failed: StatusFailedHandler | None = None
    """Set by the gateway before ``start`` for platforms that report delivery
    failures after the send (WhatsApp statuses); ``None`` elsewhere."""

    closed: asyncio.Event | None = None
    """Set when the channel ended by itself (the console's end of input): the
    bot stops. ``None`` for channels that never end on their own."""

    send_limits: SendLimits | None = None
    """The platform's send limits for this account; ``None``: sends are not paced."""

    pacer: SendPacer | None = None
    """Set by the gateway before ``start`` when ``send_limits`` is set: the adapter
    awaits ``pacer.turn`` before writing each request."""

    service_window_seconds: float | None = None
    """How long after a person's last message free-form replies are allowed
    (WhatsApp: 24 h); ``None``: no such window, nothing is recorded."""

    windows: ServiceWindows | None = None
    """Set by the gateway before ``start`` when ``service_window_seconds`` is set."""

    voice_caption_limit: int = 0
    """Longest caption (UTF-16 units) a voice note carries (Telegram: 1,024); 0: none,
    the text goes as its own message."""

    async def send_voice(
        self,
        chat_id: str,
        voice: OutgoingFile,
        *,
        caption: str | None = None,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Send ``voice`` (OGG/Opus) as a voice note, ``caption`` under it, with ``send``'s
        errors; ``code=VOICE_FORBIDDEN`` when the person does not accept voice notes.
        This default, for channels that play none, raises it too: the text goes alone
        (the gateway does not even synthesize speech for such a channel)."""
        raise PlatformError(
            "this channel sends no voice notes", platform=self.name, code=VOICE_FORBIDDEN
        )

    async def indicate_typing(self, event: MessageEvent) -> None:
        """Show that the bot is working on ``event``; called every few seconds."""
        return None

    def draft_interval(self, event: MessageEvent) -> float | None:
        """Seconds between draft updates while the answer to ``event`` is written, or
        ``None`` (this default): its chat shows no drafts, only typing."""
        return None

    async def send_draft(self, event: MessageEvent, draft_id: int, text: str) -> None:
        """Show ``text`` (already through ``format_reply``) as the answer to ``event``
        being written: a preview that is never a delivery (``""``: a placeholder while
        tools run). Raises ``PlatformError``, with ``retry_after`` on flood control."""
        return None

    def format_reply(self, text: str, agent_name: str) -> str:
        """Present a reply before it is recorded and sent (the console shows ``[Agent]``);
        most adapters return ``text`` unchanged."""
        return text

    def routes(self) -> Sequence[BaseRoute]:
        """HTTP routes to mount on the bot's server (webhooks); may be empty."""
        return ()

    async def send_attachments(
        self,
        chat_id: str,
        files: Sequence[OutgoingFile],
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Send ``files`` (one message each) right after a reply's text, with ``send``'s
        errors. This default, for channels without files, sends one line naming them."""
        names = ", ".join(f.describe() for f in files)
        line = f"(Attached: {names}. This channel cannot show files.)"
        return await self.send(chat_id, line, thread_id=thread_id, reply_to=reply_to)

    async def send_with_buttons(
        self,
        chat_id: str,
        text: str,
        buttons: Sequence[OutgoingButton],
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """``send``, with ``buttons`` under the last part of ``text``. This default, for
        channels without buttons, appends them as numbered lines."""
        listed = f"{text}\n\n{numbered_choices(buttons)}" if buttons else text
        return await self.send(chat_id, listed, thread_id=thread_id, reply_to=reply_to)

    async def answer_tap(self, event: MessageEvent, notice: str | None) -> None:
        """Acknowledge the button tap ``event`` once (Telegram ``answerCallbackQuery``),
        showing ``notice`` if given. Best effort: never raises. Default: nothing."""
        return None

    async def remove_keyboard(self, event: MessageEvent) -> None:
        """Take the used keyboard off the message the tap ``event`` came from, where the
        platform allows. Best effort: never raises. Default: nothing."""
        return None

    async def fetch_media(self, media: MediaAttachment, *, max_bytes: int) -> bytes:
        """The bytes of ``media`` (at most ``max_bytes``, else ``MediaError``).

        ``MediaError`` for what the user must be told (too big, gone);
        ``PlatformError`` for a failed request. Platforms without files keep this.
        """
        raise MediaError("I can't download files on this channel.")
