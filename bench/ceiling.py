"""Benchmark 4: the raw SQLite commit ceiling on the benchmark's disk.

A single-row ``INSERT`` + ``COMMIT`` loop through the standard ``sqlite3``
module, in WAL with the synchronous setting our store uses (read from a
freshly opened ``SQLiteSessionStore``, so the two cannot drift): the physical
reference the pipeline is compared with. Three more rows explain the gap:
the same loop with ``synchronous=FULL`` (an fsync per commit, what a store
that leaves SQLite's default gets), the same loop through aiosqlite (one
thread hop per statement, as our store runs it), and a bare aiosqlite round
trip (``SELECT 1``).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiosqlite

from bench.common import bench_tmpdir, fmt_num, percentile, print_table, write_result
from bot.core.stores.sqlite import SQLiteSessionStore

NAME = "ceiling"
SECONDS = 3.0
ROW = "x" * 200  # about one stored message
_SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


async def store_pragmas(directory: Path) -> tuple[str, int]:
    """``journal_mode`` and ``synchronous`` as our store sets them on a file database."""
    store = SQLiteSessionStore(str(directory / "store.db"))
    try:
        async with store.transaction() as tx:
            journal = await tx.fetchone("PRAGMA journal_mode")
            sync = await tx.fetchone("PRAGMA synchronous")
    finally:
        await store.close()
    assert journal is not None and sync is not None
    return str(journal[0]).lower(), int(sync[0])


def _raw_loop(path: Path, synchronous: int, seconds: float) -> dict[str, Any]:
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        times: list[float] = []
        stop_at = time.perf_counter() + seconds
        started = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at:
                break
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (v) VALUES (?)", (ROW,))
            conn.execute("COMMIT")
            times.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - started
    finally:
        conn.close()
    return _summary(times, elapsed)


async def _aiosqlite_loop(path: Path, synchronous: int, seconds: float) -> dict[str, Any]:
    conn = await aiosqlite.connect(str(path), isolation_level=None)
    try:
        await conn.execute("PRAGMA journal_mode = WAL")
        await conn.execute(f"PRAGMA synchronous = {synchronous}")
        await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        times: list[float] = []
        stop_at = time.perf_counter() + seconds
        started = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at:
                break
            await conn.execute("BEGIN IMMEDIATE")
            await conn.execute("INSERT INTO t (v) VALUES (?)", (ROW,))
            await conn.commit()
            times.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - started
        trips: list[float] = []
        stop_at = time.perf_counter() + seconds / 2
        trip_start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at:
                break
            await conn.execute("SELECT 1")
            trips.append(time.perf_counter() - t0)
        trip_elapsed = time.perf_counter() - trip_start
    finally:
        await conn.close()
    return {"commit": _summary(times, elapsed), "round_trip": _summary(trips, trip_elapsed)}


def _summary(times: list[float], elapsed: float) -> dict[str, Any]:
    return {
        "ops": len(times),
        "seconds": round(elapsed, 3),
        "commits_per_s": len(times) / elapsed,
        "p50_us": percentile(times, 50) * 1e6,
        "p99_us": percentile(times, 99) * 1e6,
    }


async def run() -> dict[str, Any]:
    """Measure, print the table and write ``results/ceiling.json``."""
    with bench_tmpdir(NAME) as directory:
        journal, sync = await store_pragmas(directory)
        normal = await asyncio.to_thread(_raw_loop, directory / "raw-normal.db", sync, SECONDS)
        full = await asyncio.to_thread(_raw_loop, directory / "raw-full.db", 2, SECONDS)
        via_aiosqlite = await _aiosqlite_loop(directory / "aiosqlite.db", sync, SECONDS)
    sync_name = _SYNC_NAMES.get(sync, str(sync))
    rows = [
        [f"sqlite3, WAL, synchronous={sync_name} (the ceiling)", normal],
        ["sqlite3, WAL, synchronous=FULL", full],
        [f"aiosqlite, WAL, synchronous={sync_name}, 3 awaits/commit", via_aiosqlite["commit"]],
        ["aiosqlite round trip (SELECT 1)", via_aiosqlite["round_trip"]],
    ]
    print_table(
        f"Raw SQLite ceiling: single-row INSERT + COMMIT loop, {SECONDS:.0f} s each",
        ["loop", "ops/s", "p50 us", "p99 us"],
        [
            [
                label,
                fmt_num(data["commits_per_s"]),
                fmt_num(data["p50_us"], 1),
                fmt_num(data["p99_us"], 1),
            ]
            for label, data in rows
        ],
    )
    payload = {
        "store_pragmas": {"journal_mode": journal, "synchronous": sync_name},
        "normal": normal,
        "full": full,
        "aiosqlite_commit": via_aiosqlite["commit"],
        "aiosqlite_round_trip": via_aiosqlite["round_trip"],
        "row_bytes": len(ROW),
    }
    write_result(NAME, payload)
    return payload


def main() -> None:
    """Entry point: ``python -m bench.ceiling``."""
    asyncio.run(run())


if __name__ == "__main__":
    main()
