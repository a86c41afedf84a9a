"""Benchmark 1: the whole path of a message, with the model's cost taken out.

inbound event -> ``Inbox.accept`` (tx 1) -> dispatcher -> ``Runner`` with an
instant model -> turn commit (tx 2) -> ledger ``mark_attempting`` -> send
through an in-process adapter -> ``mark_delivered``. SQLite on disk in WAL,
``synchronous=NORMAL``, settings as shipped (``Settings()`` defaults, so
``MAX_CONCURRENT_TURNS=8``).

N sessions each run a closed loop: send a message, wait for its reply, send
the next; each level runs twice (alternating) and the faster round is
reported. Latency is from the adapter handing the event to the gateway to
the gateway calling ``adapter.send`` for its reply: everything the bot adds
on top of the LLM. Commits are counted from SQLite's statement trace
(``bench.common.CommitCounter``); fsyncs by running the same loop under
``strace -f -c`` twice (N messages and 0 messages) and dividing the difference.

``python -m bench.pipeline`` runs the full benchmark; ``--probe N`` is the
fixed-count loop the fsync count runs under strace.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    CommitCounter,
    InstantModel,
    bench_tmpdir,
    fmt_num,
    median,
    percentile,
    print_table,
    read_result,
    write_result,
)
from bot.config import Settings
from bot.core.agent import Agent
from bot.core.runner import Runner
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.contract import EventHandler, PlatformAdapter, SendResult
from bot.gateway.events import MessageEvent, SessionSource
from bot.gateway.gateway import Gateway
from bot.heap import settle_after_start

NAME = "pipeline"
LEVELS = (1, 10, 100)
WARMUP_SECONDS = 1.5
MEASURE_SECONDS = 5.0
ROUNDS = 2
PROBE_MESSAGES = 3000
PROBE_SESSIONS = 10


class BenchAdapter(PlatformAdapter):
    """An in-process platform: events go straight to the gateway, sends resolve waiters."""

    name = "bench"
    max_text_len = 4096

    def __init__(self) -> None:
        self._on_event: EventHandler | None = None
        self._connected = False
        self._waiters: dict[str, asyncio.Future[float]] = {}
        self.sent = 0

    @property
    def is_connected(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._connected

    async def start(self, on_event: EventHandler) -> None:
        """Remember the gateway's entry point."""
        self._on_event = on_event
        self._connected = True

    async def stop(self) -> None:
        """Stop 'delivering'."""
        self._connected = False

    async def deliver(self, event: MessageEvent) -> bool:
        """Hand ``event`` to the gateway as a webhook would; True once accepted."""
        assert self._on_event is not None, "adapter not started"
        return await self._on_event(event)

    def expect(self, platform_message_id: str) -> asyncio.Future[float]:
        """A future resolved with the time the reply to ``platform_message_id`` is sent."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters[platform_message_id] = future
        return future

    async def send(
        self,
        chat_id: str,
        text: str,
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Record the send instantly (a platform with zero latency)."""
        now = time.perf_counter()
        self.sent += 1
        waiter = self._waiters.pop(reply_to or "", None)
        if waiter is not None and not waiter.done():
            waiter.set_result(now)
        return SendResult(message_ids=[f"out-{self.sent}"])

    async def indicate_typing(self, event: MessageEvent) -> None:
        """Nothing to show."""

    def format_reply(self, text: str, agent_name: str) -> str:
        """Replies go out unchanged."""
        return text

    def routes(self) -> Sequence[Any]:
        """No HTTP routes."""
        return []


@dataclass
class Harness:
    """A started gateway on a fresh database, with its adapter and commit counter."""

    gateway: Gateway
    store: SQLiteSessionStore
    adapter: BenchAdapter
    counter: CommitCounter
    settings: Settings
    seq: dict[int, int] = field(default_factory=dict)

    def event(self, session: int) -> MessageEvent:
        """The next inbound message of client ``session``."""
        n = self.seq.get(session, 0) + 1
        self.seq[session] = n
        ref = f"{session}-{n}"
        return MessageEvent(
            platform="bench",
            message_id=f"bench:{session}:{n}",
            platform_message_id=ref,
            source=SessionSource(
                platform="bench",
                chat_id=f"chat-{session}",
                chat_type="dm",
                sender_id=f"user-{session}",
            ),
            text="Hello, where is my order?",
        )

    async def one_message(self, session: int) -> float:
        """Deliver one message and wait for its reply; return the added latency (s)."""
        event = self.event(session)
        assert event.platform_message_id is not None
        reply = self.adapter.expect(event.platform_message_id)
        started = time.perf_counter()
        if not await self.adapter.deliver(event):
            raise RuntimeError("the gateway refused a fresh message")
        sent_at = await reply
        return sent_at - started

    async def close(self) -> None:
        """Stop the gateway and close the store."""
        await self.gateway.stop(grace=10)
        await self.store.close()


