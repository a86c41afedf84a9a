"""What the delivery ledger stores: one ``Obligation`` per reply owed, and its row.

An obligation's id is ``compute_obligation_id(session_key, message_ref,
content)``, so the same turn re-records idempotently. Its state moves
``pending`` -> ``attempting`` -> ``delivered``, or ``attempting`` -> ``failed``
(retried later) or ``abandoned`` (given up). This module also holds the
ledger's limits (``MAX_ATTEMPTS``, ``STALE_AFTER``, ...), the layout of its two
tables and the decoding of a row; the ledger's behaviour is in
``bot.gateway.ledger`` and the modules it is composed of.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, NotRequired, TypedDict, Unpack

from pydantic import TypeAdapter

from bot.core.attachments import OutgoingPart
from bot.gateway.instances import Owner, from_epoch
from bot.gateway.ledger.keyboards import KeyboardButton

__all__ = [
    "COLUMNS",
    "MAX_ATTEMPTS",
    "MIGRATIONS",
    "NOBODY",
    "RECOVERED_MARKER",
    "RETENTION",
    "RETRY_BACKOFF",
    "SENT_TABLE",
    "STALE_AFTER",
    "STATES",
    "TABLE",
    "Obligation",
    "ObligationState",
    "StoredRow",
    "attachments_json",
    "buttons_json",
    "clip_error",
    "compute_obligation_id",
    "decode_row",
]

ObligationState = Literal["pending", "attempting", "delivered", "failed", "abandoned"]
STATES: Final[tuple[ObligationState, ...]] = (
    "pending",
    "attempting",
    "delivered",
    "failed",
    "abandoned",
)
"""Every state, in the order of a row's life."""

RECOVERED_MARKER: Final = "↻ Resent after a restart (you may have seen this already):\n\n"
"""Prefix of a resent reply that may repeat one the user already got."""
MAX_ATTEMPTS: Final = 3
"""Send attempts per obligation; past it the row is abandoned."""
STALE_AFTER: Final = timedelta(hours=24)
"""An owed reply older than this is abandoned instead of sent."""
RETENTION: Final = timedelta(days=7)
"""Delivered and abandoned rows are pruned after this long."""
RETRY_BACKOFF: Final[tuple[float, ...]] = (30.0, 120.0)
"""Seconds before retry n (n = attempts made, the last value repeats)."""
NOBODY: Final = Owner(0, "")
"""Owner of ``pending`` rows queued for whichever gateway comes first (the operator's
``retry``, ``python -m bot send``): dead to every liveness check, and claimed by the
next ``due_retries`` poll of a running gateway."""

_MAX_ERROR_LEN = 500


def compute_obligation_id(
    session_key: str,
    message_ref: str,
    content: str,
    attachments: Sequence[OutgoingPart] = (),
    buttons: Sequence[KeyboardButton] = (),
) -> str:
    """Stable id: the same turn with the same content re-records idempotently,
    while different threads of one chat never collide.

    Attachments count by content hash, buttons by label and value (not by their
    random tokens); without either the id is DESIGN.md's
    ``session_key|message_ref|content``, as for rows made before them."""
    payload = f"{session_key}|{message_ref}|{content}"
    if attachments:
        payload += "|" + ",".join(f"{a.kind}:{a.sha256}" for a in attachments)
    if buttons:
        payload += "|buttons:" + json.dumps([[b.label, b.value] for b in buttons])
    return hashlib.sha256(payload.encode("utf-8", "replace")).hexdigest()[:24]


_ATTACHMENTS: Final = TypeAdapter(list[OutgoingPart])


def attachments_json(attachments: Sequence[OutgoingPart]) -> str | None:
    """The ``attachments`` column of a row: JSON references (never bytes), ``NULL`` for none."""
    return _ATTACHMENTS.dump_json(list(attachments)).decode() if attachments else None


_BUTTONS: Final = TypeAdapter(list[KeyboardButton])


def buttons_json(buttons: Sequence[KeyboardButton]) -> str | None:
    """The ``buttons`` column of a row: tokens, labels and values as JSON, ``NULL`` for none."""
    return _BUTTONS.dump_json(list(buttons)).decode() if buttons else None


def clip_error(error: str) -> str:
    """``error`` cut to the length a row keeps."""
    return error if len(error) <= _MAX_ERROR_LEN else error[: _MAX_ERROR_LEN - 1] + "…"


