"""The pipeline figure on PostgreSQL: messages per second with 1 and with 3 bot processes.

Each process is a real ``Gateway`` as ``bot/app.py`` builds it on PostgreSQL
(store with its two pools, instance lease, takeover loop), an in-process
adapter with zero latency and a model that answers at once, so the figure is
everything Chatflow adds on top of the LLM and the platform. Clients run a
closed loop (send, wait for the reply, send the next), split evenly over the
processes; all processes start measuring at the same moment.

    make bench                      # runs it with a throwaway PostgreSQL server
    CHATFLOW_TEST_DATABASE_URL=postgresql://... python -m bench.pg_pipeline

Tables go to a fresh schema that is dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import asyncpg  # noqa: E402

from bot.config import Settings  # noqa: E402
from bot.core.agent import Agent  # noqa: E402
from bot.core.messages import Message  # noqa: E402
from bot.core.models.base import ModelResponse, ToolSpec  # noqa: E402
from bot.core.runner import Runner  # noqa: E402
from bot.core.stores.postgres import PostgresSessionStore  # noqa: E402
from bot.gateway.contract import EventHandler, PlatformAdapter, SendResult  # noqa: E402
from bot.gateway.events import MessageEvent, SessionSource  # noqa: E402
from bot.gateway.gateway import Gateway  # noqa: E402
from bot.gateway.instances import InstanceRegistry  # noqa: E402
from bot.gateway.keys import load_or_create_shared_secret  # noqa: E402

SESSIONS = 48
"""Clients in all (split over the processes)."""
WARMUP_SECONDS = 2.0
MEASURE_SECONDS = 6.0


class InstantModel:
    """Answers at once: the model's cost taken out."""

    async def complete(
        self, *, model: str, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelResponse:
        return ModelResponse(content="Sure, done.")


class LoopAdapter(PlatformAdapter):
    """Events straight into the gateway; a send resolves the client's waiter."""

    name = "bench"
    max_text_len = 4096

    def __init__(self) -> None:
        self._on_event: EventHandler | None = None
        self._waiters: dict[str, asyncio.Future[float]] = {}
        self._connected = False

    @property
    def is_connected(self) -> bool:
        return self._connected

    async def start(self, on_event: EventHandler) -> None:
        self._on_event = on_event
        self._connected = True

    async def stop(self) -> None:
        self._connected = False

    async def send(
        self, chat_id: str, text: str, *, thread_id: str | None = None, reply_to: str | None = None
    ) -> SendResult:
        waiter = self._waiters.pop(reply_to or "", None)
        if waiter is not None and not waiter.done():
            waiter.set_result(time.perf_counter())
        return SendResult(message_ids=[secrets.token_hex(4)])

    async def indicate_typing(self, event: MessageEvent) -> None:
        return None

    def format_reply(self, text: str, agent_name: str) -> str:
        return text

    def routes(self) -> Sequence[Any]:
        return []

    async def round_trip(self, event: MessageEvent) -> float:
        assert self._on_event is not None and event.platform_message_id is not None
        waiter: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters[event.platform_message_id] = waiter
        started = time.perf_counter()
        if not await self._on_event(event):
            raise RuntimeError("a fresh message was refused")
        return await waiter - started


def _event(worker: int, session: int, n: int) -> MessageEvent:
    ref = f"{worker}-{session}-{n}"
    return MessageEvent(
        platform="bench",
        message_id=f"bench:{ref}",
        platform_message_id=ref,
        source=SessionSource(
            platform="bench",
            chat_id=f"chat-{worker}-{session}",
            chat_type="dm",
            sender_id=f"user-{worker}-{session}",
        ),
        text="Hello, where is my order?",
    )


async def worker(dsn: str, index: int, sessions: int, start_at: float) -> dict[str, Any]:
    """One bot process: measure from ``start_at`` (wall clock) for MEASURE_SECONDS."""
    settings = Settings(_env_file=None, data_dir=Path("/nonexistent"), database_url=dsn)
    # As bot.database.open_store sizes it: turns hold no connection while the model thinks.
    store = PostgresSessionStore(dsn, max_pool=max(2, settings.database_connections))
    await store.open()
    secret = await load_or_create_shared_secret(store)
    registry = InstanceRegistry(store)
    await registry.start()
    adapter = LoopAdapter()
    runner = Runner(
        Agent(name="Support", instructions="Answer briefly."), store, model=InstantModel()
    )
    gateway = Gateway(runner, store, [adapter], settings, secret=secret, instances=registry)
    await gateway.start()
    await gateway.wait_ready()
    latencies: list[float] = []
    measure_from = start_at
    measure_to = start_at + MEASURE_SECONDS

    async def client(session: int) -> None:
        n = 0
        while time.time() < measure_to:
            n += 1
            latency = await adapter.round_trip(_event(index, session, n))
            if time.time() >= measure_from and time.time() < measure_to:
                latencies.append(latency)

    await asyncio.sleep(max(0.0, start_at - WARMUP_SECONDS - time.time()))
    await asyncio.gather(*(client(s) for s in range(sessions)))
    await gateway.stop(grace=5)
    await registry.stop()
    await store.close()
    return {"messages": len(latencies), "latencies": latencies}


def _with_schema(dsn: str, schema: str) -> str:
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "search_path"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("search_path", schema)])))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def run_level(dsn: str, processes: int) -> dict[str, Any]:
    schema = "bench_" + secrets.token_hex(4)
    conn = await asyncpg.connect(dsn)
    await conn.execute(f"CREATE SCHEMA {schema}")
    await conn.close()
    try:
        target = _with_schema(dsn, schema)
        start_at = time.time() + 3.0 + WARMUP_SECONDS  # time for every process to start
        per = SESSIONS // processes
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--worker",
                str(i),
                "--dsn",
                target,
                "--sessions",
                str(per),
                "--start-at",
                repr(start_at),
                stdout=subprocess.PIPE,
            )
            for i in range(processes)
        ]
        outputs = [await p.communicate() for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError("a worker failed")
        results = [json.loads(out) for out, _ in outputs]
    finally:
        conn = await asyncpg.connect(dsn)
        await conn.execute(f"DROP SCHEMA {schema} CASCADE")
        await conn.close()
    latencies = [x for r in results for x in r["latencies"]]
    messages = sum(r["messages"] for r in results)
    return {
        "processes": processes,
        "clients": per * processes,
        "messages_per_second": round(messages / MEASURE_SECONDS, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2) if latencies else None,
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dsn", default=os.environ.get("CHATFLOW_TEST_DATABASE_URL"))
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sessions", type=int, default=SESSIONS, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.dsn:
        print("skipped: no PostgreSQL (`make bench` starts one; or set CHATFLOW_TEST_DATABASE_URL)")
        return
    if args.worker is not None:
        result = asyncio.run(worker(args.dsn, args.worker, args.sessions, args.start_at))
        print(json.dumps(result))
        return
    rows = [asyncio.run(run_level(args.dsn, n)) for n in args.processes]
    print(f"{'processes':>9} {'clients':>7} {'msg/s':>8} {'p50 ms':>7} {'p99 ms':>7}")
    for row in rows:
        print(
            f"{row['processes']:>9} {row['clients']:>7} {row['messages_per_second']:>8} "
            f"{row['p50_ms']:>7} {row['p99_ms']:>7}"
        )
    out = args.json or ROOT / "bench" / "results" / "pg_pipeline.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpus": os.cpu_count(), "levels": rows}, indent=2))


if __name__ == "__main__":
    main()
