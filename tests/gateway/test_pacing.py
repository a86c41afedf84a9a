"""The outbound scheduler of one platform account (``bot.gateway.pacing``), and what the
gateway does with it: a flood refusal pauses the account and the reply goes out once
after the pause; a turn's slot is free once its reply is committed."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from bot.core.models.scripted import ScriptedModel
from bot.gateway.contract import SendLimits, SendResult
from bot.gateway.pacing import AccountPacer
from tests.fakes.adapter import FakeAdapter, make_event, transient
from tests.gateway.conftest import Rig

TELEGRAM = SendLimits(per_second=30, per_chat_second=1, group_per_minute=20)


class ManualClock:
    """A monotonic clock the test moves; ``sleep`` moves it to the end of the sleep."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)  # a sleeper yields, as the loop's sleep does


def pacer(limits: SendLimits = TELEGRAM, clock: ManualClock | None = None) -> AccountPacer:
    clock = clock or ManualClock()
    return AccountPacer(limits, margin=0.1, clock=clock, sleep=clock.sleep)


def most_in_window(times: list[float], seconds: float) -> int:
    ordered = sorted(times)
    return max(sum(1 for t in ordered if start <= t < start + seconds) for start in ordered)


def test_the_account_window_is_never_exceeded_and_sends_are_spread() -> None:
    p = pacer()
    times = [p.reserve(str(1000 + i)) for i in range(300)]
    assert times == sorted(times)
    # 30 per rolling second (with the margin: 30 per 1.1 s), never a burst.
    assert most_in_window(times, 1.0) <= 30
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 1.1 / 30 - 1e-9
    # ... and not much slower than the platform allows: 300 in ~11 s, not 300 / 30 * 1.25.
    assert times[-1] - times[0] < 300 / 30 * 1.15


def test_one_chat_gets_one_message_a_second_and_others_are_not_held_up() -> None:
    clock = ManualClock()
    p = pacer(clock=clock)
    first = p.reserve("42")
    second = p.reserve("42")
    others = [p.reserve(str(43 + i)) for i in range(40)]
    assert second - first == pytest.approx(1.1)
    # The others fill the second the chat waits for, then go on after it.
    assert others[0] - first < 0.1
    times = sorted([first, second, *others])
    assert most_in_window(times, 1.0) <= 30
    assert min(b - a for a, b in itertools.pairwise(times)) >= 1.1 / 30 - 1e-9
    assert times[-1] - times[0] < 42 * 1.1 / 30 + 1e-9


def test_a_group_gets_twenty_messages_a_minute() -> None:
    p = pacer()
    times = [p.reserve("-1001", group=True) for _ in range(21)]
    assert all(b - a >= 1.1 - 1e-9 for a, b in itertools.pairwise(times))
    assert times[20] - times[0] >= 60.1 - 1e-9
    assert most_in_window(times, 60.0) <= 20


async def test_a_refusal_pauses_the_whole_account_and_a_waiting_send_goes_after_it() -> None:
    clock = ManualClock()
    p = pacer(clock=clock)
    start = clock.now
    p.refused(5.0)
    assert p.reserve("7") >= start + 5.0
    # A send booked before the pause, for a moment inside it, books again after it.
    q = pacer(clock=clock)
    q.reserve("8")
    booked = asyncio.create_task(q.turn("8"))  # its chat's next second
    await asyncio.sleep(0)
    assert q.waiting == 1
    q.refused(3.0)
    assert await booked is True
    assert clock.now >= start + 3.0
    assert q.pauses == 1


async def test_no_retry_after_pauses_for_one_second() -> None:
    clock = ManualClock()
    p = pacer(clock=clock)
    p.refused(None)
    assert p.paused_until == pytest.approx(clock.now + 1.0)


async def test_typing_is_dropped_under_backlog_and_replies_never_are() -> None:
    clock = ManualClock()
    p = pacer(clock=clock)
    assert await p.turn("1", optional=True) is True  # idle: typing goes out
    # Replies waiting for the account: typing and drafts give way.
    waiting = [asyncio.create_task(p.turn(str(10 + i))) for i in range(40)]
    await asyncio.sleep(0)
    assert p.waiting > 0
    assert await p.turn("2", optional=True) is False
    assert all(await asyncio.gather(*waiting))  # every reply got its turn
    # Paused: typing is dropped too.
    p.refused(2.0)
    assert await p.turn("3", optional=True) is False
    assert p.dropped == 2


