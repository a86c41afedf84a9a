"""Benchmark: what tracing costs the pipeline (issue 40), side by side in one run.

The pipeline of ``bench.pipeline`` (10 closed-loop sessions, instant model, SQLite)
in four variants, each in a fresh interpreter, rounds alternating:

- ``today``: the code without tracing (``BENCH_TRACING_TODAY``, else ``main`` while
  it has none, else the parent of the commit that added ``bot/tracing``), extracted
  with ``git archive`` (skipped without git history);
- ``off``: this tree with no ``OTEL_*`` set (the shipped default);
- ``on``: this tree exporting every span over OTLP/HTTP to a local receiver on
  127.0.0.1 (in this process, a thread that decodes each export and counts its spans);
- ``on, 10 %``: the same with ``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` at 0.1
  (one message in ten traced: what a busy deployment would run).

Reported: the median round's messages/s of each (``BENCH_TRACING_ROUNDS`` rounds,
5 by default); ``on ÷ off``, the median of the rounds' own ratios (each round's
``on`` runs right after its ``off``, so a change in the machine's load between
rounds cancels out; target >= 0.95), and the ratio of the medians; ``off ÷ today``
(no measurable difference: within the rounds' own spread); the spans the receiver
decoded per message (so ``on`` is known to have exported); and whether the bot's
process imported OpenTelemetry (off: never; on: neither, the exporter process does).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from bench.common import ROOT, fmt_num, print_table, write_result

NAME = "tracing"
SESSIONS = 10
ROUNDS = int(os.environ.get("BENCH_TRACING_ROUNDS", "5"))
TARGET = 0.95

_CHILD = """
import asyncio, json, os, sys, tempfile
from pathlib import Path
import bench.pipeline as pipeline
import bot
pipeline.WARMUP_SECONDS = float(os.environ["BENCH_WARMUP"])
pipeline.MEASURE_SECONDS = float(os.environ["BENCH_MEASURE"])
tracing = None
if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
    from bot.tracing.setup import configure
    tracing = configure()
    assert tracing is not None
with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as directory:
    level = asyncio.run(pipeline.measure_level(Path(directory), int(sys.argv[1]), light=True))
dropped = 0
if tracing is not None:
    tracing.shutdown()  # waits for the exporter process: its CPU joins os.times()'s children
    dropped = tracing.exporter.dropped
