"""Benchmark 3: does the cost stay flat as conversations, dedup ids and the ledger grow?

- Load + save of a session whose past traffic is 100, 10,000 and 100,000
  messages (turns of user + answer, window 40 turns, so every case holds a
  full 80-message window). The three sessions live in one database and the
  traffic really goes through the store (``save`` every 20 turns, each
  pruning what fell out of the window); then 500 timed turns each of
  ``session_lock`` -> ``get_or_create`` -> 2 messages -> ``save``,
  interleaved, so outside noise falls on all of them alike.
- Dedup: ``claim_message`` with 10^3, 10^5 and 10^6 live ids in the table
  (filled with one ``executemany``), new ids and duplicates, in short
  interleaved blocks.
- Ledger: ``sweep_recoverable`` over 10^4 rows, when all are delivered (a
  normal start-up) and when all are owed by a dead process (a crash backlog:
  every row is claimed and handed back).
- Memory of 10,000 idle sessions in the in-memory ``SessionStore``
  (tracemalloc, after a full collection), empty and with one turn each.
"""

from __future__ import annotations

import asyncio
import gc
import os
import secrets
import sqlite3
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.common import bench_tmpdir, fmt_num, median, percentile, print_table, write_result
from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.stores.in_memory import SessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.instances import Owner
from bot.gateway.ledger import DeliveryLedger

NAME = "growth"
TRAFFIC = (100, 10_000, 100_000)
WINDOW_TURNS = 40
TURNS_PER_SAVE = 20
TIMED_TURNS = 500
DEDUP_SIZES = (1_000, 100_000, 1_000_000)
DEDUP_CLAIMS = 2_000
DEDUP_DUPLICATES = 500
DEDUP_BLOCKS = 10
LEDGER_ROWS = 10_000
IDLE_SESSIONS = 10_000

AGENT = Agent(name="Support", instructions="Answer briefly.")
USER_TEXT = "Hi! Where is my order 1234? It was due yesterday."
ANSWER_TEXT = "Your order 1234 has shipped and should arrive tomorrow."


def _turn() -> list[Message]:
    return [
        Message(role=Role.USER, content=USER_TEXT),
        Message(role=Role.MODEL, content=ANSWER_TEXT, agent=AGENT.name),
    ]


# -- load + save against past traffic -------------------------------------------------------


def _session_id(traffic: int) -> str:
    return f"growth-{traffic}"


async def _build_session(store: SQLiteSessionStore, traffic: int) -> float:
    """Push ``traffic`` messages through one session, saving every 20 turns; seconds taken."""
    started = time.perf_counter()
    session = await store.get_or_create(_session_id(traffic), AGENT)
    turns = traffic // 2
    done = 0
    while done < turns:
        batch = min(TURNS_PER_SAVE, turns - done)
        for _ in range(batch):
            for message in _turn():
                session.add_message(message)
        await store.save(session)
        done += batch
    return time.perf_counter() - started


async def _timed_turn(store: SQLiteSessionStore, session_id: str) -> tuple[float, float]:
    """One turn as the Runner does it; (load seconds, save seconds)."""
    t0 = time.perf_counter()
    async with store.session_lock(session_id):
        session = await store.get_or_create(session_id, AGENT)
        t1 = time.perf_counter()
        for message in _turn():
            session.add_message(message)
        await store.save(session)
    return t1 - t0, time.perf_counter() - t1


async def _session_facts(store: SQLiteSessionStore, session_id: str) -> dict[str, int]:
    async with store.transaction() as tx:
        rows = await tx.fetchone(
            "SELECT COUNT(*), MAX(seq) FROM chatflow_messages WHERE session_id = ?",
            (session_id,),
        )
    assert rows is not None
    return {"rows_held": int(rows[0]), "max_seq": int(rows[1])}


