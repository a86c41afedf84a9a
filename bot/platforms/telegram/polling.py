"""Long polling over ``getUpdates``: our own loop, not PTB's ``Updater.start_polling``.

The offset handed to ``getUpdates`` moves past an update only after
``on_event`` returned for it, that is after the gateway committed it (tx 1).
PTB's ``Updater`` moves its offset past a batch as soon as it has queued it,
before any handler ran, so an update in flight at a crash would be lost: that
is why it is not used (``telegram_request`` builds the ``Application``
without one). A deliberate deviation from PTB's own way of polling.

If ``on_event`` raises, the offset stays before that update and the next
``getUpdates`` brings it back (the gateway deduplicates by
``MessageEvent.message_id``). ``stop`` lets an ``on_event`` in flight finish,
then confirms the offset to Telegram so that a restart does not refetch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from telegram import Update
from telegram.error import TelegramError
from telegram.ext import ExtBot

from bot.errors import ChatflowError, PlatformError
from bot.gateway.contract import EventHandler, MessageEvent
from bot.logs import log_ref
from bot.platforms.telegram.errors import REFUSED, log_failure, map_telegram_errors

__all__ = ["Backoff", "TelegramPoller"]

# The adapter's logger: the split into modules does not rename what operators filter on.
logger = logging.getLogger("bot.platforms.telegram")


class Backoff:
    """Exponential backoff delays, capped."""

    def __init__(self, initial: float, maximum: float) -> None:
        self._initial = initial
        self._maximum = maximum
        self._next = initial

    def next(self) -> float:
        """The delay to wait now; the one after is twice as long, up to the cap."""
        delay = self._next
        self._next = min(self._next * 2, self._maximum)
        return delay

    def reset(self) -> None:
        """Start again from the initial delay."""
        self._next = self._initial


class TelegramPoller:
    """One polling run of an adapter: ``start`` once, then ``stop``.

    ``map_update`` turns an update into an event (``None``: skip it, the
    offset moves on); ``on_token_rejected`` is called when Telegram answers
    401, after which polling ends for good.
    """

    def __init__(
        self,
        bot: ExtBot[Any],
        *,
        token: str,
        on_event: EventHandler,
        map_update: Callable[[Update], MessageEvent | None],
        on_token_rejected: Callable[[], None],
        allowed_updates: Sequence[str],
        poll_timeout: int,
        backoff_initial: float,
        backoff_max: float,
        stop_timeout: float,
    ) -> None:
        self._bot = bot
        self._token = token
        self._on_event = on_event
        self._map = map_update
        self._on_token_rejected = on_token_rejected
        self._allowed_updates = list(allowed_updates)
        self._poll_timeout = poll_timeout
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._stop_timeout = stop_timeout
        self._offset: int | None = None
        self._confirmed_offset: int | None = None
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin polling in a background task."""
        if self._task is not None:
            raise RuntimeError("TelegramPoller is already started")
        self._task = asyncio.create_task(self._poll_loop(), name="telegram-polling")

    async def stop(self) -> None:
        """End polling, waiting up to ``stop_timeout`` seconds for an ``on_event`` in flight."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            # The loop exits at its next check; an on_event in flight
            # finishes first so its acceptance is not torn.
            await asyncio.wait_for(asyncio.shield(task), timeout=self._stop_timeout)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._confirm_offset()

    async def _confirm_offset(self) -> None:
        """Tell Telegram which updates were handled, so a restart does not refetch them."""
        if self._offset is None or self._offset == self._confirmed_offset:
            return
        try:
            with map_telegram_errors(self._token):
                await self._bot.get_updates(offset=self._offset, limit=1, timeout=0)
            self._confirmed_offset = self._offset
        except PlatformError as exc:
            # Harmless: the updates come again after a restart and are deduplicated.
            logger.debug("Telegram offset confirmation failed: %s", exc.code)

    async def _wait_stop(self, delay: float) -> bool:
        """Sleep ``delay`` seconds unless stopping; True if stopping."""
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        except TimeoutError:
            return False
        return True

    async def _fetch(self) -> tuple[Update, ...] | None:
        """One long poll, abandoned as soon as ``stop`` is called (returns None then)."""
        fetch = asyncio.ensure_future(
            self._bot.get_updates(
                offset=self._offset,
                timeout=self._poll_timeout,
                allowed_updates=self._allowed_updates,
            )
        )
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({fetch, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not fetch.done():
                fetch.cancel()
                with contextlib.suppress(asyncio.CancelledError, TelegramError):
                    await fetch
        if fetch.cancelled():
            return None
        return fetch.result()

    async def _poll_loop(self) -> None:
        backoff = Backoff(self._backoff_initial, self._backoff_max)
        while not self._stopping.is_set():
            try:
                with map_telegram_errors(self._token):
                    updates = await self._fetch()
            except PlatformError as exc:
                if exc.code == 401:
                    logger.error("TELEGRAM_BOT_TOKEN was rejected by Telegram; polling stopped")
                    self._on_token_rejected()
                    return
                if exc.retry_after is not None:
                    delay = exc.retry_after
                    logger.warning("Telegram getUpdates flood control; waiting %.1fs", delay)
                elif exc.code == 409:
                    delay = backoff.next()
                    logger.warning(
                        "Telegram getUpdates conflict: another poller or a webhook uses this"
                        " token; retrying in %.1fs",
                        delay,
                    )
                else:
                    delay = backoff.next()
                    logger.warning("Telegram getUpdates failed (%s); retrying in %.1fs", exc, delay)
                if await self._wait_stop(delay):
                    return
                continue
            except Exception as exc:  # unparseable answer: PTB already logged it at CRITICAL
                delay = backoff.next()
                logger.error("Telegram getUpdates answer unusable (%s)", type(exc).__name__)
                if await self._wait_stop(delay):
                    return
                continue
            if updates is None:
                return
            if self._offset is not None:
                # Fetching with an offset confirms every update before it to Telegram.
                self._confirmed_offset = self._offset
            failure = await self._dispatch(updates)
            if failure is None:
                backoff.reset()
            elif await self._wait_stop(min(failure, self._backoff_max) or backoff.next()):
                return

    async def _dispatch(self, updates: Sequence[Update]) -> float | None:
        """Hand a batch to ``on_event`` in order.

        Returns None when all were handled, else the delay the failure asked
        for (0.0: use the backoff); the offset then stays before the failed
        update, so the next ``getUpdates`` brings it back.
        """
        for update in updates:
            if self._stopping.is_set():
                return None
            event = self._map(update)
            if event is not None:
                try:
                    await self._on_event(event)
                except Exception as exc:
                    log_failure(exc, REFUSED, update.update_id, log_ref(event.message_id))
                    return (exc.retry_after or 0.0) if isinstance(exc, ChatflowError) else 0.0
            self._offset = update.update_id + 1
        return None
