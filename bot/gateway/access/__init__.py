"""Who the bot serves: the gate before tx 1, the screen after it, pairing and rate limits.

- ``gate``: ``Gate``, the access mode's verdict on a message (``Admission``) and its session;
- ``control``: ``AccessControl``, the screen after tx 1 (limits, pairing codes, notices);
- ``pairing``: ``Pairing``, codes a stranger is given and the operator approves;
- ``rate_limits``: ``RateLimits``, a window of messages per sender.
"""

from __future__ import annotations

from bot.gateway.access.control import (
    NOT_ADMITTED_ERROR,
    PAIRING_ERROR,
    RATE_LIMITED_ERROR,
    AccessControl,
    pairing_reply,
    rate_limit_notice,
)
from bot.gateway.access.gate import Admission, Gate
from bot.gateway.access.pairing import Pairing
from bot.gateway.access.rate_limits import RateLimits

__all__ = [
    "NOT_ADMITTED_ERROR",
    "PAIRING_ERROR",
    "RATE_LIMITED_ERROR",
    "AccessControl",
    "Admission",
    "Gate",
    "Pairing",
    "RateLimits",
    "pairing_reply",
    "rate_limit_notice",
]