async def _session_growth(directory: Path) -> list[dict[str, Any]]:
    """Three sessions of different past traffic in one database, timed interleaved.

    One store means one connection and one aiosqlite thread for all three, so
    neither outside load nor where the OS happens to run that thread favours
    one size over another.
    """
    store = SQLiteSessionStore(str(directory / "traffic.db"), WINDOW_TURNS)
    store.set_agent_resolver(lambda name: AGENT if name == AGENT.name else None)
    loads: list[list[float]] = [[] for _ in TRAFFIC]
    saves: list[list[float]] = [[] for _ in TRAFFIC]
    try:
        build_seconds = [await _build_session(store, traffic) for traffic in TRAFFIC]
        for traffic in TRAFFIC:
            await _timed_turn(store, _session_id(traffic))  # warm up
        for round_number in range(TIMED_TURNS):
            # Rotate who goes first: the order within a round must not favour one size.
            for offset in range(len(TRAFFIC)):
                index = (round_number + offset) % len(TRAFFIC)
                load, save = await _timed_turn(store, _session_id(TRAFFIC[index]))
                loads[index].append(load)
                saves[index].append(save)
        rows = []
        for index, traffic in enumerate(TRAFFIC):
            totals = [a + b for a, b in zip(loads[index], saves[index], strict=True)]
            rows.append(
                {
                    "traffic_messages": traffic,
                    "build_seconds": round(build_seconds[index], 2),
                    "load_median_ms": median(loads[index]) * 1000,
                    "save_median_ms": median(saves[index]) * 1000,
                    "turn_median_ms": median(totals) * 1000,
                    "turn_p99_ms": percentile(totals, 99) * 1000,
                    **await _session_facts(store, _session_id(traffic)),
                }
            )
        async with store.transaction() as tx:
            total_rows = await tx.fetchone("SELECT COUNT(*) FROM chatflow_messages")
        assert total_rows is not None
        for row in rows:
            row["rows_in_table"] = int(total_rows[0])
    finally:
        await store.close()
    return rows


WINDOW_SIZES = (8, 80)
"""Window lengths in turns (16 and 160 messages) for the window-cost comparison."""


async def _window_cost(directory: Path) -> dict[str, Any]:
    """The median turn with a full 16-message window against a full 160-message one.

    Same past traffic, two stores timed interleaved: with a session cache and an
    O(turn) prune the two should cost the same.
    """
    stores = [
        SQLiteSessionStore(str(directory / f"window-{turns}.db"), turns) for turns in WINDOW_SIZES
    ]
    totals: list[list[float]] = [[] for _ in WINDOW_SIZES]
    try:
        for store in stores:
            store.set_agent_resolver(lambda name: AGENT if name == AGENT.name else None)
            await _build_session(store, 2 * max(WINDOW_SIZES) * 2)
            await _timed_turn(store, _session_id(2 * max(WINDOW_SIZES) * 2))
        for round_number in range(TIMED_TURNS):
            for offset in range(len(stores)):
                index = (round_number + offset) % len(stores)
                load, save = await _timed_turn(
                    stores[index], _session_id(2 * max(WINDOW_SIZES) * 2)
                )
                totals[index].append(load + save)
    finally:
        for store in stores:
            await store.close()
    small, large = (median(t) * 1000 for t in totals)
    return {
        "window_messages": [2 * t for t in WINDOW_SIZES],
        "turn_median_ms": [small, large],
        "window_ratio": large / small,
    }


# -- dedup claims ---------------------------------------------------------------------------


