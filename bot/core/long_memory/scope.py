"""Who sees which memory: the visibility rule, once in Python and once in SQL.

A turn runs for one person in one chat (``MemoryScope``: hashes only). A memory is
visible in it when:

- ``about="me"``: the same person speaks (same platform, same hashed sender id),
  and the turn is in that person's private chat or in the chat where the fact was
  remembered. A fact told in a private chat therefore never shows in a group;
- ``about="chat"``: the turn is in the chat (and forum topic) where it was
  remembered, whoever speaks.

The host (the gateway) sets the scope of each turn (``speaking_as``) from the
inbound message, never from anything the model says; no tool argument names a
person or a chat. ``recall``, ``forget`` and the prompt block all filter with
``visible_sql``; ``is_visible`` is the same rule in Python, which the tests hold
the SQL to.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "About",
    "MemoryScope",
    "current_scope",
    "is_visible",
    "speaking_as",
    "visible_sql",
]

About = Literal["me", "chat"]
"""Whom a memory is about: the person who said it, or the chat (topic) it was said in."""


@dataclass(frozen=True, slots=True)
class MemoryScope:
    """Where a turn runs and who speaks in it, as the gateway's keyed hashes."""

    platform: str
    chat: str
    """Hashed chat id (``chat_<12hex>``)."""
    person: str | None
    """Hashed sender id (``user_<12hex>``); ``None`` when nobody spoke (a scheduled
    turn in a group): then no ``"me"`` memory is visible and none can be made."""
    private: bool
    """A private chat with the person (Telegram private chat, a WhatsApp number)."""
    thread: str = ""
    """Forum topic or thread (``""`` for none)."""


_scope: ContextVar[MemoryScope | None] = ContextVar("chatflow_memory_scope", default=None)


def current_scope() -> MemoryScope | None:
    """The scope of the turn running in this task, if the host set one."""
    return _scope.get()


class speaking_as:  # lower case: it reads as the function it replaced, `with speaking_as(...)`
    """Run the turns inside the block in ``scope`` (the host's call, per inbound message).

    A class, not a generator: one per message, on the pipeline's hot path."""

    __slots__ = ("_scope", "_token")

    def __init__(self, scope: MemoryScope | None) -> None:
        self._scope = scope
        self._token: Token[MemoryScope | None] | None = None

    def __enter__(self) -> None:
        self._token = _scope.set(self._scope)

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _scope.reset(self._token)
            self._token = None


def is_visible(
    about: str, platform: str, person: str, chat: str, thread: str, scope: MemoryScope
) -> bool:
    """Whether a memory remembered by ``person`` in ``chat``/``thread`` shows in ``scope``."""
    if platform != scope.platform:
        return False
    if about == "me":
        return (
            scope.person is not None
            and person == scope.person
            and (scope.private or chat == scope.chat)
        )
    if about == "chat":
        return chat == scope.chat and thread == scope.thread
    return False


def visible_sql(scope: MemoryScope) -> tuple[str, tuple[Any, ...]]:
    """``is_visible`` as a SQL condition on the memories table, with its parameters."""
    chat_rule = "(about = 'chat' AND chat = ? AND thread = ?)"
    params: tuple[Any, ...] = (scope.platform, scope.chat, scope.thread)
    if scope.person is None:
        return f"(platform = ? AND {chat_rule})", params
    if scope.private:  # the person's own chat: their facts from anywhere on this platform
        me_rule = "(about = 'me' AND person = ?)"
        params += (scope.person,)
    else:
        me_rule = "(about = 'me' AND person = ? AND chat = ?)"
        params += (scope.person, scope.chat)
    return f"(platform = ? AND ({chat_rule} OR {me_rule}))", params