class OwedFields(TypedDict):
    """What the caller knows of a reply it now owes (``Obligation.owed``)."""

    obligation_id: str
    session_key: str
    session_id: str
    platform: str
    chat_id: str
    thread_id: str | None
    reply_to: str | None
    content: str
    message_ref: str
    attachments: NotRequired[tuple[OutgoingPart, ...]]
    buttons: NotRequired[tuple[KeyboardButton, ...]]
    traceparent: NotRequired[str | None]


@dataclass(frozen=True, slots=True)
class Obligation:
    """One reply owed to a chat."""

    obligation_id: str
    """``compute_obligation_id(session_key, message_ref, content)``."""
    session_key: str
    """Session key of the conversation."""
    session_id: str
    """Session id of the conversation."""
    platform: str
    """Adapter that must send it."""
    chat_id: str
    """Raw platform chat id to send to."""
    thread_id: str | None
    """Topic or thread to send into."""
    reply_to: str | None
    """Platform message id the reply quotes."""
    content: str
    """The reply text, without any marker."""
    state: ObligationState
    """Ledger state when this object was read."""
    attempts: int
    """Send attempts counted so far (the claim that returned it included)."""
    last_error: str | None
    """Why the last attempt failed, or why it was abandoned."""
    created_at: datetime
    """When it was recorded (UTC)."""
    needs_marker: bool
    """True when an earlier send may have arrived: resend with ``RECOVERED_MARKER``."""
    maybe_delivered: bool = False
    """An earlier attempt failed ambiguously (it may have reached the user)."""
    message_ref: str = ""
    """Inbound message id the reply answers."""
    next_attempt_at: datetime | None = None
    """When a failed row becomes due for a retry."""
    sent_ids: tuple[str, ...] = ()
    """Platform message ids of the delivered parts."""
    attachments: tuple[OutgoingPart, ...] = ()
    """Files sent after ``content`` (references into the media store), part of the reply."""
    buttons: tuple[KeyboardButton, ...] = ()
    """Choices shown under the last part of ``content`` (their rows are in
    ``chatflow_buttons``); a resend carries the same tokens."""
    traceparent: str | None = None
    """W3C ``traceparent`` of the span that owed it (tracing on): a send outside that
    trace (a resend after a crash, a scheduled message) starts a new trace linked to it."""

    @classmethod
    def owed(cls, **fields: Unpack[OwedFields]) -> Obligation:
        """A reply just owed: ``pending``, no attempt yet, created now."""
        return cls(
            **fields,
            state="pending",
            attempts=0,
            last_error=None,
            created_at=datetime.now(UTC),
            needs_marker=False,
        )

    def claimed(self) -> Obligation:
        """This obligation as its claim leaves it: ``attempting``, one more attempt counted."""
        return dataclasses.replace(
            self, state="attempting", attempts=self.attempts + 1, next_attempt_at=None
        )

    @property
    def outgoing_text(self) -> str:
        """The text to send: ``content``, prefixed by ``RECOVERED_MARKER`` if ``needs_marker``."""
        return RECOVERED_MARKER + self.content if self.needs_marker else self.content


# -- storage layout --------------------------------------------------------------

