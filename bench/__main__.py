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
from bench.floor import targets as floor_targets

BENCHMARKS = (
    "ceiling",
    "pipeline",
    "stores",
    "growth",
    "pg_pipeline",
    "streaming",
    "floor",
    "prompt_cost",
    "compaction_cost",
    "realistic",
    "tracing",
    "knowledge",
    "capacity",
)
TIMEOUT_SECONDS = 240
"""Hard stop for one benchmark (each is sized to finish well within 2 minutes)."""
LONG_TIMEOUTS = {"floor": 420, "capacity": 420}
"""Benchmarks that repeat themselves in fresh interpreters (floor: 18 runs of ~7.5 s)."""


def _run(name: str) -> tuple[bool, float]:
    started = time.perf_counter()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n### bench.{name} (load average {load})", flush=True)
    try:
        done = subprocess.run(
            [sys.executable, "-m", f"bench.{name}"],
            cwd=ROOT,
            timeout=LONG_TIMEOUTS.get(name, TIMEOUT_SECONDS),
            check=False,
        )
        ok = done.returncode == 0
        if not ok:
            print(f"bench.{name} failed with exit code {done.returncode}", flush=True)
    except subprocess.TimeoutExpired:
        ok = False
        print(
            f"bench.{name} stopped after {LONG_TIMEOUTS.get(name, TIMEOUT_SECONDS)} s", flush=True
        )
    elapsed = time.perf_counter() - started
    print(f"### bench.{name}: {elapsed:.0f} s", flush=True)
    return ok, elapsed


def _check(met: bool | None) -> str:
    return "not measured" if met is None else ("PASS" if met else "MISS")


def _row(target: str, value: float | None, fmt: str, met: bool | None) -> dict[str, Any]:
    return {
        "target": target,
        "measured": "-" if value is None else fmt.format(value),
        "met": met,
    }


def _floor_rows() -> list[dict[str, Any]]:
    """Issue 27's ratios to the floor loop, judged on ``floor.json`` (one run, medians)."""
    floor = read_result("floor")
    levels = [] if floor is None else floor.get("levels", [])
    return [_row(target, value, fmt, met) for target, value, fmt, met in floor_targets(levels)]


def _realistic_rows() -> list[dict[str, Any]]:
    # Imported here: bench.realistic loads the fake servers, which only it needs.
    from bench.realistic import targets as realistic_targets

    return [_row(*row) for row in realistic_targets()]


def _capacity_rows() -> list[dict[str, Any]]:
    from bench.capacity import targets as capacity_targets

    return [_row(*row) for row in capacity_targets()]


def _knowledge_rows() -> list[dict[str, Any]]:
    from bench.knowledge import targets as knowledge_targets

    return [_row(*row) for row in knowledge_targets()]


