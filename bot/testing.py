"""Helpers for testing your agents: a scripted model and an in-process platform adapter.

``ScriptedModel`` answers a ``Runner`` from a script and records every request,
so an agent's tools, handoffs and rollback can be tested without a provider::

    model = ScriptedModel([ScriptedModel.call("check_order_status", order_id="1001"),
                           ScriptedModel.reply("It ships tomorrow.")])
    async with Runner(orders, model=model) as runner:
        result = await runner.run_async("test-1", "where is my order?")

``FakeAdapter`` stands in for Telegram or WhatsApp in front of a ``Gateway``:
``deliver(make_event("hi"))`` hands it an inbound message, ``wait_for_sent``
waits for the replies, and ``fail_next`` makes sends fail. A photo or file:
put its bytes in ``FakeAdapter.files`` under a file id and deliver
``make_event("caption", media=[MediaAttachment("image", file_id=...)])``. Files a
tool sent with the reply (``ToolOutput``) land in ``FakeAdapter.sent_files``, spoken
replies in ``FakeAdapter.voices``; ``SilentSpeech`` is a speech model without a
service (a silent OGG/Opus note). Chatflow's own gateway tests use these same classes.

This module is imported on its own (``import bot`` does not load it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.routing import BaseRoute

from bot.core.models.scripted import (
    PartialAnswer,
    RecordedCall,
    ScriptedModel,
    ScriptExhaustedError,
    Step,
)
from bot.core.models.speech import SilentSpeech
from bot.errors import MediaError, PlatformError
from bot.gateway.contract import (
    VOICE_FORBIDDEN,
    ChatType,
    EventHandler,
    MediaAttachment,
    MessageEvent,
    OutgoingFile,
    PlatformAdapter,
    SendResult,
    SessionSource,
)

__all__ = [
    "FakeAdapter",
    "MediaAttachment",
    "PartialAnswer",
    "RecordedCall",
    "ScriptExhaustedError",
    "ScriptedModel",
    "Sent",
    "SilentSpeech",
    "Step",
    "make_event",
    "transient",
]

_ids = itertools.count(1)


@dataclass
class Sent:
    """One message the gateway sent through the fake."""

    chat_id: str
    """The chat it went to (the event's raw ``chat_id``)."""
    text: str
    """The text, as the gateway formatted it."""
    thread_id: str | None
    """Topic or thread, when the event had one."""
    reply_to: str | None
    """Platform id of the message it quotes."""


@dataclass(eq=False)
class FakeAdapter(PlatformAdapter):
    """A ``PlatformAdapter`` that records sends; ``fail_next`` queues errors for the next sends."""

    name: str = "fake"
    """Platform name (in session keys and ledger rows)."""
    max_text_len: int = 4096
    """Longest text one message may carry."""
    connected_on_start: bool = True
    """Whether ``start`` leaves it connected (False: the ledger keeps replies owed)."""
    sent: list[Sent] = field(default_factory=list)
    """Every message sent, in order."""
    fail_next: list[Exception] = field(default_factory=list)
    """Errors the next sends raise, one each, e.g. ``transient()``."""
    typing: int = 0
    """How many times the gateway showed "typing"."""
    files: dict[str, bytes] = field(default_factory=dict)
    """Bytes ``fetch_media`` serves, by ``MediaAttachment.file_id``."""
    fetched: list[str] = field(default_factory=list)
    """File ids fetched, in order (a re-run that re-downloads shows up twice)."""
    sent_ids: list[str] = field(default_factory=list)
    """Platform message id answered for each send, in order (what a reply would quote)."""
    sent_files: list[OutgoingFile] = field(default_factory=list)
    """Every file sent after a reply's text (``send_attachments``), in order."""
    fail_files: list[Exception] = field(default_factory=list)
    """Errors the next ``send_attachments`` calls raise, one each."""
    draft_seconds: float | None = None
    """Seconds between drafts (``draft_interval``); ``None``: no drafts, as most platforms."""
    drafts: list[str] = field(default_factory=list)
    """Every draft shown (``send_draft``), in order; never a delivery."""
    fail_drafts: list[Exception] = field(default_factory=list)
    """Errors the next ``send_draft`` calls raise, one each (e.g. a flood-control 429)."""
    draft_attempts: int = 0
    """How many times ``send_draft`` was called, failures included."""
    voice_caption_limit: int = 1024
    """Longest caption of a voice note (as Telegram); 0: the text goes as its own message."""
    voices: list[tuple[Sent, OutgoingFile]] = field(default_factory=list)
    """Every voice note sent (``send_voice``): its message (caption as text) and audio."""
    refuse_voice: bool = False
    """Refuse every voice note as a person whose privacy settings forbid them."""
    _on_event: EventHandler | None = None
    _connected: bool = False
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def is_connected(self) -> bool:
        """True between ``start`` (when ``connected_on_start``) and ``stop``."""
        return self._connected

    async def start(self, on_event: EventHandler) -> None:
        """Keep the gateway's entry point for ``deliver``."""
        self._on_event = on_event
        self._connected = self.connected_on_start

    async def stop(self) -> None:
        """Disconnect."""
        self._connected = False

    async def deliver(self, event: MessageEvent) -> bool:
        """Hand an inbound event to the gateway as a platform would.

        Returns once it is durably accepted (``True``) or judged a duplicate or
        ignored (``False``); the turn runs afterwards, so wait with ``wait_for_sent``.
        """
        assert self._on_event is not None, "adapter not started (call gateway.start())"
        return await self._on_event(event)

    async def send(
        self,
        chat_id: str,
        text: str,
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Record the message, or raise the next error of ``fail_next``."""
        if self.fail_next:
            raise self.fail_next.pop(0)
        message_id = f"out-{next(_ids)}"
        async with self._changed:
            self.sent.append(Sent(chat_id, text, thread_id, reply_to))
            self.sent_ids.append(message_id)
            self._changed.notify_all()
        return SendResult(message_ids=[message_id])

    async def send_attachments(
        self,
        chat_id: str,
        files: Sequence[OutgoingFile],
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Record the files (one message id each), or raise the next error of ``fail_files``."""
        if self.fail_files:
            raise self.fail_files.pop(0)
        async with self._changed:
            self.sent_files.extend(files)
            self._changed.notify_all()
        return SendResult(message_ids=[f"out-{next(_ids)}" for _ in files])

    async def send_voice(
        self,
        chat_id: str,
        voice: OutgoingFile,
        *,
        caption: str | None = None,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Record the voice note, or refuse it (``refuse_voice``, ``fail_next``)."""
        if self.refuse_voice:
            raise PlatformError("voice notes refused", platform=self.name, code=VOICE_FORBIDDEN)
        if self.fail_next:
            raise self.fail_next.pop(0)
        message_id = f"out-{next(_ids)}"
        async with self._changed:
            self.voices.append((Sent(chat_id, caption or "", thread_id, reply_to), voice))
            self.sent_ids.append(message_id)
            self._changed.notify_all()
        return SendResult(message_ids=[message_id])

    async def indicate_typing(self, event: MessageEvent) -> None:
        """Count the call."""
        self.typing += 1

    def draft_interval(self, event: MessageEvent) -> float | None:
        """``draft_seconds``."""
        return self.draft_seconds

    async def send_draft(self, event: MessageEvent, draft_id: int, text: str) -> None:
        """Record the draft, or raise the next error of ``fail_drafts``."""
        async with self._changed:
            self.draft_attempts += 1
            self._changed.notify_all()
            if self.fail_drafts:
                raise self.fail_drafts.pop(0)
            self.drafts.append(text)

    async def wait_for(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Wait until ``condition()`` holds, checked at each send, draft or draft attempt."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(condition), timeout)

    def format_reply(self, text: str, agent_name: str) -> str:
        """Return ``text`` unchanged."""
        return text

    def routes(self) -> Sequence[BaseRoute]:
        """No HTTP routes."""
        return []

    async def fetch_media(self, media: MediaAttachment, *, max_bytes: int) -> bytes:
        """The bytes in ``files`` for ``media.file_id``; a missing id fails like a 404."""
        self.fetched.append(media.file_id or "")
        data = self.files.get(media.file_id or "")
        if data is None:
            raise PlatformError("file not found", platform=self.name, code=404)
        if len(data) > max_bytes:
            raise MediaError("Your file is too big for me.")
        return data

    # A default deadline on purpose: a test whose reply never comes fails in
    # seconds with a TimeoutError instead of hanging until the suite's timeout.
    async def wait_for_sent(self, count: int, timeout: float = 10.0) -> list[Sent]:  # noqa: ASYNC109
        """Wait until at least ``count`` messages were sent; return all of them.

        ``TimeoutError`` after ``timeout`` seconds.
        """
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.sent) >= count), timeout)
        return list(self.sent)


def make_event(
    text: str = "hello",
    *,
    message_id: str | None = None,
    platform: str = "fake",
    chat_id: str = "chat-1",
    sender_id: str = "user-1",
    chat_type: ChatType = "dm",
    thread_id: str | None = None,
    mentions_bot: bool = False,
    command: str | None = None,
    media_kind: str | None = None,
    sender_name: str | None = None,
    media: Sequence[MediaAttachment] = (),
    **fields: Any,
) -> MessageEvent:
    """An inbound text event for ``FakeAdapter``; each call gets a fresh message id.

    Pass the same ``message_id`` twice to simulate a platform redelivery; other
    ``MessageEvent`` fields (``timestamp``, ``source``, ``migrate_from_chat_id``...)
    may be given as keywords.
    """
    n = next(_ids)
    event = MessageEvent(
        platform=platform,
        message_id=message_id or f"{platform}:{chat_id}:{n}",
        platform_message_id=str(n),
        source=SessionSource(
            platform=platform,
            chat_id=chat_id,
            chat_type=chat_type,
            sender_id=sender_id,
            thread_id=thread_id,
            sender_name=sender_name,
        ),
        text=text,
        mentions_bot=mentions_bot,
        command=command,
        media_kind=media_kind or (media[0].kind if media else None),
        media=tuple(media),
    )
    return dataclasses.replace(event, **fields) if fields else event


def transient(
    message: str = "flaky", *, retry_after: float | None = None, platform: str = "fake"
) -> PlatformError:
    """A retryable platform error, for ``FakeAdapter.fail_next``."""
    return PlatformError(message, platform=platform, retryable=True, retry_after=retry_after)
