"""Telegram's send limits, and the pacer's turn taken before each Bot API request.

The limits are the Bot API FAQ's: about 30 messages per second per bot, one per
second per chat, 20 per minute per group. The gateway's pacer
(``PlatformAdapter.pacer``) applies them when each request is written, which
is why the adapter runs PTB without its own rate limiter once a pacer is set.
"""

from __future__ import annotations

from bot.gateway.contract import SendLimits, SendPacer

__all__ = ["SEND_LIMITS", "take_turn"]

SEND_LIMITS = SendLimits(per_second=30, per_chat_second=1, group_per_minute=20)
"""Telegram's documented flood limits for one bot."""


async def take_turn(pacer: SendPacer | None, chat: int | str, *, optional: bool = False) -> bool:
    """Wait for ``chat``'s turn (no wait without a pacer); False: skip this optional request.

    Negative ids are groups, supergroups and channels; ``@username`` is a channel:
    all are held to the group window (channels are not documented, so the stricter).
    """
    if pacer is None:
        return True
    group = not isinstance(chat, int) or chat < 0
    return await pacer.turn(str(chat), group=group, optional=optional)
