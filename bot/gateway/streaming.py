"""Drafts: a turn's answer shown while the model writes it, never delivered by it.

``DraftStream`` is the Runner's ``ReplyStream`` for one turn in a chat whose
adapter shows drafts (``PlatformAdapter.draft_interval``: Telegram private
chats, the console). It keeps the text as it grows and hands the adapter's
``send_draft`` the whole text so far, at most once per interval: one timer and
at most one request in flight, whatever the number of pieces (no task, no
write, no row per piece).

A draft is a preview. It is not recorded anywhere, it never counts as the
reply, and nothing waits for it: the final text goes through the ledger as
every reply does (obligation in tx 2, ``Outbox.send``), and ``stop`` (called
before that send) cancels a pending draft, so a draft can neither delay the
final nor stand in for it. A crash mid-stream leaves only what the ledger and
the inbox say: the turn re-runs, or its committed reply is resent.

Flood control on a draft (``PlatformError.retry_after``) pauses the drafts for
that long (not the account's pacer: a draft's flood never delays the final);
any other failure ends them for the turn. The final is unaffected. A draft is
an optional request to the pacer (``bot.gateway.pacing``): under a backlog of
replies it is skipped, not queued.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging

from bot.errors import PlatformError
from bot.gateway.contract import MessageEvent, PlatformAdapter

__all__ = ["FIRST_DRAFT_DELAY", "DraftStream", "draft_id_for", "open_drafts", "stop_drafts"]

logger = logging.getLogger(__name__)

FIRST_DRAFT_DELAY = 0.3
"""The first draft waits this long into the turn: an answer written faster goes
out as the final alone, without a draft (and its platform call) before it."""


def draft_id_for(message_id: str) -> int:
    """A stable, non-zero 31-bit draft id for the answer to ``message_id``: a turn
    re-run after a crash animates the same draft."""
    digest = hashlib.blake2b(message_id.encode(), digest_size=4).digest()
    return (int.from_bytes(digest, "big") & 0x7FFFFFFF) or 1


class DraftStream:
    """Shows one turn's answer as drafts, throttled (a ``ReplyStream``)."""

    __slots__ = (
        "_adapter",
        "_agent",
        "_dirty",
        "_event",
        "_interval",
        "_not_before",
        "_pieces",
        "_stopped",
        "_task",
        "_timer",
        "draft_id",
        "shown",
    )

    def __init__(self, adapter: PlatformAdapter, event: MessageEvent, interval: float) -> None:
        """``interval``: seconds between two drafts (the adapter's ``draft_interval``)."""
        self._adapter = adapter
        self._event = event
        self._interval = interval
        self.draft_id = draft_id_for(event.message_id)
        """The platform's draft id for this answer."""
        self.shown = 0
        """Drafts the platform accepted."""
        self._agent = ""
        self._pieces: list[str] = []
        self._dirty = False
        self._stopped = False
        self._not_before = asyncio.get_running_loop().time() + min(FIRST_DRAFT_DELAY, interval)
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def begin(self, agent: str) -> None:
        """A model round of ``agent`` starts; text of an earlier (tool) round is void."""
        self._agent = agent
        if self._pieces:
            self._pieces = []
            self._changed()  # the draft goes back to the platform's placeholder

    def delta(self, text: str) -> None:
        """The next piece of the answer."""
        self._pieces.append(text)
        self._changed()

    def stop(self) -> None:
        """No more drafts; a pending or in-flight one is dropped. Idempotent."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _changed(self) -> None:
        self._dirty = True
        if self._timer is None and self._task is None and not self._stopped:
            loop = asyncio.get_running_loop()
            delay = max(0.0, self._not_before - loop.time())
            self._timer = loop.call_later(delay, self._flush)

    def _flush(self) -> None:
        self._timer = None
        if self._stopped or not self._dirty:
            return
        self._dirty = False
        text = "".join(self._pieces)
        if text:
            # The same presentation as the final reply (the console's "[Agent] ").
            text = self._adapter.format_reply(text, self._agent)
        self._task = asyncio.get_running_loop().create_task(self._send(text))

    async def _send(self, text: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            await self._adapter.send_draft(self._event, self.draft_id, text)
        except PlatformError as exc:
            if exc.retry_after is None:
                logger.info("drafts stopped for this answer: %s", exc.code or "platform error")
                self._stopped = True
            else:  # flood control: wait as told, and slow down for the rest of the turn
                logger.info("draft refused by flood control; next in %.1f s", exc.retry_after)
                self._interval *= 2
                self._not_before = loop.time() + max(exc.retry_after, self._interval)
        except Exception as exc:  # a draft is a nicety: never let it fail the turn
            logger.warning("draft failed (%s); no more drafts for this answer", type(exc).__name__)
            self._stopped = True
        else:
            self.shown += 1
            self._not_before = loop.time() + self._interval
        self._task = None
        if self._dirty and not self._stopped:
            self._changed()


def open_drafts(
    adapter: PlatformAdapter | None, event: MessageEvent, enabled: bool
) -> DraftStream | None:
    """The ``DraftStream`` for the answer to ``event``, or ``None`` when streaming is off
    (``STREAM_REPLIES``) or its chat shows no drafts (then the turn is not streamed at all)."""
    # A structural adapter (not a PlatformAdapter subclass) may lack the hook: no drafts.
    hook = getattr(adapter, "draft_interval", None) if enabled else None
    interval = None if hook is None else hook(event)
    return None if interval is None or adapter is None else DraftStream(adapter, event, interval)


def stop_drafts(drafts: DraftStream | None) -> None:
    """``drafts.stop()``, if there are drafts."""
    if drafts is not None:
        drafts.stop()
