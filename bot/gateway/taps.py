"""Button taps in: a tap's token resolved to its button, checked, and turned into a message.

An adapter hands the gateway a ``MessageEvent`` with ``tap_token`` set (a
Telegram ``callback_query``, a WhatsApp ``button_reply``/``list_reply``).
``Taps.handle`` resolves it against ``chatflow_buttons``
(``bot.gateway.ledger.keyboards``) and refuses, with a short notice and no
turn, a token that is unknown (forged), of another platform or chat, older
than ``BUTTON_TTL_SECONDS`` or of a keyboard already used. A keyboard belongs
to the person it was sent to: another member's tap is refused with
``NOT_YOURS``, starts nothing and leaves the keyboard open, unless the tool
offered it to anyone (``ToolOutput(..., anyone_may_tap=True)``). A resolved tap
becomes a message whose text is the button's label (``event.button`` the
button), in the session of the reply that carried the keyboard; it goes
through tx 1 and the inbox like any message, and tx 1 marks the keyboard used
(``accept_in``, a guarded UPDATE: of two racing taps one starts a turn). The
platform is answered exactly once per delivery (``answer_tap``), duplicates and
refusals included; an accepted tap's keyboard is then removed where possible.

Interceptors (``Taps.intercept``) take taps whose button value starts with a
prefix (approvals: ``"chatflow-approval:"``) before anything is journaled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final

from bot.core.buttons import Button
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.errors import ChatflowError, TapRefusedError
from bot.gateway.contract import MessageEvent, PlatformAdapter
from bot.gateway.inbox import Inbox
from bot.gateway.instances import to_epoch
from bot.gateway.keys import hash_sender_id
from bot.gateway.ledger.keyboards import (
    TapInfo,
    ensure_keyboards_schema,
    find_button_in,
    mark_used_in,
    prune_in,
)
from bot.metrics import Metrics

__all__ = [
    "ANSWER_TIMEOUT",
    "EXPIRED_NOTICE",
    "FAILED_NOTICE",
    "NOT_YOURS",
    "TapHandler",
    "TapInfo",
    "TapOutcome",
    "Taps",
    "tap_text",
]

logger = logging.getLogger(__name__)

EXPIRED_NOTICE: Final = "This choice has expired."
"""What a refused tap shows. One text for unknown, foreign, expired and used taps:
a forger learns nothing from it."""
NOT_YOURS: Final = "Only the person who asked can answer this."
"""What another member's tap on a keyboard sent to someone else shows."""
FAILED_NOTICE: Final = "Sorry, that did not work. Please try again."
"""What a tap shows when an interceptor failed."""
ANSWER_TIMEOUT: Final = 5.0
"""Seconds an answer to the platform (or the keyboard's removal) may take."""


@dataclass(frozen=True, slots=True)
class TapOutcome:
    """What an interceptor did with a tap."""

    consumed: bool
    """True: the tap was used, so its keyboard is marked used (single-use) and removed.
    False: nothing happened (e.g. the wrong person tapped); the keyboard stays open."""
    notice: str | None = None
    """Short text shown to the tapper (Telegram's callback answer); ``None``: none."""


TapHandler = Callable[[MessageEvent, Button, TapInfo], Awaitable[TapOutcome]]
"""``async (event, button, info) -> TapOutcome``: an interceptor of resolved taps.

``event`` is the tap as a message (``text`` the label, ``button`` set,
``source.sender_id`` who tapped); ``info`` the stored button (session, chat,
keyboard). Called before the keyboard is marked used and before any journaling;
no turn is started for an intercepted tap. An exception counts as
``TapOutcome(False, FAILED_NOTICE)``."""

Proceed = Callable[[MessageEvent], Awaitable[bool]]
"""The gateway's path of an ordinary message (gate, tx 1, queue): True once accepted."""


def tap_text(event: MessageEvent) -> str:
    """The text the model reads for ``event``: its text, plus the button's value when the
    tap chose a button whose value differs from its label."""
    button = event.button
    if button is None or button.value is None or button.value == button.label:
        return event.text
    return f"{event.text}\n[tapped the button {button.label!r}, value: {button.value!r}]"


