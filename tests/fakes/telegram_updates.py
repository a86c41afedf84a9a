"""Receiving updates for ``FakeTelegramServer``: ``getUpdates`` and the webhook methods.

``getUpdates`` has real offset semantics: an update is dropped once a call
with ``offset`` greater than its id arrives (unless the server's
``ignore_offsets``); with nothing pending the call waits up to ``timeout``
seconds for a new update (a condition, not a sleep loop); a second poller
terminates the first with 409; a set webhook makes ``getUpdates`` fail with
409. ``allowed_updates`` filters what is delivered. ``setWebhook``,
``deleteWebhook`` (optionally dropping pending updates) and ``getWebhookInfo``
keep the server's ``webhook_url`` and ``webhook_secret``.

The queue and the webhook live on the server (``push_update`` fills the queue);
this class only holds the handlers.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from tests.fakes.telegram_types import ApiError

if TYPE_CHECKING:
    from tests.fakes.telegram_server import FakeTelegramServer

__all__ = ["TelegramUpdateMethods"]


class TelegramUpdateMethods:
    """The fake's update methods, over the server's queue of pending updates."""

    def __init__(self, server: FakeTelegramServer) -> None:
        self._server = server

    async def delete_webhook(self, params: dict[str, Any]) -> bool:
        """The ``deleteWebhook`` method."""
        server = self._server
        server.webhook_url = None
        server.webhook_secret = None
        if params.get("drop_pending_updates"):
            server._updates.clear()
        return True

    async def set_webhook(self, params: dict[str, Any]) -> bool:
        """The ``setWebhook`` method."""
        server = self._server
        url = params.get("url")
        if not url:
            raise ApiError(400, "Bad Request: bad webhook: An HTTPS URL must be provided")
        server.webhook_url = str(url)
        server.webhook_secret = params.get("secret_token")
        if "allowed_updates" in params:
            server.allowed_updates = list(params["allowed_updates"]) or None
        return True

    async def get_webhook_info(self, params: dict[str, Any]) -> dict[str, Any]:
        """The ``getWebhookInfo`` method."""
        server = self._server
        return {
            "url": server.webhook_url or "",
            "has_custom_certificate": False,
            "pending_update_count": len(server._updates),
        }

    @staticmethod
    def _update_type(update: dict[str, Any]) -> str:
        return next((k for k in update if k != "update_id"), "")

    def _deliverable(self, offset: int | None) -> list[dict[str, Any]]:
        allowed = self._server.allowed_updates
        return [
            u
            for u in self._server._updates
            if (offset is None or int(u["update_id"]) >= offset)
            and (allowed is None or self._update_type(u) in allowed)
        ]

    async def get_updates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """The ``getUpdates`` method (long polling)."""
        server = self._server
        if server.webhook_url:
            raise ApiError(
                409,
                "Conflict: can't use getUpdates method while webhook is active;"
                " use deleteWebhook to delete the webhook first",
            )
        offset = params.get("offset")
        limit = int(params.get("limit") or 100)
        timeout = float(params.get("timeout") or 0)
        if "allowed_updates" in params:
            server.allowed_updates = list(params["allowed_updates"]) or None
        if offset is not None and int(offset) > 0 and not server.ignore_offsets:
            # Confirmation: everything below the offset is gone for good.
            server._updates = [u for u in server._updates if int(u["update_id"]) >= int(offset)]
        server._poll_generation += 1
        generation = server._poll_generation
        server._wake_pollers()  # an older poll still waiting is terminated (409)
        deadline = time.monotonic() + timeout
        while not (
            self._deliverable(offset) or generation != server._poll_generation or server._closing
        ):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            wakeup = server._wakeup
            try:
                await asyncio.wait_for(wakeup.wait(), timeout=remaining)
            except TimeoutError:
                break
        if generation != server._poll_generation:
            raise ApiError(
                409,
                "Conflict: terminated by other getUpdates request;"
                " make sure that only one bot instance is running",
            )
        return self._deliverable(offset)[:limit]