async def start_harness(directory: Path, *, light: bool = False) -> Harness:
    """A gateway as ``bot/app.py`` builds it, on ``directory/chatflow.db``.

    ``light``: count commits and hops without a trace callback (no breakdown by kind).
    """
    settings = Settings(_env_file=None, data_dir=directory)
    store = SQLiteSessionStore(str(settings.database_path), default_max_turns=settings.max_turns)
    counter = CommitCounter(light=light)
    await counter.attach(store)
    agent = Agent(name="Support", instructions="Answer briefly.")
    runner = Runner(agent, store, model=InstantModel())
    adapter = BenchAdapter()
    gateway = Gateway(runner, store, [adapter], settings, secret=b"bench-installation-secret")
    await gateway.start()
    await gateway.wait_ready()
    settle_after_start()  # as `bot run` does once started
    return Harness(gateway, store, adapter, counter, settings)


async def _closed_loop(harness: Harness, sessions: int, seconds: float) -> tuple[int, list[float]]:
    """Run ``sessions`` clients for ``seconds``; return messages answered and latencies."""
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def client(session: int) -> None:
        while time.perf_counter() < stop_at:
            latencies.append(await harness.one_message(session))

    await asyncio.gather(*(client(i) for i in range(sessions)))
    return len(latencies), latencies