def targets() -> list[dict[str, Any]]:
    """Issue 15's targets, judged from the result files present (PASS / MISS)."""
    rows: list[dict[str, Any]] = []
    # Issue 27: ratios taken within each round of bench.stores, median of the rounds.
    ratios = (read_result("stores") or {}).get("ratios", {})
    for name, floor, what in (
        ("as_shipped_pinned", 3.0, "openai-agents SQLiteSession as shipped, both on one CPU"),
        ("as_shipped", 2.2, "openai-agents SQLiteSession as shipped, unpinned"),
        ("normal_pinned", 2.0, "openai-agents with synchronous=NORMAL, both on one CPU"),
        ("chatflow_agent", 15.0, "chatflow-agent 0.3.4"),
        ("concurrent", 3.0, "openai-agents, 20 sessions at once"),
    ):
        figures = ratios.get(name)
        ratio = None if figures is None else float(figures["median"])
        rows.append(
            _row(
                f"store >= {floor:g}x {what} (median of rounds)",
                ratio,
                "{:.2f}x",
                None if ratio is None else ratio >= floor,
            )
        )
    pipeline = read_result("pipeline")
    levels = {lv["sessions"]: lv for lv in (pipeline or {}).get("levels", [])}
    top, one = levels.get(100), levels.get(1)

    def figure(level: dict[str, Any] | None, key: str) -> float | None:
        return None if level is None or level.get(key) is None else float(level[key])

    checks: list[tuple[str, float | None, str, Any]] = [
        (
            "pipeline >= 1,200 msg/s at 100 sessions",
            figure(top, "messages_per_s"),
            "{:,.0f} msg/s",
            lambda v: v >= 1200,
        ),
        (
            "p99 added latency <= 200 ms at 100 sessions",
            figure(top, "latency_p99_ms"),
            "{:.0f} ms",
            lambda v: v <= 200,
        ),
        (
            "pipeline >= 1,000 msg/s at 1 session",
            figure(one, "messages_per_s"),
            "{:,.0f} msg/s",
            lambda v: v >= 1000,
        ),
        (
            "<= 3 COMMITs per message at 1 session",
            figure(one, "commits_per_message"),
            "{:.2f}",
            lambda v: v <= 3,
        ),
        (
            "<= 1 COMMIT per message at 100 sessions",
            figure(top, "commits_per_message"),
            "{:.2f}",
            lambda v: v <= 1,
        ),
        (
            "<= 6 round trips into the database thread per message",
            figure(top, "round_trips_per_message"),
            "{:.1f}",
            lambda v: v <= 6,
        ),
        (
            "CPU <= 1.0 ms per message at 100 sessions",
            figure(top, "cpu_ms_per_message"),
            "{:.2f} ms",
            lambda v: v <= 1.0,
        ),
    ]
    for target, value, fmt, test in checks:
        rows.append(_row(target, value, fmt, None if value is None else bool(test(value))))
    growth = read_result("growth")
    growth_ratio = None
    if growth is not None:
        by_traffic = {row["traffic_messages"]: row for row in growth["sessions"]}
        if 100 in by_traffic and 100_000 in by_traffic:
            growth_ratio = by_traffic[100_000]["turn_median_ms"] / by_traffic[100]["turn_median_ms"]
    rows.append(
        _row(
            "a 100,000-message session <= 1.2x a 100-message one",
            growth_ratio,
            "{:.2f}x",
            None if growth_ratio is None else growth_ratio <= 1.2,
        )
    )
    window = None if growth is None else growth.get("window_ratio")
    rows.append(
        _row(
            "a turn's cost independent of the window size (160 vs 16 messages <= 1.2x)",
            window,
            "{:.2f}x",
            None if window is None else window <= 1.2,
        )
    )
    rows.extend(_floor_rows())
    rows.extend(_realistic_rows())
    rows.extend(_knowledge_rows())
    rows.extend(_capacity_rows())
    prompt = (read_result("prompt_cost") or {}).get("product")
    share = None if prompt is None else float(prompt["cacheable_share"]) * 100
    rows.append(
        _row(
            ">= 85 % of input tokens cacheable over 150 turns",
            share,
            "{:.1f} %",
            None if share is None else share >= 85,
        )
    )
    traced = read_result("tracing") or {}
    on_off = traced.get("on_over_off")
    rows.append(
        _row(
            "pipeline with tracing on (OTLP/HTTP to 127.0.0.1) / off >= 0.95",
            on_off,
            "{:.3f}",
            None if on_off is None else on_off >= 0.95,
        )
    )
    pg = read_result("pg_pipeline")
    pg3 = next((lv for lv in (pg or {}).get("levels", []) if lv.get("processes") == 3), None)
    pg_rate = None if pg3 is None else float(pg3["messages_per_second"])
    rows.append(
        _row(
            "PostgreSQL pipeline, 3 processes >= 449 msg/s",
            pg_rate,
            "{:,.0f} msg/s",
            None if pg_rate is None else pg_rate >= 449,
        )
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
        "Targets (issue 15)",
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
