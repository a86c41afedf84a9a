"""The console's side of the web channel: what it needs of the adapter that carries it.

The adapter lives in ``bot.platforms.web`` (wired by ``bot.app``); the console
knows it only through ``WebChannel``, so it imports no platform.
"""

from __future__ import annotations

from typing import Final, Protocol, runtime_checkable

from bot.gateway.contract import MessageEvent

__all__ = ["WEB_PLATFORM", "WebChannel"]

WEB_PLATFORM: Final = "web"
"""The platform name of the web channel."""


@runtime_checkable
class WebChannel(Protocol):
    """An adapter that turns what the operator types into messages for the gateway."""

    async def say(self, chat_id: str, text: str, *, message_id: str) -> tuple[MessageEvent, bool]:
        """Hand ``text`` to the gateway; the event, and whether the gateway accepted it."""
        ...

    async def tap(self, chat_id: str, token: str, *, message_id: str) -> bool:
        """Hand the tap of the button ``token`` to the gateway; whether a turn follows."""
        ...
