"""Capacity on PostgreSQL (issue #38): many conversations thinking at once on few connections.

``python -m bench.capacity`` (part of ``make bench``, which starts PostgreSQL)
runs, side by side in one run, three fleets of 3 ``python -m bot run``
processes with ``DATABASE_CONNECTIONS=8`` each, on one fresh schema each:

- **leases**: this code, straight to PostgreSQL;
- **leases via PgBouncer**: this code through Debian's ``pgbouncer`` in
  transaction mode (``tests.pgbouncer``, pool of 20 server connections),
  ``DATABASE_POOLER=transaction``;
- **held lock (base)**: the code before issue #38, whose turns each held a
  lock connection for the whole model call: ``--base DIR`` (a checkout of it),
  else a temporary ``git worktree`` of the parent of the commit that added
  ``bot/core/stores/pglease.py``, removed afterwards (skipped outside a git
  checkout).

300 conversations write at once (150 Telegram chats and 150 WhatsApp users,
spread over the 3 processes, as a load balancer would), to a model that
answers after 3 s; the fake platforms enforce today's pacing (Telegram 30
messages/s, WhatsApp 80/s). Measured: replies and the time to the last,
turns at once (model requests in flight: arrivals within the model's 3 s),
and the server connections of the bots sampled every 100 ms from
``pg_stat_activity`` (by ``application_name`` and in all, through PgBouncer
its server connections). Targets: all answered within 30 s, at most 30
server connections.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench.common import bench_tmpdir, print_table, read_result, write_result
from tests.e2e.botprocess import BotProcess
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_webhook import WebhookSender
from tests.pgbouncer import bouncer
from tests.pgtest import fresh_schema

PROCESSES = 3
CONNECTIONS = 8
CONVERSATIONS = 300
MODEL_SECONDS = 3.0
BOUNCER_POOL = 20
SAMPLE_SECONDS = 0.1
SECRET = "capacity-bench-secret"
APP_SECRET = "capacity-bench-app-secret"
BASE_USER = 700_000_000
TARGET_SECONDS = 30.0
TARGET_CONNECTIONS = 30


@contextlib.asynccontextmanager
async def _sampled(dsn: str, counts: list[tuple[int, int]]) -> AsyncIterator[None]:
    """Sample the server's client backends of this database while the block runs."""
    conn = await asyncpg.connect(dsn)
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            row = await conn.fetchrow(
                "SELECT count(*) FILTER (WHERE application_name LIKE 'chatflow/%'), count(*) "
                "FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
            assert row is not None
            counts.append((int(row[0]), int(row[1])))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), SAMPLE_SECONDS)

    task = asyncio.create_task(sample())
    try:
        yield
    finally:
        done.set()
        await task
        await conn.close()


def _peak_in_flight(arrivals: list[float], seconds: float) -> int:
    arrivals = sorted(arrivals)
    return max(
        (bisect.bisect_right(arrivals, t + seconds - 1e-6) - i for i, t in enumerate(arrivals)),
        default=0,
    )


