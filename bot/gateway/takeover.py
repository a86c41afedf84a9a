"""Human takeover: conversations a person answers, and that person's messages.

A conversation under takeover starts no bot turn (``Turns.process`` asks
``Takeovers.is_taken_over`` first): its inbound messages are still journaled
(tx 1) and deduplicated, and each is appended to the session history with its
inbox row closed in one transaction, so the console shows it and the bot's
next turn after "Hand back" sees it. The operator's replies
(``OperatorDesk.reply``) are appended as MODEL messages named
``OPERATOR_NAME`` and recorded in the ledger in the same transaction, then sent
by the ``Outbox``: a crash never loses one, and resends it with the marker.

The state is a table (``chatflow_takeovers``, one row per conversation taken
over), so it survives restarts and is shared by every process on PostgreSQL.
The check on the message path reads an in-memory copy, reloaded at most every
``REFRESH_SECONDS`` (a read, never a commit); this process's own changes apply
at once, another process's within ``REFRESH_SECONDS``.

Whether a bot answer goes out is decided at its commit: ``check_in``, inside
the turn's tx 2, raises ``TakenOverError`` for a conversation taken over by
then (the copy; on PostgreSQL the table itself, for other processes), so a turn
already running when a person steps in rolls back, sends nothing, and its
message is kept for the person. Before that, the listeners (``on_take_over``)
let the gateway stop such a turn at once: it holds the session lock while the
model answers, and the person's reply must not wait for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.sql import Transaction, ensure_schema
from bot.core.stores.base import TransactionalStore, require_transactional
from bot.errors import ChatflowError, StorageError
from bot.gateway.contract import PlatformAdapter
from bot.gateway.events import event_from_dict
from bot.gateway.inbox import Inbox, InboxClaimLostError, InboxEntry
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import TABLE as OBLIGATIONS_TABLE
from bot.gateway.ledger.obligations import Obligation, compute_obligation_id
from bot.gateway.outbox import Outbox

__all__ = [
    "AGENT_REASON_PREFIX",
    "OPERATOR_NAME",
    "REFRESH_SECONDS",
    "TAKEOVER_TABLE",
    "ConversationNotFoundError",
    "OperatorDesk",
    "Route",
    "TakenOverError",
    "Takeovers",
    "owe_operator_message",
]

logger = logging.getLogger(__name__)

OPERATOR_NAME: Final = "operator"
"""``Message.name`` of the replies a person typed (MODEL messages without an agent)."""
REFRESH_SECONDS: Final = 2.0
"""Longest time the message path may use its copy of the takeover table."""
TAKEOVER_TABLE: Final = "chatflow_takeovers"
"""One row per conversation a person answers."""
AGENT_REASON_PREFIX: Final = "agent: "
"""Start of the ``reason`` of a takeover an agent asked for (``transfer_to_human``)."""
TAKEN_OVER_NOTE: Final = "taken over"
"""``error`` of an inbox row closed without a turn because a person answers."""

_COMPONENT = "takeover"
_INBOX_TABLE = "chatflow_inbox"  # bot.gateway.inbox's journal, read for a reply's route
_MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {TAKEOVER_TABLE} ("
        "session_id TEXT PRIMARY KEY NOT NULL, "
        "reason TEXT NOT NULL, "
        "started_at REAL NOT NULL)",
    ),
}


class Takeovers:
    """Which conversations are taken over (table ``chatflow_takeovers``)."""

    def __init__(
        self,
        store: TransactionalStore,
        *,
        refresh_seconds: float = REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = require_transactional(store, "human takeover")
        self._refresh = refresh_seconds
        self._clock = clock
        self._active: frozenset[str] = frozenset()
        self._loaded_at: float | None = None
        self._opened = False
        self._reload_lock = asyncio.Lock()
        self._generation = 0
        self._listeners: list[Callable[[str], None]] = []

    def on_take_over(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(session_id)`` as soon as this process learns of a takeover
        (its own, at once; another process's, at the next reload): the gateway stops
        a bot turn in flight there, so the person need not wait for the model."""
        self._listeners.append(listener)

    def _announce(self, session_ids: Iterable[str]) -> None:
        for session_id in session_ids:
            for listener in self._listeners:
                listener(session_id)

    async def open(self) -> None:
        """Create or migrate the table; idempotent (also done on first use)."""
        if not self._opened:
            async with self._store.transaction() as tx:
                await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
            self._opened = True

    async def is_taken_over(self, session_id: str) -> bool:
        """Whether a person answers ``session_id`` (the copy, reloaded when stale)."""
        loaded = self._loaded_at
        if loaded is None or self._clock() - loaded >= self._refresh:
            async with self._reload_lock:
                loaded = self._loaded_at
                if loaded is None or self._clock() - loaded >= self._refresh:
                    try:
                        await self.reload()
                    except ChatflowError as exc:
                        # The turn meets the same database and fails or succeeds there;
                        # the copy stays right for this process's own takeovers. Tried
                        # again after the refresh interval, not at every message.
                        self._loaded_at = self._clock()
                        logger.warning(
                            "could not read the takeover table (%s); using the last copy",
                            type(exc).__name__,
                        )
        return session_id in self._active

    async def reload(self) -> frozenset[str]:
        """Read the table now (one read-only transaction); returns the ids taken over."""
        await self.open()

        async def body(tx: Transaction) -> list[tuple[Any, ...]]:
            return await tx.fetchall(f"SELECT session_id FROM {TAKEOVER_TABLE}")

        for _ in range(5):
            generation = self._generation
            rows = await self._store.run(body, write=False)
            if generation == self._generation:
                before, self._active = self._active, frozenset(str(row[0]) for row in rows)
                self._loaded_at = self._clock()
                if self._listeners and self._active - before:
                    self._announce(self._active - before)
                break
            # This process changed a takeover while the read ran: the read may predate
            # it, so it must not overwrite the change. Read again.
        return self._active

    async def take_over(self, session_id: str, reason: str = OPERATOR_NAME) -> bool:
        """Stop the bot answering ``session_id``; ``False`` if it already was."""
        await self.open()

        async def body(tx: Transaction) -> int:
            return await tx.execute(
                f"INSERT INTO {TAKEOVER_TABLE} (session_id, reason, started_at) VALUES (?, ?, ?) "
                "ON CONFLICT(session_id) DO NOTHING",
                (session_id, reason, time.time()),
            )

        # In this process's copy before the commit: no turn starts here from this moment,
        # and none commits (check_in); one in flight is stopped by the listeners.
        already = session_id in self._active
        self.note(session_id)
        if not already:
            self._announce((session_id,))
        try:
            changed = await self._store.run(body) == 1
        except BaseException:
            if not already:
                self._set(self._active - {session_id})
            raise
        if changed:
            logger.info("session %s taken over by an operator", session_id)
        return changed

    async def take_over_in(self, tx: Transaction, session_id: str, reason: str) -> None:
        """Take ``session_id`` over inside the caller's transaction (an agent asked for a
        person, in the turn's tx 2); call ``note`` once it committed."""
        if not self._opened:
            await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
        await tx.execute(
            f"INSERT INTO {TAKEOVER_TABLE} (session_id, reason, started_at) VALUES (?, ?, ?) "
            "ON CONFLICT(session_id) DO NOTHING",
            (session_id, f"{AGENT_REASON_PREFIX}{reason}"[:300], time.time()),
        )

    async def check_in(self, tx: Transaction, session_id: str) -> None:
        """Raise ``TakenOverError`` inside a turn's transaction (tx 2) if ``session_id``
        is taken over now: whether the bot's answer goes out is decided at its commit.

        This process's own takeovers are in its copy at once (before their own
        commit). Another process's reach the copy only at its next reload: on
        PostgreSQL the table itself is read here, in the commit.
        """
        if session_id in self._active:
            raise TakenOverError(f"session {session_id} was taken over during its turn")
        if tx.dialect != "postgres":
            return  # one process per SQLite file: its copy is the truth
        if not self._opened:
            await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
        row = await tx.fetchone(
            f"SELECT 1 FROM {TAKEOVER_TABLE} WHERE session_id = ?", (session_id,)
        )
        if row is not None:
            self.note(session_id)
            raise TakenOverError(f"session {session_id} was taken over during its turn")

    def note(self, session_id: str) -> None:
        """Record in this process's copy that ``session_id`` is taken over."""
        self._set(self._active | {session_id})

    def _set(self, active: frozenset[str]) -> None:
        self._active = active
        self._generation += 1  # a reload in flight must not overwrite this

    async def hand_back(self, session_id: str) -> bool:
        """Let the bot answer ``session_id`` again; ``False`` if it was not taken over."""
        await self.open()

        async def body(tx: Transaction) -> int:
            return await tx.execute(
                f"DELETE FROM {TAKEOVER_TABLE} WHERE session_id = ?", (session_id,)
            )

        changed = await self._store.run(body) == 1
        self._set(self._active - {session_id})  # after the commit: never early
        if changed:
            logger.info("session %s handed back to the bot", session_id)
        return changed

    async def record_inbound(self, entry: InboxEntry, inbox: Inbox, default_agent: Agent) -> None:
        """Append ``entry``'s message to its session and close its inbox row, in one
        transaction, without a turn (the conversation is taken over)."""
        event = entry.event
        text = event.text
        if event.media:
            kinds = ", ".join(sorted({m.kind for m in event.media}))
            text = f"{text}\n[{kinds}]".strip()
        store = self._store

        async def close(tx: Transaction) -> None:
            await inbox.mark_done_in(tx, event.message_id, error=TAKEN_OVER_NOTE)

        try:
            async with store.session_lock(entry.session_id):
                session = await store.get_or_create(
                    entry.session_id,
                    default_agent,
                    {"platform": event.platform, "chat_type": event.source.chat_type},
                )
                session.add_message(Message(role=Role.USER, content=text or None))
                await store.save(session, also=close)
        except InboxClaimLostError:
            logger.info("message in session %s taken over elsewhere", entry.session_id)
            return
        except ChatflowError:
            # The inbox row stays 'received': the next start-up handles it again.
            logger.exception("could not record a message of session %s", entry.session_id)
            return
        logger.info("message in session %s kept for the operator (no turn)", entry.session_id)


