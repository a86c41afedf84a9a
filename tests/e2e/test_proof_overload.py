"""Proof, overload: a burst across many sessions with a slow model.

Half the sessions write on WhatsApp (each person posting their messages one
after another as fast as the webhook accepts them, retrying like Meta when it
is refused), half on Telegram (every update queued at once). The model takes
``MODEL_DELAY`` per answer and the bot's queue is smaller than the burst, so it
must push back. Checked: nothing dropped (every message answered exactly once),
per-session order kept (replies and history), every webhook answered within
1 s (200, or a quick "busy" refusal that Meta retries), memory bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from bot.config import Settings
from tests.e2e import proof_report
from tests.e2e.botprocess import BotProcess
from tests.e2e.proof_world import (
    FULL,
    SEED,
    Inbound,
    ProofModel,
    World,
    history_problems,
    metrics,
    read_database,
)
from tests.fakes.whatsapp_webhook import WebhookSender

pytestmark = pytest.mark.e2e

SESSIONS_PER_PLATFORM = 50 if FULL else 6
MESSAGES_PER_SESSION = 10 if FULL else 6
MODEL_DELAY = 0.25 if FULL else 0.1
MAX_QUEUED = 300 if FULL else 40
MAX_LATENCY = 1.0
RSS_GROWTH_LIMIT_MB = 150


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def _watch_memory(bot: BotProcess, samples: list[float], stop: asyncio.Event) -> None:
    assert bot.proc is not None
    pid = bot.proc.pid
    while not stop.is_set():
        samples.append(await asyncio.to_thread(_rss_mb, pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


async def _person(
    world: World,
    sender: WebhookSender,
    client: httpx.AsyncClient,
    label: str,
    wa_id: str,
    latencies: list[float],
    answers: Counter[int],
) -> None:
    rng = random.Random(f"{SEED}-{label}")
    for index in range(MESSAGES_PER_SESSION):
        payload, _ = world.whatsapp_text(
            sender, wa_id, f"Q{label}N{index:03d} burst {index} of {label}", label
        )
        body = sender.encode(payload)
        headers = sender.headers(body)
        while True:
            began = time.monotonic()
            response = await client.post(sender.url, content=body, headers=headers)
            latencies.append(time.monotonic() - began)
            answers[response.status_code] += 1
            if response.status_code == 200:
                break
            # Meta retries a refused webhook later.
            await asyncio.sleep(rng.uniform(0.2, 0.6))


@pytest.mark.timeout(600 if FULL else 120)
async def test_proof_overload_burst_is_answered_in_order_without_drops(tmp_path: Path) -> None:
    started = time.monotonic()
    async with World(tmp_path, ProofModel(delay=MODEL_DELAY)) as world:
        bot = world.bot(MAX_QUEUED_MESSAGES=str(MAX_QUEUED))
        await bot.start()
        assert bot.proc is not None
        baseline = await asyncio.to_thread(_rss_mb, bot.proc.pid)
        samples: list[float] = []
        stop_watch = asyncio.Event()
        watcher = asyncio.create_task(_watch_memory(bot, samples, stop_watch))
        sender = world.sender(bot)
        latencies: list[float] = []
        answers: Counter[int] = Counter()
        burst_began = time.monotonic()
        for s in range(SESSIONS_PER_PLATFORM):
            for index in range(MESSAGES_PER_SESSION):
                label = f"tg{s:03d}"
                world.telegram_text(
                    4444000000 + s, f"Q{label}N{index:03d} burst {index} of {label}", label
                )
        limits = httpx.Limits(max_connections=SESSIONS_PER_PLATFORM)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            await asyncio.gather(
                *(
                    _person(
                        world,
                        sender,
                        client,
                        f"wa{s:03d}",
                        f"49155520{s:04d}",
                        latencies,
                        answers,
                    )
                    for s in range(SESSIONS_PER_PLATFORM)
                )
            )
        accepted_in = time.monotonic() - burst_began
        inbound = list(world.inbound)
        missing = await world.wait_answered(inbound, within=500 if FULL else 90, settle=bot)
        drained_in = time.monotonic() - burst_began
        stop_watch.set()
        await watcher
        seen = await metrics(bot)
        assert await bot.stop() == 0
        grouped = world.replies_to(inbound)
        db = read_database(bot.data_dir / "chatflow.db")

    assert missing == [], f"{len(missing)} messages never answered"
    copies = {i.token: len(r) for i, r in grouped.items() if len(r) != 1}
    assert copies == {}, f"messages without exactly one reply: {copies}"
    refused = {status: n for status, n in answers.items() if status != 200}
    assert set(refused) <= {503}, f"webhook answers other than 200/503: {answers}"
    assert max(latencies) < MAX_LATENCY, f"slowest webhook answer {max(latencies):.2f} s"

    # Per-session order: replies went out, and turns were committed, in the order sent.
    sessions: dict[str, list[Inbound]] = {}
    for message in inbound:
        sessions.setdefault(message.session, []).append(message)
    out_of_order = []
    for label, messages in sessions.items():
        order = [grouped[m][0].seq for m in messages]
        if order != sorted(order):
            out_of_order.append(label)
        session_id = db.session_of(messages[0].message_id)
        assert session_id is not None
        history = db.histories[session_id]
        assert history_problems(history, 40) == []
        users = [m.content for m in history if m.role.value == "user"]
        if users != [m.text for m in messages]:
            out_of_order.append(f"{label} (history)")
    assert out_of_order == [], out_of_order

    peak = max(samples, default=baseline)
    assert peak - baseline < RSS_GROWTH_LIMIT_MB, f"RSS grew {peak - baseline:.0f} MB"
    ordered = sorted(latencies)
    proof_report.record(
        "overload",
        {
            "burst": (
                f"{len(inbound)} messages across {len(sessions)} sessions "
                f"({SESSIONS_PER_PLATFORM} WhatsApp + {SESSIONS_PER_PLATFORM} Telegram)"
            ),
            "model latency per answer": f"{MODEL_DELAY} s",
            "MAX_QUEUED_MESSAGES / MAX_CONCURRENT_TURNS": (
                f"{MAX_QUEUED} / {Settings.model_fields['max_concurrent_turns'].default}"
            ),
            "webhook answers 200 / 503 busy": f"{answers[200]} / {answers[503]}",
            "messages refused while the queue was full (bot metric)": seen[
                "chatflow_messages_busy_total"
            ],
            "webhook latency p50 / p99 / max": (
                f"{statistics.median(ordered) * 1000:.0f} ms / "
                f"{ordered[int(len(ordered) * 0.99) - 1] * 1000:.0f} ms / "
                f"{ordered[-1] * 1000:.0f} ms"
            ),
            "all WhatsApp messages accepted after": f"{accepted_in:.1f} s",
            "all messages answered after": f"{drained_in:.1f} s",
            "bot RSS baseline / peak": f"{baseline:.0f} MB / {peak:.0f} MB",
            "messages dropped": 0,
            "duplicates delivered": 0,
            "sessions answered out of order": 0,
        },
        seconds=time.monotonic() - started,
        about=__doc__,
    )