async def fleet_run(label: str, dsn: str, *, base: Path | None, pooled: bool) -> dict[str, Any]:
    """One fleet of ``PROCESSES`` bots on a fresh schema; its figures."""
    arrivals: list[float] = []
    sent_at: list[float] = []
    counts: list[tuple[int, int]] = []
    async with AsyncExitStack() as stack:
        schema_dsn = await stack.enter_async_context(fresh_schema(dsn))
        bot_dsn = schema_dsn
        if pooled:
            bot_dsn = await stack.enter_async_context(bouncer(schema_dsn, pool_size=BOUNCER_POOL))
        telegram = await stack.enter_async_context(FakeTelegramServer())
        graph = await stack.enter_async_context(FakeWhatsAppServer(token="bench-token"))
        model = FakeOpenAIServer(on_request=lambda _r: arrivals.append(time.monotonic()))
        model.slow = (MODEL_SECONDS, MODEL_SECONDS)
        await model.start()
        stack.push_async_callback(model.stop)
        all_sent = asyncio.Event()

        def on_send(_sent: object) -> None:
            sent_at.append(time.monotonic())
            if len(sent_at) >= CONVERSATIONS:
                all_sent.set()

        telegram.on_send = on_send
        graph.on_send = on_send
        tmp = stack.enter_context(bench_tmpdir("capacity"))
        bots: list[BotProcess] = []
        for index in range(PROCESSES):
            env = {
                "DATABASE_URL": bot_dsn,
                "DATABASE_CONNECTIONS": str(CONNECTIONS),
                "OPENAI_API_KEY": model.api_key,
                "OPENAI_BASE_URL": model.base_url,
                "DEFAULT_MODEL": "gpt-4o-mini",
                "STREAM_REPLIES": "false",
                "TELEGRAM_BOT_TOKEN": telegram.token,
                "TELEGRAM_API_BASE_URL": telegram.base_url,
                "TELEGRAM_WEBHOOK_SECRET": SECRET,
                "WHATSAPP_PHONE_ID": graph.phone_id,
                "WHATSAPP_TOKEN": "bench-token",
                "WHATSAPP_VERIFY_TOKEN": "bench-verify",
                "WHATSAPP_APP_SECRET": APP_SECRET,
                "WHATSAPP_API_BASE_URL": graph.base_url,
            }
            if pooled:
                env["DATABASE_POOLER"] = "transaction"
            (tmp / f"bot{index}" / "data").mkdir(parents=True)
            bot = BotProcess(tmp / f"bot{index}" / "data", env)
            bot.env["TELEGRAM_WEBHOOK_URL"] = f"{bot.url}/webhooks/telegram"
            if base is not None:
                bot.env["PYTHONPATH"] = str(base)
            bots.append(bot)
            stack.push_async_callback(bot.kill)
        await asyncio.gather(*(bot.start(within=90) for bot in bots))
        telegram.enforce_limits()
        graph.enforce_limits(80)
        requests: list[tuple[str, bytes, dict[str, str]]] = []
        half = CONVERSATIONS // 2
        for i in range(half):
            user = BASE_USER + i
            person = {"id": user, "is_bot": False, "first_name": "U"}
            update = {
                "update_id": 900_000_000 + i,
                "message": {
                    "message_id": 10 + i,
                    "from": person,
                    "chat": {"id": user, "type": "private", "first_name": "U"},
                    "date": int(time.time()),
                    "text": "hello, where is my order #1001?",
                },
            }
            url = f"{bots[i % PROCESSES].url}/webhooks/telegram"
            headers = {
                "X-Telegram-Bot-Api-Secret-Token": SECRET,
                "Content-Type": "application/json",
            }
            requests.append((url, json.dumps(update).encode(), headers))
        for i in range(CONVERSATIONS - half):
            bot = bots[i % PROCESSES]
            sender = WebhookSender(
                f"{bot.url}/webhooks/whatsapp", APP_SECRET, phone_number_id=graph.phone_id
            )
            body = sender.encode(
                sender.text("hello, where is my order #1001?", wa_id=f"1651{i:07d}")
            )
            requests.append((sender.url, body, sender.headers(body)))
        async with (
            _sampled(dsn, counts),
            httpx.AsyncClient(
                timeout=60, limits=httpx.Limits(max_connections=CONVERSATIONS)
            ) as client,
        ):
            started = time.monotonic()
            answers = await asyncio.gather(
                *(client.post(url, content=body, headers=h) for url, body, h in requests)
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_sent.wait(), TARGET_SECONDS * 3)
        accepted = sum(1 for a in answers if a.status_code == 200)
        last = (max(sent_at) - started) if sent_at else None
        return {
            "fleet": label,
            "conversations": CONVERSATIONS,
            "accepted": accepted,
            "answered": len(sent_at),
            "last_reply_s": None if last is None else round(last, 2),
            "turns_at_once": _peak_in_flight(arrivals, MODEL_SECONDS),
            "bot_connections_max": max((c[0] for c in counts), default=0),
            "server_connections_max": max((c[1] for c in counts), default=0),
            "refused_by_platforms": (telegram.limits.refused if telegram.limits else 0)
            + (graph.limits.refused if graph.limits else 0),
        }


