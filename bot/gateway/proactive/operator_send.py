"""A message the operator sends from the shell (``python -m bot send``), owed through the ledger.

The command does not talk to a platform: it records one ``pending``
obligation owned by ``NOBODY`` (``owe_operator_message``, the console's reply
path, so the message is in the conversation's history as the operator's where
the command can hold the session's lock: on PostgreSQL, or on SQLite with no bot
running; a running bot's turn on SQLite would otherwise fail its save) and
the running gateway's retry poll claims and sends it; with no gateway running,
the sweep of the next start does.

Where it lands: the conversation whose latest ledger row went to that chat
(and thread), which is the one the console shows for it; a chat the bot never
answered gets the key the gateway gives a private chat with that id.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any, Final

from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.gateway.contract import SessionSource
from bot.gateway.keys import build_session_key, session_id_for
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import NOBODY, Obligation
from bot.gateway.ledger.obligations import TABLE as OBLIGATIONS_TABLE
from bot.gateway.takeover import Route, owe_operator_message

__all__ = ["PLATFORMS", "SendTarget", "TargetError", "find_route", "parse_target", "queue_message"]

PLATFORMS: Final = ("telegram", "whatsapp", "console", "web")
"""Platforms ``python -m bot send`` writes to (and ``schedule list --chat`` filters on):
every platform a conversation can be on, the terminal's and the console's web chat too."""

_TELEGRAM_ID = re.compile(r"-?[0-9]{1,20}")
_WHATSAPP_ID = re.compile(r"[0-9]{5,20}")
_TOPIC_ID = re.compile(r"[0-9]{1,12}")
_LOCAL_ID = re.compile(r"[A-Za-z0-9._@-]{1,128}")
"""A terminal user's or a web test chat's id (``local-user``, ``web-3f2a...``)."""


class TargetError(ValueError):
    """A ``<platform>:<chat id>[:<thread id>]`` that names no chat; the message says why."""


@dataclass(frozen=True, slots=True)
class SendTarget:
    """A chat (and topic) the operator names."""

    platform: str
    chat_id: str
    thread_id: str | None = None


def parse_target(target: str) -> SendTarget:
    """``telegram:123456789``, ``telegram:-1001234567890:42``, ``whatsapp:15551234567``.

    Raises ``TargetError`` with a one-line reason.
    """
    platform, sep, rest = target.partition(":")
    platform = platform.strip().lower()
    if not sep or not platform:
        raise TargetError(
            f"target must be <platform>:<chat id>[:<thread id>], e.g. telegram:123456789, "
            f"not {target!r}"
        )
    if platform not in PLATFORMS:
        raise TargetError(f"unknown platform {platform!r} (one of: {', '.join(PLATFORMS)})")
    chat_id, _, thread = rest.partition(":")
    thread_id = thread or None
    if platform == "telegram":
        if not _TELEGRAM_ID.fullmatch(chat_id) or int(chat_id) == 0:
            raise TargetError(
                f"telegram chat id must be an integer (e.g. 123456789 or -1001234567890), "
                f"not {chat_id!r}"
            )
        if thread_id is not None and not _TOPIC_ID.fullmatch(thread_id):
            raise TargetError(f"telegram topic id must be a positive integer, not {thread_id!r}")
    elif platform in ("console", "web"):
        if not _LOCAL_ID.fullmatch(chat_id):
            raise TargetError(
                f"{platform} chat id must be one word (e.g. {platform}:local-user), not {chat_id!r}"
            )
        if thread_id is not None:
            raise TargetError(f"{platform} chats have no threads: use {platform}:<chat id>")
    else:
        if not _WHATSAPP_ID.fullmatch(chat_id):
            raise TargetError(
                "whatsapp chat id must be the number in digits, country code first, "
                f"without + or spaces (e.g. 15551234567), not {chat_id!r}"
            )
        if thread_id is not None:
            raise TargetError("whatsapp chats have no threads: use whatsapp:<number>")
    return SendTarget(platform, chat_id, thread_id)


async def find_route(
    store: TransactionalStore, target: SendTarget, *, secret: bytes
) -> tuple[Route, str]:
    """``(route, session id)`` of the conversation a message to ``target`` belongs to.

    The latest ledger row to that chat and thread names it (the console routes
    replies by the same rows); without one, the private-chat rule of
    ``build_session_key`` (the CLI cannot know a chat's type).
    """

    async def body(tx: Transaction) -> tuple[Any, ...] | None:
        thread_match = "thread_id IS NULL" if target.thread_id is None else "thread_id = ?"
        params: tuple[str, ...] = (target.platform, target.chat_id)
        if target.thread_id is not None:
            params += (target.thread_id,)
        return await tx.fetchone(
            f"SELECT session_key, session_id FROM {OBLIGATIONS_TABLE} "
            f"WHERE platform = ? AND chat_id = ? AND {thread_match} "
            "ORDER BY created_at DESC LIMIT 1",
            params,
        )

    row = await store.run(body, write=False)
    if row is not None:
        session_key, session_id = str(row[0]), str(row[1])
    else:
        source = SessionSource(target.platform, target.chat_id, "dm", target.chat_id)
        session_key = build_session_key(source, secret=secret)
        session_id = session_id_for(session_key)
    route = Route(session_key, target.platform, target.chat_id, target.thread_id)
    return route, session_id


async def queue_message(
    store: TransactionalStore,
    target: SendTarget,
    text: str,
    *,
    secret: bytes,
    into_history: bool = True,
) -> Obligation:
    """Record ``text`` to ``target`` as the operator's message, ``pending`` for any gateway.

    The platforms' adapters show an operator's text unchanged, so the content is
    ``text`` as given (an adapter splits what is over its limit when sending).
    ``into_history=False``: the obligation alone, the conversation untouched (the
    caller cannot hold the session's lock against a running gateway's turns).
    """
    ledger = DeliveryLedger(store, owner=NOBODY)
    await ledger.open()
    route, session_id = await find_route(store, target, secret=secret)
    obligation = await owe_operator_message(
        store,
        ledger,
        route,
        session_id,
        text,
        content=text,
        nonce=uuid.uuid4().hex,
        claimed=False,
        require_session=False,
        into_history=into_history,
    )
    assert obligation is not None  # a fresh nonce is never recorded before
    return obligation
