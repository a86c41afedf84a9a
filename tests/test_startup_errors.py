"""Operator mistakes at start-up: one line on stderr and exit 2, never a traceback.

Each case runs ``python -m bot`` as a subprocess, configured the way an operator
does it (environment, ``.env``, an ``agents/`` folder beside the working
directory), with piped input as ``echo hi | make run`` gives it.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.botprocess import free_port
from tests.test_cli import ROOT, _bot, _env

ONE_LINE_COMMANDS = [
    pytest.param(["run"], id="run"),
    pytest.param(["chat"], id="chat"),
    pytest.param(["sessions", "list"], id="sessions"),
    pytest.param(["ledger", "status"], id="ledger"),
    pytest.param(["pairing", "list"], id="pairing"),
]


def one_error_line(stderr: str) -> str:
    """The single line the bot printed: no traceback, nothing else."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("args", ONE_LINE_COMMANDS)
def test_a_data_dir_that_cannot_be_made_is_one_line_for_every_command(
    tmp_path: Path, args: list[str]
) -> None:
    result = _bot(tmp_path, *args, stdin="hi\n", DATA_DIR="/proc/chatflow")
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert line.startswith("chatflow: configuration error: DATA_DIR: cannot create /proc/chatflow")


def test_a_data_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    result = _bot(tmp_path, "run", stdin="hi\n", DATA_DIR=str(tmp_path / "afile"))
    assert result.returncode == 2
    assert "DATA_DIR: " in one_error_line(result.stderr)
    assert "afile is a file, not a folder" in result.stderr


def test_a_data_dir_nobody_may_write_in_is_one_line(tmp_path: Path) -> None:
    # A folder in which no process may create files, root included.
    result = _bot(tmp_path, "run", stdin="hi\n", DATA_DIR="/proc/self")
    assert result.returncode == 2
    assert "DATA_DIR: cannot write in /proc/self" in one_error_line(result.stderr)


