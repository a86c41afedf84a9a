"""Which events the bot answers, and the session each belongs to."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from bot.config import Settings
from bot.gateway.aliases import ChatAliases
from bot.gateway.contract import MessageEvent
from bot.gateway.keys import build_session_key

__all__ = ["Gate"]


class Gate:
    """The allow lists, group addressing and session keys (migrated chats followed)."""

    def __init__(self, settings: Settings, aliases: ChatAliases, secret: bytes) -> None:
        self._settings = settings
        self.aliases = aliases
        self._secret = secret

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
        source = event.source
        chat_id = self.aliases.resolve(source.platform, source.chat_id)
        if chat_id != source.chat_id:
            source = replace(source, chat_id=chat_id)
        return build_session_key(
            source,
            group_sessions_per_user=self._settings.group_sessions_per_user,
            secret=self._secret,
        )