def _fill_claims(path: Path, count: int, now: float) -> None:
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("BEGIN")
        # Random ids (like wamids) spread over the last 7 days: all still inside the TTL.
        span = 7 * 86_400
        conn.executemany(
            "INSERT INTO chatflow_processed_messages (message_id, processed_at) VALUES (?, ?)",
            ((f"wamid.{secrets.token_hex(16)}", now - span * i / count) for i in range(count)),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


async def _dedup(directory: Path) -> list[dict[str, Any]]:
    """Fill every size, then claim new and duplicate ids in short blocks across the sizes.

    Each block opens a fresh store (a fresh aiosqlite thread): on a small VM
    the cost of a thread hop depends on where the OS placed that thread, and
    many short blocks spread that luck evenly over the sizes.
    """
    paths: list[Path] = []
    fill_seconds: list[float] = []
    for size in DEDUP_SIZES:
        path = directory / f"dedup-{size}.db"
        store = SQLiteSessionStore(str(path))
        await store.open()  # creates the tables
        await store.close()
        filled = time.perf_counter()
        await asyncio.to_thread(_fill_claims, path, size, time.time())
        fill_seconds.append(time.perf_counter() - filled)
        paths.append(path)
    fresh: list[list[float]] = [[] for _ in DEDUP_SIZES]
    dupes: list[list[float]] = [[] for _ in DEDUP_SIZES]
    per_block = DEDUP_CLAIMS // DEDUP_BLOCKS
    dupes_per_block = DEDUP_DUPLICATES // DEDUP_BLOCKS
    for block in range(DEDUP_BLOCKS):
        for offset in range(len(paths)):
            index = (block + offset) % len(paths)
            store = SQLiteSessionStore(str(paths[index]))
            try:
                await store.claim_message(f"warm-up-{block}")  # opens; first purge check
                for i in range(per_block):
                    message_id = f"bench:new:{block}:{i}"
                    t0 = time.perf_counter()
                    claimed = await store.claim_message(message_id)
                    fresh[index].append(time.perf_counter() - t0)
                    assert claimed
                for i in range(dupes_per_block):
                    t0 = time.perf_counter()
                    claimed = await store.claim_message(f"bench:new:{block}:{i}")
                    dupes[index].append(time.perf_counter() - t0)
                    assert not claimed
            finally:
                await store.close()
    return [
        {
            "ids_in_table": size,
            "fill_seconds": round(fill_seconds[index], 2),
            "claim_median_us": median(fresh[index]) * 1e6,
            "claim_p99_us": percentile(fresh[index], 99) * 1e6,
            "claims_per_s": len(fresh[index]) / sum(fresh[index]),
            "duplicate_median_us": median(dupes[index]) * 1e6,
        }
        for index, size in enumerate(DEDUP_SIZES)
    ]


# -- ledger sweep ---------------------------------------------------------------------------


async def _ledger(directory: Path, case: str) -> dict[str, Any]:
    store = SQLiteSessionStore(str(directory / f"ledger-{case}.db"))
    try:
        # A dead owner: our pid with another instance id (a restarted process, PID reuse).
        writer_owner = (
            Owner(os.getpid(), "dead-" + secrets.token_hex(8)) if case == "backlog" else None
        )
        writer = DeliveryLedger(store, owner=writer_owner)
        await writer.open()
        async with store.transaction() as tx:
            for i in range(LEDGER_ROWS):
                await writer.record_obligation_in(
                    tx,
                    obligation_id=f"obl{i:021d}",
                    session_key=f"agent:main:bench:dm:chat_{i % 500:012x}",
                    session_id=f"bench-{i % 500:016x}",
                    platform="bench",
                    chat_id=str(100_000 + i % 500),
                    thread_id=None,
                    reply_to=str(i),
                    content=ANSWER_TEXT,
                    message_ref=f"bench:{i}",
                )
            if case == "delivered":
                await tx.execute("UPDATE chatflow_delivery_obligations SET state = 'delivered'")
        ledger = DeliveryLedger(store)
        runs: list[float] = []
        claimed = 0
        for _ in range(1 if case == "backlog" else 5):
            t0 = time.perf_counter()
            owed = await ledger.sweep_recoverable(deliverable_platforms={"bench"})
            runs.append(time.perf_counter() - t0)
            claimed = len(owed)
    finally:
        await store.close()
    return {
        "case": case,
        "rows": LEDGER_ROWS,
        "claimed": claimed,
        "sweep_ms": median(runs) * 1000,
        "runs": len(runs),
    }


# -- idle sessions in memory ----------------------------------------------------------------


async def _memory(turns: int) -> dict[str, Any]:
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        store = SessionStore(WINDOW_TURNS)
        for i in range(IDLE_SESSIONS):
            sid = f"bench-{i:016x}"
            session = await store.get_or_create(sid, AGENT)
            if turns:
                for _ in range(turns):
                    for message in _turn():
                        session.add_message(message)
                await store.save(session)
        del session
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(await store.list_sessions()) == IDLE_SESSIONS
    used = after - before
    return {
        "sessions": IDLE_SESSIONS,
        "turns_each": turns,
        "bytes_total": used,
        "bytes_per_session": used / IDLE_SESSIONS,
    }


# -- main -----------------------------------------------------------------------------------


async def run() -> dict[str, Any]:
    """All four parts, their tables and ``results/growth.json``."""
    started = time.perf_counter()
    with bench_tmpdir(NAME) as directory:
        sessions = await _session_growth(directory)
        window = await _window_cost(directory)
        dedup = await _dedup(directory)
        ledger = [await _ledger(directory, case) for case in ("delivered", "backlog")]
    memory = [await _memory(0), await _memory(1)]

    base = sessions[0]["turn_median_ms"]
    for row in sessions:
        row["ratio_to_100"] = row["turn_median_ms"] / base
    print_table(
        f"Growth: load + save of one session vs its past traffic (window {WINDOW_TURNS} "
        f"turns, {TIMED_TURNS} timed turns each)",
        ["past messages", "load ms", "save ms", "turn ms", "turn p99 ms", "rows kept", "x 100-msg"],
        [
            [
                fmt_num(r["traffic_messages"]),
                fmt_num(r["load_median_ms"], 3),
                fmt_num(r["save_median_ms"], 3),
                fmt_num(r["turn_median_ms"], 3),
                fmt_num(r["turn_p99_ms"], 3),
                r["rows_held"],
                f"{r['ratio_to_100']:.2f}x",
            ]
            for r in sessions
        ],
    )
    print_table(
        f"Growth: dedup claim_message vs ids in the table ({DEDUP_CLAIMS} new, "
        f"{DEDUP_DUPLICATES} duplicates)",
        ["ids in table", "new: median us", "new: p99 us", "claims/s", "duplicate: median us"],
        [
            [
                fmt_num(r["ids_in_table"]),
                fmt_num(r["claim_median_us"], 1),
                fmt_num(r["claim_p99_us"], 1),
                fmt_num(r["claims_per_s"]),
                fmt_num(r["duplicate_median_us"], 1),
            ]
            for r in dedup
        ],
    )
    print_table(
        f"Growth: ledger sweep_recoverable over {LEDGER_ROWS:,} rows",
        ["rows are", "claimed", "sweep ms"],
        [
            [
                "delivered (normal start-up)"
                if r["case"] == "delivered"
                else "owed by a dead process (crash backlog)",
                fmt_num(r["claimed"]),
                fmt_num(r["sweep_ms"], 1),
            ]
            for r in ledger
        ],
    )
    print_table(
        f"Growth: memory of {IDLE_SESSIONS:,} idle sessions in the in-memory SessionStore",
        ["sessions hold", "MB per 10,000", "bytes/session"],
        [
            [
                "nothing (just created)" if r["turns_each"] == 0 else f"{r['turns_each']} turn",
                fmt_num(r["bytes_total"] / 1e6 * 10_000 / IDLE_SESSIONS, 1),
                fmt_num(r["bytes_per_session"]),
            ]
            for r in memory
        ],
    )
    print(
        f"\nWindow cost: median turn {window['turn_median_ms'][0]:.3f} ms with "
        f"{window['window_messages'][0]} messages, {window['turn_median_ms'][1]:.3f} ms with "
        f"{window['window_messages'][1]} ({window['window_ratio']:.2f}x)"
    )
    payload = {
        "sessions": sessions,
        "window_ratio": window["window_ratio"],
        "window": window,
        "dedup": dedup,
        "ledger": ledger,
        "memory": memory,
        "settings": {
            "window_turns": WINDOW_TURNS,
            "messages_per_turn": 2,
            "turns_per_save_while_building": TURNS_PER_SAVE,
            "timed_turns": TIMED_TURNS,
        },
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_result(NAME, payload)
    return payload


def main() -> None:
    """Entry point: ``python -m bench.growth``."""
    asyncio.run(run())


if __name__ == "__main__":
    main()
