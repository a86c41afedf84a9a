"""SIGKILL a streaming gateway mid-answer and after the commit: drafts were shown, yet
after a restart every message has exactly one final reply (drafts are not deliveries)."""

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
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_STREAM": "1"}
    args = [sys.executable, str(HARNESS), str(directory)] + ([kill_at] if kill_at else [])
    proc = await asyncio.create_subprocess_exec(*args, env=env, cwd=ROOT)
    return await asyncio.wait_for(proc.wait(), 60)


def _lines(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize(
    ("kill_at", "marked_copy"),
    [
        # Not committed: the turn re-runs from the journal and streams again; one plain reply.
        pytest.param("mid_stream", False, id="mid-stream-before-commit"),
        # Committed and owed: the reply is resent once (marked), never streamed again.
        pytest.param("after_commit", True, id="after-commit-before-send"),
    ],
)
async def test_a_kill_while_streaming_leaves_exactly_one_final_reply(
    tmp_path: Path, kill_at: str, marked_copy: bool
) -> None:
    inbound = [{"id": f"m{n}", "chat": f"c{n % 2}", "text": f"hello {n}"} for n in range(3)]
    (tmp_path / "inbound.jsonl").write_text("".join(json.dumps(i) + "\n" for i in inbound))

    assert await _run(tmp_path, kill_at) == -signal.SIGKILL
    drafts_before = _lines(tmp_path / "drafts.jsonl")
    assert drafts_before, "no draft was shown before the kill"
    assert await _run(tmp_path, None) == 0

    sent = _lines(tmp_path / "sent.jsonl")
    for item in inbound:
        answer = f"echo: {item['text']}"
        copies = [s["text"] for s in sent if s["text"].endswith(answer)]
        plain = [c for c in copies if not c.startswith(RECOVERED_MARKER)]
        assert len(copies) == 1, f"{item['id']} answered {len(copies)} times: {copies}"
        assert len(plain) == (0 if copies[0].startswith(RECOVERED_MARKER) else 1)
    assert any(s["text"].startswith(RECOVERED_MARKER) for s in sent) is marked_copy
    # Every draft is a prefix of its chat's answers: a preview, never a different text.
    for draft in _lines(tmp_path / "drafts.jsonl"):
        answers = [f"echo: {i['text']}" for i in inbound if i["chat"] == draft["chat"]]
        assert any(a.startswith(draft["text"]) for a in answers)
