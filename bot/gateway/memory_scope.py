"""The memory scope of a turn (``bot.core.long_memory``), from the message that started it.

Hashes only, keyed with the installation secret like the session keys: the
memories table never holds a raw id. A scheduled turn has no speaker in a group
(the chat stands in for the sender there), so it sees no one's own facts; in a
private chat the chat is the person, as for their own messages.
"""

from __future__ import annotations

from bot.core.long_memory.scope import MemoryScope
from bot.gateway.events import MessageEvent
from bot.gateway.keys import hash_chat_id, hash_sender_id

__all__ = ["person_ref", "scope_for"]


def person_ref(sender_id: str, secret: bytes) -> str:
    """The hashed id memories keep for the person with this platform id."""
    return hash_sender_id(sender_id, secret)


def scope_for(event: MessageEvent, secret: bytes) -> MemoryScope:
    """Where ``event``'s turn runs and who speaks in it."""
    source = event.source
    private = source.chat_type == "dm"
    nobody = event.scheduled and not private
    return MemoryScope(
        platform=source.platform,
        chat=hash_chat_id(source.chat_id, secret),
        person=None if nobody else person_ref(source.sender_id, secret),
        private=private,
        thread="" if private else (source.thread_id or ""),
    )
