"""The kill driver: SIGKILLs the bot at seeded, reproducible moments and restarts it.

A ``KillPlan`` says when to kill, counted from the (re)start of the process:

- ``model``: when the n-th model request arrives at the fake OpenAI server,
  before it is answered (a turn in flight: between tx 1 and tx 2);
- ``send``: when the n-th reply reaches a fake platform, before the answer
  goes back (the user got it, the ledger still says ``attempting``);
- ``accept``: right after the n-th WhatsApp webhook was answered 200 (tx 1
  just committed);
- ``poll``: when the n-th ``getUpdates`` arrives (Telegram offsets just moved);
- ``delay``: n milliseconds after the process was spawned (often during
  start-up: recovery, sweep and resend included).

Every plan ends in exactly one kill: if its trigger has not fired within
``fallback_after`` seconds of readiness, the process is killed anyway and the
record says so. The schedule is drawn from a seeded ``random.Random``; which
message a kill lands on also depends on OS scheduling.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from dataclasses import dataclass
from typing import Literal

from tests.e2e.botprocess import BotProcess

__all__ = ["CrashDriver", "KillPlan", "KillRecord", "Trigger", "kill_schedule"]

Trigger = Literal["model", "send", "accept", "poll", "delay"]
TRIGGERS: tuple[Trigger, ...] = ("model", "send", "accept", "poll", "delay")
_RANGES: dict[Trigger, tuple[int, int]] = {
    "model": (1, 5),
    "send": (1, 5),
    "accept": (1, 6),
    "poll": (1, 4),
    "delay": (100, 2500),
}


@dataclass(frozen=True)
class KillPlan:
    """When to kill the bot, counted from its (re)start."""

    trigger: Trigger
    """What is counted."""
    after: int
    """How many (``delay``: milliseconds after spawning)."""
    downtime_ms: int
    """How long the bot stays dead before the restart."""

    def describe(self) -> str:
        """Short text for the report."""
        if self.trigger == "delay":
            return f"{self.after} ms after spawn"
        return f"at {self.trigger} #{self.after}"


@dataclass(frozen=True)
class KillRecord:
    """What happened to one plan."""

    plan: KillPlan
    """The plan."""
    fired_by: str
    """The trigger that fired, or ``fallback``."""
    during_startup: bool
    """Whether the bot died before it was ready (recovery interrupted)."""
    at: float
    """Seconds since the driver started."""


def kill_schedule(rng: random.Random, kills: int) -> list[KillPlan]:
    """``kills`` plans drawn from ``rng``."""
    plans = []
    for _ in range(kills):
        trigger = rng.choice(TRIGGERS)
        low, high = _RANGES[trigger]
        plans.append(KillPlan(trigger, rng.randint(low, high), rng.randint(0, 300)))
    return plans


class CrashDriver:
    """Runs a kill schedule against one ``BotProcess`` while traffic flows elsewhere.

    Wire ``observe`` into the fakes (``openai.on_request``, ``graph.on_send``,
    ``telegram.on_send``, ``telegram.on_request`` for ``getUpdates``) and call
    ``observe("accept")`` after each webhook answered 200.
    """

    def __init__(self, bot: BotProcess, plans: list[KillPlan], *, fallback_after: float) -> None:
        self.bot = bot
        self.plans = plans
        self.fallback_after = fallback_after
        self.records: list[KillRecord] = []
        self.counts: dict[str, int] = dict.fromkeys(TRIGGERS, 0)
        """Events observed over the whole run, per kind."""
        self._armed: KillPlan | None = None
        self._seen = 0
        self._killed = asyncio.Event()
        self._fired_by = ""
        self._ready = False
        self._started = time.monotonic()

    def observe(self, kind: str) -> None:
        """Count one event; kill the bot now if it is the armed trigger's n-th."""
        if kind in self.counts:
            self.counts[kind] += 1
        plan = self._armed
        if plan is None or plan.trigger != kind or self._killed.is_set():
            return
        self._seen += 1
        if self._seen >= plan.after:
            self._kill(kind)

    def _kill(self, reason: str) -> None:
        proc = self.bot.proc
        if proc is None or self._killed.is_set():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        self._fired_by = reason
        self._killed.set()

    async def run(self) -> list[KillRecord]:
        """Start, kill and restart the bot once per plan; leave it running at the end."""
        loop = asyncio.get_running_loop()
        self._started = time.monotonic()
        for plan in self.plans:
            self._killed = asyncio.Event()
            self._seen = 0
            self._ready = False
            self._armed = plan
            timer = None
            if plan.trigger == "delay":
                timer = loop.call_later(plan.after / 1000, self._kill, "delay")
            try:
                await self.bot.start(within=60)
                self._ready = True
            except AssertionError:
                if not self._killed.is_set():
                    raise
            if not self._killed.is_set():
                await self._wait_for_kill()
            if timer is not None:
                timer.cancel()
            self._armed = None
            self.records.append(
                KillRecord(
                    plan,
                    self._fired_by,
                    not self._ready,
                    round(time.monotonic() - self._started, 2),
                )
            )
            await self.bot.kill()
            # Dead time: webhooks meet a closed port, Telegram updates pile up.
            await asyncio.sleep(plan.downtime_ms / 1000)
        await self.bot.start(within=60)
        return self.records

    async def _wait_for_kill(self) -> None:
        proc = self.bot.proc
        assert proc is not None
        exited = asyncio.ensure_future(proc.wait())
        killed = asyncio.ensure_future(self._killed.wait())
        try:
            done, _ = await asyncio.wait(
                {exited, killed},
                timeout=self.fallback_after,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            killed.cancel()
        if exited in done and not self._killed.is_set():
            raise AssertionError("the bot died by itself:\n" + "\n".join(self.bot.log[-40:]))
        exited.cancel()
        if not done:
            self._kill("fallback")
