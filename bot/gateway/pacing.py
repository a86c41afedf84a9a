"""One outbound scheduler per platform account: sends paced to the platform's limits.

An adapter declares its account's ``SendLimits`` (Telegram: 30 requests per
second per bot, 1 message per second per chat, 20 per minute per group;
WhatsApp: the number's throughput, 80 per second by default). The outbox
gives it an ``AccountPacer`` (its ``pacer``), which the adapter awaits right
before writing each request.

- **Reserved when asked, not polled.** ``turn`` computes the moment the request
  may be written from what was already granted and sleeps once until then: the
  account's requests form one queue, oldest first, spaced
  ``(1 s + WINDOW_MARGIN) / per_second`` apart. So any rolling second holds at
  most ``per_second`` of them even when some are written a little late, and no
  burst leaves at once (a spike on a busy loop outruns the platform's window).
  Per chat and per group, sliding windows of the documented sizes plus the
  margin; a message held by its chat's window does not hold up other chats.
- **Optional requests** (typing, draft previews) never wait: they are granted
  only when nothing is waiting and the account is not paused, else dropped. A
  final reply is never dropped: it waits its turn, and its ledger row stays
  owed across a crash.
- **A refusal pauses the whole account** (``refused``: a 429 or 130429 with the
  platform's ``retry_after``, 1 s if it gave none); a request granted for a
  moment inside the pause takes a new turn after it.

Only optional requests are exempt from the per-chat windows: the platforms
document those limits for messages.

- **Scheduled posts give way to replies** (``make_way``, awaited by the outbox
  before a scheduled message is handed to the adapter). They book no moment
  ahead: a scheduled post waits until nothing is booked for its chat, and in a
  group until the chat's window has room left beyond ``REPLY_RESERVE`` of it. So
  however many posts are scheduled into a group, replies to its people always
  find room in the window, and never queue behind the posts.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from bot.gateway.contract import SendLimits

__all__ = ["DEFAULT_RETRY_AFTER", "REPLY_RESERVE", "WINDOW_MARGIN", "AccountPacer"]

logger = logging.getLogger(__name__)

WINDOW_MARGIN = 0.15
"""Seconds added to every window: a granted request reaches the platform a little
after its grant, and not always equally late."""
DEFAULT_RETRY_AFTER = 1.0
"""How long a refusal pauses the account when the platform did not say."""
REPLY_RESERVE = 0.25
"""The share of a group's per-minute window that scheduled posts leave to replies."""
_CHAT_WINDOW = 1.0
_GROUP_WINDOW = 60.0
_MAX_CHATS = 20_000
"""Per-chat histories kept; the oldest idle ones are forgotten past this."""
_MAX_SEARCH = 64
"""Grants looked at for room before the end of the queue (bounds the CPU per request)."""


