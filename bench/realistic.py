"""Realistic load: the installed bot, webhooks, a slow model, platforms that enforce their limits.

``python -m bench.realistic`` (or ``python -m bench realistic``) runs
``python -m bot run --no-console`` as a subprocess with its defaults
(``LOG_LEVEL=INFO``, the bot's own HTTP server) against the project's fakes,
served from this process:

- a model answering every request after U(1, 3) s (``FakeOpenAIServer.slow``);
- **Telegram**: webhook mode; ``--sessions`` private chats (1,000) write at
  once, POSTed through 40 connections (Telegram's default ``max_connections``)
  from a child process with a raw HTTP/1.1 client (``bench.webhook_burst``: a
  generator sharing the fakes' loop and CPU would add its own lag to the figure);
  the fake Bot API answers 429 past 30 messages per second per bot, 1 per
  second per chat, 20 per minute per group (``enforce_limits``);
- **WhatsApp**: as many users, their signed webhooks through 40 connections;
  the fake Graph API answers 130429 past 80 messages in any second.

Measured per platform: webhook answers (p50 / p99 / max, during the burst),
the span from the first reply sent to the last against the platform's minimum
(N / rate), rate-limit refusals, the bot's CPU per reply (``/proc``), and its
RSS growth per message in flight. ``--ten-thousand`` adds a Telegram run with
10,000 chats and as many turns (several minutes: not part of ``make bench``),
for the memory per waiting turn at that scale.

Results go to ``bench/results/realistic.json``; ``python -m bench`` checks the
targets of issue 27 against them.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import bench_tmpdir, percentile, print_table, read_result, write_result
from bench.webhook_burst import burst, encode_request
from tests.e2e.botprocess import BotProcess
from tests.fakes import serving
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_webhook import WebhookSender

CONNECTIONS = 40
"""Webhook connections, as Telegram's default ``max_connections``."""
MODEL_SECONDS = (1.0, 3.0)
TELEGRAM_RATE = 30
WHATSAPP_RATE = 80
SECRET = "realistic-bench-secret"
APP_SECRET = "realistic-bench-app-secret"
BASE_USER = 600_000_000
SAMPLE_SECONDS = 0.2


def _proc_rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    """What one scenario measured."""

    platform: str
    sessions: int
    rate: int
    acks: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    sent_at: list[float] = field(default_factory=list)
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, rss KiB, in flight)

    def figures(self, *, refusals: int, cpu_s: float, idle_rss: int, took: float) -> dict[str, Any]:
        ordered = sorted(self.sent_at)
        span = ordered[-1] - ordered[0] if len(ordered) > 1 else 0.0
        minimum = self.sessions / self.rate
        peak_rss = max((rss for _, rss, _ in self.samples), default=idle_rss)
        in_flight = max((n for _, _, n in self.samples), default=0)
        return {
            "platform": self.platform,
            "sessions": self.sessions,
            "delivered": len(self.sent_at),
            "webhook_p50_ms": round(statistics.median(self.acks) * 1000, 1),
            "webhook_p99_ms": round(percentile(self.acks, 99) * 1000, 1),
            "webhook_max_ms": round(max(self.acks) * 1000, 1),
            "webhook_statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "delivery_span_s": round(span, 2),
            "minimum_s": round(minimum, 2),
            "span_over_minimum": round(span / minimum, 3),
            "rate_limit_refusals": refusals,
            "peak_sends_per_s": _peak(ordered, 1.0),
            "cpu_ms_per_reply": round(cpu_s * 1000 / max(1, len(self.sent_at)), 2),
            "rss_idle_mib": round(idle_rss / 1024, 1),
            "rss_peak_mib": round(peak_rss / 1024, 1),
            "max_in_flight": in_flight,
            "kib_per_message_in_flight": (
                round((peak_rss - idle_rss) / in_flight, 1) if in_flight else None
            ),
            "run_s": round(took, 1),
        }


