"""The real transports: a stdio child process killed mid-conversation, Streamable HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from bot import MCPServerError, MCPServerStdio, MCPServerStreamableHttp
from bot.core.agent import Agent
from bot.core.messages import Role
from bot.core.models.scripted import ScriptedModel
from bot.core.runner import Runner, RunResult
from bot.core.tools import ToolContext
from tests.fakes.mcp_http import FakeMCPHttpServer
from tests.fakes.mcp_server import stdio_params
from tests.fakes.serving import LocalServer

SECRET = "sk-live-SECRET-do-not-log-4242"


class WatchedStdio(MCPServerStdio):
    """Tells the test each time a connection is up (its tools listed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.up = asyncio.Event()

    async def _watch(self, client: Any) -> None:
        self.up.set()
        await super()._watch(client)


def tool_results(result: RunResult) -> list[str]:
    return [m.content or "" for m in result.new_messages if m.role is Role.TOOL]


async def test_a_killed_stdio_server_gives_an_error_result_then_comes_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    pid_file, refuse = tmp_path / "pid", tmp_path / "refuse"
    server = WatchedStdio(
        params=stdio_params(
            FAKE_MCP_PID_FILE=str(pid_file),
            FAKE_MCP_REFUSE_FILE=str(refuse),
            FAKE_MCP_SECRET=SECRET,
        ),
        name="crm",
    )
    agent = Agent("Support", "Help.", mcp_servers=[server])
    model = ScriptedModel()
    async with Runner(agent, model=model) as runner:
        model.add(ScriptedModel.call("secret_length"), ScriptedModel.reply("ok"))
        first = await runner.run_async("s-1", "check")
        assert tool_results(first) == [str(len(SECRET))]  # the env reached the child

        refuse.touch()  # the server stays dead after the kill
        server.up.clear()
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        model.add(
            ScriptedModel.call("crm_lookup_order", order_id="1001"),
            ScriptedModel.reply("The order system is down, sorry."),
        )
        second = await runner.run_async("s-1", "where is 1001?")
        (error,) = tool_results(second)
        assert "'crm'" in json.loads(error)["error"]
        assert second.content == "The order system is down, sorry."  # the turn committed

        refuse.unlink()  # the server can start again: the backoff loop reconnects
        await asyncio.wait_for(server.up.wait(), 30)
        model.add(
            ScriptedModel.call("crm_lookup_order", order_id="1001"), ScriptedModel.reply("ok")
        )
        third = await runner.run_async("s-1", "and now?")
        assert "order 1001 is in transit" in tool_results(third)[0]
        session = await runner.store.get("s-1")
        assert session is not None and len(session.history) == 12  # three whole turns
    assert SECRET not in caplog.text
    assert any("unavailable" in r.getMessage() for r in caplog.records)


async def test_streamable_http_sends_the_headers_and_survives_the_server_going_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with FakeMCPHttpServer() as http:
        server = MCPServerStreamableHttp(
            params={"url": http.url, "headers": {"Authorization": f"Bearer {SECRET}"}},
            name="kb",
            connect_timeout_seconds=10,
        )
        async with server:
            assert "crm_lookup_order" in [t.name for t in server.tools]
            assert server.describe() == (
                f"http: http://127.0.0.1:{http.port}/mcp (headers: Authorization: ***)"
            )
            lookup = next(t for t in server.tools if t.name == "crm_lookup_order")
            context = ToolContext(session_id="s-9", inbound_message_id="wa:1")
            text = await lookup.invoke(context, {"order_id": "7"})
            assert isinstance(text, str)  # text only: no image in this result
            assert "order 7 is in transit" in text and "session=s-9" in text
            assert all(h.get("authorization") == f"Bearer {SECRET}" for h in http.headers)
            await http.stop()
            failed = await lookup.invoke(context, {"order_id": "7"})
            assert isinstance(failed, str) and "error" in json.loads(failed)
    assert SECRET not in caplog.text and SECRET not in repr(server)


def test_describe_names_the_command_but_not_the_environment() -> None:
    server = MCPServerStdio(
        params={"command": "npx", "args": ["-y", "crm-mcp"], "env": {"CRM_KEY": SECRET}}
    )
    assert server.name == "npx crm-mcp"
    assert server.describe() == "stdio: npx -y crm-mcp"
    assert SECRET not in repr(server)


# -- issue 24: reconnect backoff, the child's end, HTTP refusals, secrets in doctor --------


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CrashLooping(MCPServerStdio):
    """Counts its connections; the third one stays up (on the clock) past a minute."""

    def __init__(self, clock: Clock, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clock = clock
        self.connections = 0

    async def _watch(self, client: Any) -> None:
        self.connections += 1
        if self.connections == 3:
            self.clock.now += 61
        await super()._watch(client)


class Retries(logging.Handler):
    """Collects the waits of ``retrying in X s`` lines; ``enough`` is set at ``wanted``."""

    def __init__(self, wanted: int) -> None:
        super().__init__(logging.WARNING)
        self.delays: list[float] = []
        self.wanted = wanted
        self.enough = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"retrying in ([0-9.]+) s", record.getMessage())
        if found:
            self.delays.append(float(found.group(1)))
            if len(self.delays) >= self.wanted:
                self.enough.set()


async def test_a_crash_looping_server_is_restarted_ever_more_slowly_until_it_stays_up() -> None:
    from bot.core.mcp.retry import Backoff

    clock = Clock()
    server = CrashLooping(clock, params=stdio_params(FAKE_MCP_EXIT_AFTER_LIST="1"), name="flaky")
    server._backoff = Backoff(first=0.05, limit=0.2, stable_after=60, clock=clock)
    retries = Retries(wanted=5)
    logger = logging.getLogger("bot.core.mcp.connection")
    logger.addHandler(retries)
    try:
        await server.connect()
        await asyncio.wait_for(retries.enough.wait(), 60)
    finally:
        logger.removeHandler(retries)
        await server.close()
    # Doubling while it crashes at once; back to the first wait only after the
    # third connection had stayed up 61 s.
    assert retries.delays[:5] == [0.05, 0.1, 0.05, 0.1, 0.2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: only its parent's wait is missing.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


async def test_closing_never_leaves_a_stubborn_child_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bot.core.mcp.connection as connection

    # As on a loaded machine: the SDK's stop (stdin closed, SIGTERM, SIGKILL)
    # outlasts the close grace.
    monkeypatch.setattr(connection, "_CLOSE_GRACE", 0.2)
    pid_file = tmp_path / "pid"
    server = MCPServerStdio(
        params=stdio_params(FAKE_MCP_PID_FILE=str(pid_file), FAKE_MCP_STUBBORN="1"), name="wedged"
    )
    await server.connect()
    pid = int(pid_file.read_text())
    closing = asyncio.create_task(server.close())
    try:
        done, _ = await asyncio.wait({closing}, timeout=20)  # the SDK's kill takes ~4.5 s
        assert done, "close() is stuck behind the child it failed to stop"
        assert not alive(pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # this test owns the child's end either way
        await closing


def refusing(status: int) -> Starlette:
    async def refuse(request: Request) -> Response:
        return PlainTextResponse("no", status_code=status)

    return Starlette(routes=[Route("/mcp", refuse, methods=["GET", "POST", "DELETE"])])


@pytest.mark.parametrize(
    ("status", "says"),
    [
        pytest.param(401, "HTTP 401 Unauthorized: the server refused the credentials", id="401"),
        pytest.param(403, "HTTP 403 Forbidden", id="403"),
        pytest.param(500, "HTTP 500: the server failed", id="500"),
        pytest.param(503, "HTTP 503: the server failed", id="503"),
    ],
)
async def test_an_http_refusal_at_start_up_says_which_and_what_to_check(
    status: int, says: str
) -> None:
    local = LocalServer(refusing(status))
    port = await local.start()
    try:
        server = MCPServerStreamableHttp(
            params={
                "url": f"http://127.0.0.1:{port}/mcp?api_key=QUERY-{SECRET}",
                "headers": {"Authorization": f"Bearer {SECRET}"},
            },
            name="kb",
            connect_timeout_seconds=10,
        )
        with pytest.raises(MCPServerError) as caught:
            await server.connect()
    finally:
        await local.stop()
    message = str(caught.value)
    assert message.startswith(f"MCP server 'kb' failed to start: {says}")
    assert SECRET not in message


async def test_doctor_masks_credentials_on_the_command_line_and_in_headers() -> None:
    from bot.doctor import _check_mcp_server

    server = MCPServerStdio(
        params={
            "command": sys.executable,
            "args": [
                "-c",
                "import sys; sys.exit(2)",
                "--token",
                "ARGV-SECRET-456",
                f"--api-key={SECRET}",
                "--dsn",
                "postgres://crm:DB-PASSWORD-9@db.internal/crm",
                "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6",
            ],
            "env": {"CRM_KEY": "ENV-SECRET-789"},
        },
        name="crm2",
        connect_timeout_seconds=10,
    )
    checked = await _check_mcp_server(server)
    assert not checked.ok and "failed to start" in checked.detail
    for secret in ("ARGV-SECRET-456", SECRET, "DB-PASSWORD-9", "ghp_A1b2", "ENV-SECRET-789"):
        assert secret not in checked.detail
    assert "--token *** --api-key=*** --dsn postgres://crm:***@db.internal/crm ***" in (
        checked.detail
    )
    http = MCPServerStreamableHttp(
        params={"url": "https://kb.example/mcp", "headers": {"Authorization": f"Bearer {SECRET}"}}
    )
    assert http.describe() == "http: https://kb.example/mcp (headers: Authorization: ***)"


def test_the_default_name_never_takes_a_secret_argument() -> None:
    server = MCPServerStdio(params={"command": "crm-mcp", "args": ["--token", SECRET, "serve"]})
    assert server.name == "crm-mcp serve"
    assert SECRET not in server.describe()


async def test_a_stdio_server_that_dies_at_start_is_explained_by_its_last_stderr_line(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """D4 of the newcomer report: `"command": "python"` started a Python without `mcp`."""
    server = MCPServerStdio(
        params={"command": sys.executable, "args": ["-c", "import crm_server_missing_module"]},
        name="crm",
        connect_timeout_seconds=20,
    )
    with pytest.raises(MCPServerError) as caught:
        await server.connect()
    message = str(caught.value)
    assert message.startswith(
        "MCP server 'crm' failed to start: ModuleNotFoundError: No module named "
        "'crm_server_missing_module' (the server's last words on stderr; "
    )
    assert "\n" not in message
    # What the child printed still reaches the operator's terminal, as it always did.
    assert "Traceback" in capfd.readouterr().err
