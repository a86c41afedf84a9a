"""SIGKILL during a ``remember`` turn: the fact is stored and its answer owed, or neither.

After the restart each fact is stored exactly once and its answer delivered (with
the resend marker where it may have been seen already).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from pathlib import Path

import pytest

from bot.gateway.ledger.obligations import RECOVERED_MARKER

HARNESS = Path(__file__).with_name("memory_killpoint_harness.py")
ROOT = Path(__file__).resolve().parents[2]
FACTS = ["likes green tea", "lives in Porto"]


async def _run(directory: Path, kill_at: str | None) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, str(HARNESS), str(directory)] + ([kill_at] if kill_at else [])
    proc = await asyncio.create_subprocess_exec(*args, env=env, cwd=ROOT)
    return await asyncio.wait_for(proc.wait(), 60)


def _stored_and_owed(db: Path) -> list[tuple[int, int]]:
    """Per fact: (memories holding it, replies recorded for it)."""
    conn = sqlite3.connect(db)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        result = []
        for fact in FACTS:
            stored = (
                conn.execute(
                    "SELECT COUNT(*) FROM chatflow_memories WHERE text = ?", (fact,)
                ).fetchone()[0]
                if "chatflow_memories" in tables
                else 0
            )
            owed = conn.execute(
                "SELECT COUNT(*) FROM chatflow_delivery_obligations WHERE content = ?",
                (f"remembered: {fact}",),
            ).fetchone()[0]
            result.append((stored, owed))
        return result
    finally:
        conn.close()


@pytest.mark.parametrize("kill_at", ["after_tool", "in_commit", "after_commit", "during_send"])
async def test_a_kill_in_a_remember_turn_keeps_fact_and_answer_together(
    tmp_path: Path, kill_at: str
) -> None:
    inbound = [{"id": f"m{n}", "chat": f"c{n}", "text": fact} for n, fact in enumerate(FACTS)]
    (tmp_path / "inbound.jsonl").write_text("".join(json.dumps(i) + "\n" for i in inbound))

    assert await _run(tmp_path, kill_at) == -signal.SIGKILL
    after_kill = _stored_and_owed(tmp_path / "chatflow.db")
    assert all(pair in ((0, 0), (1, 1)) for pair in after_kill), after_kill
    # The kill comes in the first turn to get there; the other chat's turn may be
    # anywhere in its own (a loaded machine decides), so only the first one is known.
    died_before_commit = kill_at in ("after_tool", "in_commit")
    assert ((0, 0) if died_before_commit else (1, 1)) in after_kill, after_kill

    assert await _run(tmp_path, None) == 0
    assert _stored_and_owed(tmp_path / "chatflow.db") == [(1, 1)] * len(FACTS)
    sent = [json.loads(line)["text"] for line in (tmp_path / "sent.jsonl").read_text().splitlines()]
    for fact in FACTS:
        copies = [s for s in sent if s.endswith(f"remembered: {fact}")]
        assert copies and len([c for c in copies if not c.startswith(RECOVERED_MARKER)]) <= 1
