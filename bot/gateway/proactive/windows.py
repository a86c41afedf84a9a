"""When each person last wrote to the bot, for platforms that only allow free-form
replies for a while after that (WhatsApp's 24-hour customer-service window).

``ContactWindows.record_in`` runs inside tx 1 (``Inbox.accept``), so a message the
bot accepted has always opened its sender's window here too, at no extra
transaction. The time recorded is when the bot accepted the message, not Meta's
timestamp of it (a redelivery may come hours late): we may think a window open a
little longer than Meta does, and then Meta's refusal (131047) still switches the
reply to the template, but we never pay for a template while the window is open.

Rows are keyed by the hashed chat id (``hash_chat_id`` with the gateway's
secret), never the raw phone number, and hold only the platform, that key and a
Unix time. Only direct chats are recorded: a window belongs to a person.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Final

from bot.core.sql import Transaction, ensure_schema
from bot.core.stores.base import TransactionalStore, require_transactional
from bot.gateway.contract import MessageEvent
from bot.gateway.instances import to_epoch
from bot.gateway.keys import hash_chat_id

__all__ = ["TABLE", "ContactWindows", "window_open"]

logger = logging.getLogger(__name__)

TABLE: Final = "chatflow_contact_windows"
_COMPONENT: Final = "contact_windows"
_MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {TABLE} ("
        "platform TEXT NOT NULL, "
        "chat_key TEXT NOT NULL, "
        "last_inbound_at REAL NOT NULL, "
        "PRIMARY KEY (platform, chat_key))",
    ),
}


def window_open(last_inbound: float | None, now: float, length: float) -> bool | None:
    """Whether a window of ``length`` seconds opened at ``last_inbound`` is open at ``now``.

    ``None`` when nobody's message was ever recorded (before this table existed,
    or a chat the bot never heard from): the caller tries free-form and lets the
    platform decide.
    """
    if last_inbound is None:
        return None
    return now - last_inbound < length


class ContactWindows:
    """Last inbound time per (platform, hashed chat id) in the session store's database."""

    def __init__(
        self,
        store: TransactionalStore,
        secret: bytes,
        *,
        platforms: Collection[str],
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        """``platforms``: those whose inbound messages are recorded (the others cost nothing)."""
        self._store = store = require_transactional(store, "the contact windows")
        self._secret = secret
        self.platforms = frozenset(platforms)
        self._clock = clock or store.now
        self._opened = False

    async def open(self) -> None:
        """Create or migrate the table (at start): tx 1 then skips the schema check."""
        await self._store.run(lambda tx: ensure_schema(tx, _COMPONENT, _MIGRATIONS))
        self._opened = True

    def now(self) -> float:
        """The clock the windows are measured with (Unix seconds)."""
        return to_epoch(self._clock())

    def _key(self, chat_id: str) -> str:
        return hash_chat_id(chat_id, self._secret)

    async def record_in(self, tx: Transaction, event: MessageEvent) -> None:
        """Open (or extend) the sender's window inside the caller's transaction (tx 1)."""
        if event.platform not in self.platforms or event.source.chat_type != "dm":
            return
        if not self._opened:
            # Not marked open here: the caller's transaction may still roll back.
            await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
        await tx.execute(
            f"INSERT INTO {TABLE} (platform, chat_key, last_inbound_at) VALUES (?, ?, ?) "
            "ON CONFLICT(platform, chat_key) DO UPDATE SET last_inbound_at = "
            f"excluded.last_inbound_at WHERE {TABLE}.last_inbound_at < excluded.last_inbound_at",
            (event.platform, self._key(event.source.chat_id), self.now()),
        )

    async def last_inbound(self, platform: str, chat_id: str) -> float | None:
        """Unix time of the last accepted message of ``chat_id``, ``None`` if never seen."""
        key = self._key(chat_id)

        async def body(tx: Transaction) -> tuple[object, ...] | None:
            if not self._opened:
                await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
            return await tx.fetchone(
                f"SELECT last_inbound_at FROM {TABLE} WHERE platform = ? AND chat_key = ?",
                (platform, key),
            )

        row = await self._store.run(body, write=not self._opened)
        self._opened = True
        if row is None:
            return None
        value = row[0]
        return float(value) if isinstance(value, int | float | str) else None

    async def is_open(self, platform: str, chat_id: str, length: float) -> bool | None:
        """``window_open`` for ``chat_id`` now; ``None`` when it was never recorded."""
        return window_open(await self.last_inbound(platform, chat_id), self.now(), length)