def _peak(times: list[float], seconds: float) -> int:
    best = start = 0
    for end, at in enumerate(times):
        while times[start] <= at - seconds:
            start += 1
        best = max(best, end - start + 1)
    return best


async def _burst(
    run: Run,
    url: str,
    requests: list[bytes],
    bot: BotProcess,
    wait_sent: Callable[[float], Awaitable[object]],
    *,
    within: float,
) -> tuple[float, float]:
    """POST every encoded request through ``CONNECTIONS`` connections (from a child
    process, ``bench.webhook_burst``), sample the bot until every reply is sent;
    returns (bot CPU seconds from the burst on, run seconds)."""
    assert bot.proc is not None
    pid = bot.proc.pid
    done = asyncio.Event()
    rss: list[tuple[float, int]] = []

    async def sampler() -> None:
        while not done.is_set():
            rss.append((time.monotonic(), _proc_rss_kib(pid)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), SAMPLE_SECONDS)

    cpu0 = _proc_cpu_s(pid)
    started = time.monotonic()
    sampling = asyncio.create_task(sampler())
    try:
        answers = await burst(url, requests, CONNECTIONS)
        await wait_sent(within)
    finally:
        done.set()
        await sampling
    cpu = _proc_cpu_s(pid) - cpu0
    for status, sent, answered in answers:
        run.acks.append(answered - sent)
        run.statuses[status] = run.statuses.get(status, 0) + 1
    # Messages in flight at each sample: accepted (answered 200) and not yet replied to.
    accepted = sorted(answered for status, _, answered in answers if status == 200)
    replied = sorted(run.sent_at)
    for at, kib in rss:
        in_flight = bisect.bisect_right(accepted, at) - bisect.bisect_right(replied, at)
        run.samples.append((at, kib, in_flight))
    return cpu, time.monotonic() - started


async def _model() -> FakeOpenAIServer:
    model = FakeOpenAIServer()
    model.slow = MODEL_SECONDS
    await model.start()
    return model


def _bot_env(model: FakeOpenAIServer, extra: dict[str, str]) -> dict[str, str]:
    return {
        "OPENAI_API_KEY": model.api_key,
        "OPENAI_BASE_URL": model.base_url,
        "DEFAULT_MODEL": "gpt-4o-mini",
        "STREAM_REPLIES": "false",
        **extra,
    }


async def _ready_bot(
    data: Path, env: dict[str, str], webhook: Callable[[str], dict[str, str]]
) -> BotProcess:
    bot = BotProcess(data, env)
    bot.env.update(webhook(bot.url))
    await bot.start(within=60)
    return bot


