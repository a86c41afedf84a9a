"""An in-process platform adapter for gateway tests: push events in, read sends out."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from starlette.routing import BaseRoute

from bot.errors import PlatformError
from bot.gateway.events import MessageEvent, SessionSource
from bot.platforms.base import EventHandler, SendResult

_ids = itertools.count(1)


@dataclass
class Sent:
    """One message the gateway sent through the fake."""

    chat_id: str
    text: str
    thread_id: str | None
    reply_to: str | None


@dataclass
class FakeAdapter:
    """Records sends; ``fail_next`` queues errors for the next sends."""

    name: str = "fake"
    max_text_len: int = 4096
    connected_on_start: bool = True
    sent: list[Sent] = field(default_factory=list)
    fail_next: list[Exception] = field(default_factory=list)
    typing: int = 0
    _on_event: EventHandler | None = None
    _connected: bool = False
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def is_connected(self) -> bool:
        return self._connected

    async def start(self, on_event: EventHandler) -> None:
        self._on_event = on_event
        self._connected = self.connected_on_start

    async def stop(self) -> None:
        self._connected = False

    async def deliver(self, event: MessageEvent) -> bool:
        """Hand an inbound event to the gateway as a platform would."""
        assert self._on_event is not None, "adapter not started"
        return await self._on_event(event)

    async def send(
        self,
        chat_id: str,
        text: str,
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        if self.fail_next:
            raise self.fail_next.pop(0)
        async with self._changed:
            self.sent.append(Sent(chat_id, text, thread_id, reply_to))
            self._changed.notify_all()
        return SendResult(message_ids=[f"out-{next(_ids)}"])

    async def indicate_typing(self, event: MessageEvent) -> None:
        self.typing += 1

    def format_reply(self, text: str, agent_name: str) -> str:
        return text

    def routes(self) -> Sequence[BaseRoute]:
        return []

    async def wait_for_sent(self, count: int, timeout: float = 10.0) -> list[Sent]:
        """Wait until at least ``count`` messages were sent."""
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
    chat_type: str = "dm",
    thread_id: str | None = None,
    mentions_bot: bool = False,
    command: str | None = None,
    media_kind: str | None = None,
) -> MessageEvent:
    """A realistic inbound event for the fake platform."""
    n = next(_ids)
    return MessageEvent(
        platform=platform,
        message_id=message_id or f"{platform}:{chat_id}:{n}",
        platform_message_id=str(n),
        source=SessionSource(
            platform=platform,
            chat_id=chat_id,
            chat_type=chat_type,  # type: ignore[arg-type]
            sender_id=sender_id,
            thread_id=thread_id,
        ),
        text=text,
        mentions_bot=mentions_bot,
        command=command,
        media_kind=media_kind,
    )


def transient(message: str = "flaky", *, retry_after: float | None = None) -> PlatformError:
    """A retryable platform error."""
    return PlatformError(message, platform="fake", retryable=True, retry_after=retry_after)
