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

Interleaved (``bench.interleave``): a round starts the four together and runs them
one at a time, in turn, 0.2 s each while the others are held (the ``on`` bots'
exporter processes with them), so every variant meets the same machine; each
round starts fresh processes.

Reported: each variant's median round (msg/s); ``on ÷ off``, the median of the
rounds' own ratios (target >= 0.95), and of the totals; ``off ÷ today`` (no
measurable difference: within the rounds' spread); the CPU per message of the
bot's process and of the rest of its group (the exporter); the spans the receiver
decoded per message (so ``on`` is known to have exported); and whether a bot
imported OpenTelemetry (off: never; on: neither, the exporter process does).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
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

from bench.common import ROOT, extract_revision, fmt_num, print_table, write_result
from bench.interleave import CYCLES, SLICE, Spec, run_round

NAME = "tracing"
SESSIONS = 10
ROUNDS = int(os.environ.get("BENCH_TRACING_ROUNDS", "5"))
TARGET = 0.95


class _Receiver(BaseHTTPRequestHandler):
    # Keep-alive, as collectors answer (HTTP/1.0 made the exporter connect, and this
    # receiver start a thread, for every export: twice the CPU of a post on each side).
    protocol_version = "HTTP/1.1"
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


def _round(variants: dict[str, Spec], scratch: Path) -> dict[str, Any]:
    """One interleaved round, and the spans the receiver decoded while it counted."""
    spans_at: list[int] = []
    results: dict[str, Any] = run_round(
        variants, SESSIONS, scratch, measuring=lambda _: spans_at.append(_Receiver.spans)
    )
    results["spans_exported"] = spans_at[1] - spans_at[0]  # the "on" variants' (both)
    return results


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tmp-tracing-") as scratch, _receiver() as endpoint:
        today = _baseline(Path(scratch))
        traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "bench"}
        sampled = {
            **traced,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.1",
        }
        variants = {
            "off": Spec("pipeline", ROOT, {}),
            "on": Spec("pipeline", ROOT, traced),
            "on, 10 %": Spec("pipeline", ROOT, sampled),
        }
        if today is not None:
            variants = {"today": Spec("pipeline", today[0], {}), **variants}
        rounds = [_round(variants, Path(scratch)) for _ in range(ROUNDS)]
    return _report(rounds, variants, today[1] if today else None)


def _report(
    rounds: list[dict[str, Any]],
    variants: dict[str, Spec],
    today_commit: str | None,
) -> int:
    rates = {name: [r[name]["messages_per_s"] for r in rounds] for name in variants}
    middle = {name: statistics.median(values) for name, values in rates.items()}
    cpu = {
        name: statistics.median(r[name]["cpu_ms_per_message"] for r in rounds) for name in variants
    }
    exporter_cpu = {
        name: statistics.median(r[name]["group_cpu_ms_per_message"] for r in rounds)
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