class TakenOverError(ChatflowError):
    """A person took the conversation over while the bot's turn ran: the turn must not
    commit (its message is kept for the operator instead, and the answer dropped)."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where replies of a conversation go, as its latest message or reply says."""

    session_key: str
    """The conversation's session key."""
    platform: str
    """Adapter name."""
    chat_id: str
    """Raw platform chat id."""
    thread_id: str | None
    """Topic or thread."""


class ConversationNotFoundError(StorageError):
    """No stored session, or no message or reply that says where to send (pruned)."""


class OperatorDesk:
    """A person's replies: appended to the history and owed in one transaction, then sent."""

    def __init__(
        self,
        store: TransactionalStore,
        ledger: DeliveryLedger,
        outbox: Outbox,
        adapters: Mapping[str, PlatformAdapter],
    ) -> None:
        self._store = require_transactional(store, "operator replies")
        self._ledger = ledger
        self._outbox = outbox
        self._adapters = adapters

    async def route(self, session_id: str) -> Route | None:
        """The latest route of ``session_id`` (the ledger, else the inbox journal), or ``None``.

        The ledger first: the console indexes its ``session_id``; the journal has no
        such index, so it is read only for a conversation the bot never answered.
        """

        async def body(tx: Transaction) -> Route | None:
            row = await tx.fetchone(
                f"SELECT session_key, platform, chat_id, thread_id FROM {OBLIGATIONS_TABLE} "
                "WHERE session_id = ? ORDER BY created_at DESC LIMIT 1",
                (session_id,),
            )
            if row is not None:
                return Route(str(row[0]), str(row[1]), str(row[2]), row[3])
            row = await tx.fetchone(
                f"SELECT session_key, event_json FROM {_INBOX_TABLE} WHERE session_id = ? "
                "ORDER BY received_at DESC LIMIT 1",
                (session_id,),
            )
            if row is None:
                return None
            source = event_from_dict(json.loads(row[1])).source
            return Route(str(row[0]), source.platform, source.chat_id, source.thread_id)

        return await self._store.run(body, write=False)

    async def reply(self, session_id: str, text: str, *, nonce: str | None = None) -> bool:
        """Send ``text`` as the person's reply in ``session_id``.

        ``nonce`` (one per reply form) makes a resubmitted form a no-op:
        returns ``False`` when that reply was already recorded. Raises
        ``ConversationNotFoundError`` when there is nowhere to send it.
        """
        nonce = nonce or uuid.uuid4().hex
        route = await self.route(session_id)
        if route is None:
            raise ConversationNotFoundError("no message of this conversation says where to reply")
        adapter = self._adapters.get(route.platform)
        content = text if adapter is None else adapter.format_reply(text, OPERATOR_NAME)
        obligation = await owe_operator_message(
            self._store, self._ledger, route, session_id, text, content=content, nonce=nonce
        )
        if obligation is None:
            return False
        await self._outbox.send(obligation.claimed())
        return True


