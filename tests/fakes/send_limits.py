"""Platform send limits as the fake servers enforce them: sliding windows, counted.

``FakeTelegramServer.enforce_limits()`` and ``FakeWhatsAppServer.enforce_limits()``
use one ``SendWindows``: a message past a window is refused (429 / 130429) the
way the platform would, and ``refusals`` counts why.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["SendWindows", "Window"]


@dataclass(frozen=True)
class Window:
    """At most ``limit`` messages in any ``seconds``-long window."""

    limit: int
    seconds: float


class SendWindows:
    """Sliding windows per account, per chat and per group; ``check`` admits or refuses."""

    def __init__(
        self,
        account: Window,
        *,
        chat: Window | None = None,
        group: Window | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.account = account
        self.chat = chat
        self.group = group
        self._clock = clock
        self._account: deque[float] = deque()
        self._chats: dict[str, deque[float]] = {}
        self._groups: dict[str, deque[float]] = {}
        self.accepted = 0
        """Messages admitted."""
        self.refusals: Counter[str] = Counter()
        """Messages refused, by window: ``account``, ``chat`` or ``group``."""
        self.admitted_at: list[float] = []
        """Clock time of every admitted message, in order."""

    @property
    def refused(self) -> int:
        """Messages refused, all windows together."""
        return sum(self.refusals.values())

    def check(self, chat_id: str, *, group: bool) -> float | None:
        """Admit a message to ``chat_id`` (None), or refuse it: the seconds to wait."""
        now = self._clock()
        checks: list[tuple[str, Window, deque[float]]] = [("account", self.account, self._account)]
        if self.chat is not None:
            checks.append(("chat", self.chat, self._chats.setdefault(chat_id, deque())))
        if group and self.group is not None:
            checks.append(("group", self.group, self._groups.setdefault(chat_id, deque())))
        for name, window, times in checks:
            while times and times[0] <= now - window.seconds:
                times.popleft()
            if len(times) >= window.limit:
                self.refusals[name] += 1
                return max(1.0, float(math.ceil(times[0] + window.seconds - now)))
        for _, _, times in checks:
            times.append(now)
        self.accepted += 1
        self.admitted_at.append(now)
        return None

    def peak(self, seconds: float = 1.0) -> int:
        """The most messages admitted within any ``seconds``-long window."""
        best = 0
        start = 0
        times = self.admitted_at
        for end, at in enumerate(times):
            while times[start] <= at - seconds:
                start += 1
            best = max(best, end - start + 1)
        return best