async def test_typing_and_a_draft_due_at_once_both_go_out_within_the_account_budget() -> None:
    # Drafts: the typing action and a turn's first draft fall due in the same instant
    # (both 0.3 s into the turn); the second was dropped for the spacing of queued
    # messages, so a fast answer showed its first draft a whole interval late.
    clock = ManualClock()
    p = pacer(clock=clock)
    assert await p.turn("1", optional=True) is True  # typing
    assert await p.turn("1", optional=True) is True  # the first draft, the same instant
    # Optional requests still count in the account's rolling second...
    for n in range(TELEGRAM.per_second - 2):
        assert await p.turn(str(n), optional=True) is True
    assert await p.turn("x", optional=True) is False
    clock.now += 1.1  # ... until it has passed
    assert await p.turn("x", optional=True) is True
    # ... and a message after them keeps the account's window and spacing.
    times = [p.reserve(str(500 + i)) for i in range(40)]
    assert times[0] >= clock.now and most_in_window(times, 1.0) <= TELEGRAM.per_second


# -- through the gateway -----------------------------------------------------------------


@dataclass
class PacedAdapter(FakeAdapter):
    """A fake platform with send limits that takes the pacer's turn before each send."""

    send_limits: SendLimits | None = field(default_factory=lambda: SendLimits(per_second=30))
    sent_at: list[float] = field(default_factory=list)

    async def send(
        self,
        chat_id: str,
        text: str,
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        assert self.pacer is not None
        await self.pacer.turn(chat_id)
        self.sent_at.append(asyncio.get_running_loop().time())
        return await super().send(chat_id, text, thread_id=thread_id, reply_to=reply_to)


async def test_a_flood_refusal_pauses_the_account_and_the_reply_goes_out_once_after_it(
    rigs: Callable[..., object],
) -> None:
    adapter = PacedAdapter()
    rig: Rig = await rigs(adapter=adapter)  # type: ignore[misc]
    assert adapter.pacer is rig.gateway.outbox.pacers["fake"]
    adapter.fail_next.append(transient("Too Many Requests", retry_after=0.3))
    rig.model.add(ScriptedModel.reply("in a moment"))
    started = asyncio.get_running_loop().time()
    await adapter.deliver(make_event("hi"))
    # Well before the 5-s retry poll: right after the pause the platform asked for.
    sent = await adapter.wait_for_sent(1, timeout=3.0)
    assert [s.text for s in sent] == ["in a moment"]
    assert adapter.sent_at[-1] - started >= 0.3
    assert rig.gateway.outbox.pacers["fake"].pauses == 1
    assert await rig.gateway._dispatcher.drain(5)
    await rig.gateway.ledger.flush()
    assert await rig.gateway.ledger.list_obligations(state="failed") == []
    assert len(await rig.gateway.ledger.list_obligations(state="delivered")) == 1
    assert len(adapter.sent) == 1


@dataclass
class HeldAdapter(FakeAdapter):
    """A fake platform whose sends wait until the test lets them go."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    entered: int = 0

    async def send(
        self,
        chat_id: str,
        text: str,
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        async with self._changed:
            self.entered += 1  # a send begins only after its turn committed
            self._changed.notify_all()
        await self.release.wait()
        return await super().send(chat_id, text, thread_id=thread_id, reply_to=reply_to)


async def test_a_reply_waiting_to_be_sent_holds_no_turn_slot(rigs: Callable[..., object]) -> None:
    adapter = HeldAdapter()
    rig: Rig = await rigs(adapter=adapter, max_concurrent_turns=1)  # type: ignore[misc]
    rig.model.add(ScriptedModel.reply("first"))
    rig.model.add(ScriptedModel.reply("second"))
    await adapter.deliver(make_event("one", chat_id="1001", sender_id="1001"))
    await adapter.deliver(make_event("two", chat_id="1002", sender_id="1002"))
    # The first reply cannot leave yet; the other chat's turn still runs to its commit.
    await adapter.wait_for(lambda: adapter.entered == 2, timeout=5)
    adapter.release.set()
    sent = await adapter.wait_for_sent(2)
    assert sorted(s.text for s in sent) == ["first", "second"]