def _show(results: list[dict[str, Any]]) -> None:
    print_table(
        f"Capacity: {PROCESSES} processes x DATABASE_CONNECTIONS={CONNECTIONS}, "
        f"{CONVERSATIONS} conversations at once, a {MODEL_SECONDS:g} s model",
        [
            "fleet",
            "answered",
            "last reply",
            "turns at once",
            "bot conns (app name)",
            "server conns (all)",
        ],
        [
            [
                r["fleet"],
                f"{r['answered']}/{r['conversations']}",
                "-" if r["last_reply_s"] is None else f"{r['last_reply_s']:.1f} s",
                str(r["turns_at_once"]),
                str(r["bot_connections_max"]),
                str(r["server_connections_max"]),
            ]
            for r in results
        ],
    )


def targets() -> list[tuple[str, float | None, str, bool | None]]:
    """Issue 38's capacity targets, judged on ``capacity.json``."""
    result = read_result("capacity") or {}
    fleets = {r["fleet"]: r for r in result.get("fleets", [])}
    rows: list[tuple[str, float | None, str, bool | None]] = []
    for label in ("leases", "leases via PgBouncer"):
        r = fleets.get(label)
        done = None if r is None or r["answered"] < r["conversations"] else r["last_reply_s"]
        rows.append(
            (
                f"capacity ({label}): all {CONVERSATIONS} answered within {TARGET_SECONDS:g} s",
                done,
                "{:.1f} s",
                None if r is None else done is not None and done <= TARGET_SECONDS,
            )
        )
        conns = None if r is None else float(r["server_connections_max"])
        rows.append(
            (
                f"capacity ({label}): at most {TARGET_CONNECTIONS} server connections",
                conns,
                "{:.0f}",
                None if conns is None else conns <= TARGET_CONNECTIONS,
            )
        )
    return rows


@contextlib.contextmanager
def _base_checkout(given: Path | None) -> Iterator[Path | None]:
    """The code before issue #38: ``given``, or a temporary worktree of it."""
    if given is not None:
        yield given
        return
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        added = git("log", "--diff-filter=A", "--format=%H", "--", "bot/core/stores/pglease.py")
    except (OSError, subprocess.CalledProcessError):
        added = ""
    if not added:
        print("no baseline: not a git checkout with the commit of issue #38")
        yield None
        return
    where = Path(tempfile.mkdtemp(prefix="chatflow-base38.")) / "tree"
    git("worktree", "add", "--detach", str(where), added.splitlines()[-1] + "^")
    try:
        yield where
    finally:
        git("worktree", "remove", "--force", str(where))
        shutil.rmtree(where.parent, ignore_errors=True)


async def main_async(dsn: str, base: Path | None) -> dict[str, Any]:
    fleets = [
        await fleet_run("leases", dsn, base=None, pooled=False),
        await fleet_run("leases via PgBouncer", dsn, base=None, pooled=True),
    ]
    if base is not None:
        fleets.append(await fleet_run("held lock (base)", dsn, base=base, pooled=False))
    return {"fleets": fleets}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("CHATFLOW_TEST_DATABASE_URL"))
    parser.add_argument(
        "--base",
        type=Path,
        default=os.environ.get("CHATFLOW_BENCH_BASE") or None,
        help="a checkout of the code before issue #38, for the side-by-side baseline",
    )
    args = parser.parse_args(argv)
    if not args.dsn:
        print("skipped: no PostgreSQL (`make bench` starts one; or set CHATFLOW_TEST_DATABASE_URL)")
        return 0
    with _base_checkout(args.base) as base:
        result = asyncio.run(main_async(args.dsn, base))
    _show(result["fleets"])
    write_result("capacity", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