async def telegram_run(sessions: int, *, turns: int | None = None) -> dict[str, Any]:
    """``sessions`` private chats write at once over the webhook."""
    run = Run("telegram", sessions, TELEGRAM_RATE)
    async with FakeTelegramServer() as telegram:
        model = await _model()
        telegram.on_send = lambda sent: run.sent_at.append(time.monotonic())
        extra = {"TELEGRAM_BOT_TOKEN": telegram.token, "TELEGRAM_API_BASE_URL": telegram.base_url}
        if turns is not None:
            extra["MAX_CONCURRENT_TURNS"] = str(turns)
            extra["MAX_QUEUED_MESSAGES"] = str(2 * sessions)
        with bench_tmpdir("realistic") as tmp:
            bot = await _ready_bot(
                tmp / "data",
                _bot_env(model, extra),
                lambda url: {
                    "TELEGRAM_WEBHOOK_URL": f"{url}/webhooks/telegram",
                    "TELEGRAM_WEBHOOK_SECRET": SECRET,
                },
            )
            try:
                # setWebhook is a request the fake records: wait on its condition.
                await telegram.wait_for_request("setWebhook", 1, within=30)
                assert bot.proc is not None
                await asyncio.sleep(1.0)  # settle: the idle RSS
                idle_rss = _proc_rss_kib(bot.proc.pid)
                limits = telegram.enforce_limits()
                headers = {
                    "X-Telegram-Bot-Api-Secret-Token": SECRET,
                    "Content-Type": "application/json",
                }

                def update(i: int) -> dict[str, Any]:
                    user = BASE_USER + i
                    person = {"id": user, "is_bot": False, "first_name": "U"}
                    return {
                        "update_id": 800_000_000 + i,
                        "message": {
                            "message_id": 10 + i,
                            "from": person,
                            "chat": {"id": user, "type": "private", "first_name": "U"},
                            "date": int(time.time()),
                            "text": "hello, where is my order #1001?",
                        },
                    }

                url = f"{bot.url}/webhooks/telegram"
                requests = [
                    encode_request(url, json.dumps(update(i)).encode(), headers)
                    for i in range(sessions)
                ]

                async def wait_sent(within: float) -> None:
                    await telegram.wait_for_sent(sessions, within=within)

                cpu, took = await _burst(
                    run, url, requests, bot, wait_sent, within=sessions / TELEGRAM_RATE * 3 + 60
                )
                figures = run.figures(
                    refusals=limits.refused, cpu_s=cpu, idle_rss=idle_rss, took=took
                )
                figures["refusals_by_window"] = dict(limits.refusals)
                return figures
            finally:
                await bot.kill()
                await model.stop()


async def whatsapp_run(sessions: int) -> dict[str, Any]:
    """``sessions`` WhatsApp users write at once."""
    run = Run("whatsapp", sessions, WHATSAPP_RATE)
    async with FakeWhatsAppServer(token="bench-token") as graph:
        model = await _model()
        graph.on_send = lambda record: run.sent_at.append(time.monotonic())
        extra = {
            "WHATSAPP_PHONE_ID": graph.phone_id,
            "WHATSAPP_TOKEN": "bench-token",
            "WHATSAPP_VERIFY_TOKEN": "bench-verify",
            "WHATSAPP_APP_SECRET": APP_SECRET,
            "WHATSAPP_API_BASE_URL": graph.base_url,
        }
        with bench_tmpdir("realistic") as tmp:
            bot = await _ready_bot(tmp / "data", _bot_env(model, extra), lambda url: {})
            try:
                assert bot.proc is not None
                await asyncio.sleep(1.0)
                idle_rss = _proc_rss_kib(bot.proc.pid)
                limits = graph.enforce_limits(WHATSAPP_RATE)
                sender = WebhookSender(
                    f"{bot.url}/webhooks/whatsapp", APP_SECRET, phone_number_id=graph.phone_id
                )

                requests = []
                for i in range(sessions):
                    body = sender.encode(
                        sender.text("hello, where is my order #1001?", wa_id=f"1650{i:07d}")
                    )
                    requests.append(encode_request(sender.url, body, sender.headers(body)))

                async def wait_sent(within: float) -> None:
                    await graph.wait_for_sent(sessions, within=within)

                cpu, took = await _burst(
                    run,
                    sender.url,
                    requests,
                    bot,
                    wait_sent,
                    within=sessions / WHATSAPP_RATE * 3 + 60,
                )
                figures = run.figures(
                    refusals=limits.refused, cpu_s=cpu, idle_rss=idle_rss, took=took
                )
                figures["refusals_by_window"] = dict(limits.refusals)
                return figures
            finally:
                await bot.kill()
                await model.stop()


