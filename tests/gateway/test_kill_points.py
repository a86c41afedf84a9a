"""SIGKILL the gateway at each durable boundary; after a restart nothing is lost or doubled."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from bot.gateway.ledger.obligations import RECOVERED_MARKER

HARNESS = Path(__file__).with_name("killpoint_harness.py")
ROOT = Path(__file__).resolve().parents[2]


async def _run(directory: Path, kill_at: str | None) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, str(HARNESS), str(directory)] + ([kill_at] if kill_at else [])
    proc = await asyncio.create_subprocess_exec(*args, env=env, cwd=ROOT)
    return await asyncio.wait_for(proc.wait(), 60)


@pytest.mark.parametrize(
    ("kill_at", "marked_copy"),
    [
        pytest.param("after_accept", False, id="a-after-accept-before-commit"),
        # The obligation is written claimed in tx 2 (no mark_attempting commit), so
        # after a crash there it may have been sent: the resend carries the marker.
        pytest.param("after_commit", True, id="b-after-commit-before-send"),
        pytest.param("during_send", True, id="c-during-send"),
        pytest.param("after_send", True, id="d-after-send-before-delivered"),
    ],
)
async def test_kill_point(tmp_path: Path, kill_at: str, marked_copy: bool) -> None:
    inbound = [{"id": f"m{n}", "chat": f"c{n % 2}", "text": f"hello {n}"} for n in range(3)]
    (tmp_path / "inbound.jsonl").write_text("".join(json.dumps(i) + "\n" for i in inbound))

    assert await _run(tmp_path, kill_at) == -signal.SIGKILL
    assert await _run(tmp_path, None) == 0

    sent = [json.loads(line) for line in (tmp_path / "sent.jsonl").read_text().splitlines()]
    for item in inbound:
        answer = f"echo: {item['text']}"
        copies = [s["text"] for s in sent if s["text"].endswith(answer)]
        plain = [c for c in copies if not c.startswith(RECOVERED_MARKER)]
        marked = [c for c in copies if c.startswith(RECOVERED_MARKER)]
        assert copies, f"{item['id']} never answered"
        assert len(plain) <= 1, f"{item['id']} answered twice without the marker"
        assert all(c == RECOVERED_MARKER + answer for c in marked)
    # the message the process died on was resent with the marker exactly when it may have arrived
    assert any(s["text"].startswith(RECOVERED_MARKER) for s in sent) is marked_copy


async def test_a_kill_before_the_group_commit_resends_each_buffered_reply_once_marked(
    tmp_path: Path,
) -> None:
    inbound = [{"id": f"m{n}", "chat": f"c{n % 3}", "text": f"hello {n}"} for n in range(6)]
    (tmp_path / "inbound.jsonl").write_text("".join(json.dumps(i) + "\n" for i in inbound))

    assert await _run(tmp_path, "before_group_commit") == -signal.SIGKILL
    first = (tmp_path / "sent.jsonl").read_text().splitlines()
    # Every reply left before the kill, so all six delivered marks were buffered.
    assert len(first) == len(inbound)
    assert not any(json.loads(s)["text"].startswith(RECOVERED_MARKER) for s in first)
    assert await _run(tmp_path, None) == 0

    sent = [json.loads(line)["text"] for line in (tmp_path / "sent.jsonl").read_text().splitlines()]
    for item in inbound:
        answer = f"echo: {item['text']}"
        assert [s for s in sent if s.endswith(answer)] == [answer, RECOVERED_MARKER + answer]
    assert len(sent) == 2 * len(inbound)
