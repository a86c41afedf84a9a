"""Benchmark: what tracing costs the pipeline (issue 40), side by side in one run.

The pipeline of ``bench.pipeline`` (10 closed-loop sessions, instant model, SQLite)
in four variants, each a bot in a process (and process group) of its own:

- ``today``: the code without tracing (``BENCH_TRACING_TODAY``, else ``main`` while
  it has none, else the parent of the commit that added ``bot/tracing``), extracted
  with ``git archive`` (skipped without git history);
- ``off``: this tree with no ``OTEL_*`` set (the shipped default);
- ``on``: this tree exporting every span over OTLP/HTTP to a local receiver on
  127.0.0.1 (in this process, a thread that decodes each export and counts its spans),
  its exporter process in the bot's group;
- ``on, 10 %``: the same with ``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` at 0.1
  (one message in ten traced: what a busy deployment would run).

Interleaved: a round starts the four together, then runs them one at a time, in
turn, ``SLICE`` seconds each while the others are held (``SIGSTOP`` to the group,
exporter included), ``CYCLES`` turns each, the order reversed every other turn. So
every variant meets the same machine, second by second: on a shared machine the
same code's speed drifts by up to ±20 % between runs a few seconds apart, which
swamped a 5 % figure when the variants ran one after another. A variant's rate is
its messages over the time it ran (counted in a shared page the bot writes). Each
round starts fresh processes: one process runs a few % faster than the next on the
same code (its memory's layout).

Reported: each variant's median round (msg/s); ``on ÷ off``, the median of the
rounds' own ratios (target >= 0.95), and of the totals; ``off ÷ today`` (no
measurable difference: within the rounds' spread); the CPU per message of the
bot's process and of the rest of its group (the exporter); the spans the receiver
decoded per message (so ``on`` is known to have exported); and whether a bot
imported OpenTelemetry (off: never; on: neither, the exporter process does).
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from bench.common import ROOT, extract_revision, fmt_num, print_table, write_result

NAME = "tracing"
SESSIONS = 10
ROUNDS = int(os.environ.get("BENCH_TRACING_ROUNDS", "5"))
SLICE = float(os.environ.get("BENCH_TRACING_SLICE", "0.2"))
"""Seconds a variant runs at a turn."""
CYCLES = int(os.environ.get("BENCH_TRACING_CYCLES", "25"))
"""Measured turns of each variant a round (``CYCLES * SLICE`` seconds of it)."""
WARMUP_CYCLES = 5
"""Turns each before the count starts (caches, the exporter's first batches)."""
TARGET = 0.95
_TICKS = os.sysconf("SC_CLK_TCK")
_START_SECONDS = 120.0

_CHILD = """
import asyncio, json, mmap, os, sys
from pathlib import Path
import bench.pipeline as pipeline
import bot
tracing = None
if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
    from bot.tracing.setup import configure
    tracing = configure()
    assert tracing is not None

async def main():
    harness = await pipeline.start_harness(Path(os.environ["BENCH_DIR"]), light=True)
    with open(os.environ["BENCH_COUNTER"], "r+b") as fh:
        page = mmap.mmap(fh.fileno(), 8)
    answered = memoryview(page).cast("Q")
    stop = asyncio.Event()

    async def client(session):
        while not stop.is_set():
            await harness.one_message(session)
            answered[0] += 1

    clients = [asyncio.create_task(client(n)) for n in range(int(sys.argv[1]))]
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    stop.set()
    await asyncio.gather(*clients)
    await harness.close()
    answered.release()
    page.close()

asyncio.run(main())
dropped = 0
if tracing is not None:
    tracing.shutdown()
    dropped = tracing.exporter.dropped
print(json.dumps({"bot": bot.__file__, "dropped": dropped,
                  "otel": any(m.startswith("opentelemetry") for m in sys.modules)}))
"""


class _Receiver(BaseHTTPRequestHandler):
    spans = 0
    exports = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        count = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with _Receiver.lock:
            _Receiver.spans += count
            _Receiver.exports += 1
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@contextmanager
def _receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _untraced(rev: str | None) -> bool:
    """Whether ``rev`` is a commit of this repository without ``bot/tracing``."""
    if not rev:
        return False
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    if found.returncode != 0:
        return False
    traced = subprocess.run(
        ["git", "cat-file", "-e", f"{rev}:bot/tracing/__init__.py"],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return traced.returncode != 0


def _baseline(directory: Path) -> tuple[Path, str] | None:
    """Today's tree, without ``bot/tracing``, extracted into ``directory``: the commit
    ``BENCH_TRACING_TODAY`` names, else ``main`` while it has no tracing yet, else the
    parent of the commit that added ``bot/tracing``."""
    parent = next(
        (rev for rev in (os.environ.get("BENCH_TRACING_TODAY"), "main") if _untraced(rev)),
        None,
    )
    if parent is None:
        try:
            added = subprocess.run(
                ["git", "log", "--diff-filter=A", "--format=%H", "--", "bot/tracing/__init__.py"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout.split()
        except (OSError, subprocess.SubprocessError):
            return None
        if not added:
            return None
        parent = f"{added[-1]}^"
    return extract_revision(parent, directory)


@dataclass
class _Bot:
    """One variant's bot: its process group, its count of answered messages, and what
    it has run so far this round."""

    name: str
    process: subprocess.Popen[str]
    page: mmap.mmap
    messages: int = 0
    seconds: float = 0.0

    @property
    def answered(self) -> int:
        return int.from_bytes(self.page[:8], sys.byteorder)

    def cpu(self) -> tuple[int, int]:
        """Clock ticks of CPU used so far by the bot's process and by the rest of its
        group (the exporter process)."""
        own = others = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", encoding="ascii") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if int(fields[2]) != self.process.pid:
                continue
            used = int(fields[11]) + int(fields[12])
            if int(entry.name) == self.process.pid:
                own += used
            else:
                others += used
        return own, others

    def hold(self) -> None:
        """Stop the group and wait until the bot is stopped (its count then stands)."""
        os.killpg(self.process.pid, signal.SIGSTOP)
        _, status = os.waitpid(self.process.pid, os.WUNTRACED)
        if not os.WIFSTOPPED(status):
            raise RuntimeError(f"the {self.name} bot ended during the run (status {status})")

    def turn(self, seconds: float, *, counted: bool) -> None:
        """Let the group run for ``seconds``, then hold it again."""
        before = self.answered
        started = time.perf_counter()
        os.killpg(self.process.pid, signal.SIGCONT)
        time.sleep(seconds)
        self.hold()
        if counted:
            self.seconds += time.perf_counter() - started
            self.messages += self.answered - before


def _start(name: str, tree: Path, env: dict[str, str], scratch: Path) -> _Bot:
    directory = Path(
        tempfile.mkdtemp(prefix=f"{name.replace(' ', '').replace(',', '')}-", dir=scratch)
    )
    counter = directory / "answered"
    counter.write_bytes(bytes(8))
    keep = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    with (directory / "stderr").open("w") as errors:
        process = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(SESSIONS)],
            cwd=tree,
            env={
                **keep,
                "PYTHONPATH": str(tree),
                "BENCH_DIR": str(directory),
                "BENCH_COUNTER": str(counter),
                **env,
            },
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            start_new_session=True,  # its own group: held and resumed with its exporter
        )
    with counter.open("r+b") as fh:
        page = mmap.mmap(fh.fileno(), 8)
    bot = _Bot(name, process, page)
    if not _ready(process, _START_SECONDS):
        _kill(bot)
        raise RuntimeError(f"the {name} bot did not start:\n{_stderr(directory)}")
    bot.hold()
    return bot


def _ready(process: subprocess.Popen[str], seconds: float) -> bool:
    """Whether the bot says it is ready within ``seconds`` (its first line)."""
    said: list[str] = []
    assert process.stdout is not None
    stdout = process.stdout
    # A thread, for the timeout: it ends with the process's stdout if it never says.
    reader = threading.Thread(target=lambda: said.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(seconds)
    return bool(said) and said[0].strip() == "ready"


def _stderr(directory: Path) -> str:
    try:
        return (directory / "stderr").read_text(encoding="utf-8", errors="replace")[-2000:]
    except OSError:
        return ""


def _kill(bot: _Bot) -> None:
    """End a bot and its exporter whatever state they are in."""
    with suppress(ProcessLookupError):
        os.killpg(bot.process.pid, signal.SIGKILL)
    bot.process.wait(30)
    bot.page.close()


def _finish(bot: _Bot, tree: Path) -> dict[str, Any]:
    """Let the bot stop on its own (its exporter flushed) and read its report."""
    os.killpg(bot.process.pid, signal.SIGCONT)
    out, _ = bot.process.communicate("stop\n", timeout=120)
    bot.page.close()
    if bot.process.returncode != 0:
        raise RuntimeError(f"the {bot.name} bot failed (exit {bot.process.returncode})")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if not result["bot"].startswith(str(tree)):
        raise RuntimeError(f"the {bot.name} bot imported another tree's bot: {result['bot']}")
    return result


def _round(variants: dict[str, tuple[Path, dict[str, str]]], scratch: Path) -> dict[str, Any]:
    """One round: the variants started together, run in turn, each's rate and CPU."""
    bots: dict[str, _Bot] = {}
    try:
        for name, (tree, env) in variants.items():
            bots[name] = _start(name, tree, env, scratch)
        order = list(bots.values())
        for _ in range(WARMUP_CYCLES):
            for bot in order:
                bot.turn(SLICE, counted=False)
        spans_before = _Receiver.spans
        cpu_before = {name: bot.cpu() for name, bot in bots.items()}
        for cycle in range(CYCLES):
            for bot in order if cycle % 2 == 0 else reversed(order):
                bot.turn(SLICE, counted=True)
        cpu_after = {name: bot.cpu() for name, bot in bots.items()}
        exported = _Receiver.spans - spans_before  # the "on" variants' (both)
        results: dict[str, Any] = {}
        for name, bot in bots.items():
            (own_0, others_0), (own_1, others_1) = cpu_before[name], cpu_after[name]
            results[name] = {
                "messages": bot.messages,
                "seconds": bot.seconds,
                "messages_per_s": bot.messages / bot.seconds,
                "cpu_ms_per_message": (own_1 - own_0) / _TICKS / bot.messages * 1000,
                "exporter_cpu_ms_per_message": (others_1 - others_0) / _TICKS / bot.messages * 1000,
            }
        for name in list(bots):
            results[name].update(_finish(bots[name], variants[name][0]))
            del bots[name]  # ended: nothing left for the clean-up below
        results["spans_exported"] = exported
        return results
    finally:
        for bot in bots.values():
            _kill(bot)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tmp-tracing-") as scratch, _receiver() as endpoint:
        today = _baseline(Path(scratch))
        traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "bench"}
        sampled = {
            **traced,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.1",
        }
        variants: dict[str, tuple[Path, dict[str, str]]] = {
            "off": (ROOT, {}),
            "on": (ROOT, traced),
            "on, 10 %": (ROOT, sampled),
        }
        if today is not None:
            variants = {"today": (today[0], {}), **variants}
        rounds = [_round(variants, Path(scratch)) for _ in range(ROUNDS)]
    return _report(rounds, variants, today[1] if today else None)


def _report(
    rounds: list[dict[str, Any]],
    variants: dict[str, tuple[Path, dict[str, str]]],
    today_commit: str | None,
) -> int:
    rates = {name: [r[name]["messages_per_s"] for r in rounds] for name in variants}
    middle = {name: statistics.median(values) for name, values in rates.items()}
    cpu = {
        name: statistics.median(r[name]["cpu_ms_per_message"] for r in rounds) for name in variants
    }
    exporter_cpu = {
        name: statistics.median(r[name]["exporter_cpu_ms_per_message"] for r in rounds)
        for name in variants
    }
    per_round = [r["on"]["messages_per_s"] / r["off"]["messages_per_s"] for r in rounds]
    ratio = statistics.median(per_round)
    of_totals = sum(r["on"]["messages"] for r in rounds) / sum(r["on"]["seconds"] for r in rounds)
    of_totals /= sum(r["off"]["messages"] for r in rounds) / sum(
        r["off"]["seconds"] for r in rounds
    )
    sampled_ratio = statistics.median(
        r["on, 10 %"]["messages_per_s"] / r["off"]["messages_per_s"] for r in rounds
    )
    off_today = (
        statistics.median(r["off"]["messages_per_s"] / r["today"]["messages_per_s"] for r in rounds)
        if "today" in variants
        else None
    )
    print_table(
        f"Pipeline with tracing ({SESSIONS} sessions; {ROUNDS} rounds of {CYCLES} interleaved "
        f"turns of {SLICE:g} s each)",
        ["variant", "msg/s", "rounds", "bot CPU/msg", "exporter CPU/msg"],
        [
            [
                name,
                fmt_num(middle[name]),
                ", ".join(fmt_num(v) for v in rates[name]),
                f"{cpu[name]:.3f} ms",
                f"{exporter_cpu[name]:.3f} ms",
            ]
            for name in variants
        ],
    )
    print(
        f"on / off = {ratio:.3f}, median of the rounds' (target >= {TARGET}; rounds "
        f"{', '.join(f'{r:.3f}' for r in per_round)}; of the totals {of_totals:.3f}); "
        f"10 % sampled / off = {sampled_ratio:.3f}"
    )
    if off_today is not None:
        print(f"off / today = {off_today:.3f} (today = {today_commit})")
    on_messages = sum(r["on"]["messages"] + r["on, 10 %"]["messages"] / 10 for r in rounds)
    exported = sum(r["spans_exported"] for r in rounds)
    dropped = sum(r[name]["dropped"] for r in rounds for name in ("on", "on, 10 %"))
    print(
        f"spans received while measuring: {exported} (about {exported / max(on_messages, 1):.1f} "
        f"per traced message), dropped: {dropped}"
    )
    otel_off = any(r[name]["otel"] for r in rounds for name in ("off", "today") if name in r)
    if otel_off:
        print("warning: OpenTelemetry was imported with tracing off")
    write_result(
        NAME,
        {
            "sessions": SESSIONS,
            "rounds": ROUNDS,
            "cycles": CYCLES,
            "slice_seconds": SLICE,
            "messages_per_s": middle,
            "rounds_messages_per_s": rates,
            "on_over_off": ratio,
            "on_over_off_per_round": per_round,
            "on_over_off_of_totals": of_totals,
            "sampled_10_percent_over_off": sampled_ratio,
            "off_over_today": off_today,
            "today_commit": today_commit,
            "spans_per_traced_message": exported / max(on_messages, 1),
            "spans_dropped_on": dropped,
            "cpu_ms_per_message": cpu,
            "exporter_cpu_ms_per_message": exporter_cpu,
            "otel_imported_when_off": otel_off,
            "otel_imported_in_the_bot_when_on": any(r["on"]["otel"] for r in rounds),
        },
    )
    return 0  # the target is checked in the summary (python -m bench)


if __name__ == "__main__":
    sys.exit(main())
