"""Which events the bot answers, and the session each belongs to."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Literal

from bot.config import Settings
from bot.gateway.access.pairing import Pairing
from bot.gateway.access.rate_limits import sender_digest
from bot.gateway.aliases import ChatAliases
from bot.gateway.contract import ChatType, MessageEvent
from bot.gateway.keys import build_session_key, session_id_for

__all__ = ["Admission", "Gate"]

Admission = Literal["serve", "pair", "ignore"]
"""What the access mode says of a message: run it, answer with a pairing code, or drop it."""

_KEYS_KEPT = 4096
"""Session keys remembered per origin: each costs two HMACs and a SHA-256 to build."""


class Gate:
    """Access mode and allow lists, group addressing and session keys (migrated chats
    followed)."""

    def __init__(
        self,
        settings: Settings,
        aliases: ChatAliases,
        secret: bytes,
        *,
        pairing: Pairing | None = None,
    ) -> None:
        self._settings = settings
        self.aliases = aliases
        self._secret = secret
        self.mode = settings.effective_access_mode
        if self.mode == "pairing" and pairing is None:
            raise ValueError("ACCESS_MODE=pairing needs the pairing tables")
        self._pairing = pairing
        # (platform, chat, chat type, thread, sender) -> (session key, session id)
        self._keys: dict[tuple[str, str, str, str | None, str], tuple[str, str]] = {}
        # platform -> digests of ALLOWED_USERS (a job's owner is stored as a digest)
        self._allowed_digests: dict[str, frozenset[str]] = {}

    async def admit(self, event: MessageEvent) -> Admission:
        """The access mode's verdict (``ACCESS_MODE``); before tx 1, so "ignore" stores nothing.

        ``open`` serves everyone and ``allowlist`` the allow lists. ``pairing``
        serves the allow lists and approved senders; another sender's DM is
        answered with a code, and group messages of unknown senders are ignored
        unless the group is in ``ALLOWED_CHATS``.
        """
        if self.mode == "open":
            return "serve"
        if self.allowed(event):
            return "serve"
        if self.mode == "allowlist":
            return "ignore"
        assert self._pairing is not None
        source = event.source
        if await self._pairing.is_approved(source.platform, source.sender_id):
            return "serve"
        return "pair" if source.chat_type == "dm" else "ignore"

    async def admits_owner(
        self, platform: str, chat_id: str, chat_type: ChatType, sender: str | None
    ) -> bool:
        """Whether the person who scheduled a job is still served, as their own message in
        that chat would be: the allow lists and pairing approvals of now, not of when
        they scheduled it (an operator who revoked them stops their jobs).

        ``sender`` is their ``sender_digest``. A job written before owners were stored
        has none: in a DM the chat is the person; in a group only the chat is judged.
        """
        if self.mode == "open":
            return True
        if sender is None and chat_type == "dm":
            sender = sender_digest(platform, chat_id, self._secret)
        s = self._settings
        if not s.allowed_users and not s.allowed_chats:
            if self.mode != "pairing":
                return True
        else:
            chats = s.allowed_chats
            if chat_id in chats or self.aliases.resolve(platform, chat_id) in chats:
                return True
            if sender is not None and sender in self._allowed_users_of(platform):
                return True
        if sender is None:
            return self.mode == "pairing"  # an old group job of an unknown member
        if self.mode == "allowlist":
            return False
        assert self._pairing is not None
        return await self._pairing.is_approved_digest(platform, sender)

    def _allowed_users_of(self, platform: str) -> frozenset[str]:
        known = self._allowed_digests.get(platform)
        if known is None:
            known = frozenset(
                sender_digest(platform, user, self._secret) for user in self._settings.allowed_users
            )
            self._allowed_digests[platform] = known
        return known

    def allowed(self, event: MessageEvent) -> bool:
        """Whether the allow lists let the event in (no list set: everyone, except in
        pairing mode, where the lists only add to the approved senders)."""
        s = self._settings
        if not s.allowed_users and not s.allowed_chats:
            return self.mode != "pairing"
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