TABLE: Final = "chatflow_delivery_obligations"
"""One row per obligation."""
SENT_TABLE: Final = "chatflow_delivery_sent"
"""(platform, chat, platform message id) -> obligation: for the platforms' later status
reports and the reply context of a reply to the bot."""
MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {TABLE} ("
        "obligation_id TEXT PRIMARY KEY NOT NULL, "
        "session_key TEXT NOT NULL, "
        "session_id TEXT NOT NULL, "
        "platform TEXT NOT NULL, "
        "chat_id TEXT NOT NULL, "
        "thread_id TEXT, "
        "reply_to TEXT, "
        "message_ref TEXT NOT NULL, "
        "content TEXT NOT NULL, "
        "state TEXT NOT NULL CHECK (state IN "
        "('pending', 'attempting', 'delivered', 'failed', 'abandoned')), "
        "attempts INTEGER NOT NULL DEFAULT 0, "
        "maybe_delivered INTEGER NOT NULL DEFAULT 0, "
        "last_error TEXT, "
        "owner_pid INTEGER NOT NULL, "
        "owner_instance TEXT NOT NULL, "
        "owner_started INTEGER, "
        "next_attempt_at REAL, "
        "sent_ids TEXT, "
        "created_at REAL NOT NULL, "
        "fresh_since REAL NOT NULL, "
        "updated_at REAL NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_state_next ON {TABLE} (state, next_attempt_at)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_platform_state ON {TABLE} (platform, state)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_state_updated ON {TABLE} (state, updated_at)",
        f"CREATE TABLE IF NOT EXISTS {SENT_TABLE} ("
        "platform TEXT NOT NULL, "
        "message_id TEXT NOT NULL, "
        "obligation_id TEXT NOT NULL, "
        "PRIMARY KEY (platform, message_id))",
        f"CREATE INDEX IF NOT EXISTS {SENT_TABLE}_obligation ON {SENT_TABLE} (obligation_id)",
    ),
    # 2: the files a reply carries (JSON references); rows before it have none (NULL).
    2: (f"ALTER TABLE {TABLE} ADD COLUMN attachments TEXT",),
    # 3: the buttons a reply carries (JSON: token, label, value); rows before it have none.
    3: (f"ALTER TABLE {TABLE} ADD COLUMN buttons TEXT",),
    # 4: sent ids keyed by chat too: Telegram numbers messages per chat, so two chats'
    # messages share ids (the second one's id was dropped, and a lookup by id alone
    # found the other chat's reply).
    4: (
        f"CREATE TABLE IF NOT EXISTS {SENT_TABLE}_v4 ("
        "platform TEXT NOT NULL, "
        "chat_id TEXT NOT NULL, "
        "message_id TEXT NOT NULL, "
        "obligation_id TEXT NOT NULL, "
        "PRIMARY KEY (platform, chat_id, message_id))",
        f"INSERT INTO {SENT_TABLE}_v4 (platform, chat_id, message_id, obligation_id) "
        f"SELECT s.platform, o.chat_id, s.message_id, s.obligation_id FROM {SENT_TABLE} s "
        f"JOIN {TABLE} o ON o.obligation_id = s.obligation_id",
        f"DROP TABLE {SENT_TABLE}",
        f"ALTER TABLE {SENT_TABLE}_v4 RENAME TO {SENT_TABLE}",
        f"CREATE INDEX IF NOT EXISTS {SENT_TABLE}_obligation ON {SENT_TABLE} (obligation_id)",
    ),
    # 5: the trace context of the span that owed the reply (tracing on); NULL before it.
    5: (f"ALTER TABLE {TABLE} ADD COLUMN traceparent TEXT",),
}
"""Schema versions of the ledger's tables (component ``delivery_ledger``)."""
COLUMNS: Final = (
    "obligation_id, session_key, session_id, platform, chat_id, thread_id, reply_to, "
    "content, state, attempts, last_error, created_at, maybe_delivered, message_ref, "
    "next_attempt_at, sent_ids, owner_pid, owner_instance, owner_started, fresh_since, "
    "attachments, buttons, traceparent"
)
"""The columns ``decode_row`` reads, in its order."""


@dataclass(frozen=True, slots=True)
class StoredRow:
    """A row as read, with the stamps a guarded UPDATE compares against."""

    obligation: Obligation
    """The obligation as stored."""
    owner: Owner
    """The process that owns the row."""
    fresh_since: float
    """Unix time the staleness clock started (recorded, or re-queued by the operator)."""


def _moment(value: Any) -> datetime | None:
    return None if value is None else from_epoch(value)


def decode_row(values: Sequence[Any]) -> StoredRow:
    """Decode one row of ``SELECT {COLUMNS}`` (``needs_marker`` = ``maybe_delivered``)."""
    (
        obligation_id,
        session_key,
        session_id,
        platform,
        chat_id,
        thread_id,
        reply_to,
        content,
        state,
        attempts,
        last_error,
        created_at,
        maybe_delivered,
        message_ref,
        next_attempt_at,
        sent_ids,
        owner_pid,
        owner_instance,
        owner_started,
        fresh_since,
        attachments,
        buttons,
        traceparent,
    ) = values
    obligation = Obligation(
        obligation_id=str(obligation_id),
        session_key=str(session_key),
        session_id=str(session_id),
        platform=str(platform),
        chat_id=str(chat_id),
        thread_id=thread_id,
        reply_to=reply_to,
        content=str(content),
        state=state,
        attempts=int(attempts),
        last_error=last_error,
        created_at=from_epoch(created_at),
        needs_marker=bool(maybe_delivered),
        maybe_delivered=bool(maybe_delivered),
        message_ref=str(message_ref),
        next_attempt_at=_moment(next_attempt_at),
        sent_ids=tuple(json.loads(sent_ids)) if sent_ids else (),
        attachments=tuple(_ATTACHMENTS.validate_json(attachments)) if attachments else (),
        buttons=tuple(_BUTTONS.validate_json(buttons)) if buttons else (),
        traceparent=None if traceparent is None else str(traceparent),
    )
    owner = Owner(int(owner_pid), str(owner_instance), owner_started)
    return StoredRow(obligation, owner, float(fresh_since))
