"""The web channel: an operator chats with the agents in the console's browser page.

A platform like any other (``name = "web"``): what the operator types becomes a
``MessageEvent`` handed to the gateway (inbox, dedup, runner, ledger), and the
replies the gateway sends arrive in ``send``, which only acknowledges them:
the console shows the conversation from the session's history, as for every
platform. Enabled with the console (``CONSOLE_TOKEN``). Sender id
``WEB_SENDER_ID``: list it in ``ALLOWED_USERS`` when an allow list is on.
"""

from __future__ import annotations

import itertools
import logging
from typing import Final

from bot.errors import PlatformError
from bot.gateway.contract import (
    EventHandler,
    MessageEvent,
    PlatformAdapter,
    SendResult,
    SessionSource,
)

__all__ = ["PLATFORM", "WEB_SENDER_ID", "WebAdapter"]

logger = logging.getLogger(__name__)

PLATFORM: Final = "web"
"""The channel's platform name."""
WEB_SENDER_ID: Final = "console-operator"
"""Sender id of everything typed in the web channel."""


class WebAdapter(PlatformAdapter):
    """Messages typed in the console, and their replies acknowledged."""

    name = PLATFORM
    max_text_len = 16_000

    def __init__(self) -> None:
        self._on_event: EventHandler | None = None
        self._connected = False
        self._ids = itertools.count(1)

    @property
    def is_connected(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._connected

    async def start(self, on_event: EventHandler) -> None:
        """Keep the gateway's entry point."""
        self._on_event = on_event
        self._connected = True

    async def stop(self) -> None:
        """Refuse further messages; idempotent."""
        self._connected = False

    async def say(self, chat_id: str, text: str, *, message_id: str) -> tuple[MessageEvent, bool]:
        """Hand ``text`` to the gateway as a message of ``chat_id``: the event, and
        whether the gateway accepted it (``False``: a duplicate, or refused by the gate).

        ``message_id`` (one per form) makes a form sent twice one message: the
        gateway's dedup drops the second. Raises ``PlatformError`` when stopped.
        """
        if self._on_event is None or not self._connected:
            raise PlatformError("the web channel is not running", platform=PLATFORM)
        event = MessageEvent(
            platform=PLATFORM,
            message_id=f"{PLATFORM}:{chat_id}:{message_id}",
            source=_source(chat_id),
            text=text,
            platform_message_id=message_id,
        )
        return event, await self._on_event(event)

    async def tap(self, chat_id: str, token: str, *, message_id: str) -> bool:
        """Hand the click of the button ``token`` (shown by the console) to the gateway as a
        tap: whether it was accepted (``False``: expired, used, or clicked twice)."""
        if self._on_event is None or not self._connected:
            raise PlatformError("the web channel is not running", platform=PLATFORM)
        event = MessageEvent(
            platform=PLATFORM,
            message_id=f"{PLATFORM}:{chat_id}:tap:{message_id}",
            source=_source(chat_id),
            text="",
            tap_token=token,
        )
        return await self._on_event(event)

    async def send(
        self,
        chat_id: str,
        text: str,
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Acknowledge a reply: the console shows it from the session's history."""
        if not self._connected:
            raise PlatformError("the web channel is not running", platform=PLATFORM, retryable=True)
        return SendResult(message_ids=[f"web-out-{next(self._ids)}"])


def _source(chat_id: str) -> SessionSource:
    """Where everything typed or clicked in the web channel comes from: the operator."""
    return SessionSource(
        platform=PLATFORM,
        chat_id=chat_id,
        chat_type="dm",
        sender_id=WEB_SENDER_ID,
        sender_name="Operator (web)",
    )
