"""``python -m bot`` through a subprocess, as an operator runs it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SYSTEMROOT")}
    return {
        **keep,
        "PYTHONPATH": str(ROOT),
        "DATA_DIR": str(tmp_path / "data"),
        "HTTP_PORT": "0",
        "LOG_FORMAT": "text",
        **extra,
    }


def _bot(
    tmp_path: Path, *args: str, stdin: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(tmp_path, **env),
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([], id="top"),
        pytest.param(["run"], id="run"),
        pytest.param(["chat"], id="chat"),
        pytest.param(["sessions"], id="sessions"),
        pytest.param(["ledger"], id="ledger"),
        pytest.param(["doctor"], id="doctor"),
    ],
)
def test_help(tmp_path: Path, args: list[str]) -> None:
    result = _bot(tmp_path, *args, "--help")
    assert result.returncode == 0
    assert "usage:" in result.stdout


def test_doctor_passes_on_defaults(tmp_path: Path) -> None:
    result = _bot(tmp_path, "doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok   database" in result.stdout
    assert "offline" in result.stdout


def test_doctor_says_whether_replies_can_be_spoken(tmp_path: Path) -> None:
    def voice_line(**env: str) -> str:
        (line,) = [
            line for line in _bot(tmp_path, "doctor", **env).stdout.splitlines() if "voice" in line
        ]
        return line

    assert voice_line().startswith("ok   voice replies: off")
    demo = voice_line(VOICE_REPLIES="auto")  # the offline demo speaks with its silent voice
    assert demo == "ok   voice replies: auto, gpt-4o-mini-tts (alloy)"
    keyless = voice_line(VOICE_REPLIES="always", DEFAULT_MODEL="gpt-4o-mini", TTS_VOICE="nova")
    assert keyless == (
        "WARN voice replies: always, gpt-4o-mini-tts (nova); no OPENAI_API_KEY: replies stay text"
    )


def test_doctor_fails_on_an_unroutable_model(tmp_path: Path) -> None:
    result = _bot(tmp_path, "doctor", DEFAULT_MODEL="claude-9")
    assert result.returncode == 1
    assert "FAIL agents" in result.stdout


def test_wrong_setting_stops_with_one_line_naming_it(tmp_path: Path) -> None:
    result = _bot(tmp_path, "run", HTTP_PORT="eighty")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "HTTP_PORT" in lines[0]


def test_chat_shows_tools_and_handoffs_and_keeps_history(tmp_path: Path) -> None:
    first = _bot(tmp_path, "chat", stdin="hello\nwhere is my order #1001?\n")
    assert first.returncode == 0, first.stderr
    assert "[Triage]" in first.stdout
    assert "[Order Tracking]" in first.stdout
    assert "shipped" in first.stdout.lower()
    sessions = _bot(tmp_path, "sessions", "list").stdout.split()
    assert len(sessions) == 1
    show = _bot(tmp_path, "sessions", "show", sessions[0])
    assert "unknown" not in show.stderr  # on Order Tracking: one of the operator's agents
    shown = show.stdout
    assert "where is my order #1001?" in shown
    assert "check_order_status" in shown
    # A new process continues the same conversation with the agent it ended on.
    second = _bot(
        tmp_path, "chat", stdin="and order 1002?\n/reset\nI need a refund for invoice INV-2001\n"
    )
    assert second.returncode == 0, second.stderr
    lines = second.stdout.strip().splitlines()
    assert lines[0].startswith("[Order Tracking]")
    assert any(line.startswith("[Billing]") for line in lines[2:])


def test_ledger_status_after_a_chat(tmp_path: Path) -> None:
    _bot(tmp_path, "chat", stdin="hello\n")
    result = _bot(tmp_path, "ledger", "status")
    assert result.returncode == 0
    assert "delivered: 1" in result.stdout


async def test_second_instance_is_refused_and_sigterm_stops_cleanly(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        "run",
        "--no-console",
        cwd=tmp_path,
        env=_env(tmp_path),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    banner = b""
    while b"Chatflow:" not in banner:
        line = await asyncio.wait_for(proc.stderr.readline(), 30)
        assert line, "bot exited before its banner"
        banner += line
    second = await asyncio.to_thread(_bot, tmp_path, "run", "--no-console")
    assert second.returncode == 2
    assert "already running" in second.stderr
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0


def test_run_with_piped_input_and_no_platform_chats_and_exits(tmp_path: Path) -> None:
    # `echo 'where is order 1001?' | make run`: answered over stdin, then the bot exits.
    result = _bot(tmp_path, "run", stdin="where is order 1001?\n", TELEGRAM_BOT_TOKEN="")
    assert result.returncode == 0, result.stderr
    assert "1001" in result.stdout
    assert "Shipped" in result.stdout or "shipped" in result.stdout


def test_run_as_a_service_with_no_platform_stops_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bot", "run"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(tmp_path),
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "TELEGRAM_BOT_TOKEN" in lines[0] and "WHATSAPP_PHONE_ID" in lines[0]


def test_doctor_says_what_the_knowledge_base_holds(tmp_path: Path) -> None:
    def knowledge_line(**env: str) -> str:
        (line,) = [
            line
            for line in _bot(tmp_path, "doctor", **env).stdout.splitlines()
            if "knowledge" in line
        ]
        return line

    assert knowledge_line() == (
        "WARN knowledge: Triage, Order Tracking search it, but it is empty: "
        "python -m bot knowledge add PATH (make run adds agents/knowledge)"
    )
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "faq.md").write_text("# FAQ\n\nWe ship worldwide.")
    assert _bot(tmp_path, "knowledge", "add", str(docs)).returncode == 0
    assert knowledge_line() == (
        "ok   knowledge: 1 sources, 1 passages; full text; searched by Triage, Order Tracking"
    )