def _bytes_written() -> int:
    """Bytes this process passed to write() so far (``wchar`` of /proc/self/io), or -1."""
    try:
        with open("/proc/self/io", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return -1


async def measure_level(directory: Path, sessions: int, *, light: bool = False) -> dict[str, Any]:
    """Warm up, then measure ``sessions`` concurrent closed-loop sessions (``light``: see
    ``start_harness``)."""
    harness = await start_harness(directory, light=light)
    try:
        await _closed_loop(harness, sessions, WARMUP_SECONDS)
        await harness.gateway._dispatcher.drain(30)
        harness.counter.reset()
        written_before = _bytes_written()
        cpu_started = os.times()
        started = time.perf_counter()
        count, latencies = await _closed_loop(harness, sessions, MEASURE_SECONDS)
        elapsed = time.perf_counter() - started
        # mark_delivered of the last replies belongs to these messages too.
        await harness.gateway._dispatcher.drain(30)
        cpu_ended = os.times()
        cpu_user = cpu_ended.user - cpu_started.user
        cpu_system = cpu_ended.system - cpu_started.system
        cpu = cpu_user + cpu_system
        written_after = _bytes_written()
        written = written_after - written_before if min(written_before, written_after) >= 0 else -1
        counts = harness.counter.snapshot()
        settings = harness.settings
    finally:
        await harness.close()
    return {
        "sessions": sessions,
        "messages": count,
        "seconds": round(elapsed, 3),
        "messages_per_s": count / elapsed,
        "latency_p50_ms": percentile(latencies, 50) * 1000,
        "latency_p99_ms": percentile(latencies, 99) * 1000,
        "latency_median_ms": median(latencies) * 1000,
        "commits_per_message": counts["commits"] / count,
        "write_commits_per_message": counts["write_commits"] / count,
        "statements_per_message": counts["statements"] / count,
        "round_trips_per_message": counts["round_trips"] / count,
        "cpu_ms_per_message": cpu / count * 1000,
        "cpu_user_ms_per_message": cpu_user / count * 1000,
        "cpu_system_ms_per_message": cpu_system / count * 1000,
        "kb_written_per_message": written / count / 1024 if written >= 0 else None,
        "cpu_utilisation": cpu / elapsed,
        "connection_held_ms_per_message": sum(counts["held_by_label"].values()) / count * 1000,
        "connection_held_ms_by_kind_per_message": {
            k: v / count * 1000 for k, v in counts["held_by_label"].items()
        },
        "commits_by_kind_per_message": {k: v / count for k, v in counts["by_label"].items()},
        "write_commits_by_kind_per_message": {
            k: v / count for k, v in counts["writes_by_label"].items()
        },
        "rollbacks": counts["rollbacks"],
        "max_concurrent_turns": settings.max_concurrent_turns,
    }


# -- fsyncs ---------------------------------------------------------------------------


async def probe(messages: int, sessions: int, directory: Path) -> None:
    """Start a gateway and push ``messages`` through it (the strace'd workload)."""
    harness = await start_harness(directory)
    try:
        per_session = [
            messages // sessions + (1 if i < messages % sessions else 0) for i in range(sessions)
        ]

        async def client(session: int) -> None:
            for _ in range(per_session[session]):
                await harness.one_message(session)

        await asyncio.gather(*(client(i) for i in range(sessions)))
        await harness.gateway._dispatcher.drain(30)
    finally:
        await harness.close()


_TRACED = "trace=fsync,fdatasync,sync_file_range"
_STRACE_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")


def _strace_calls(report: str) -> dict[str, int]:
    calls: dict[str, int] = {}
    for line in report.splitlines():
        match = _STRACE_ROW.match(line)
        if match and match.group(2) != "total":
            calls[match.group(2)] = int(match.group(1))
    return calls


def _seccomp_supported(strace: str) -> bool:
    """Whether this strace has ``--seccomp-bpf`` (5.3+) and may use it here."""
    try:
        done = subprocess.run(
            [strace, "-f", "--seccomp-bpf", "-c", "-o", os.devnull, "-e", _TRACED, "true"],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _strace_run(strace: str, extra: list[str], messages: int, directory: Path) -> dict[str, int]:
    target = directory / f"probe-{messages}"
    with tempfile.NamedTemporaryFile("r", suffix=".strace", dir=directory) as out:
        command = [
            strace,
            "-f",
            *extra,
            "-c",
            "-o",
            out.name,
            "-e",
            _TRACED,
            sys.executable,
            "-m",
            "bench.pipeline",
            "--probe",
            str(messages),
            "--dir",
            str(target),
        ]
        subprocess.run(command, cwd=ROOT, check=True, timeout=150, capture_output=True)
        return _strace_calls(out.read())


def measure_fsyncs(directory: Path) -> dict[str, Any]:
    """fsync + fdatasync calls per message, or why they were not measured."""
    strace = shutil.which("strace")
    if strace is None:
        return {"measured": False, "why": "strace is not installed"}
    # --seccomp-bpf stops only at the traced calls; plain ptrace stops at every
    # syscall and slows the run about tenfold, so it gets a shorter run.
    fast = _seccomp_supported(strace)
    extra = ["--seccomp-bpf"] if fast else []
    messages = PROBE_MESSAGES if fast else PROBE_MESSAGES // 3
    try:
        loaded = _strace_run(strace, extra, messages, directory)
        idle = _strace_run(strace, extra, 0, directory)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"measured": False, "why": f"strace failed: {exc}"}
    names = ("fsync", "fdatasync", "sync_file_range")
    with_load = sum(loaded.get(n, 0) for n in names)
    without = sum(idle.get(n, 0) for n in names)
    return {
        "measured": True,
        "messages": messages,
        "sessions": PROBE_SESSIONS,
        "syncs_with_messages": loaded,
        "syncs_without_messages": idle,
        "fsyncs_per_message": max(with_load - without, 0) / messages,
    }


# -- main -----------------------------------------------------------------------------


_PATH_ORDER = (
    "accept (tx 1)",
    "load session",
    "turn commit (tx 2)",
    "mark attempting",
    "mark delivered",
)


def _kind_rows(level: dict[str, Any]) -> list[list[str]]:
    """Per-transaction rows in path order; rare kinds (start-up, retry poll) folded."""
    commits = level["commits_by_kind_per_message"]
    writes = level["write_commits_by_kind_per_message"]
    held = level["connection_held_ms_by_kind_per_message"]
    rows = [
        [
            kind,
            fmt_num(commits.get(kind, 0.0), 3),
            fmt_num(writes.get(kind, 0.0), 3),
            fmt_num(held.get(kind, 0.0), 3),
        ]
        for kind in _PATH_ORDER
    ]
    rest = [kind for kind in commits if kind not in _PATH_ORDER]
    rows.append(
        [
            "other (start-up, retry poll)",
            fmt_num(sum(commits[k] for k in rest), 3),
            fmt_num(sum(writes.get(k, 0.0) for k in rest), 3),
            fmt_num(sum(held.get(k, 0.0) for k in rest), 3),
        ]
    )
    rows.append(
        [
            "total",
            fmt_num(level["commits_per_message"], 3),
            fmt_num(level["write_commits_per_message"], 3),
            fmt_num(level["connection_held_ms_per_message"], 3),
        ]
    )
    return rows


async def run() -> dict[str, Any]:
    """Every level, the fsync probe, the tables and the result file."""
    rounds: dict[int, list[dict[str, Any]]] = {sessions: [] for sessions in LEVELS}
    with bench_tmpdir(NAME) as directory:
        # Levels alternate over the rounds; outside load only ever slows a round
        # down, so the faster round of each level is reported (both are kept).
        for round_number in range(ROUNDS):
            for sessions in LEVELS:
                level_dir = directory / f"level-{sessions}-{round_number}"
                level_dir.mkdir()
                rounds[sessions].append(await measure_level(level_dir, sessions))
        fsyncs = await asyncio.to_thread(measure_fsyncs, directory)
    levels = []
    for sessions in LEVELS:
        best = dict(max(rounds[sessions], key=lambda level: float(level["messages_per_s"])))
        best["rounds_messages_per_s"] = [round(r["messages_per_s"], 1) for r in rounds[sessions]]
        levels.append(best)

    ceiling = read_result("ceiling")
    ceiling_rate = None if ceiling is None else ceiling.get("normal", {}).get("commits_per_s")
    fsync_text = f"{fsyncs['fsyncs_per_message']:.3f}" if fsyncs["measured"] else "not measured"
    rows = []
    for level in levels:
        fraction = None
        if ceiling_rate:
            fraction = level["messages_per_s"] * level["write_commits_per_message"] / ceiling_rate
            level["fraction_of_ceiling"] = fraction
        rows.append(
            [
                level["sessions"],
                fmt_num(level["messages_per_s"]),
                fmt_num(level["latency_p50_ms"], 2),
                fmt_num(level["latency_p99_ms"], 2),
                fmt_num(level["commits_per_message"], 2),
                fmt_num(level["write_commits_per_message"], 2),
                fsync_text,
                fmt_num(level["kb_written_per_message"], 1),
                f"{level['cpu_ms_per_message']:.2f} ({level['cpu_user_ms_per_message']:.2f}"
                f"+{level['cpu_system_ms_per_message']:.2f})",
                "-" if fraction is None else f"{fraction:.1%}",
            ]
        )
    print_table(
        "Pipeline: inbound -> accept -> turn (instant model) -> commit -> send "
        f"(WAL, synchronous=NORMAL, MAX_CONCURRENT_TURNS={levels[0]['max_concurrent_turns']})",
        [
            "sessions",
            "msg/s",
            "p50 ms",
            "p99 ms",
            "commits/msg",
            "writing/msg",
            "fsyncs/msg",
            "KB written/msg",
            "CPU ms/msg (user+sys)",
            "of ceiling",
        ],
        rows,
    )
    top = levels[-1]
    print_table(
        f"Pipeline: transactions per message at {top['sessions']} sessions "
        "(held = BEGIN..COMMIT on the store's one connection)",
        ["transaction", "commits/msg", "writing/msg", "held ms/msg"],
        _kind_rows(top),
    )
    print(
        f"per message: {top['statements_per_message']:.1f} SQL statements, "
        f"{top['round_trips_per_message']:.1f} round trips to aiosqlite's thread"
    )
    if not fsyncs["measured"]:
        print(f"fsyncs not measured: {fsyncs['why']}")
    if ceiling_rate is None:
        print("'of ceiling' needs results/ceiling.json: run `python -m bench.ceiling` first")
    payload = {
        "settings": {
            "journal_mode": "wal",
            "synchronous": "NORMAL",
            "max_concurrent_turns": levels[0]["max_concurrent_turns"],
            "warmup_seconds": WARMUP_SECONDS,
            "measure_seconds": MEASURE_SECONDS,
            "rounds": ROUNDS,
        },
        "levels": levels,
        "fsyncs": fsyncs,
        "ceiling_commits_per_s": ceiling_rate,
        "how": {
            "commits": "SQLite trace callback on the store's connection: COMMIT statements; "
            "'writing' = transactions whose total_changes moved",
            "fsyncs": "strace -f -c of an N-message run (10 sessions) minus a 0-message run, "
            "divided by N",
            "latency": "adapter hands the event to the gateway -> gateway calls adapter.send",
            "fraction_of_ceiling": "msg/s x writing commits/msg / raw single-row commit ceiling",
            "cpu": "process CPU time (os.times, all threads, user + system) over the "
            "measurement / messages",
            "written": "wchar of /proc/self/io (bytes handed to write(): WAL frames and "
            "checkpoints) / messages",
        },
    }
    write_result(NAME, payload)
    return payload


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: ``python -m bench.pipeline [--probe N --dir D]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--probe", type=int, default=None, help="push N messages and exit")
    parser.add_argument("--dir", type=Path, default=None, help="database directory for --probe")
    args = parser.parse_args(argv)
    if args.probe is not None:
        directory = args.dir or Path(tempfile.mkdtemp())
        directory.mkdir(parents=True, exist_ok=True)
        asyncio.run(probe(args.probe, PROBE_SESSIONS, directory))
        return
    asyncio.run(run())


if __name__ == "__main__":
    main()
