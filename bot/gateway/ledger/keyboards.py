"""The buttons of sent keyboards: one row per button, found again by its opaque token.

A reply with buttons (``Obligation.buttons``) writes one row per button in the
same transaction as the obligation (tx 2), so a recorded reply always has its
keyboard. The platform only ever sees the token (Telegram ``callback_data``, a
WhatsApp reply id): a short random url-safe string, never the label or value.
A tap is resolved by token (``find_button``); the first accepted tap marks the
whole keyboard used with a guarded UPDATE (``mark_used_in``), so two taps racing
in two processes start one turn. Component ``chatflow_buttons``, its own
migrations.

A keyboard belongs to the person it was sent to (``owner_ref``: the keyed hash
of the sender whose message the turn answered, set in the same tx 2 by
``set_owner_in``); only a keyboard recorded with ``anyone`` (a tool's
``ToolOutput(..., anyone_may_tap=True)``, a poll for a whole group) takes
another member's tap. Rows from before version 2, and keyboards of turns that
answered nobody in particular (a scheduled turn), have no owner.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from bot.core.buttons import Button
from bot.core.sql import Transaction, ensure_schema
from bot.gateway.instances import from_epoch

__all__ = [
    "COMPONENT",
    "MIGRATIONS",
    "TABLE",
    "KeyboardButton",
    "TapInfo",
    "ensure_keyboards_schema",
    "find_button_in",
    "mark_used_in",
    "new_keyboard",
    "new_token",
    "prune_in",
    "record_keyboard_in",
    "set_owner_in",
]

COMPONENT: Final = "chatflow_buttons"
TABLE: Final = "chatflow_buttons"
MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {TABLE} ("
        "token TEXT PRIMARY KEY NOT NULL, "
        "keyboard_id TEXT NOT NULL, "
        "obligation_id TEXT NOT NULL, "
        "position INTEGER NOT NULL, "
        "platform TEXT NOT NULL, "
        "chat_id TEXT NOT NULL, "
        "thread_id TEXT, "
        "session_key TEXT NOT NULL, "
        "session_id TEXT NOT NULL, "
        "label TEXT NOT NULL, "
        "value TEXT, "
        "created_at REAL NOT NULL, "
        "used_at REAL)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_keyboard ON {TABLE} (keyboard_id)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_created ON {TABLE} (created_at)",
    ),
    # 2: whose keyboard it is (G2 of the 2026-12-07 review: another member's tap acted
    # in the owner's conversation), and whether anyone may tap it.
    2: (
        f"ALTER TABLE {TABLE} ADD COLUMN owner_ref TEXT",
        f"ALTER TABLE {TABLE} ADD COLUMN anyone INTEGER NOT NULL DEFAULT 0",
    ),
}
"""Schema versions of the buttons table (component ``chatflow_buttons``)."""

_TOKEN_BYTES: Final = 12
"""Random bytes per token: 16 url-safe characters, far below Telegram's 64-byte limit."""


def new_token() -> str:
    """A fresh opaque button token (random, url-safe, 16 characters)."""
    return secrets.token_urlsafe(_TOKEN_BYTES)


@dataclass(frozen=True, slots=True)
class KeyboardButton:
    """A button as a reply carries it: its token, and the choice it stands for."""

    token: str
    """What the platform sends back on a tap (``callback_data``, a reply id)."""
    label: str
    """What the person sees."""
    value: str | None = None
    """What the tool means by it (``None``: the label)."""

    @property
    def button(self) -> Button:
        """The choice as the core knows it."""
        return Button(self.label, self.value)


def new_keyboard(buttons: Sequence[Button]) -> tuple[KeyboardButton, ...]:
    """``buttons`` with fresh tokens, ready to record."""
    return tuple(KeyboardButton(new_token(), b.label, b.value) for b in buttons)