class Taps:
    """Resolves button taps, runs interceptors, marks keyboards used, answers the platform."""

    def __init__(
        self,
        store: TransactionalStore,
        *,
        ttl_seconds: float = 86_400.0,
        clock: Callable[[], datetime] | None = None,
        inbox: Inbox | None = None,
        metrics: Metrics | None = None,
        secret: bytes | None = None,
    ) -> None:
        """``ttl_seconds``: a keyboard older than this is refused (``BUTTON_TTL_SECONDS``).
        ``inbox``: where a redelivered tap is found journaled, so it is answered as a
        duplicate, not refused as used. ``metrics``: taps counted by outcome.
        ``secret``: the key of sender hashes (``owner_ref``: whose keyboard it is)."""
        self._store = store
        self._secret = secret
        self._metrics = metrics
        self._inbox = inbox
        self._ttl = timedelta(seconds=ttl_seconds)
        self._clock = clock or store.now
        self._handlers: list[tuple[str, TapHandler]] = []
        # Taps between their resolution and tx 1: message id -> the stored button.
        self._resolved: dict[str, TapInfo] = {}
        self._opened = False

    def intercept(self, prefix: str, handler: TapHandler) -> None:
        """Route resolved taps whose button value starts with ``prefix`` to ``handler``.

        The handler runs before the keyboard is marked used and before anything
        is journaled, and no turn starts for the tap: the handler does what the
        tap means (approvals record the decision) and returns a ``TapOutcome``:
        ``consumed`` marks the keyboard used (and removes it), ``notice`` is shown
        to the tapper. The longest matching prefix wins (of equal ones, the last
        registered).
        """
        if not prefix:
            raise ValueError("an interceptor needs a non-empty prefix")
        # Stable sort: of two handlers of one prefix, the one registered last wins.
        self._handlers.insert(0, (prefix, handler))
        self._handlers.sort(key=lambda item: len(item[0]), reverse=True)

    def _handler_for(self, button: Button) -> TapHandler | None:
        value = button.effective_value
        for prefix, handler in self._handlers:
            if value.startswith(prefix):
                return handler
        return None

    async def open(self) -> None:
        """Create or migrate the buttons table; idempotent."""
        async with self._store.transaction() as tx:
            await ensure_keyboards_schema(tx)
        self._opened = True

    async def _find(self, token: str) -> TapInfo | None:
        if not self._opened:
            await self.open()

        async def body(tx: Transaction) -> TapInfo | None:
            return await find_button_in(tx, token)

        return await self._store.run(body, write=False)

    async def resolve(self, event: MessageEvent) -> tuple[MessageEvent, TapInfo]:
        """The tap ``event`` as a message (text = label, ``button`` set) and its stored
        button; ``TapRefusedError`` (its message the notice) for a tap to refuse."""
        token = event.tap_token
        info = await self._find(token) if token else None
        if info is None:
            logger.info("%s tap refused: unknown token", event.platform)
            raise TapRefusedError(EXPIRED_NOTICE)
        source = event.source
        if (info.platform, info.platform, info.chat_id) != (
            event.platform,
            source.platform,
            source.chat_id,
        ):
            logger.warning("%s tap refused: its keyboard belongs to another chat", event.platform)
            raise TapRefusedError(EXPIRED_NOTICE)
        if self._clock() - info.created_at > self._ttl:
            logger.info("%s tap refused: keyboard expired", event.platform)
            raise TapRefusedError(EXPIRED_NOTICE)
        if info.used_at is not None:
            logger.info("%s tap refused: keyboard already used", event.platform)
            raise TapRefusedError(EXPIRED_NOTICE)
        if not info.may_tap(self.sender_ref(event)):
            # Another member of the group: nothing happens, the keyboard stays open.
            logger.info("%s tap refused: the keyboard was sent to someone else", event.platform)
            raise TapRefusedError(NOT_YOURS)
        resolved = replace(
            event,
            text=info.button.label,
            button=info.button,
            # A tap answers the bot's own message: addressed to it, also in a group, and
            # the model is shown what it answers (the reply context of that message).
            replies_to_bot=True,
            reply_to_id=event.reply_to_id or event.keyboard_message_id,
            source=replace(event.source, thread_id=info.thread_id),
        )
        return resolved, info

    def sender_ref(self, event: MessageEvent) -> str:
        """The keyed hash of who sent ``event`` (as keyboards and approvals store it)."""
        return hash_sender_id(event.source.sender_id, self._secret)

    async def _journaled(self, message_id: str) -> bool:
        if self._inbox is None:
            return False
        try:
            return await self._inbox.journaled_event(message_id) is not None
        except ChatflowError:  # best effort: the tap is refused either way
            return False

    def route(self, event: MessageEvent) -> tuple[str, str] | None:
        """``(session_key, session_id)`` of a tap being accepted: the conversation of the
        reply that carried its keyboard; ``None`` for other events."""
        info = self._resolved.get(event.message_id) if event.button is not None else None
        return None if info is None else (info.session_key, info.session_id)

    async def accept_in(self, tx: Transaction, event: MessageEvent) -> None:
        """In tx 1 of an accepted tap: mark its keyboard used, or raise ``TapRefusedError``
        (rolling tx 1 back) when another tap used it first."""
        info = self._resolved.get(event.message_id) if event.button is not None else None
        if info is None:
            return
        if not await mark_used_in(tx, info.keyboard_id, to_epoch(self._clock())):
            raise TapRefusedError(EXPIRED_NOTICE)

    async def mark_used(self, keyboard_id: str) -> bool:
        """Mark ``keyboard_id`` used in its own transaction; False if it already was."""
        now = to_epoch(self._clock())

        async def body(tx: Transaction) -> bool:
            return await mark_used_in(tx, keyboard_id, now)

        return await self._store.run(body)

    async def prune(self) -> int:
        """Delete buttons of keyboards past twice the TTL (no tap can use them any more)."""
        before = to_epoch(self._clock() - 2 * self._ttl)

        async def body(tx: Transaction) -> int:
            return await prune_in(tx, before)

        if not self._opened:
            await self.open()
        return await self._store.run(body)

    async def handle(
        self, event: MessageEvent, adapter: PlatformAdapter | None, proceed: Proceed
    ) -> bool:
        """Take one tap delivery: refuse, intercept, or ``proceed`` with it as a message.

        The platform is answered exactly once, whatever happens (a failure of
        ``proceed`` is answered, then re-raised so the delivery is not confirmed).
        Returns what ``proceed`` returned (False for refused or intercepted taps).
        """
        try:
            resolved, info = await self.resolve(event)
        except TapRefusedError as exc:
            # A redelivery of a tap we accepted finds its keyboard used: a duplicate,
            # answered without a notice.
            duplicate = await self._journaled(event.message_id)
            self._count("duplicate" if duplicate else "refused")
            await self._answer(adapter, event, None if duplicate else str(exc))
            return False
        handler = self._handler_for(info.button)
        if handler is not None:
            self._count("intercepted")
            return await self._intercepted(handler, resolved, info, adapter)
        self._resolved[event.message_id] = info
        try:
            accepted = await proceed(resolved)
        except TapRefusedError as exc:
            # Another tap on this keyboard won the race in tx 1.
            self._count("refused")
            await self._answer(adapter, event, str(exc))
            return False
        except BaseException:
            await self._answer(adapter, event, None)
            raise
        finally:
            self._resolved.pop(event.message_id, None)
        await self._answer(adapter, event, None)
        if accepted:
            self._count("accepted")
            await self._remove(adapter, event)
        return accepted

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.taps.labels(outcome).inc()

    async def _intercepted(
        self,
        handler: TapHandler,
        event: MessageEvent,
        info: TapInfo,
        adapter: PlatformAdapter | None,
    ) -> bool:
        try:
            outcome = await handler(event, info.button, info)
        except Exception as exc:
            logger.exception("a tap interceptor failed (%s)", type(exc).__name__)
            outcome = TapOutcome(consumed=False, notice=FAILED_NOTICE)
        if outcome.consumed:
            await self.mark_used(info.keyboard_id)
        await self._answer(adapter, event, outcome.notice)
        if outcome.consumed:
            await self._remove(adapter, event)
        return False

    async def _answer(
        self, adapter: PlatformAdapter | None, event: MessageEvent, notice: str | None
    ) -> None:
        hook = getattr(adapter, "answer_tap", None)
        if hook is None:
            return
        try:
            await asyncio.wait_for(hook(event, notice), ANSWER_TIMEOUT)
        except Exception as exc:  # best effort: the tap itself is decided
            logger.warning("answering a %s tap failed (%s)", event.platform, type(exc).__name__)

    async def _remove(self, adapter: PlatformAdapter | None, event: MessageEvent) -> None:
        hook = getattr(adapter, "remove_keyboard", None)
        if hook is None:
            return
        try:
            await asyncio.wait_for(hook(event), ANSWER_TIMEOUT)
        except Exception as exc:
            logger.debug(
                "removing a used %s keyboard failed (%s)", event.platform, type(exc).__name__
            )
