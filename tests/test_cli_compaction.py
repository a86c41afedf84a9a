"""Compaction from the operator's side: ``sessions show`` prints the whole conversation with
the compacted messages marked, and a wrong ``COMPACTION_*`` setting stops start-up."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.core.agent import Agent
from bot.core.compaction import SUMMARY_INSTRUCTIONS, Compaction
from bot.core.compactor import CompactionOutcome
from bot.core.models.base import ModelResponse
from bot.core.models.scripted import RecordedCall, ScriptedModel
from bot.core.runner import Runner
from bot.core.stores.sqlite import SQLiteSessionStore
from tests.cli_inprocess import cli as _bot


def _answer(record: RecordedCall) -> ModelResponse:
    if record.system == SUMMARY_INSTRUCTIONS:
        return ModelResponse(content="The user's order is ORD-77.")
    return ModelResponse(content=f"ok: {record.messages[-1].content}")


async def _compacted_session(path: Path) -> None:
    model = ScriptedModel([_answer] * 9)
    agent = Agent(name="Support", instructions="Help.", compaction=Compaction(10**6, 2))
    store = SQLiteSessionStore(path)
    async with Runner(agent, store, model=model) as runner:
        for index in range(4):
            await runner.run_async("cli-session", f"message {index}")
        assert await runner.compact("cli-session") is CompactionOutcome.COMPACTED
    await store.close()


def test_sessions_show_prints_the_whole_conversation_with_compacted_messages_marked(
    tmp_path: Path,
) -> None:
    (tmp_path / "data").mkdir()
    asyncio.run(_compacted_session(tmp_path / "data" / "chatflow.db"))
    shown = _bot(tmp_path, "sessions", "show", "cli-session")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "  (compacted) [user:user] message 0" in lines
    assert "  (compacted) [model:Support] ok: message 1" in lines
    assert "  [user:user] message 2" in lines and "  [user:user] message 3" in lines
    summary = [line for line in lines if "[system:summary]" in line]
    assert len(summary) == 1 and not summary[0].startswith("  (compacted)")
    assert any("The user's order is ORD-77." in line for line in lines)


def test_a_wrong_compaction_setting_stops_start_up_in_one_line(tmp_path: Path) -> None:
    for name, value in (
        ("COMPACTION_TRIGGER_TOKENS", "lots"),
        ("COMPACTION_TRIGGER_TOKENS", "0"),
        ("COMPACTION_KEEP_RECENT_TURNS", "40"),
    ):
        result = _bot(tmp_path, "run", **{name: value})
        assert result.returncode == 2, (name, value, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and name in lines[0], lines


def test_an_unroutable_compaction_model_fails_the_doctor(tmp_path: Path) -> None:
    result = _bot(tmp_path, "doctor", COMPACTION_TRIGGER_TOKENS="8000", COMPACTION_MODEL="claude-9")
    assert result.returncode == 1
    assert "FAIL agents" in result.stdout
