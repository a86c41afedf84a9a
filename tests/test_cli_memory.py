"""``python -m bot memory`` and ``forget-user``: refusals, the confirmation, the empty list.

The whole path (a running bot, then the commands) is in ``tests/e2e/test_memory_bot.py``.
"""

from __future__ import annotations

import argparse
import builtins
import sys
from pathlib import Path

import pytest

from bot.config import Settings
from bot.core.stores.base import TransactionalStore
from bot.memory_commands import forget_user
from tests.test_cli import _bot


def test_bad_person_and_unknown_ids_are_refused(tmp_path: Path) -> None:
    result = _bot(tmp_path, "forget-user", "123456789", "--yes")
    assert result.returncode == 2 and "PLATFORM:USER_ID" in result.stderr
    result = _bot(tmp_path, "memory", "list", "--user", "nobody")
    assert result.returncode == 2 and "PLATFORM:USER_ID" in result.stderr
    result = _bot(tmp_path, "forget-user", "telegarm:123", "--yes")
    assert result.returncode == 2 and "unknown platform 'telegarm'" in result.stderr
    assert "removed" not in result.stdout
    result = _bot(tmp_path, "memory", "list", "--user", "telegarm:123")
    assert result.returncode == 2 and "unknown platform 'telegarm'" in result.stderr
    result = _bot(tmp_path, "memory", "forget", "mem_000000000000")
    assert result.returncode == 2 and "no memory mem_000000000000" in result.stderr
    result = _bot(tmp_path, "memory", "list")
    assert result.returncode == 0 and result.stdout.strip() == "No memories."


async def _secret(store: TransactionalStore, settings: Settings) -> bytes:
    return b"s" * 32


async def test_forget_user_asks_on_a_terminal_and_no_means_nothing_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    asked: list[str] = []

    def answer(question: str) -> str:
        asked.append(question)
        return "n"

    monkeypatch.setattr(builtins, "input", answer)
    args = argparse.Namespace(person="telegram:42", yes=False)
    assert await forget_user(settings, args, _secret) == 1
    assert asked == ["Remove everything the bot holds about telegram:42? [y/N] "]
    assert "nothing removed" in capsys.readouterr().out
    assert not (tmp_path / "data" / "chatflow.db").exists()
    monkeypatch.setattr(builtins, "input", lambda question: "yes")
    (tmp_path / "data").mkdir()
    assert await forget_user(settings, args, _secret) == 0
    out = capsys.readouterr().out
    assert "removed what the bot held about telegram:42:" in out and "memories: 0" in out
