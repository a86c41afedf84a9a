"""WhatsApp Cloud API, through pywa: the adapter and what it is made of.

- ``adapter``: ``WhatsAppAdapter`` (the signed webhook, sending, pacing);
- ``payload``: webhook bodies into ``MessageEvent`` objects;
- ``errors``: Graph API errors into ``PlatformError`` with retry facts;
- ``media`` and ``send_media``: files in and out.
"""

from __future__ import annotations

from bot.platforms.whatsapp.adapter import (
    DEFAULT_API_VERSION,
    MAX_BODY_BYTES,
    WEBHOOK_PATH,
    StatusFailedHandler,
    WhatsAppAdapter,
)
from bot.platforms.whatsapp.errors import RETRYABLE_CODES
from bot.platforms.whatsapp.payload import is_group_chat_id

__all__ = [
    "DEFAULT_API_VERSION",
    "MAX_BODY_BYTES",
    "RETRYABLE_CODES",
    "WEBHOOK_PATH",
    "StatusFailedHandler",
    "WhatsAppAdapter",
    "is_group_chat_id",
]