class AccountPacer:
    """Paces the requests of one platform account (a ``SendPacer``)."""

    def __init__(
        self,
        limits: SendLimits,
        *,
        name: str = "",
        margin: float = WINDOW_MARGIN,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        """``clock``/``sleep``: the event loop's by default (tests pass their own)."""
        if margin < 0:
            raise ValueError("margin must not be negative")
        self.limits = limits
        self.name = name
        self._margin = margin
        self._clock = clock
        self._sleep = sleep
        # per_second requests spaced this far apart span the window and its margin,
        # so no rolling window (of either length) ever holds more than per_second.
        self._spacing = (1.0 + margin) / limits.per_second
        self._booked: list[float] = []  # account grants, sorted; old ones pruned
        # When granted requests actually went on: on a busy loop timers fire late,
        # and several at once; the window is checked again against these.
        self._released: deque[float] = deque(maxlen=limits.per_second)
        self._chats: dict[str, deque[float]] = {}
        self._paused_until = float("-inf")
        self._waiting = 0
        self.granted = 0
        """Requests granted (optional ones included)."""
        self.dropped = 0
        """Optional requests dropped under backlog or pause."""
        self.pauses = 0
        """Refusals reported (``refused``)."""

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    @property
    def waiting(self) -> int:
        """Requests waiting for their moment."""
        return self._waiting

    @property
    def paused_until(self) -> float:
        """Clock time until which the account is paused (in the past when it is not)."""
        return self._paused_until

    def _chat_ready(self, chat_id: str, group: bool) -> float:
        """The earliest time a message to ``chat_id`` fits its chat windows."""
        history = self._chats.get(chat_id)
        if not history:
            return float("-inf")
        ready = float("-inf")
        per_chat = self.limits.per_chat_second
        if per_chat is not None and len(history) >= per_chat:
            ready = history[-per_chat] + _CHAT_WINDOW + self._margin
        per_group = self.limits.group_per_minute
        if group and per_group is not None and len(history) >= per_group:
            ready = max(ready, history[-per_group] + _GROUP_WINDOW + self._margin)
        return ready

    def _free_from(self, earliest: float) -> float:
        """The first moment from ``earliest`` at least ``spacing`` away from every grant.

        Grants are mostly booked at the end; a message held by its chat's window
        books ahead and leaves room before it, which later requests may fill (a
        short search; past it, the end of the queue is always free).
        """
        booked, gap = self._booked, self._spacing
        if not booked or earliest >= booked[-1] + gap:
            return earliest
        at = earliest
        index = bisect.bisect_left(booked, at - gap)
        for _ in range(_MAX_SEARCH):
            if index == len(booked):
                return at
            if booked[index] > at - gap and booked[index] < at + gap:
                at = booked[index] + gap  # too close to this grant: just after it
                index += 1
                continue
            if booked[index] >= at + gap:
                return at
            index += 1
        return max(earliest, booked[-1] + gap)

    def _record(self, at: float, chat_id: str | None, group: bool) -> None:
        booked = self._booked
        if booked and at >= booked[-1]:
            booked.append(at)
        else:
            bisect.insort(booked, at)
        self.granted += 1
        if len(booked) > 2 * _MAX_SEARCH:
            # Grants long past constrain nothing: only ``spacing`` back matters.
            stale = bisect.bisect_left(booked, self._now() - self._spacing)
            if stale:
                del booked[:stale]
        if chat_id is None:
            return
        keep = max(
            self.limits.per_chat_second or 0, (self.limits.group_per_minute or 0) if group else 0
        )
        if keep == 0:
            return
        history = self._chats.pop(chat_id, None)  # re-inserted last: dict order is recency
        if history is None or history.maxlen != keep:
            history = deque(history or (), maxlen=keep)
        history.append(at)
        self._chats[chat_id] = history
        if len(self._chats) > _MAX_CHATS:
            del self._chats[next(iter(self._chats))]

    def reserve(self, chat_id: str, *, group: bool = False) -> float:
        """Book the earliest moment a message to ``chat_id`` may be written; returns it."""
        now = self._now()
        at = self._free_from(max(now, self._paused_until, self._chat_ready(chat_id, group)))
        self._record(at, chat_id, group)
        return at

    def try_optional(self) -> bool:
        """Grant an optional request now if nothing waits and the account has room."""
        now = self._now()
        if self._waiting or self._paused_until > now or self._free_from(now) > now:
            self.dropped += 1
            return False
        self._record(now, None, False)
        self._released.append(now)
        return True

    async def turn(self, chat_id: str, *, group: bool = False, optional: bool = False) -> bool:
        """Wait until a request to ``chat_id`` may be written (see ``SendPacer.turn``)."""
        if optional:
            return self.try_optional()
        self._waiting += 1
        try:
            at = self.reserve(chat_id, group=group)
            while True:
                delay = at - self._now()
                if delay > 0:
                    await self._sleep(delay)
                # A timer may fire a hair early (clock resolution): it slept until ``at``.
                now = max(self._now(), at)
                if self._paused_until > now:
                    # Paused by a refusal while this one slept: a turn after the pause.
                    at = self.reserve(chat_id, group=group)
                    continue
                released = self._released
                if len(released) == released.maxlen:
                    free = released[0] + 1.0 + self._margin
                    if now < free:
                        at = free  # woke late, with others: the window decides
                        continue
                released.append(now)
                return True
        finally:
            self._waiting -= 1

    def _way_from(self, chat_id: str, group: bool, now: float) -> float:
        """When a scheduled post to ``chat_id`` stops being in a reply's way."""
        history = self._chats.get(chat_id)
        if not history:
            return now
        ready = max(now, history[-1])  # a message booked ahead (a reply waiting) goes first
        per_group = self.limits.group_per_minute
        if group and per_group is not None:
            allowed = max(1, per_group - max(1, round(per_group * REPLY_RESERVE)))
            window = _GROUP_WINDOW + self._margin
            recent = sorted(at for at in history if at > now - window)
            if len(recent) >= allowed:
                ready = max(ready, recent[len(recent) - allowed] + window)
        return ready

    async def make_way(self, chat_id: str, *, group: bool = False) -> None:
        """Wait until a scheduled post to ``chat_id`` may take its turn without delaying a
        reply: nothing booked for the chat from now on, and (a group) its window left
        with ``REPLY_RESERVE`` of its room. The post then takes its ``turn`` as usual."""
        while True:
            now = self._now()
            ready = self._way_from(chat_id, group, now)
            if ready <= now:
                return
            await self._sleep(ready - now)

    def refused(self, retry_after: float | None) -> None:
        """Pause the account for ``retry_after`` seconds (``DEFAULT_RETRY_AFTER`` if None)."""
        pause = DEFAULT_RETRY_AFTER if retry_after is None else max(retry_after, 0.0)
        until = self._now() + pause
        self.pauses += 1
        if until > self._paused_until:
            self._paused_until = until
            logger.warning("%s refused a send for flood; pausing it %.1f s", self.name, pause)
