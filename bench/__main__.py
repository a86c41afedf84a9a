"""``python -m bench [NAME ...]``: every benchmark in a fresh interpreter, then the targets.

Order: ``ceiling`` (the pipeline is compared with it), ``pipeline``,
``stores`` (creates ``.venv-bench`` with the peer libraries on first use),
``growth``. Every benchmark prints its tables and writes
``bench/results/<name>.json``; the last table checks the issue's targets
against those files and is saved as ``bench/results/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.common import RESULTS_DIR, ROOT, machine_info, print_table, read_result

BENCHMARKS = ("ceiling", "pipeline", "stores", "growth", "pg_pipeline")
TIMEOUT_SECONDS = 240
"""Hard stop for one benchmark (each is sized to finish well within 2 minutes)."""


def _run(name: str) -> tuple[bool, float]:
    started = time.perf_counter()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n### bench.{name} (load average {load})", flush=True)
    try:
        done = subprocess.run(
            [sys.executable, "-m", f"bench.{name}"],
            cwd=ROOT,
            timeout=TIMEOUT_SECONDS,
            check=False,
        )
        ok = done.returncode == 0
        if not ok:
            print(f"bench.{name} failed with exit code {done.returncode}", flush=True)
    except subprocess.TimeoutExpired:
        ok = False
        print(f"bench.{name} stopped after {TIMEOUT_SECONDS} s", flush=True)
    elapsed = time.perf_counter() - started
    print(f"### bench.{name}: {elapsed:.0f} s", flush=True)
    return ok, elapsed


def _check(met: bool | None) -> str:
    return "not measured" if met is None else ("met" if met else "MISSED")


def targets() -> list[dict[str, Any]]:
    """The issue's targets, judged from the result files present."""
    rows: list[dict[str, Any]] = []
    pipeline = read_result("pipeline")
    stores = read_result("stores")
    growth = read_result("growth")

    top = None
    if pipeline is not None:
        top = next((lv for lv in pipeline["levels"] if lv["sessions"] == 100), None)
    rate = None if top is None else top["messages_per_s"]
    rows.append(
        {
            "target": "pipeline >= 1,000 msg/s at 100 concurrent sessions",
            "measured": "-" if rate is None else f"{rate:,.0f} msg/s",
            "met": None if rate is None else rate >= 1000,
        }
    )
    ratio = None
    if stores is not None:
        ours = stores["results"].get("ours", {})
        peer = stores["results"].get("openai_agents", {})
        if ours.get("ops_per_s") and peer.get("ops_per_s"):
            ratio = ours["ops_per_s"] / peer["ops_per_s"]
    rows.append(
        {
            "target": "store turns >= 5x openai-agents SQLiteSession",
            "measured": "-" if ratio is None else f"{ratio:.2f}x",
            "met": None if ratio is None else ratio >= 5,
        }
    )
    growth_ratio = None
    if growth is not None:
        by_traffic = {row["traffic_messages"]: row for row in growth["sessions"]}
        if 100 in by_traffic and 100_000 in by_traffic:
            growth_ratio = by_traffic[100_000]["turn_median_ms"] / by_traffic[100]["turn_median_ms"]
    rows.append(
        {
            "target": "load + save of a 100,000-message session <= 1.2x a 100-message one",
            "measured": "-" if growth_ratio is None else f"{growth_ratio:.2f}x",
            "met": None if growth_ratio is None else growth_ratio <= 1.2,
        }
    )
    commits = writing = None
    if top is not None:
        commits, writing = top["commits_per_message"], top["write_commits_per_message"]
    rows.append(
        {
            "target": "<= 4 commits per message on the inbound-to-reply path",
            "measured": "-"
            if commits is None
            else f"{commits:.2f} COMMITs, {writing:.2f} that write",
            "met": None if commits is None else commits <= 4.0 + 1e-6,
        }
    )
    fraction = None if top is None else top.get("fraction_of_ceiling")
    rows.append(
        {
            "target": "pipeline >= 25% of raw commit ceiling / commits per message",
            "measured": "-" if fraction is None else f"{fraction:.1%}",
            "met": None if fraction is None else fraction >= 0.25,
        }
    )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run the named benchmarks (all by default) and print the target summary."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(BENCHMARKS))
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    names = [n for n in BENCHMARKS if n in args.names] if args.names else list(BENCHMARKS)
    machine = machine_info()
    print(
        f"machine: {machine['nproc']} cores, {machine['cpu']}, Python {machine['python']}, "
        f"SQLite {machine['sqlite']}, disk {machine['disk'].get('df', '?')} "
        f"({machine['disk'].get('fstype', '?')}), load average {machine['loadavg']}"
    )
    if machine["loadavg"][0] > 0.5:
        print("note: the machine is busy; figures will be lower and noisier than on an idle one")
    started = time.perf_counter()
    failed: list[str] = []
    durations: dict[str, float] = {}
    for name in names:
        ok, elapsed = _run(name)
        durations[name] = round(elapsed, 1)
        if not ok:
            failed.append(name)
    summary = targets()
    print_table(
        "Targets (issue 9)",
        ["target", "measured", "status"],
        [[row["target"], row["measured"], _check(row["met"])] for row in summary],
    )
    total = time.perf_counter() - started
    print(f"total: {total:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in durations.items())})")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "summary.json").write_text(
        json.dumps(
            {
                "machine": machine,
                "targets": summary,
                "durations_s": durations,
                "total_s": round(total, 1),
                "failed": failed,
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    if failed:
        print(f"failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