def _show(results: list[dict[str, Any]]) -> None:
    print_table(
        "Realistic load (model U(1, 3) s, platform limits enforced)",
        [
            "platform",
            "chats",
            "webhook p50 / p99 / max ms",
            "first to last reply",
            "minimum",
            "refusals",
            "peak/s",
            "CPU/reply",
            "RSS idle -> peak",
            "KiB per msg in flight",
        ],
        [
            [
                r["platform"],
                f"{r['sessions']:,}",
                " / ".join(f"{r[f'webhook_{q}_ms']:.0f}" for q in ("p50", "p99", "max")),
                f"{r['delivery_span_s']:.1f} s ({r['span_over_minimum']:.2f}x)",
                f"{r['minimum_s']:.1f} s",
                r["rate_limit_refusals"],
                r["peak_sends_per_s"],
                f"{r['cpu_ms_per_reply']:.1f} ms",
                f"{r['rss_idle_mib']:.0f} -> {r['rss_peak_mib']:.0f} MiB",
                "-" if r["kib_per_message_in_flight"] is None else r["kib_per_message_in_flight"],
            ]
            for r in results
        ],
    )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    serving.LocalServer.backlog = 8192  # the fakes must not be the bottleneck
    results: dict[str, Any] = {"model_seconds": list(MODEL_SECONDS), "connections": CONNECTIONS}
    if "telegram" in args.platforms:
        results["telegram"] = await telegram_run(args.sessions)
    if "whatsapp" in args.platforms:
        results["whatsapp"] = await whatsapp_run(args.sessions)
    if args.ten_thousand:
        results["telegram_10000"] = await telegram_run(10_000, turns=10_000)
    _show([results[k] for k in ("telegram", "whatsapp", "telegram_10000") if k in results])
    return results


def targets() -> list[tuple[str, float | None, str, bool | None]]:
    """Issue 27's realistic-load targets as ``(target, measured, format, met)``, judged
    from ``results/realistic.json``; ``None``: not measured."""
    result = read_result("realistic") or {}
    rows: list[tuple[str, float | None, str, bool | None]] = []
    runs = [result[k] for k in ("telegram", "whatsapp") if k in result]
    for key, label, code in (("telegram", "Telegram", "429"), ("whatsapp", "WhatsApp", "130429")):
        run = result.get(key)
        span = None if run is None else float(run["span_over_minimum"])
        rows.append(
            (
                f"{label}: 1,000 replies due at once delivered within 1.25x the minimum time",
                span,
                "{:.2f}x",
                None if span is None else span <= 1.25,
            )
        )
        refused = None if run is None else float(run["rate_limit_refusals"])
        rows.append(
            (
                f"{label}: 0 rate-limit refusals ({code}) in that burst",
                refused,
                "{:.0f}",
                None if refused is None else refused == 0,
            )
        )
    cpu = max((float(r["cpu_ms_per_reply"]) for r in runs), default=None)
    rows.append(("bot CPU <= 5 ms per reply under that load", cpu, "{:.1f} ms", _at_most(cpu, 5)))
    ack = max((float(r["webhook_p99_ms"]) for r in runs), default=None)
    rows.append(
        ("webhook answers p99 <= 500 ms during the burst", ack, "{:.0f} ms", _at_most(ack, 500))
    )
    big = result.get("telegram_10000") or {}
    per_turn = big.get("kib_per_message_in_flight")
    per_turn = None if per_turn is None else float(per_turn)
    rows.append(
        (
            "<= 64 KiB per waiting turn at 10,000 chats (bench.realistic --ten-thousand)",
            per_turn,
            "{:.0f} KiB",
            _at_most(per_turn, 64),
        )
    )
    return rows


def _at_most(value: float | None, bound: float) -> bool | None:
    return None if value is None else value <= bound


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.realistic", description=__doc__)
    parser.add_argument("--sessions", type=int, default=1000, help="chats writing at once")
    parser.add_argument(
        "--platforms", nargs="+", default=["telegram", "whatsapp"], choices=["telegram", "whatsapp"]
    )
    parser.add_argument(
        "--ten-thousand", action="store_true", help="also 10,000 Telegram chats (several minutes)"
    )
    args = parser.parse_args(argv)
    results = asyncio.run(main_async(args))
    write_result("realistic", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