@dataclass(frozen=True, slots=True)
class TapInfo:
    """One stored button: where its keyboard was sent and in which conversation."""

    token: str
    """The button's token."""
    keyboard_id: str
    """The keyboard it belongs to (its reply's obligation id)."""
    obligation_id: str
    """The reply that carried the keyboard."""
    position: int
    """Its place in the keyboard, from 0."""
    platform: str
    """Adapter the keyboard was sent on."""
    chat_id: str
    """Raw chat id the keyboard was sent to."""
    thread_id: str | None
    """Topic or thread it was sent into."""
    session_key: str
    """Session key of the conversation."""
    session_id: str
    """Session id of the conversation."""
    button: Button
    """The choice."""
    created_at: datetime
    """When the keyboard was recorded (UTC)."""
    used_at: datetime | None
    """When a tap used the keyboard; ``None`` while it is open."""
    owner_ref: str | None = None
    """Keyed hash of the person it was sent to (``user_<12hex>``); ``None``: nobody in
    particular (a scheduled turn's, or a row from before owners were kept)."""
    anyone: bool = False
    """True: any member of the chat may tap it (``ToolOutput.anyone_may_tap``)."""

    def may_tap(self, sender_ref: str) -> bool:
        """Whether the sender of keyed hash ``sender_ref`` may use this keyboard."""
        return self.anyone or self.owner_ref is None or self.owner_ref == sender_ref


_COLUMNS: Final = (
    "token, keyboard_id, obligation_id, position, platform, chat_id, thread_id, "
    "session_key, session_id, label, value, created_at, used_at, owner_ref, anyone"
)
_INSERTED: Final = (
    "token, keyboard_id, obligation_id, position, platform, chat_id, thread_id, "
    "session_key, session_id, label, value, created_at, used_at"
)


def _decode(row: Sequence[Any]) -> TapInfo:
    (token, keyboard, obligation, position, platform, chat, thread, key, sid, label, value) = row[
        :11
    ]
    created_at, used_at = row[11], row[12]
    return TapInfo(
        token=str(token),
        keyboard_id=str(keyboard),
        obligation_id=str(obligation),
        position=int(position),
        platform=str(platform),
        chat_id=str(chat),
        thread_id=thread,
        session_key=str(key),
        session_id=str(sid),
        button=Button(str(label), value),
        created_at=from_epoch(created_at),
        used_at=None if used_at is None else from_epoch(used_at),
        owner_ref=None if row[13] is None else str(row[13]),
        anyone=bool(row[14]),
    )


async def ensure_keyboards_schema(tx: Transaction) -> None:
    """Create or migrate the buttons table in ``tx``; idempotent."""
    await ensure_schema(tx, COMPONENT, MIGRATIONS)


async def record_keyboard_in(
    tx: Transaction,
    *,
    keyboard_id: str,
    obligation_id: str,
    platform: str,
    chat_id: str,
    thread_id: str | None,
    session_key: str,
    session_id: str,
    buttons: Sequence[KeyboardButton],
    now: float,
) -> None:
    """One row per button of a keyboard, in the caller's transaction (the reply's tx 2)."""
    await tx.executemany(
        f"INSERT INTO {TABLE} ({_INSERTED}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL) "
        "ON CONFLICT(token) DO NOTHING",
        [
            (
                b.token,
                keyboard_id,
                obligation_id,
                position,
                platform,
                chat_id,
                thread_id,
                session_key,
                session_id,
                b.label,
                b.value,
                now,
            )
            for position, b in enumerate(buttons)
        ],
    )


async def set_owner_in(
    tx: Transaction, keyboard_id: str, owner_ref: str | None, *, anyone: bool
) -> None:
    """Record whose keyboard ``keyboard_id`` is, in the transaction that recorded it."""
    await tx.execute(
        f"UPDATE {TABLE} SET owner_ref = ?, anyone = ? WHERE keyboard_id = ?",
        (owner_ref, 1 if anyone else 0, keyboard_id),
    )


async def find_button_in(tx: Transaction, token: str) -> TapInfo | None:
    """The stored button of ``token``, or ``None`` for a token never issued (or pruned)."""
    row = await tx.fetchone(f"SELECT {_COLUMNS} FROM {TABLE} WHERE token = ?", (token,))
    return None if row is None else _decode(row)


async def mark_used_in(tx: Transaction, keyboard_id: str, now: float) -> bool:
    """Mark every button of ``keyboard_id`` used; ``False`` when it already was.

    A guarded UPDATE: of two taps racing (two processes, two transactions) only
    one changes rows; the other's UPDATE waits for it and then matches nothing.
    """
    changed = await tx.execute(
        f"UPDATE {TABLE} SET used_at = ? WHERE keyboard_id = ? AND used_at IS NULL",
        (now, keyboard_id),
    )
    return changed > 0


async def prune_in(tx: Transaction, before: float) -> int:
    """Delete the buttons of keyboards recorded before ``before`` (Unix time); how many."""
    return await tx.execute(f"DELETE FROM {TABLE} WHERE created_at < ?", (before,))
