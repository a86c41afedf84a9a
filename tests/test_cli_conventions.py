"""N10: one convention across the CLI. A usage error (a wrong argument, an unknown id)
is one ``chatflow: <command>: <reason>`` line on stderr and exit 2; times read
``2026-12-07 02:35:58 UTC`` everywhere; ``console:`` names the terminal's chat wherever
jobs and conversations show that platform; operator commands print no INFO logs."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.cli import main, utc_time
from bot.doctor import tools_line
from tests.test_cli import _env

UNKNOWN_IDS = [
    pytest.param(["sessions", "show", "nope"], "sessions: no session nope", id="sessions-show"),
    pytest.param(["sessions", "reset", "nope"], "sessions: no session nope", id="sessions-reset"),
    pytest.param(["sessions", "delete", "nope"], "sessions: no session nope", id="sessions-delete"),
    pytest.param(["ledger", "retry", "nope"], "ledger: cannot retry nope: not found", id="retry"),
    pytest.param(["ledger", "abandon", "nope"], "ledger: cannot abandon nope", id="abandon"),
    pytest.param(["pairing", "approve", "ZZZZ2222"], "pairing: code ZZZZ2222 is", id="pairing"),
    pytest.param(["pairing", "revoke", "telegram:42"], "pairing: no approval", id="revoke"),
    pytest.param(["approvals", "approve", "nope"], "approvals: cannot approve nope", id="approve"),
    pytest.param(["schedule", "cancel", "nope"], "schedule: cannot cancel nope", id="cancel"),
    pytest.param(["send", "fax:1", "hi"], "send: unknown platform 'fax'", id="send"),
    pytest.param(["usage", "--since", "yesterday"], "usage: ", id="usage"),
]


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., tuple[int, str, str]]]:
    """``python -m bot`` run in this process (a subprocess per case would cost seconds):
    the environment and working directory of ``tests.test_cli._bot``, logging restored."""
    for name in list(os.environ):
        if name not in ("PATH", "HOME", "LANG") and not name.startswith("PYTEST_"):
            monkeypatch.delenv(name)  # the settings see what a fresh shell has
    for name, value in _env(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def run(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
        return code, out.getvalue(), err.getvalue()

    try:
        yield run
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.parametrize(("args", "starts"), UNKNOWN_IDS)
def test_a_usage_error_is_one_prefixed_line_on_stderr_and_exit_2(
    in_process: Callable[..., tuple[int, str, str]], args: list[str], starts: str
) -> None:
    code, out, err = in_process(*args)
    assert (code, out) == (2, ""), err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"chatflow: {starts}"), err


def test_console_targets_are_accepted_where_jobs_show_them(
    tmp_path: Path, in_process: Callable[..., tuple[int, str, str]]
) -> None:
    # The terminal conversation is on platform "console": `schedule list` shows it, so
    # `send` and `--chat` take it too (it goes out when a bot runs with the terminal).
    code, out, err = in_process("send", "console:local", "Hello from the operator")
    assert code == 0 and out.startswith("queued "), err
    assert err == ""  # no INFO lines of first-use migrations
    with sqlite3.connect(tmp_path / "data" / "chatflow.db") as db:
        rows = db.execute(
            "SELECT platform, chat_id, content FROM chatflow_delivery_obligations"
        ).fetchall()
    assert rows == [("console", "local", "Hello from the operator")]
    assert in_process("schedule", "list", "--chat", "console:local")[:2] == (
        0,
        "No scheduled messages.\n",
    )
    code, out, err = in_process("send", "console:two words", "hi")
    assert (code, out) == (2, "") and err.startswith("chatflow: send: console chat id")


def test_every_cli_time_reads_the_same() -> None:
    assert utc_time(datetime(2026, 12, 7, 2, 35, 58, tzinfo=UTC)) == "2026-12-07 02:35:58 UTC"
    source = (Path(__file__).resolve().parents[1] / "bot" / "cli.py").read_text()
    # No command formats a time on its own (isoformat with Z, strftime with its own pattern).
    assert not re.search(r'isoformat\(timespec|:%Y-%m-%d|replace\("\+00:00", "Z"\)', source)


def test_an_unreachable_database_is_one_line_naming_database_url(
    in_process: Callable[..., tuple[int, str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # N16: the line did not say which setting to fix. A runtime failure: exit 1.
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody:pw@127.0.0.1:1/x")
    code, out, err = in_process("sessions", "list")
    assert (code, out) == (1, "")
    assert err.startswith(
        "chatflow: DatabaseUnavailableError: DATABASE_URL: cannot connect to PostgreSQL"
    )
    assert "pw" not in err and len(err.splitlines()) == 1


def test_doctor_counts_tools_in_words() -> None:
    # N18: "1 tools: lookup_customer".
    assert tools_line(["lookup_customer"]) == "1 tool: lookup_customer"
    assert tools_line(["a", "b"]) == "2 tools: a, b"
    assert tools_line([]) == "0 tools: none"