times = os.times()
print(json.dumps({"level": level, "bot": bot.__file__, "dropped": dropped,
                  "exporter_cpu_s": times.children_user + times.children_system,
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
    """Today's tree, without ``bot/tracing``, extracted into ``directory``: the branch
    ``BENCH_TRACING_TODAY`` names, else ``main`` while it has no tracing yet, else the
    parent of the commit that added ``bot/tracing``."""
    try:
        parent = next(
            (rev for rev in (os.environ.get("BENCH_TRACING_TODAY"), "main") if _untraced(rev)),
            None,
        )
        if parent is None:
            added = subprocess.run(
                ["git", "log", "--diff-filter=A", "--format=%H", "--", "bot/tracing/__init__.py"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout.split()
            if not added:
                return None
            parent = f"{added[-1]}^"
        archive = directory / "today.tar"
        with archive.open("wb") as out:
            subprocess.run(
                ["git", "archive", parent, "bot", "bench"],
                cwd=ROOT,
                stdout=out,
                timeout=120,
                check=True,
            )
        tree = directory / "today"
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        commit = subprocess.run(
            ["git", "rev-parse", "--short", parent],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        return tree, commit
    except (OSError, subprocess.SubprocessError, tarfile.TarError):
        return None


def _measure(tree: Path, env: dict[str, str]) -> dict[str, Any]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(SESSIONS)],
        cwd=tree,
        env={**keep, "PYTHONPATH": str(tree), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pipeline run failed in {tree}:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["bot"].startswith(str(tree)):
        raise RuntimeError(f"the run in {tree} imported another tree's bot: {result['bot']}")
    return result


def main() -> int:
    warmup, measure = os.environ.get("BENCH_WARMUP", "1"), os.environ.get("BENCH_MEASURE", "4")
    with tempfile.TemporaryDirectory(prefix="tmp-tracing-") as scratch, _receiver() as endpoint:
        base = {"BENCH_WARMUP": warmup, "BENCH_MEASURE": measure, "BENCH_TMP": scratch}
        today = _baseline(Path(scratch))
        traced = {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "bench"}
        sampled = {
            **traced,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.1",
        }
        variants: dict[str, tuple[Path, dict[str, str]]] = {
            "off": (ROOT, base),
            "on": (ROOT, traced),
            "on, 10 %": (ROOT, sampled),
        }
        if today is not None:
            variants = {"today": (today[0], base), **variants}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        exported = 0
        for _ in range(ROUNDS):
            for name, (tree, env) in variants.items():
                before = _Receiver.spans
                result = _measure(tree, env)
                result["spans"] = _Receiver.spans - before
                runs[name].append(result)
                if name == "on":
                    exported += result["spans"]
    middle = {
        name: statistics.median(r["level"]["messages_per_s"] for r in rs)
        for name, rs in runs.items()
    }
    spread = {
        name: [round(r["level"]["messages_per_s"], 1) for r in rs] for name, rs in runs.items()
    }
    on_messages = sum(
        r["level"]["messages"] for r in runs["on"]
    )  # measured messages only: warm-up spans are exported too, so the ratio is an upper bound
    per_round = [
        on["level"]["messages_per_s"] / off["level"]["messages_per_s"]
        for on, off in zip(runs["on"], runs["off"], strict=True)
    ]
    ratio = statistics.median(per_round)
    of_medians = middle["on"] / middle["off"]
    off_today = middle["off"] / middle["today"] if "today" in middle else None
    rows = [
        [name, fmt_num(middle[name]), ", ".join(fmt_num(v) for v in spread[name])]
        for name in middle
    ]
    print_table(
        f"Pipeline with tracing ({SESSIONS} sessions, median of {ROUNDS} rounds)",
        ["variant", "msg/s", "rounds"],
        rows,
    )
    sampled_ratio = middle["on, 10 %"] / middle["off"]
    print(
        f"on / off = {ratio:.3f}, median of the rounds' (target >= {TARGET}; rounds "
        f"{', '.join(f'{r:.3f}' for r in per_round)}; of the medians {of_medians:.3f}); "
        f"10 % sampled / off = {sampled_ratio:.3f}"
    )
    if off_today is not None:
        print(f"off / today = {off_today:.3f} (today = {today[1] if today else '?'})")
    dropped = sum(r["dropped"] for r in runs["on"])
    cpu = {
        name: statistics.median(r["level"]["cpu_ms_per_message"] for r in rs)
        for name, rs in runs.items()
    }
    exporter_us_per_span = statistics.median(
        r["exporter_cpu_s"] / r["spans"] * 1e6 for r in runs["on"] if r["spans"]
    )
    print(
        "CPU of the bot's process per message (median, ms): "
        + ", ".join(f"{name} {value:.3f}" for name, value in cpu.items())
        + f"; the exporter process: {exporter_us_per_span:.0f} us a span"
    )
    print(
        f"spans received while on: {exported} ({exported / max(on_messages, 1):.1f} per "
        f"measured message, warm-up included), dropped: {dropped}"
    )
    if any(r["otel"] for name in ("off", "today") if name in runs for r in runs[name]):
        print("warning: OpenTelemetry was imported with tracing off")
    write_result(
        NAME,
        {
            "sessions": SESSIONS,
            "rounds": ROUNDS,
            "messages_per_s": middle,
            "rounds_messages_per_s": spread,
            "on_over_off": ratio,
            "on_over_off_per_round": per_round,
            "on_over_off_of_medians": of_medians,
            "sampled_10_percent_over_off": sampled_ratio,
            "off_over_today": off_today,
            "today_commit": today[1] if today else None,
            "spans_per_message_on": exported / max(on_messages, 1),
            "spans_dropped_on": dropped,
            "cpu_ms_per_message": cpu,
            "exporter_cpu_us_per_span": exporter_us_per_span,
            "otel_imported_when_off": any(r["otel"] for r in runs["off"]),
            "otel_imported_in_the_bot_when_on": any(r["otel"] for r in runs["on"]),
        },
    )
    return 0  # the target is checked in the summary (python -m bench)


if __name__ == "__main__":
    sys.exit(main())