def _project_agents(tmp_path: Path) -> Path:
    """A copy of the example agents in ``<tmp_path>/agents``, for the test to break."""
    folder = tmp_path / "agents"
    shutil.copytree(ROOT / "agents", folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def test_a_syntax_error_in_the_agents_is_one_line_with_file_and_line(tmp_path: Path) -> None:
    orders = _project_agents(tmp_path) / "orders.py"
    lines = orders.read_text().splitlines()
    broken = next(n for n, line in enumerate(lines) if line.startswith("def "))
    lines[broken] = lines[broken].replace("(", "(:", 1)
    orders.write_text("\n".join(lines) + "\n")
    for args in (["run"], ["chat"], ["sessions", "reset", "console-0123456789abcdef"]):
        result = _bot(tmp_path, *args, stdin="hi\n")
        assert result.returncode == 2, result.stderr
        line = one_error_line(result.stderr)
        # N14: AGENTS_MODULE is unset, so the line does not point at it.
        assert "configuration error: the agents in" in line and "AGENTS_MODULE" not in line
        assert f"orders.py:{broken + 1}: SyntaxError" in line


def test_an_error_raised_by_agents_code_names_where(tmp_path: Path) -> None:
    billing = _project_agents(tmp_path) / "billing.py"
    billing.write_text(billing.read_text() + "\nraise RuntimeError('no billing today')\n")
    result = _bot(tmp_path, "chat", stdin="hi\n")
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert "billing.py:" in line and "RuntimeError: no billing today" in line


def test_two_agents_with_one_name_are_one_line(tmp_path: Path) -> None:
    init = _project_agents(tmp_path) / "__init__.py"
    # The mistake of agents/README "Add an agent": a new agent named like an old one.
    init.write_text(
        init.read_text()
        + "\nfrom bot import Agent as _Agent\n"
        + "starting_agent.handoffs = (*starting_agent.handoffs, _Agent(name='Billing', "
        + "instructions='x', handoffs=[starting_agent]))\n"
    )
    result = _bot(tmp_path, "chat", stdin="hi\n")
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert "two different agents" in line and "'Billing'" in line


def test_agents_module_given_as_a_folder_path_loads_that_folder(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    shutil.copytree(ROOT / "agents", folder, ignore=shutil.ignore_patterns("__pycache__"))
    result = _bot(tmp_path, "chat", stdin="hi\n", AGENTS_MODULE="./mine", LOG_LEVEL="ERROR")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("[Triage]")
    missing = _bot(tmp_path, "chat", stdin="hi\n", AGENTS_MODULE="./nowhere")
    assert missing.returncode == 2
    assert "AGENTS_MODULE: './nowhere' is a path" in one_error_line(missing.stderr)


def test_typos_in_dotenv_and_the_environment_are_named_with_the_setting_meant(
    tmp_path: Path,
) -> None:
    (tmp_path / ".env").write_text("LOG_LEVL=DEBUG\nTELEGRAM_TOKEN=123456:ABCdef\n")
    result = _bot(tmp_path, "chat", stdin="hi\n", OPENAI_API_KEYS="sk-x", LOG_LEVEL="WARNING")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "is not a setting" in line]
    assert [w.split("bot.cli: ", 1)[1] for w in warnings] == [
        "LOG_LEVL is not a setting; did you mean LOG_LEVEL?",
        "OPENAI_API_KEYS is not a setting; did you mean OPENAI_API_KEY?",
        "TELEGRAM_TOKEN is not a setting; did you mean TELEGRAM_BOT_TOKEN?",
    ]
    assert "123456:ABCdef" not in result.stderr and "sk-x" not in result.stderr  # names only


@pytest.mark.parametrize(
    ("dotenv", "environ", "meant"),
    [
        pytest.param("ACCES_MODE=pairing\n", {}, "ACCESS_MODE", id="ACCES_MODE"),
        pytest.param(
            "ACCESS_MODE=allowlist\nALLOWED_USER=42\n", {}, "ALLOWED_USERS", id="ALLOWED_USER"
        ),
        pytest.param("", {"CONSOLE_TOKN": "t" * 32}, "CONSOLE_TOKEN", id="CONSOLE_TOKN-env"),
        pytest.param("RATE_LIMIT_MESAGES=5\n", {}, "RATE_LIMIT_MESSAGES", id="RATE_LIMIT"),
    ],
)
def test_a_misspelt_security_setting_stops_run_with_one_line(
    tmp_path: Path, dotenv: str, environ: dict[str, str], meant: str
) -> None:
    # The bot would otherwise start open (or unguarded) and answer everyone.
    (tmp_path / ".env").write_text(dotenv)
    result = _bot(tmp_path, "run", stdin="hi\n", **environ)
    assert result.returncode == 2, result.stdout + result.stderr
    line = one_error_line(result.stderr)
    assert line.startswith("chatflow: configuration error: ")
    assert f"did you mean {meant}?" in line and "security setting" in line
    assert result.stdout == ""  # nothing was answered
    assert "t" * 32 not in line  # names only, never values


def test_a_meta_style_phone_number_id_is_named_in_the_half_set_up_error(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(
        "WHATSAPP_TOKEN=x\nWHATSAPP_VERIFY_TOKEN=v\nWHATSAPP_APP_SECRET=s\n"
        "WHATSAPP_PHONE_NUMBER_ID=1234567890\n"
    )
    for args in (["run"], ["doctor"]):
        result = _bot(tmp_path, *args, stdin="hi\n")
        assert result.returncode == 2, result.stderr
        line = one_error_line(result.stderr)
        assert "WHATSAPP_PHONE_ID is missing" in line
        assert "WHATSAPP_PHONE_NUMBER_ID is set: did you mean WHATSAPP_PHONE_ID?" in line


def test_a_malformed_telegram_token_stops_at_once_without_the_network(tmp_path: Path) -> None:
    # No Bot API to ask here: the shape alone is checked, in one line, before any retry.
    result = _bot(tmp_path, "run", stdin="hi\n", TELEGRAM_BOT_TOKEN="not-a-token")
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert line.startswith("chatflow: configuration error: TELEGRAM_BOT_TOKEN: not a bot token")
    assert "not-a-token" not in line


def test_whatsapp_set_up_but_for_the_phone_id_is_an_error_not_the_terminal(
    tmp_path: Path,
) -> None:
    (tmp_path / ".env").write_text(
        "WHATSAPP_TOKEN=x\nWHATSAPP_VERIFY_TOKEN=v\nWHATSAPP_APP_SECRET=s\n"
    )
    result = _bot(tmp_path, "run", stdin="hi\n")
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert "WhatsApp is half set up: WHATSAPP_PHONE_ID is missing" in line


def test_ledger_status_lists_what_needs_attention_first_with_age_and_session(
    tmp_path: Path,
) -> None:
    assert _bot(tmp_path, "chat", stdin="one\ntwo\nthree\n").returncode == 0
    db = sqlite3.connect(tmp_path / "data" / "chatflow.db")
    with db:
        ids = [r[0] for r in db.execute("SELECT obligation_id FROM chatflow_delivery_obligations")]
        db.execute(
            "UPDATE chatflow_delivery_obligations SET state = 'failed' WHERE obligation_id = ?",
            ids[:1],
        )
        db.execute(
            "UPDATE chatflow_delivery_obligations SET state = 'abandoned', last_error = 'gave up' "
            "WHERE obligation_id = ?",
            ids[1:2],
        )
    db.close()
    result = _bot(tmp_path, "ledger", "status", "--limit", "2")
    counts, *rows = result.stdout.splitlines()
    assert "abandoned: 1" in counts and "delivered: 1" in counts and "failed: 1" in counts
    assert [row.split()[1] for row in rows] == ["failed", "abandoned"]
    assert all(" old  session console-" in row for row in rows)
    assert rows[1].endswith("gave up")


def test_version_and_an_empty_pairing_list_say_something(tmp_path: Path) -> None:
    version = _bot(tmp_path, "--version")
    assert version.returncode == 0 and version.stdout.startswith("chatflow ")
    listed = _bot(tmp_path, "pairing", "list")
    assert listed.returncode == 0
    assert listed.stdout.strip() == "no pending codes and no approved senders"


def test_a_busy_port_is_said_before_the_banner_and_before_input_is_read(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _bot(tmp_path, "run", stdin="where is my order?\n", HTTP_PORT=str(port))
    assert result.returncode == 2
    line = one_error_line(result.stderr)  # no banner, no "could not be accepted", no trace
    assert line == (
        f"chatflow: configuration error: HTTP_HOST/HTTP_PORT: cannot listen on "
        f"127.0.0.1:{port} (Address already in use)"
    )
    assert result.stdout == ""  # the piped message was never taken


async def test_run_with_only_the_web_chat_and_no_stdin_serves_it(tmp_path: Path) -> None:
    """D9: under systemd or docker (no stdin), CONSOLE_TOKEN alone is a platform."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        "run",
        cwd=tmp_path,
        env=_env(tmp_path, HTTP_PORT=str(port), CONSOLE_TOKEN="c" * 32),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        seen = b""
        while b"HTTP server listening" not in seen:
            line = await asyncio.wait_for(proc.stderr.readline(), 30)
            assert line, f"bot exited: {seen.decode()}"
            seen += line
        assert b"Chatflow: web;" in seen
        async with httpx.AsyncClient() as client:
            page = await client.get(f"http://127.0.0.1:{port}/console/login")
        assert page.status_code == 200
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0


def _doctor_lines(result: subprocess.CompletedProcess[str]) -> dict[str, list[str]]:
    assert "Traceback" not in result.stdout + result.stderr
    lines: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        mark, rest = line[:4].strip(), line[5:]
        lines.setdefault(rest.split(":", 1)[0], []).append(f"{mark} {rest}")
    return lines


def test_doctor_reports_each_start_up_mistake_as_a_line(tmp_path: Path) -> None:
    orders = _project_agents(tmp_path) / "orders.py"
    orders.write_text(orders.read_text().replace("def ", "def (", 1))
    (tmp_path / ".env").write_text("ACCES_MODE=pairing\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _bot(
            tmp_path,
            "doctor",
            DATA_DIR="/proc/chatflow",
            HTTP_PORT=str(port),
            TELEGRAM_BOT_TOKEN="123:abc",
            TELEGRAM_API_BASE_URL=f"http://127.0.0.1:{free_port()}/bot",
        )
    assert result.returncode == 1
    lines = _doctor_lines(result)
    assert (
        lines["settings"][1]
        == "FAIL settings: ACCES_MODE is not a setting; did you mean ACCESS_MODE?"
    )
    assert lines["data dir"][0].startswith("FAIL data dir: DATA_DIR: cannot create /proc/chatflow")
    assert lines["http"][0].startswith(
        f"FAIL http: HTTP_HOST/HTTP_PORT: cannot listen on 127.0.0.1:{port}"
    )
    (agents,) = lines["agents"]
    assert agents.startswith("FAIL agents: the agents in") and "orders.py:" in agents
    assert "mcp" not in lines  # the same failure is not reported twice
    assert lines["telegram"][0].startswith("FAIL telegram: Telegram unreachable")


def test_doctor_validates_the_agent_graph(tmp_path: Path) -> None:
    init = _project_agents(tmp_path) / "__init__.py"
    init.write_text(
        init.read_text()
        + "\nfrom bot import Agent as _Agent\n"
        + "starting_agent.handoffs[0].handoffs = (_Agent(name='Triage', instructions='x'),)\n"
    )
    result = _bot(tmp_path, "doctor")
    assert result.returncode == 1
    (agents,) = _doctor_lines(result)["agents"]
    assert agents.startswith("FAIL agents: ") and "two different agents" in agents
