"""What every platform adapter offers the gateway."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from starlette.routing import BaseRoute

from bot.errors import PlatformError
from bot.gateway.events import MessageEvent

__all__ = ["EventHandler", "PlatformAdapter", "PlatformError", "SendResult"]

EventHandler = Callable[[MessageEvent], Awaitable[bool]]
"""The gateway's entry point. It returns once the event is durably accepted
(``True``) or judged a duplicate or ignored (``False``); an adapter confirms the
update to its platform (webhook 200, polling offset) only after it returns, and
must not confirm if it raises."""


@dataclass(frozen=True, slots=True)
class SendResult:
    """What a successful send produced."""

    message_ids: list[str] = field(default_factory=list)
    """Platform ids of the messages sent, one per part, in order."""


@runtime_checkable
class PlatformAdapter(Protocol):
    """A messaging platform as the gateway sees it.

    Errors from ``send`` are ``PlatformError`` with ``retryable``,
    ``retry_after`` and ``ambiguous`` set as the platform's answer allows.
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

    async def indicate_typing(self, event: MessageEvent) -> None:
        """Show that the bot is working on ``event``; called every few seconds."""
        ...

    def format_reply(self, text: str, agent_name: str) -> str:
        """Present a reply before it is recorded and sent (the console shows ``[Agent]``);
        most adapters return ``text`` unchanged."""
        ...

    def routes(self) -> Sequence[BaseRoute]:
        """HTTP routes to mount on the bot's server (webhooks); may be empty."""
        ...
