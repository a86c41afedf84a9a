"""Which events the bot answers, and the session each belongs to."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from bot.config import Settings
from bot.gateway.aliases import ChatAliases
from bot.gateway.contract import MessageEvent
from bot.gateway.keys import build_session_key, session_id_for

__all__ = ["Gate"]

_KEYS_KEPT = 4096
"""Session keys remembered per origin: each costs two HMACs and a SHA-256 to build."""


class Gate:
    """The allow lists, group addressing and session keys (migrated chats followed)."""

    def __init__(self, settings: Settings, aliases: ChatAliases, secret: bytes) -> None:
        self._settings = settings
        self.aliases = aliases
        self._secret = secret
        # (platform, chat, chat type, thread, sender) -> (session key, session id)
        self._keys: dict[tuple[str, str, str, str | None, str], tuple[str, str]] = {}

    def allowed(self, event: MessageEvent) -> bool:
        s = self._settings
        if not s.allowed_users and not s.allowed_chats:
            return True
        return event.source.sender_id in s.allowed_users or self._chat_listed(
            event, s.allowed_chats
        )

    def addressed(self, event: MessageEvent) -> bool:
        if event.source.chat_type == "dm":
            return True
        return event.addressed or self._chat_listed(event, self._settings.group_answer_all_chats)

    def _chat_listed(self, event: MessageEvent, chats: Collection[str]) -> bool:
        """Whether the chat is in ``chats`` by its id or by the id it had before a migration."""
        chat_id = event.source.chat_id
        return chat_id in chats or self.aliases.resolve(event.platform, chat_id) in chats

    def session_key_for(self, event: MessageEvent) -> str:
        """The logical session key of an event (hashed ids, aliases applied)."""
        return self.session_of(event)[0]

    def session_of(self, event: MessageEvent) -> tuple[str, str]:
        """``(session key, session id)`` of an event (hashed ids, aliases applied)."""
        source = event.source
        chat_id = self.aliases.resolve(source.platform, source.chat_id)
        origin = (source.platform, chat_id, source.chat_type, source.thread_id, source.sender_id)
        known = self._keys.get(origin)
        if known is not None:
            return known
        if chat_id != source.chat_id:
            source = replace(source, chat_id=chat_id)
        key = build_session_key(
            source,
            group_sessions_per_user=self._settings.group_sessions_per_user,
            secret=self._secret,
        )
        if len(self._keys) >= _KEYS_KEPT:
            self._keys.clear()  # cheaper than an LRU, and rebuilt on demand
        known = self._keys[origin] = (key, session_id_for(key))
        return known