async def owe_operator_message(
    store: TransactionalStore,
    ledger: DeliveryLedger,
    route: Route,
    session_id: str,
    text: str,
    *,
    content: str,
    nonce: str,
    claimed: bool = True,
    require_session: bool = True,
    into_history: bool = True,
) -> Obligation | None:
    """Append ``text`` to ``session_id`` as a MODEL message named ``OPERATOR_NAME`` and
    record its obligation (``content``, to ``route``) in the same transaction.

    ``claimed``: recorded ``attempting`` for the caller, who sends it now (the
    console); else ``pending`` under ``ledger``'s owner, for whichever gateway
    claims it (``python -m bot send``). Without ``require_session`` a
    conversation that does not exist yet gets the obligation alone, and so does
    every one without ``into_history`` (a writer that cannot hold the session's
    lock against the gateway's turns: another process on SQLite).
    Returns ``None`` when ``nonce`` was recorded before; raises
    ``ConversationNotFoundError`` for a missing session when it is required.
    """
    store = require_transactional(store, "operator replies")
    message_ref = f"{OPERATOR_NAME}:{nonce}"
    obligation = Obligation.owed(
        obligation_id=compute_obligation_id(route.session_key, message_ref, content),
        session_key=route.session_key,
        session_id=session_id,
        platform=route.platform,
        chat_id=route.chat_id,
        thread_id=route.thread_id,
        reply_to=None,
        content=content,
        message_ref=message_ref,
    )

    async def owe(tx: Transaction) -> None:
        if not await ledger.record_in(tx, obligation, claimed=claimed):
            raise _AlreadyRecordedError("this reply was recorded before")

    try:
        async with store.session_lock(session_id):
            session = await store.get(session_id) if into_history else None
            if session is not None:
                session.add_message(
                    Message(role=Role.MODEL, content=text, name=OPERATOR_NAME, id=nonce)
                )
                await store.save(session, also=owe)
            elif require_session and into_history:
                raise ConversationNotFoundError("the conversation was deleted")
            else:
                await store.run(owe)
    except _AlreadyRecordedError:
        return None
    logger.info("operator reply %s owed in session %s", obligation.obligation_id, session_id)
    return obligation


class _AlreadyRecordedError(StorageError):
    """Rolls back a reply whose obligation exists already (a form sent twice)."""
