"""Store workload for the peer libraries; runs in the bench venv, never in the project's.

Run as ``.venv-bench/bin/python -I bench/peer_worker.py --store NAME --dir D``:
``-I`` keeps the project root (and its own ``agents/`` package, which would
shadow openai-agents' top-level ``agents``) off ``sys.path``. Prints one JSON
object on stdout. Imports nothing from ``bot`` or ``bench``: ``bench.stores``
imports the workload constants from here, so both sides run the same turns.

The workload: ``SESSIONS`` sessions, one warm-up turn each (creates them,
not timed), then ``TURNS`` timed turns per session, round-robin. One
operation = load the session's window + append one turn (user message, a
model message calling a tool, the tool's result, the model's answer), each
store driven the way its library drives it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

SESSIONS = 20
"""Sessions in the workload."""
TURNS = 50
"""Timed turns per session (after one warm-up turn)."""
WINDOW_TURNS = 40
"""Turns a load returns (our ``max_turns`` default); 4 items per turn."""
USER_TEXT = "Hi! Where is my order 1234? It was due yesterday."
TOOL_NAME = "lookup_order"
TOOL_ARGS = {"order_id": "1234"}
TOOL_RESULT = '{"order_id": "1234", "status": "shipped", "eta": "tomorrow"}'
ANSWER_TEXT = "Your order 1234 has shipped and should arrive tomorrow."


def session_name(index: int) -> str:
    """Session id of the ``index``-th session (path-safe for every store)."""
    return f"bench-{index:04d}"


def call_id(session: int, turn: int) -> str:
    """Tool call id of a turn (unique per session)."""
    return f"call_{session}_{turn}"


def summarise(latencies: list[float], elapsed: float) -> dict[str, Any]:
    """ops/s and latency percentiles of a run."""
    ordered = sorted(latencies)

    def pct(p: float) -> float:
        rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
        return ordered[rank] * 1000 if ordered else float("nan")

    return {
        "ops": len(latencies),
        "seconds": round(elapsed, 4),
        "ops_per_s": len(latencies) / elapsed if elapsed else float("nan"),
        "p50_ms": pct(50),
        "p99_ms": pct(99),
    }


async def drive_async(
    op: Callable[[int, int], Awaitable[None]], *, concurrent: bool
) -> dict[str, Any]:
    """Warm up, then run the timed turns one at a time or all sessions at once."""
    for s in range(SESSIONS):
        await op(s, 0)
    latencies: list[float] = []

    async def timed(s: int, t: int) -> None:
        t0 = time.perf_counter()
        await op(s, t)
        latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    if concurrent:

        async def lane(s: int) -> None:
            for t in range(1, TURNS + 1):
                await timed(s, t)

        await asyncio.gather(*(lane(s) for s in range(SESSIONS)))
    else:
        for t in range(1, TURNS + 1):
            for s in range(SESSIONS):
                await timed(s, t)
    return summarise(latencies, time.perf_counter() - started)


# -- openai-agents --------------------------------------------------------------------


def _openai_items(s: int, t: int) -> list[dict[str, Any]]:
    """One turn as openai-agents' Runner stores it (Responses API input items)."""
    cid = call_id(s, t)
    return [
        {"role": "user", "content": USER_TEXT},
        {
            "type": "function_call",
            "call_id": cid,
            "name": TOOL_NAME,
            "arguments": json.dumps(TOOL_ARGS),
            "id": f"fc_{s}_{t}",
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": cid, "output": TOOL_RESULT},
        {
            "type": "message",
            "role": "assistant",
            "id": f"msg_{s}_{t}",
            "status": "completed",
            "content": [{"type": "output_text", "text": ANSWER_TEXT, "annotations": []}],
        },
    ]


async def run_openai_agents(directory: Path, *, normal: bool, concurrent: bool) -> dict[str, Any]:
    """openai-agents' ``SQLiteSession`` on a file: ``get_items`` then ``add_items``."""
    agents_pkg = importlib.import_module("agents")
    origin = str(getattr(agents_pkg, "__file__", ""))
    if "site-packages" not in origin:
        raise RuntimeError(f"'agents' resolved to {origin}, not openai-agents")
    memory = importlib.import_module("agents.memory")
    base: Any = memory.SQLiteSession
    session_class: Any = base
    if normal:

        class NormalSyncSession(base):  # type: ignore[misc]
            """The same session with ``synchronous=NORMAL`` (our durability level)."""

            @staticmethod
            def _configure_connection(conn: sqlite3.Connection) -> None:
                base._configure_connection(conn)
                conn.execute("PRAGMA synchronous = NORMAL")

        session_class = NormalSyncSession

    db = directory / ("openai-normal.db" if normal else "openai.db")
    sessions = [session_class(session_name(s), str(db)) for s in range(SESSIONS)]
    limit = WINDOW_TURNS * 4

    async def op(s: int, t: int) -> None:
        session = sessions[s]
        await session.get_items(limit=limit)
        await session.add_items(_openai_items(s, t))

    try:
        result = await drive_async(op, concurrent=concurrent)
        probe = sessions[0]._get_connection()
        result["synchronous"] = int(probe.execute("PRAGMA synchronous").fetchone()[0])
        result["journal_mode"] = str(probe.execute("PRAGMA journal_mode").fetchone()[0])
        window = await sessions[0].get_items(limit=limit)
        result["window_items"] = len(window)
        result["stored_rows"] = int(
            probe.execute("SELECT COUNT(*) FROM agent_messages").fetchone()[0]
        )
    finally:
        for session in sessions:
            session.close()
    result["version"] = _version("openai-agents")
    return result


# -- chatflow-agent -------------------------------------------------------------------


def run_chatflow_agent(directory: Path) -> dict[str, Any]:
    """chatflow-agent's ``SQLiteSessionStore``: sync ``get_or_create`` + 4 ``add_message``.

    That is how its own ``Runner.run_async`` uses it: synchronously, on the
    event loop's thread (every call opens its own connection and commits).
    """
    memory = importlib.import_module("chatflow_agent.core.memory")
    types = importlib.import_module("chatflow_agent.types")
    agent_module = importlib.import_module("chatflow_agent.core.agent")
    agent = agent_module.Agent(name="Support", instructions="Answer briefly.")
    store = memory.SQLiteSessionStore(str(directory / "chatflow-agent.db"), default_max_turns=40)
    store.set_agent_resolver(lambda name: agent if name == agent.name else None)
    message, role = types.Message, types.Role

    def op(s: int, t: int) -> None:
        session = store.get_or_create(session_name(s), agent)
        cid = call_id(s, t)
        session.add_message(message(role=role.USER, content=USER_TEXT))
        session.add_message(
            message(
                role=role.MODEL,
                tool_calls=[types.ToolCall(id=cid, name=TOOL_NAME, args=dict(TOOL_ARGS))],
            )
        )
        session.add_message(
            message(
                role=role.TOOL,
                tool_results=[
                    types.ToolResult(tool_call_id=cid, name=TOOL_NAME, content=TOOL_RESULT)
                ],
            )
        )
        session.add_message(message(role=role.MODEL, content=ANSWER_TEXT))

    for s in range(SESSIONS):
        op(s, 0)
    latencies: list[float] = []
    started = time.perf_counter()
    for t in range(1, TURNS + 1):
        for s in range(SESSIONS):
            t0 = time.perf_counter()
            op(s, t)
            latencies.append(time.perf_counter() - t0)
    result = summarise(latencies, time.perf_counter() - started)
    window = store.get_or_create(session_name(0), agent)
    result["window_items"] = len(window.history)
    conn = sqlite3.connect(str(directory / "chatflow-agent.db"))
    try:
        result["stored_rows"] = int(
            conn.execute("SELECT COUNT(*) FROM chatflow_messages").fetchone()[0]
        )
    finally:
        conn.close()
    result["synchronous"] = 1  # it sets PRAGMA synchronous = NORMAL on every connection
    result["journal_mode"] = "wal"
    result["version"] = _version("chatflow-agent")
    return result


def _version(distribution: str) -> str:
    metadata = importlib.import_module("importlib.metadata")
    return str(metadata.version(distribution))


def main() -> None:
    """Entry point (in the bench venv): run one store's workload, print JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--store",
        required=True,
        choices=["openai-agents", "openai-agents-normal", "chatflow-agent"],
    )
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--concurrent", action="store_true")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    if args.store == "chatflow-agent":
        result = run_chatflow_agent(args.dir)
    else:
        result = asyncio.run(
            run_openai_agents(
                args.dir,
                normal=args.store == "openai-agents-normal",
                concurrent=args.concurrent,
            )
        )
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
